"""The hostile-input table's own cases, beyond the suite's (tests/faults/test_bad_input.py, test_hostile_*.py): a
model's config.json key by bad value, config.json files that are no JSON object, data files that are no data,
launch flags, and damaged checkpoints. Each is bad input: exit 2, one block, nothing written.

A case is the suite's harness Case (tests.faults.harness); checkpoint cases are ExportCase, whose run dir comes from
a trained one-rank run (made once by run.py).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tests.faults.harness import Case, Sandbox

GPT2 = {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 1024, "n_positions": 256}
LLAMA = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 1024, "max_position_embeddings": 256}
BAD_SIZES = {"float": 64.5, "string": "64", "nan": "NaN", "bool": True, "negative": -1, "zero": 0,
             "huge": 10**12, "object": {"value": 64}}
ZERO_ALLOWED = ("n_inner", "intermediate_size")  # an MLP width of 0 means "none" in some families


def config_dir(s: Sandbox, text: str, name: str = "model") -> str:
    d = s.root / name
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(text)
    return str(d)


def with_value(base: dict, key: str, value) -> str:
    """config.json text with ``key`` set to ``value`` ("NaN" is written as the bare JSON constant)."""
    if value == "NaN":
        return json.dumps(base | {key: 0}).replace(f'"{key}": 0', f'"{key}": NaN')
    return json.dumps(base | {key: value})


def config_cases() -> list[Case]:
    out = []
    for base in (GPT2, LLAMA):
        for key in [k for k in base if k != "model_type"]:
            for kind, value in BAD_SIZES.items():
                if kind == "zero" and key in ZERO_ALLOWED:
                    continue
                text = with_value(base, key, value)
                out.append(Case(f"config-{base['model_type']}-{key}-{kind}",
                                lambda s, t=text: [s.job(model=config_dir(s, t))], [key], verb="plan"))
    texts = {
        "zero-bytes": "", "blank": "  \n", "null": "null", "number": "42", "string": '"llama"', "list": "[]",
        "empty-object": "{}", "cut-short": json.dumps(LLAMA)[:40], "trailing-garbage": json.dumps(LLAMA) + "}}",
        "single-quotes": str(LLAMA), "model-type-number": json.dumps(LLAMA | {"model_type": 7}),
        "model-type-empty": json.dumps(LLAMA | {"model_type": ""}),
        "model-type-typo-lama": json.dumps(LLAMA | {"model_type": "lama"}),
        "model-type-hub-name": json.dumps(LLAMA | {"model_type": "meta-llama/Llama-3-8B"}),
        "model-type-missing": json.dumps({k: v for k, v in LLAMA.items() if k != "model_type"}),
        "rope-theta-infinity": json.dumps(LLAMA | {"rope_theta": 1}).replace('"rope_theta": 1',
                                                                              '"rope_theta": Infinity'),
        "heads-not-dividing": json.dumps(LLAMA | {"num_attention_heads": 6, "num_key_value_heads": 6}),
        "kv-heads-not-dividing": json.dumps(LLAMA | {"num_key_value_heads": 3}),
        "text-config-nan": json.dumps({"model_type": "llava", "text_config": LLAMA | {"hidden_size": 0}}),
        "deep-nesting": "[" * 100_000 + "]" * 100_000,
    }
    for name, text in texts.items():
        out.append(Case(f"config-json-{name}", lambda s, t=text: [s.job(model=config_dir(s, t))], ["model: "],
                        verb="plan"))
    binary = {"utf16": json.dumps(LLAMA).encode("utf-16"), "latin1": b'{"model_type": "llama\xe9"}',
              "nul-bytes": b"\x00" * 64}
    for name, data in binary.items():
        def make(s: Sandbox, d: bytes = data) -> list:
            (s.root / "model").mkdir(exist_ok=True)
            (s.root / "model" / "config.json").write_bytes(d)
            return [s.job(model=str(s.root / "model"))]
        out.append(Case(f"config-json-{name}", make, ["model: "], verb="plan"))
    return out


def data_file(s: Sandbox, name: str, data: bytes | str) -> list:
    p = s.root / name
    p.write_bytes(data if isinstance(data, bytes) else data.encode())
    return [s.job(**{"data.path": str(p)})]


def rows(items: list) -> str:
    return "".join(json.dumps(r) + "\n" for r in items)


def chat(user: str = "q", reply: str = "a") -> dict:
    return {"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]}


def data_cases() -> list[Case]:
    ok_text = [{"text": f"row {i}"} for i in range(40)]
    files: dict[str, tuple[str, bytes | str, str]] = {
        "jsonl-empty": ("d.jsonl", "", "holds no examples"),
        "jsonl-blank-lines": ("d.jsonl", "\n\n  \n", "holds no examples"),
        "jsonl-not-json": ("d.jsonl", rows(ok_text) + "not json\n", "not JSON"),
        "jsonl-array-row": ("d.jsonl", rows(ok_text) + "[1, 2]\n", "not an object"),
        "jsonl-number-row": ("d.jsonl", rows(ok_text) + "7\n", "not an object"),
        "jsonl-invalid-utf8": ("d.jsonl", rows(ok_text).encode() + b'{"text": "\xc3\x28"}\n', "not UTF-8 text"),
        "jsonl-latin1": ("d.jsonl", rows(ok_text).encode() + b'{"text": "caf\xe9"}\n', "not UTF-8 text"),
        "jsonl-nesting-bomb": ("d.jsonl", '{"text": ' + "[" * 50_000 + "]" * 50_000 + "}\n", "nests too deeply"),
        "jsonl-row-over-16mb": ("d.jsonl", rows(ok_text) + '{"text": "' + "y" * (16 * 10**6 + 10) + '"}\n',
                                "one row may hold"),
        "surrogate-in-text": ("d.jsonl", rows(ok_text) + '{"text": "a\\ud800b"}\n', "lone surrogate"),
        "surrogate-high-low-swapped": ("d.jsonl", rows(ok_text) + '{"text": "\\udc00\\ud800"}\n', "lone surrogate"),
        "surrogate-in-user-turn": ("d.jsonl", rows([chat()] * 40) + '{"messages": [{"role": "user", "content": '
                                   '"\\ud83d"}, {"role": "assistant", "content": "a"}]}\n', "lone surrogate"),
        "surrogate-in-reply": ("d.jsonl", rows([chat()] * 40) + '{"messages": [{"role": "user", "content": "q"}, '
                               '{"role": "assistant", "content": "\\udbff"}]}\n', "lone surrogate"),
        "surrogate-in-prompt": ("d.jsonl", rows([{"prompt": "p", "completion": "c"}] * 40)
                                + '{"prompt": "\\ud800", "completion": "c"}\n', "lone surrogate"),
        "surrogate-in-role": ("d.jsonl", rows([chat()] * 40) + '{"messages": [{"role": "\\ud800", "content": "q"}, '
                              '{"role": "assistant", "content": "a"}]}\n', "is not one of"),
        "text-not-a-string": ("d.jsonl", rows(ok_text) + '{"text": null}\n', "no field 'text'"),
        "one-row": ("d.jsonl", rows(ok_text[:1]), "fewer than one step takes"),
        "two-rows": ("d.jsonl", rows(ok_text[:2]), "fewer than one step takes"),
        "three-rows": ("d.jsonl", rows(ok_text[:3]), "fewer than one step takes"),
        "all-prompts-fill-the-sequence": ("d.jsonl", rows([chat("z" * 400)] * 40), "leave nothing to train on"),
        "all-completions-after-a-long-prompt": ("d.jsonl", rows([{"prompt": "z" * 400, "completion": "c"}] * 40),
                                                "leave nothing to train on"),
        "most-prompts-long-too-few-left": ("d.jsonl", rows([chat("z" * 400)] * 36 + [chat()] * 4),
                                           "fewer than one step takes"),
        "messages-empty-list": ("d.jsonl", rows([chat()] * 40 + [{"messages": []}]), "an empty list"),
        "messages-no-assistant": ("d.jsonl", rows([chat()] * 40 + [{"messages": [{"role": "user", "content": "q"}]}]),
                                  "no assistant message"),
        "content-a-number": ("d.jsonl", rows([chat()] * 40 + [{"messages": [{"role": "user", "content": 5},
                                                                            {"role": "assistant", "content": "a"}]}]),
                             "not a string"),
        "csv-invalid-utf8": ("d.csv", b"text\nok\n\xff\n", "not UTF-8 text"),
        "csv-field-over-the-csv-limit": ("d.csv", "text\n" + "w" * 200_000 + "\n", "not a CSV file the reader takes"),
        "json-document-not-a-list": ("d.json", '[{"text": 1}', "not JSON"),
        "json-document-list-of-numbers": ("d.json", "[1, 2, 3]", "not an object"),
        "json-document-not-utf8": ("d.json", b'[{"text": "\xff"}]', "not UTF-8 text"),
        "parquet-garbage": ("d.parquet", b"PAR1 garbage", "not a readable parquet file"),
        "arrow-garbage": ("d.arrow", b"garbage", "not an Arrow stream file"),
        "unknown-extension": ("d.txt", "text", "must end in"),
    }
    out = [Case(f"data-{name}", lambda s, n=n, d=d: data_file(s, n, d), [expect])
           for name, (n, d, expect) in files.items()]

    def link(target: str) -> Callable[[Sandbox], list]:
        def make(s: Sandbox) -> list:
            p = s.root / "d.jsonl"
            p.symlink_to(target)
            return [s.job(**{"data.path": str(p)})]
        return make

    def fifo(s: Sandbox) -> list:
        os.mkfifo(s.root / "d.jsonl")
        return [s.job(**{"data.path": str(s.root / "d.jsonl")})]

    out += [Case("data-link-to-dev-zero", link("/dev/zero"), ["a character device"]),
            Case("data-link-to-dev-null", link("/dev/null"), ["a character device"]),
            Case("data-broken-link", link("/nonexistent/d.jsonl"), ["is a broken symlink"]),
            Case("data-fifo", fifo, ["a FIFO (named pipe)"]),
            Case("data-plan-reads-too-few-rows", lambda s: data_file(s, "d.jsonl", rows(ok_text[:2])),
                 ["fewer than one step takes"], verb="plan")]
    return out


def flag_cases() -> list[Case]:
    endpoints = {"port-99999": "h:99999", "port-0": "h:0", "port-negative": "h:-1", "port-word": "h:port",
                 "port-empty": "h:", "two-colons": "h:1:2", "ipv6-bare": "::1", "ipv6-unclosed": "[::1:29400",
                 "ipv6-junk-after": "[::1]x29400", "space": "h 1:29400", "shell": "$(reboot):29400",
                 "semicolon": "a;b:29400", "label-too-long": "a" * 64 + ":29400", "name-too-long": "a." * 130 + ":1",
                 "unresolvable": "no-such-node.invalid:29400", "leading-hyphen": "-node:29400", "empty": ""}
    out = [Case(f"flag-rdzv-{name}", lambda s, v=v: [s.job(), "--nodes", "2", f"--rdzv-endpoint={v}"],
                ["--rdzv-endpoint"]) for name, v in endpoints.items()]
    out += [Case(f"flag-node-rank-{v}", lambda s, v=v: [s.job(), "--nodes", "2", "--node-rank", v,
                                                        "--rdzv-endpoint", "127.0.0.1:29400"], ["--node-rank"])
            for v in ("-1", "2", "99", "-100")]

    def script(kind: str) -> Callable[[Sandbox], list]:
        def make(s: Sandbox) -> list:
            p = s.root / "train.py"
            if kind == "fifo":
                os.mkfifo(p)
            elif kind == "dir":
                p.mkdir()
            elif kind == "dev-zero":
                p.symlink_to("/dev/zero")
            return [s.job(), "--script", p]
        return make

    out += [Case(f"flag-script-{k}", script(k), ["--script: "]) for k in ("fifo", "dir", "dev-zero", "missing")]
    return out


@dataclass
class ExportCase:
    """A damaged copy of a trained run's checkpoint, exported with `launch export`."""

    id: str
    engine: str
    damage: Callable[[Path], None]
    argv: tuple[str, ...] = ()
    """More `launch export` arguments."""


def _shard(run: Path, pattern: str) -> Path:
    return next((run / "checkpoint" / "step-00000002").rglob(pattern))


def _cut(pattern: str, keep: float) -> Callable[[Path], None]:
    def damage(run: Path) -> None:
        f = _shard(run, pattern)
        f.write_bytes(f.read_bytes()[: int(f.stat().st_size * keep)])
    return damage


def _write(pattern: str, data: bytes) -> Callable[[Path], None]:
    return lambda run: _shard(run, pattern).write_bytes(data)


def export_cases() -> list[ExportCase]:
    out = []
    for pattern, engine in ((".metadata", "fsdp"), ("*.distcp", "fsdp"), ("*optim_states.pt", "deepspeed"),
                            ("*model_states.pt", "deepspeed"), ("trainer_state.json", "fsdp")):
        name = pattern.strip("*.").replace(".", "-")
        for keep in (0.0, 0.1, 0.5, 0.99):
            out.append(ExportCase(f"ckpt-{name}-cut-to-{int(keep * 100)}pct", engine, _cut(pattern, keep)))
        out.append(ExportCase(f"ckpt-{name}-garbage", engine, _write(pattern, b"\x00garbage\xff" * 32)))
    out.append(ExportCase("ckpt-distcp-missing", "fsdp", lambda r: _shard(r, "*.distcp").unlink()))
    out.append(ExportCase("ckpt-optim-missing", "deepspeed", lambda r: _shard(r, "*optim_states.pt").unlink()))
    out.append(ExportCase("ckpt-model-states-missing", "deepspeed", lambda r: _shard(r, "*model_states.pt").unlink()))
    out.append(ExportCase("ckpt-step-zero", "fsdp", lambda r: None, ("--step", "0")))
    out.append(ExportCase("ckpt-step-not-saved", "fsdp", lambda r: None, ("--step", "7")))
    return out


def table_cases() -> list[Case]:
    """Every generated CLI case (the checkpoint cases aside)."""
    return config_cases() + data_cases() + flag_cases()
