"""Launches that several test modules assert on, each run once per session (conftest imports the fixtures): a
launch costs its start-up, ~15 s of CPU on 2 cores (docs/testing.md), whatever it checks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from launcher.processes.rankenv import HEAP_ENV

CURVE_TRAIN = {"global_batch_size": 8, "precision": "fp32", "lr": 3e-3, "max_steps": 6, "seed": 7,
               "weight_decay": 0.01, "warmup_steps": 2, "max_grad_norm": 0.05}
"""The step contract's seeded job (tests/worker/test_step_contract.py): max_grad_norm far below the tiny GPT-2's
gradient norm (about 1 to 5 at these steps), so every step clips."""
CURVE_PINS = {"micro_batch_size": 2, "activation_checkpointing": False, "offload_optimizer": "none",
              "offload_params": "none"}
"""2 micro-batches of 2 per rank: accumulation is part of the math."""
CURVE_ENGINES = {"zero2": {"engine": "deepspeed", "zero_stage": 2, "loss_chunks": 0},
                 "fsdp2": {"engine": "fsdp", "fsdp_reshard_after_forward": True, "loss_chunks": 3},
                 "ddp": {"engine": "plain", "loss_chunks": 0}}
"""FSDP2 computes its loss in 3 chunks (launcher.model.chunked_loss, exact: the same curve as ZeRO-2's whole logits),
through its unsharded root unit."""


@pytest.fixture(scope="session")
def curve_runs(tmp_path_factory) -> Path:
    """The seeded job on ZeRO-2, FSDP2 and the plain engine's DDP replicas, one launch each: the step contract's loss
    curves, and the DDP run's memory against its prediction and its export (tests/cli/test_plain_cli.py), for which
    it runs under a budget near its prediction. RUN/<name> for each name of CURVE_ENGINES."""
    from tests.cli.test_run_cli import job_file, launch, near_budget

    root = tmp_path_factory.mktemp("curves")
    for name, strategy in CURVE_ENGINES.items():
        job = job_file(root, name, strategy={**strategy, **CURVE_PINS}, train=CURVE_TRAIN)
        if strategy["engine"] == "plain":
            near_budget(job)
        res = launch(job, "--run-dir", root / name, "--quiet")
        assert res.returncode == 0, res.stdout + res.stderr
    return root


SECRET_TOKEN = "hf_FAKE_SECRET_987654"
"""HF_TOKEN's value in the terminal run's environment: it must reach no file and no output."""


@dataclass(frozen=True)
class TerminalRun:
    """The terminal run (terminal_run) and what it was given."""

    run: Path
    """The run dir launch chose itself (runs/NAME-STAMP under the working dir)."""
    out: str
    """Everything the terminal showed: stdout and stderr, one pty (launch exited 0)."""
    job: Path
    """The job file: relative model dir and data beside it (tests/conftest.py relative_project)."""
    cwd: Path
    """Where launch started: not the job's directory."""
    env: dict


@pytest.fixture(scope="session")
def terminal_run(tmp_path_factory) -> TerminalRun:
    """`launch run ../proj/job.yaml train.max_steps=6` on a terminal (a pty), from another directory, without
    --run-dir, under a budget near its prediction, with secret-looking variables in its environment (one naming the
    data's directory, one a credentials file, HF_TOKEN a token): the live table (tests/records/test_live.py) and the
    secret-named paths (tests/faults/test_secret_paths.py) are checked on this one run (they were two)."""
    from tests.cli.test_run_cli import LAUNCH, near_budget
    from tests.conftest import relative_project
    from tests.records.test_live import read_all

    root = tmp_path_factory.mktemp("terminal")
    job = relative_project(root / "proj")
    doc = yaml.safe_load(job.read_text())
    near_budget(job, train={**doc["train"], "max_steps": 6})
    (root / "key.json").write_text("{}")
    (root / "tmp").mkdir()  # its own TMPDIR: torchrun's agent once left a torchelastic_* dir there after every run
    env = {**os.environ, "COLUMNS": "140", "TERM": "xterm", HEAP_ENV: "1", "MY_API_KEY": str(job.parent / "data"),
           "GOOGLE_APPLICATION_CREDENTIALS": str(root / "key.json"), "HF_TOKEN": SECRET_TOKEN,
           "TMPDIR": str(root / "tmp")}
    cwd = root / "elsewhere"
    cwd.mkdir()
    primary, secondary = os.openpty()
    proc = subprocess.Popen([LAUNCH, "run", "../proj/job.yaml", "train.max_steps=6"], cwd=cwd, stdin=secondary,
                            stdout=secondary, stderr=secondary, env=env, close_fds=True)
    os.close(secondary)
    out = read_all(primary, proc, 300)
    code = proc.wait(timeout=60)
    os.close(primary)
    runs = list((cwd / "runs").iterdir()) if (cwd / "runs").is_dir() else []
    assert code == 0 and len(runs) == 1, (runs, out[-3000:])
    return TerminalRun(run=runs[0], out=out, job=job, cwd=cwd, env=env)


WORLD_OF_ONE = """
import json, os, socket, sys
import launcher.worker.rank_entry  # noqa: F401  (what torchrun starts, before the worker)
from launcher.worker.main import main

for run in sys.argv[1:]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    code = main([run])
    print(json.dumps({"code": code, "deepspeed": sorted(m for m in sys.modules if m.split(".")[0] == "deepspeed")}))
"""
"""One world-of-one rank after another, each through the worker's main as rank_entry runs it; after each, the
deepspeed modules loaded so far."""
SINGLE_RANK_ENGINES = ("fsdp", "plain", "deepspeed")
"""In this order: DeepSpeed's run last, so that the others' show what they loaded themselves."""


@pytest.fixture(scope="session")
def single_rank_runs(tmp_path_factory) -> dict[str, dict]:
    """A one-rank run of 2 steps on each engine of SINGLE_RANK_ENGINES, by the real worker, one after another in
    one fresh interpreter (one start-up for all): engine -> {"run": its dir, ending with a checkpoint
    (step-00000002) and its model; "code": the worker's exit code; "deepspeed": the deepspeed modules loaded once
    it had run}. The damaged checkpoints (tests/faults) and what a rank imports (tests/worker/test_rank_imports.py)
    read them."""
    from tests.conftest import REPO
    from tests.worker.run_dirs import ds_config_dict, plan_dict, tiny_gpt2_job, write_run_dir

    root = tmp_path_factory.mktemp("single-rank")
    runs = {}
    for engine in SINGLE_RANK_ENGINES:
        plan = plan_dict(engine=engine, zero_stage=2 if engine == "deepspeed" else None, micro_batch_size=2,
                         grad_accum_steps=1, world_size=1, seq_len=32)
        job = tiny_gpt2_job(str(REPO / "examples" / "data" / "causal.jsonl"), max_steps=2)
        job["data"]["max_seq_len"] = 32
        job["train"]["global_batch_size"] = 2
        runs[engine] = write_run_dir(root / engine, job=job, plan=plan,
                                     ds_config=ds_config_dict(plan) if engine == "deepspeed" else None)
    env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
           "MASTER_ADDR": "127.0.0.1", "LAUNCHER_CACHE": str(root / "cache"), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", WORLD_OF_ONE, *map(str, runs.values())], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    results = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(results) == len(runs), done.stdout[-3000:] + done.stderr[-3000:]
    return {engine: {"run": run, **result} for (engine, run), result in zip(runs.items(), results, strict=True)}
