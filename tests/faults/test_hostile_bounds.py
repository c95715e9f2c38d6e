"""Absurd sizes through the real CLI: exit 2, one error block, no traceback, nothing written, and cheaply.

Each size a job, an override or a model's config.json can carry is bounded (launcher.config.bounds) before anything
is built, probed or allocated. The table runs in-process through the shared harness; the worst cases also run in a
subprocess of the `launch` binary under RLIMIT_AS and a timeout, which asserts the cost of a refusal: under 10 s of
wall time and under 1 GB of memory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from launcher.config import bounds
from launcher.units import GB, MB
from tests.conftest import REPO, TINY_GPT2, base_job
from tests.faults.harness import Case, Sandbox, check_refused, entries, one_error_block

LAUNCH = str(REPO / ".venv" / "bin" / "launch")


def _big_job(s: Sandbox, name: str, field: str, size: int) -> Path:
    """A job file whose ``field`` holds ``size`` characters (written straight, not through YAML's dumper)."""
    text = s.job(name).read_text()
    key = field.rsplit(".", 1)[-1]
    if field == "name":
        text = text.replace("name: t\n", f"name: {'x' * size}\n", 1)
    else:
        text += f"{field.split('.')[0]}:\n  {key}: {'p' * size}\n"
    return s.raw(text, name)


def _huge_file(s: Sandbox) -> Path:
    """A 100 MB job file: a valid job, then a comment long enough (sparse: no 100 MB is written to disk)."""
    p = s.job("huge")
    with p.open("r+b") as f:
        f.seek(0, os.SEEK_END)
        f.write(b"# ")
        f.truncate(100 * MB)
    return p


def _targets(s: Sandbox, n: int, name: str) -> Path:
    """A job whose LoRA names ``n`` target modules, written as one flow list."""
    targets = ", ".join(["c_attn"] * n)
    text = s.job(name).read_text().replace("train:\n", f"train:\n  lora: {{r: 4, target_modules: [{targets}]}}\n", 1)
    return s.raw(text, name)


def _model_dir(s: Sandbox, name: str = "model", *, weights: bytes | None = None, pad: int = 0, **config) -> Path:
    """A GPT-2 model dir (config.json written by hand: no transformers needed) with ``config`` over the tiny one."""
    d = s.root / name
    d.mkdir()
    cfg = {"model_type": "gpt2", "n_embd": TINY_GPT2["hidden_size"], "n_layer": TINY_GPT2["num_layers"],
           "n_head": TINY_GPT2["num_heads"], "vocab_size": TINY_GPT2["vocab_size"],
           "n_positions": TINY_GPT2["max_position_embeddings"], **config}
    if pad:
        cfg["padding"] = "x" * pad
    (d / "config.json").write_text(json.dumps(cfg))
    if weights is not None:
        (d / "model.safetensors").write_bytes(weights)
    return d


def _sweep(s: Sandbox, axes: int, values: int) -> Path:
    grid = {f"train.{k}": list(range(values)) for k in ("seed", "warmup_steps", "log_every_steps", "lr")[:axes]}
    return s.job("sweep", sweep={"grid": grid})


CASES = [
    # -- the sequence, the batch ----------------------------------------------------------------------------------
    Case("seq-len-flag-billion", lambda s: [s.job(model="gpt2-124m"), "--seq-len", "1000000000"],
         ["data.max_seq_len: 1000000000 tokens is over the 4194304 launcher plans for", "--seq-len 4096"],
         verb="plan"),
    Case("seq-past-bundled-position-table", lambda s: [s.job(model="gpt2-124m"), "--seq-len", "4000000"],
         ["data.max_seq_len: 4000000 tokens is past this gpt2 model's position table (n_positions = 1024)",
          "use --seq-len 1024 or less"], verb="plan"),
    Case("global-batch-10e12", lambda s: [s.job(), "--global-batch", str(10**12)],
         ["train.global_batch_size: 1000000000000 sequences is over the 1048576", "global_batch_size: 512"]),
    Case("micro-batch-10e9", lambda s: [s.job(**{"strategy.micro_batch_size": 10**9})],
         ["strategy.micro_batch_size: 1000000000 sequences is over the 1048576"]),
    Case("gpus-a-million", lambda s: [s.job(**{"train.global_batch_size": 10**6}), "--gpus", "1000000"],
         ["gpus: 1000000 ranks per node is over the 1024", "--gpus 8"], verb="plan"),
    Case("nodes-a-million", lambda s: [s.job(), "--nodes", "1000000"],
         ["nodes: 1000000 nodes is over the 65536", "--nodes 16"], verb="plan"),
    # -- an inline architecture -------------------------------------------------------------------------------
    Case("vocab-10e9", lambda s: [s.job(**{"model.vocab_size": 10**9})],
         ["model.vocab_size: 1000000000 tokens is over the 1048576", "e.g. 32000"]),
    Case("hidden-10e6", lambda s: [s.job(**{"model.hidden_size": 10**6})],
         ["model.hidden_size: 1000000 features is over the 65536", "e.g. 4096"]),
    Case("layers-10e5", lambda s: [s.job(**{"model.num_layers": 10**5})],
         ["model.num_layers: 100000 layers is over the 512", "e.g. 32"]),
    Case("hidden-and-layers-together", lambda s: [s.job(**{"model.hidden_size": 10**6, "model.num_layers": 10**5})],
         ["model.hidden_size: 1000000 features is over the 65536", "model.num_layers: 100000 layers is over"]),
    Case("heads-4096", lambda s: [s.job(**{"model.hidden_size": 65536, "model.num_heads": 4096})],
         ["model.num_heads: 4096 heads is over the 1024"]),
    Case("intermediate-10e9", lambda s: [s.job(**{"model.intermediate_size": 10**9})],
         ["model.intermediate_size: 1000000000 features is over the 262144"]),
    Case("position-table-10e10", lambda s: [s.job(**{"model.max_position_embeddings": 10**10})],
         ["model.max_position_embeddings: 10000000000 tokens is over the 67108864"]),
    Case("lora-rank-10e9", lambda s: [s.job(**{"train.lora": {"r": 10**9, "target_modules": ["c_attn"]}})],
         ["train.lora.r: 1000000000 features is over the 65536", "r: 16"]),
    Case("num-labels-10e9", lambda s: [s.job(task="seq_cls", **{"data.num_labels": 10**9})],
         ["data.num_labels: 1000000000 classes is over the 1048576"], verb="plan"),
    # -- a model dir's config.json ---------------------------------------------------------------------------
    Case("config-json-hidden-and-layers", lambda s: [s.job(model=str(_model_dir(s, n_embd=10**6, n_layer=10**5)))],
         ["model: config.json's n_embd: 1000000 features is over the 65536",
          "model: config.json's n_layer: 100000 layers is over the 512", "the model's own?"], verb="plan"),
    Case("config-json-experts-10e6",
         lambda s: [s.job(model=str(_model_dir(s, model_type="mixtral", num_local_experts=10**6,
                                               num_experts_per_tok=2)))],
         ["model: config.json's num_local_experts: 1000000 experts is over the 2048"], verb="plan"),
    Case("config-json-vocab-10e9", lambda s: [s.job(model=str(_model_dir(s, vocab_size=10**9)))],
         ["model: config.json's vocab_size: 1000000000 tokens is over the 1048576"], verb="plan"),
    Case("config-json-2mb", lambda s: [s.job(model=str(_model_dir(s, pad=2 * 10**6)))],
         ["config.json' is 2.00 MB, over the 1.00 MB a model's config.json may be"], verb="plan"),
    Case("safetensors-header-2e62",
         lambda s: [s.job(model=str(_model_dir(s, weights=(2**62).to_bytes(8, "little") + b"{}")))],
         ["model.safetensors' says its safetensors header is 4611686018427387904 bytes",
          "fetch the model again"], verb="plan"),
    # -- strings, lists, the file ----------------------------------------------------------------------------
    Case("name-50mb", lambda s: [_big_job(s, "name50", "name", 50 * 10**6)],
         ["name50.yaml: the job file is 50.00 MB, over the 256.00 KB a job file may be",
          "keep data in data.path"]),
    Case("partition-10mb-string", lambda s: [_big_job(s, "part10", "slurm.partition", 10 * 10**6)],
         ["part10.yaml: the job file is 10.00 MB, over the 256.00 KB"]),
    Case("job-file-100mb", lambda s: [_huge_file(s)],
         ["huge.yaml: the job file is 100.00 MB, over the 256.00 KB a job file may be"]),
    Case("lora-targets-a-million", lambda s: [_targets(s, 10**6, "targets")],
         ["targets.yaml: the job file is 8.00 MB, over the 256.00 KB"]),
    Case("lora-targets-2000", lambda s: [_targets(s, 2000, "targets")],
         ["train.lora.target_modules: ['c_attn', 'c_attn',", "has 2000 items, over the 1024 a job's lists may hold",
          "at most 1024 items"]),
    Case("name-300-characters", lambda s: [_big_job(s, "long-name", "name", 300)],
         ["name: 'xxxx", "is 300 characters, over the 128 a job name may hold", "give a shorter name"]),
    Case("data-path-5000-characters", lambda s: [s.job(**{"data.path": "/d" * 2500})],
         ["data.path: '/d/d/d", "is 5000 characters, over the 4096 a job's strings may hold", "shorten data.path"]),
    Case("setup-line-5000-characters", lambda s: [s.job(slurm={"setup": ["echo " + "y" * 5000]})],
         ["slurm.setup[0]: 'echo yyy", "is 5005 characters, over the 4096"]),
    Case("additional-parameters-2000-keys",
         lambda s: [s.job(slurm={"additional_parameters": {f"k{i}": 1 for i in range(2000)}})],
         ["slurm.additional_parameters: ", "has 2000 keys, over the 1024 a job's mappings may hold"], verb="plan"),
    Case("additional-parameter-value-10k", lambda s: [s.job(slurm={"additional_parameters": {"comment": "z" * 10**4}})],
         ["slurm.additional_parameters.comment: 'zzz", "is 10000 characters, over the 4096", "shorten"],
         verb="plan"),
    Case("nested-string-5000", lambda s: [s.job(slurm={"additional_parameters": {"comment": ["q" * 5000]}})],
         ["slurm.additional_parameters.comment: ['qqq", "holds a string of 5000 characters, over the 4096",
          "shorten the string in slurm.additional_parameters.comment"], verb="plan"),
    Case("override-value-10mb", lambda s: [s.job(), "name=" + "x" * 10**7],
         ["name: the value given on the command line is 10000000 characters, over the 16384",
          "set long values in the job file"]),
    Case("integer-of-5000-digits", lambda s: [s.raw(s.job().read_text().replace("max_steps: 4",
                                                                                      "max_steps: " + "9" * 5000))],
         ["raw.yaml: a value in the job file cannot be read (a whole number of over 4300 digits); fix that value"]),
    Case("sweep-10-to-the-8-variants", lambda s: [_sweep(s, 4, 100), "--slurm"],
         ["sweep: 100000000 variants, over the 1000 one sweep may hold", "split the sweep"]),
]


def test_the_table_is_big_enough():
    assert len(CASES) >= 15 and len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_an_absurd_size_exits_2_with_one_clear_message(case: Case, sandbox: Sandbox):
    check_refused(case, sandbox)


# The worst of the table, through the `launch` binary, under an address-space limit: a refusal must cost under
# 10 s and 1 GB. RLIMIT_AS caps the whole address space (more than the resident set), so a case that tried to
# allocate past it fails with a MemoryError traceback instead of being refused.
COSTLY = ["seq-len-flag-billion", "global-batch-10e12", "hidden-and-layers-together", "vocab-10e9",
          "config-json-hidden-and-layers", "name-50mb", "job-file-100mb", "lora-targets-a-million",
          "sweep-10-to-the-8-variants", "integer-of-5000-digits"]
ADDRESS_SPACE = 1 * 1024**3
SECONDS = 10.0
TIMEOUT = 60.0
"""Past it the child is killed: a case that only ends minutes later fails on SECONDS without holding the suite."""


def _limited():
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_AS and wait4's peak RSS are Linux's")
@pytest.mark.parametrize("case", [c for c in CASES if c.id in COSTLY], ids=COSTLY)
def test_a_refusal_costs_under_10_s_and_1_gb(case: Case, sandbox: Sandbox, tmp_path):
    argv = [str(a) for a in case.argv(sandbox)]
    if case.verb == "run":
        argv += ["--run-dir", str(sandbox.run_dir), "--quiet"]
    before = entries(sandbox.root)
    env = {**os.environ, "HOME": str(tmp_path / "home"), "TMPDIR": str(tmp_path)}
    out, err = tmp_path / "out", tmp_path / "err"
    with out.open("wb") as o, err.open("wb") as e:
        start = time.monotonic()
        proc = subprocess.Popen([LAUNCH, case.verb, *argv], stdout=o, stderr=e, cwd=sandbox.root, env=env,
                                preexec_fn=_limited)
        # wait4 gives this child's own peak RSS; polled, so that a case past the timeout is killed, not waited for.
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid or time.monotonic() - start > TIMEOUT:
                break
            time.sleep(0.02)
        if not pid:
            proc.kill()
            os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status) if pid else -9
        wall = time.monotonic() - start
    stderr = err.read_text()
    assert pid, f"{case.id}: still running after {TIMEOUT:.0f} s; stderr:\n{stderr[-2000:]}"
    assert proc.returncode == 2, stderr[-4000:]
    assert "Traceback" not in stderr and "MemoryError" not in stderr, stderr
    one_error_block(stderr)
    for part in case.expect:
        assert part in stderr, f"{part!r} not in:\n{stderr}"
    assert out.read_text() == ""
    assert wall < SECONDS, f"{case.id}: refused after {wall:.1f} s"
    assert usage.ru_maxrss * 1024 < 1 * GB, f"{case.id}: peak RSS {usage.ru_maxrss / 1024:.0f} MB"
    assert entries(sandbox.root) == before


def test_bounds_are_generous_for_real_models():
    """A 405B-class config, a 256k vocabulary, a 1M-token context and 512 experts are all within the bounds."""
    llama_405b = json.loads((REPO / "launcher" / "model" / "configs" / "llama-405b.json").read_text())
    assert bounds.config_problems(llama_405b) == []
    real = {"hidden_size": 16384, "num_hidden_layers": 126, "num_attention_heads": 128, "intermediate_size": 53248,
            "vocab_size": 256000, "max_position_embeddings": 10485760, "num_experts": 512}
    assert bounds.config_problems(real) == []
    assert 2**20 <= bounds.SEQ_LEN <= bounds.POSITIONS
    assert bounds.over("x", bounds.SEQ_LEN, bounds.SEQ_LEN, "tokens", "", "") is None


def test_a_text_config_is_checked_too():
    """A multimodal config keeps its language model's sizes under text_config."""
    problems = bounds.config_problems({"model_type": "llava", "text_config": {"num_hidden_layers": 10**5}})
    assert problems == [p for p in problems if "num_hidden_layers: 100000 layers is over the 512" in p] != []


def test_no_probe_for_a_sequence_past_the_position_table(sandbox: Sandbox, monkeypatch):
    """The model's own position table is checked after the meta build and before the activation probe, which
    feeds seq_len real token ids through the model (--seq-len 10^9 took 20 GB before the check)."""
    import launcher.model.activations as activations
    from launcher.config.jobfile import load_job
    from launcher.errors import ConfigError
    from launcher.inputs.plan_inputs import plan_request

    def no_probe(*a, **k):
        raise AssertionError("the activation probe ran for a sequence the model cannot take")

    monkeypatch.setattr(activations, "probe_activations", no_probe)
    job = load_job(sandbox.job(model="gpt2-124m", **{"data.max_seq_len": 2048}), for_run=False)
    with pytest.raises(ConfigError, match=r"2048 tokens is past this gpt2 model's position table"):
        plan_request(job)


def test_the_file_bound_reads_no_more_than_it_allows(tmp_path):
    """/proc files report size 0 and a file may grow: the loader reads one byte past the bound, never the file."""
    from launcher.config.load import load_yaml
    from launcher.errors import ConfigError

    p = tmp_path / "grown.yaml"
    p.write_text("name: x\n" + "#" * bounds.JOB_FILE_BYTES)
    with pytest.raises(ConfigError, match="over the 256.00 KB a job file may be"):
        load_yaml(p)
    p.write_text("name: x\n" + "#" * (bounds.JOB_FILE_BYTES - 20))
    assert load_yaml(p) == {"name": "x"}


def test_override_keeps_its_message_short(sandbox: Sandbox, capsys):
    """A bad override value is quoted bounded, not in full."""
    from launcher.cli.main import main

    code = main(["plan", str(sandbox.job()), "train.max_steps=" + "9" * 5000])
    err = capsys.readouterr().err
    assert code == 2 and "a whole number of over 4300 digits" in err and len(err) < 600, err
    one_error_block(err)


def test_base_job_is_within_every_bound(sandbox: Sandbox):
    """The table's base job plans: the bounds refuse the absurd part of each case, not the job around it."""
    from launcher.config.jobfile import load_job

    assert load_job(sandbox.job()).name == "t"
    assert yaml.safe_load(sandbox.job().read_text()) == base_job(str(sandbox.data))
