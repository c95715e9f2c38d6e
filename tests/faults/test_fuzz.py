"""Fuzz what a user hands the launcher: any input either works or fails with ConfigError, never another error.

- Job documents start from a valid job (or from nothing) and get random keys (known at every level, unknown,
  non-string) set to random values (huge and negative numbers, NaN, inf, unicode, nested lists and mappings). A Job
  that loads must also survive what `launch` does next with it: job_to_data and yaml.safe_dump (job.yaml).
- A model dir's config.json: random size keys, model types and values (NaN, floats, strings, lists, zero),
  sometimes cut or not an object: the model's statistics (its meta build) or ConfigError.
- Data files: random rows (text, messages, prompt/completion; lone surrogates, wrong types, empty strings), as
  JSON Lines or raw bytes: the launcher's data check gives a summary or ConfigError.
- Checkpoints: a real one-rank checkpoint of each engine cut short or with bytes flipped: `launch export` exits 0
  or 2 with one line, never a traceback.

Deterministic by default (CI); LAUNCHER_FUZZ_EXAMPLES=5000 explores more with fresh randomness.
"""

from __future__ import annotations

import copy
import json
import math
import os
import time

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from launcher.config import bounds
from launcher.config.job import Job
from launcher.config.jobfile import job_from_data, job_to_data
from launcher.config.load import load_yaml
from launcher.errors import ConfigError
from tests.conftest import TINY_GPT2, base_job

EXAMPLES = int(os.environ.get("LAUNCHER_FUZZ_EXAMPLES", "300"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                derandomize="LAUNCHER_FUZZ_EXAMPLES" not in os.environ,
                suppress_health_check=list(HealthCheck))

# Every key the schema knows, at any level, plus near misses and junk.
KNOWN = ["name", "model", "task", "data", "train", "strategy", "cluster", "launcher", "slurm", "sweep", "gpus", "nodes",
         "budget", "auto_fallback", "family", "hidden_size", "num_layers", "num_heads", "num_kv_heads",
         "intermediate_size", "vocab_size", "max_position_embeddings", "tie_word_embeddings", "path", "text_field",
         "label_field", "pair_field", "max_seq_len", "num_labels", "eval_fraction", "global_batch_size", "precision",
         "optimizer", "lr", "weight_decay", "warmup_steps", "max_steps", "epochs", "seed", "log_every_steps",
         "eval_every_steps", "lora", "r", "alpha", "dropout", "target_modules", "checkpoint_every_steps", "engine",
         "zero_stage", "fsdp_reshard_after_forward", "offload_optimizer", "offload_params", "micro_batch_size",
         "activation_checkpointing", "safety_margin", "host_ram_per_node", "nvme_path", "nvme_free", "gpus_per_node",
         "hardware", "partition", "account", "qos", "timeout_min", "cpus_per_task", "mem_gb", "constraint",
         "exclusive", "signal_delay_s", "max_requeues", "array_parallelism", "additional_parameters", "setup", "grid",
         "list"]
JUNK_KEYS = ["trian", "learning_rate", "Budget", "", " ", "ünïcødé", "💥", "a.b", "-", "null"]

SCALARS = st.one_of(
    st.none(), st.booleans(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.sampled_from([0, -1, 1, 2, 8, 2**31, 2**63, -(2**63), 10**30]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([math.nan, math.inf, -math.inf, 1e308, -0.0, 5e-324]),
    st.text(max_size=20),
    st.sampled_from(["16GB", "1e400GB", "-1GB", "nan", "inf", ".nan", "0GB", "16 GiB", "1.5", "∞", "gpt2", "causal_lm",
                     "deepspeed", "fsdp", "cpu", "nvme", "bf16", "/", "~nosuchuser/x", "a\x00b", "../../etc/passwd",
                     "x" * 5000, "llama-1b"]),
)
KEYS = st.one_of(st.sampled_from(KNOWN), st.sampled_from(JUNK_KEYS), st.integers(-3, 3), st.booleans(), st.none(),
                 st.floats(allow_nan=False))
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(KEYS, inner, max_size=5)), max_leaves=25)


def valid_base(data_path: str) -> dict:
    return {"name": "fuzz", "model": copy.deepcopy(TINY_GPT2), "task": "causal_lm",
            "data": {"path": data_path, "max_seq_len": 64},
            "train": {"global_batch_size": 8, "lr": 1e-3, "max_steps": 4}, "gpus": 2, "budget": "1GB"}


@st.composite
def documents(draw, data_path: str):
    if draw(st.integers(0, 9)) == 0:
        return draw(VALUES)  # not even a mapping, sometimes
    doc = valid_base(data_path) if draw(st.booleans()) else {}
    for _ in range(draw(st.integers(1, 6))):
        path = draw(st.lists(st.one_of(st.sampled_from(KNOWN), KEYS), min_size=1, max_size=3))
        node = doc
        for k in path[:-1]:
            if not isinstance(node.get(k), dict):
                node[k] = {}
            node = node[k]
        node[path[-1]] = draw(VALUES)
    return doc


def check_loads_or_config_error(doc, base_dir) -> None:
    try:
        job = job_from_data(doc, base_dir)
    except ConfigError as e:
        assert e.problems and all(isinstance(p, str) and p for p in e.problems)
        # Quoted values are bounded: a huge or aliased value must not become a huge message.
        assert all(len(p) < 20_000 for p in e.problems), max(len(p) for p in e.problems)
        return
    assert isinstance(job, Job)
    yaml.safe_dump(job_to_data(job))  # what `launch` writes to RUN/job.yaml next


def test_random_documents_load_or_fail_with_config_error(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz")
    data = d / "data.jsonl"
    data.write_text('{"text": "a b c"}\n' * 8)

    @FUZZ
    @given(documents(str(data)))
    def run(doc):
        check_loads_or_config_error(doc, d)

    run()


def test_random_yaml_text_loads_or_fails_with_config_error(tmp_path_factory):
    """The text layer too: random YAML (including the safe_dump of random data, cut short) through load_yaml."""
    d = tmp_path_factory.mktemp("fuzz-text")
    data = d / "data.jsonl"
    data.write_text('{"text": "a b c"}\n' * 8)
    p = d / "job.yaml"

    @FUZZ
    @given(documents(str(data)), st.integers(0, 400), st.text(max_size=40))
    def run(doc, cut, noise):
        text = yaml.safe_dump(doc, allow_unicode=True)
        text = text[:cut] + noise + text[cut:] if noise else text
        p.write_text(text)
        try:
            loaded = load_yaml(p)
        except ConfigError:
            return
        check_loads_or_config_error(loaded, d)

    run()


def test_yaml_alias_bomb_is_refused_quickly(tmp_path, data_file):
    """A "billion laughs" in a free-form field: refused with ConfigError in well under a second, not expanded."""
    levels = "".join(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]\n" for i in range(1, 10))
    text = "l0: &l0 [lol]\n" + levels + yaml.safe_dump(valid_base(str(data_file)), sort_keys=False) + \
        "sweep:\n  grid:\n    train.lr: *l9\n"
    p = tmp_path / "bomb.yaml"
    p.write_text(text)
    t = time.monotonic()
    try:
        job_from_data({k: v for k, v in load_yaml(p).items() if not k.startswith("l")}, tmp_path)
        raise AssertionError("an alias bomb loaded")
    except ConfigError as e:
        assert "expands to over" in str(e) and "sweep.grid.train.lr" in str(e)
    assert time.monotonic() - t < 5


def test_self_referencing_alias_is_refused(tmp_path, data_file):
    text = yaml.safe_dump(valid_base(str(data_file)), sort_keys=False) + \
        "slurm:\n  additional_parameters: &a {loop: *a}\n"
    p = tmp_path / "loop.yaml"
    p.write_text(text)
    try:
        job_from_data(load_yaml(p), tmp_path)
        raise AssertionError("a self-referencing value loaded")
    except ConfigError as e:
        assert "slurm.additional_parameters.loop" in str(e) and "refers to itself" in str(e)


def test_regressions_found_by_the_fuzzer(tmp_path, data_file):
    """Each of these raised something other than ConfigError (or loaded nonsense) before the fix."""
    cases = {
        "budget": math.inf,                     # OverflowError in int(inf)
        "cluster.host_ram_per_node": "1e400GB",  # OverflowError through parse_bytes
        "train.lr": math.nan,                   # loaded: NaN passes "> 0" checks
        "slurm.mem_gb": math.nan,               # loaded
        "strategy.zero_stage": 1.0,             # loaded as a float stage
        "gpus": 2**70,                          # loaded; overflows int64 later
        "model.hidden_size": 0,                 # ZeroDivisionError in the planner
        "model.num_heads": 3,                   # transformers ValueError at plan time (64 % 3)
        "data.path": "~nosuchuser/x.jsonl",     # RuntimeError from expanduser
        "data.num_labels": -1,                  # loaded
        "model": "",                            # planned the job's own directory as a model
    }
    for dotted, value in cases.items():
        doc = valid_base(str(data_file))
        node = doc
        keys = dotted.split(".")
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = value
        try:
            job_from_data(doc, tmp_path)
        except ConfigError as e:
            assert dotted.split(".")[0] in str(e), (dotted, str(e))
            continue
        raise AssertionError(f"{dotted}={value!r} loaded")
    # One component past NAME_MAX (255), the whole path within the 4096 characters any string may hold.
    long_path = valid_base(str(tmp_path / ("x" * 300 + ".jsonl")))
    try:
        job_from_data(long_path, tmp_path)  # OSError: File name too long
    except ConfigError as e:
        assert "data.path" in str(e) and "File name too long" in str(e)


# -- a model dir's config.json -------------------------------------------------------------------------------------
CONFIG_KEYS = sorted({k for keys in bounds.CONFIG_KEYS.values() for k in keys}
                     | {"model_type", "head_dim", "tie_word_embeddings", "text_config", "rope_theta",
                                        "layer_norm_epsilon", "rope_scaling", "architectures", "junk"})
CONFIG_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 96), st.sampled_from([0, -1, 2**40, 10**9, 2**63]),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8),
    st.sampled_from(["gpt2", "llama", "bert", "t5", "mixtral", "notamodel", "", "GPT2"]),
    st.lists(st.integers(0, 64), max_size=3),
    st.dictionaries(st.sampled_from(["type", "factor", "rope_type"]), st.one_of(st.integers(), st.text(max_size=4)),
                    max_size=2))
BASES = [{"model_type": "gpt2", "n_embd": 32, "n_layer": 1, "n_head": 2, "vocab_size": 64, "n_positions": 64},
         {"model_type": "llama", "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
          "num_key_value_heads": 1, "intermediate_size": 64, "vocab_size": 64, "max_position_embeddings": 64}]


@st.composite
def config_texts(draw) -> str:
    if draw(st.integers(0, 9)) == 0:
        return json.dumps(draw(VALUES), allow_nan=True)  # not even an object, sometimes
    doc = dict(draw(st.sampled_from(BASES))) if draw(st.integers(0, 5)) else {}
    for _ in range(draw(st.integers(1, 4))):
        doc[draw(st.sampled_from(CONFIG_KEYS))] = draw(CONFIG_VALUES)
    text = json.dumps(doc, allow_nan=True)
    if draw(st.integers(0, 7)) == 0:
        text = text[: draw(st.integers(0, len(text)))]  # cut short
    return text


def test_random_model_configs_build_or_fail_with_config_error(tmp_path_factory, monkeypatch):
    """Before: a float, string or NaN size, an unknown model_type, a list, vocab 0 or heads not dividing the hidden
    size each ended in a transformers traceback (exit 1)."""
    from launcher.inputs.plan_inputs import model_stats

    d = tmp_path_factory.mktemp("fuzz-config")
    monkeypatch.setenv("LAUNCHER_CACHE", str(d / "cache"))
    model = d / "model"
    model.mkdir()

    @settings(max_examples=min(EXAMPLES, 120), deadline=None, database=None, suppress_health_check=list(HealthCheck),
              derandomize="LAUNCHER_FUZZ_EXAMPLES" not in os.environ)
    @given(config_texts())
    def run(text):
        (model / "config.json").write_text(text)
        job = job_from_data(base_job(str(d / "d.jsonl"), model=str(model)), d, for_run=False)
        try:
            stats = model_stats(job)
        except ConfigError as e:
            assert e.problems and all(p and len(p) < 20_000 for p in e.problems)
            return
        assert stats.num_params > 0

    run()


# -- data files ------------------------------------------------------------------------------------------------------
TEXTS = st.one_of(st.text(max_size=30), st.sampled_from(["", " ", "\ud800", "a\udfffb", "\x00", "é" * 40, "x" * 500]))
MESSAGES = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system", "tool", "bot", 3]),
                                           "content": st.one_of(TEXTS, st.integers(), st.none())}), max_size=4)
FIELD_VALUES = st.one_of(TEXTS, MESSAGES, st.integers(), st.none(), st.booleans(), st.floats(allow_nan=True),
                         st.lists(TEXTS, max_size=2))
ROWS = st.lists(st.dictionaries(st.sampled_from(["text", "messages", "prompt", "completion", "label", "junk"]),
                                FIELD_VALUES, max_size=3), min_size=0, max_size=24)


@st.composite
def data_files(draw) -> bytes:
    rows = draw(ROWS)
    if draw(st.integers(0, 5)) == 0:  # a uniform dataset, sometimes, so the later checks are reached too
        rows = [{"messages": [{"role": "user", "content": draw(TEXTS)}, {"role": "assistant", "content": draw(TEXTS)}]}
                for _ in range(draw(st.integers(1, 40)))]
    elif draw(st.integers(0, 4)) == 0:
        rows = [{"text": draw(st.text(max_size=40))} for _ in range(draw(st.integers(1, 40)))]
    text = "".join(json.dumps(r) + "\n" for r in rows).encode()
    if draw(st.integers(0, 7)) == 0:
        text += draw(st.binary(max_size=20)) + b"\n"  # bytes that may be no JSON, no UTF-8
    return text


def test_random_data_files_are_counted_or_fail_with_config_error(tmp_path_factory):
    """Before: a lone surrogate, an over-long prompt or too few rows for the ranks ended on a rank (exit 1)."""
    from launcher.session.datacheck import check_job_data

    d = tmp_path_factory.mktemp("fuzz-data")
    data = d / "d.jsonl"

    @settings(max_examples=min(EXAMPLES, 200), deadline=None, database=None, suppress_health_check=list(HealthCheck),
              derandomize="LAUNCHER_FUZZ_EXAMPLES" not in os.environ)
    @given(data_files(), st.sampled_from(["auto", "text", "messages", "prompt_completion"]), st.booleans())
    def run(raw, fmt, packing):
        data.write_bytes(raw)
        job = job_from_data(base_job(str(data), **{"data.format": fmt, "data.packing": packing, "gpus": 1,
                                                   "data.max_seq_len": 32, "train.global_batch_size": 2}),
                            d, for_run=False)
        try:
            s = check_job_data(job, 1024)
        except ConfigError as e:
            assert e.problems and all(p and len(p) < 20_000 for p in e.problems)
            return
        assert s.train_examples > 0 and s.sequences > 0

    run()


# -- checkpoints -----------------------------------------------------------------------------------------------------
@st.composite
def damages(draw):
    """(file pattern, how): a cut at a random point of any file, or random bytes written over a shard's tensor
    data or the trainer state (never into a pickle: unpickling chosen bytes could run code)."""
    target = draw(st.sampled_from(["*.distcp", ".metadata", "trainer_state.json", "*optim_states.pt",
                                   "*model_states.pt"]))
    if target in ("*.distcp", "trainer_state.json") and draw(st.booleans()):
        return target, ("flip", draw(st.floats(0, 1)), draw(st.binary(min_size=1, max_size=64)))
    return target, ("cut", draw(st.floats(0, 1)), b"")


def test_damaged_checkpoints_export_or_are_refused_in_one_line(trained_runs, tmp_path_factory):
    import contextlib
    import io
    import shutil

    from launcher.cli.main import main

    d = tmp_path_factory.mktemp("fuzz-ckpt")

    @settings(max_examples=min(EXAMPLES, 24), deadline=None, database=None, suppress_health_check=list(HealthCheck),
              derandomize="LAUNCHER_FUZZ_EXAMPLES" not in os.environ)
    @given(damages())
    def run(damage):
        target, (how, at, data) = damage
        engine = "deepspeed" if target.endswith(".pt") else "fsdp"
        run_dir = d / "run"
        shutil.rmtree(run_dir, ignore_errors=True)
        shutil.copytree(trained_runs[engine], run_dir)
        f = next((run_dir / "checkpoint" / "step-00000002").rglob(target))
        raw = f.read_bytes()
        cut = int(len(raw) * at)
        f.write_bytes(raw[:cut] if how == "cut" else raw[:cut] + data + raw[cut + len(data):])
        err, out = io.StringIO(), io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            code = main(["export", str(run_dir)])
        text = err.getvalue()
        assert code in (0, 2) and "Traceback" not in text, text
        if code == 2:
            lines = [ln for ln in text.splitlines() if ln.strip()]
            assert len(lines) == 1 and lines[0].startswith("launch: error: checkpoint step-00000002"), text

    run()
