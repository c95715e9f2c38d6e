"""Fuzz the job schema: any YAML document either loads into a Job or fails with ConfigError, never another error.

Documents start from a valid job (or from nothing) and get random keys (known at every level, unknown, non-string)
set to random values (huge and negative numbers, NaN, inf, unicode, nested lists and mappings). A Job that loads
must also survive what `launch` does next with it: job_to_data and yaml.safe_dump (job.yaml in the run dir).

Deterministic by default (CI); LAUNCHER_FUZZ_EXAMPLES=5000 explores more with fresh randomness.
"""

from __future__ import annotations

import copy
import math
import os
import time

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from launcher.config.job import Job
from launcher.config.jobfile import job_from_data, job_to_data
from launcher.config.load import load_yaml
from launcher.errors import ConfigError
from tests.conftest import TINY_GPT2

EXAMPLES = int(os.environ.get("LAUNCHER_FUZZ_EXAMPLES", "300"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize="LAUNCHER_FUZZ_EXAMPLES" not in os.environ,
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
