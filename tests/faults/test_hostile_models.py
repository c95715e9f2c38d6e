"""A model dir whose config.json is not a model (issue 35 §3): each is bad input like any job problem, one block
naming the file, the key, the value, the rule and the fix, exit 2, before transformers builds anything; and
`plan --json` answers it with the bad_input object on stdout, as it answers every other refusal."""

from __future__ import annotations

import contextlib
import io
import json
import os

import pytest

from launcher.cli.main import main
from tests.faults.harness import Case, Sandbox, check_refused

GOOD = {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 1024, "n_positions": 256}
FIX = "fix config.json (is it the model's own?)"


def model_dir(s: Sandbox, text: str | None = None, name: str = "model", **over) -> str:
    """A model dir holding only config.json: ``text`` as written, else GOOD with ``over`` (None drops a key)."""
    d = s.root / name
    d.mkdir(exist_ok=True)
    cfg = {k: v for k, v in {**GOOD, **over}.items() if v is not None}
    (d / "config.json").write_text(text if text is not None else json.dumps(cfg))
    return str(d)


def fifo_config(s: Sandbox) -> str:
    d = s.root / "model"
    d.mkdir()
    os.mkfifo(d / "config.json")
    return str(d)


def plan(make) -> callable:
    return lambda s: [s.job(model=make(s))]


CASES = [
    Case("config-json-invalid-json", plan(lambda s: model_dir(s, "{not json")),
         ["config.json' is not JSON (line 1, column 2", FIX], verb="plan"),
    Case("config-json-empty", plan(lambda s: model_dir(s, "")),
         ["config.json' is empty", "a config.json is a JSON object with model_type"], verb="plan"),
    Case("config-json-float-size", plan(lambda s: model_dir(s, n_embd=64.5)),
         ["n_embd is 64.5 (a float), not a whole number", FIX], verb="plan"),
    Case("config-json-string-size", plan(lambda s: model_dir(s, n_layer="2")),
         ["n_layer is \"2\" (a str), not a whole number", FIX], verb="plan"),
    Case("config-json-nan-size", plan(lambda s: model_dir(s, json.dumps(GOOD).replace('"n_head": 4', '"n_head": NaN'))),
         ["n_head is NaN, not a number a size can be", FIX], verb="plan"),
    Case("config-json-nan-elsewhere",
         plan(lambda s: model_dir(s, json.dumps(GOOD | {"layer_norm_epsilon": 1}).replace(
             '"layer_norm_epsilon": 1', '"layer_norm_epsilon": Infinity'))),
         ["layer_norm_epsilon is NaN or infinite, which no setting means", FIX], verb="plan"),
    Case("config-json-unknown-model-type", plan(lambda s: model_dir(s, model_type="notamodel")),
         ["model_type 'notamodel' is no architecture transformers", "fix model_type, or upgrade transformers"],
         verb="plan"),
    Case("config-json-model-type-typo", plan(lambda s: model_dir(s, model_type="lama")),
         ["model_type 'lama' is no architecture transformers", "did you mean 'llama'?"], verb="plan"),
    Case("config-json-no-model-type", plan(lambda s: model_dir(s, model_type=None)),
         ["has no model_type, so transformers cannot tell the architecture", "\"model_type\": \"llama\""],
         verb="plan"),
    Case("config-json-a-list", plan(lambda s: model_dir(s, "[1, 2, 3]")),
         ["config.json' holds a JSON list, not an object of settings", FIX], verb="plan"),
    Case("config-json-vocab-zero", plan(lambda s: model_dir(s, vocab_size=0)),
         ["vocab_size is 0; it must be at least 1", FIX], verb="plan"),
    Case("config-json-negative-layers", plan(lambda s: model_dir(s, n_layer=-2)),
         ["n_layer is -2; it must be at least 1"], verb="plan"),
    Case("config-json-heads-do-not-divide-hidden", plan(lambda s: model_dir(s, n_head=5)),
         ["the hidden size 64 is not divisible by the 5 attention heads (and no head_dim is given)", FIX],
         verb="plan"),
    Case("config-json-kv-heads-do-not-divide-heads",
         plan(lambda s: model_dir(s, json.dumps({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
                                                 "num_attention_heads": 4, "num_key_value_heads": 3,
                                                 "intermediate_size": 128, "vocab_size": 1024,
                                                 "max_position_embeddings": 256}))),
         ["the 4 attention heads are not a multiple of the 3 key/value heads"], verb="plan"),
    Case("config-json-bool-size", plan(lambda s: model_dir(s, n_embd=True)),
         ["n_embd is true (a bool), not a whole number"], verb="plan"),
    Case("config-json-not-utf8", plan(lambda s: model_dir(s, "")),
         ["config.json' is not UTF-8 text"], verb="plan",
         setup=lambda s: (s.root / "model").mkdir() or (s.root / "model" / "config.json").write_bytes(b"\xff\xfe{}")),
    Case("config-json-a-fifo", plan(lambda s: fifo_config(s)),
         ["config.json' is a FIFO (named pipe), not a file"], verb="plan"),
    Case("config-json-a-directory", plan(lambda s: str((s.root / "model").mkdir() or (s.root / "model" / "config.json")
                                                       .mkdir() or s.root / "model")),
         ["config.json' is a directory, not a file"], verb="plan"),
]


def _fix_not_utf8() -> None:
    # The not-UTF-8 case writes its bytes in setup; its argv must not write config.json again.
    case = next(c for c in CASES if c.id == "config-json-not-utf8")
    case.argv = lambda s: [s.job(model=str(s.root / "model"))]


_fix_not_utf8()


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_a_config_json_that_is_not_a_model_is_refused(case, sandbox):
    check_refused(case, sandbox)


@pytest.mark.parametrize("case", [c for c in CASES if c.id in ("config-json-float-size", "config-json-vocab-zero",
                                                                "config-json-heads-do-not-divide-hidden")],
                         ids=lambda c: c.id)
def test_plan_json_answers_a_bad_config_with_the_bad_input_object(case, sandbox):
    """`plan --json` prints the same errors as one JSON object on stdout (it printed nothing before)."""
    argv = [str(a) for a in case.argv(sandbox)]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["plan", *argv, "--json"])
    assert code == 2, err.getvalue()
    answer = json.loads(out.getvalue())
    assert answer["status"] == "bad_input" and any(case.expect[0] in e for e in answer["errors"]), answer
    assert "Traceback" not in err.getvalue() and case.expect[0] in err.getvalue()


def test_a_config_transformers_cannot_build_is_one_line_too(sandbox, monkeypatch):
    """Whatever else the model code asserts on a config (here: a ValueError from the meta build) is one line
    naming the config, not a traceback."""
    from transformers import AutoModelForCausalLM

    def refuse(*_a, **_k):
        raise ValueError("`rope_theta` must be positive\nsecond line")

    # A config of its own (an epsilon no other case uses): the shared introspection cache cannot answer for it.
    job = sandbox.job(model=model_dir(sandbox, layer_norm_epsilon=1.2345e-5))
    monkeypatch.setattr(AutoModelForCausalLM, "from_config", refuse)
    check_refused(Case("meta-build-refuses", lambda s: [job],
                       ["model: transformers cannot build a gpt2 model from", "`rope_theta` must be positive",
                        "fix the config"], verb="plan"), sandbox)
