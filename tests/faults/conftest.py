"""Fixtures of the refused-input tables: a sandbox per case, one planner cache for the session; real one-rank
checkpoints for the damaged-checkpoint cases and their fuzzing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.faults.harness import Sandbox
from tests.worker.conftest import free_port
from tests.worker.run_dirs import ds_config_dict, plan_dict, tiny_gpt2_job, write_run_dir

DATA = REPO / "examples" / "data" / "causal.jsonl"


@pytest.fixture(scope="session")
def planner_cache(tmp_path_factory) -> Path:
    """One introspection cache for every case (a temporary dir, shared so each case does not re-probe)."""
    return tmp_path_factory.mktemp("launcher-cache")


@pytest.fixture
def sandbox(tmp_path, monkeypatch, planner_cache) -> Sandbox:
    root = tmp_path / "box"
    root.mkdir()
    monkeypatch.chdir(root)  # the default run dir (runs/...) would land here
    monkeypatch.setenv("LAUNCHER_CACHE", str(planner_cache))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    data = root / "data.jsonl"
    data.write_text("".join(f'{{"text": "sentence number {i} about memory"}}\n' for i in range(64)))
    return Sandbox(root=root, data=data)


def trained_run(root: Path, engine: str) -> Path:
    """A one-rank run of 2 steps that ends with a checkpoint (step-00000002), made by the real worker."""
    plan = plan_dict(engine=engine, zero_stage=2 if engine == "deepspeed" else None, micro_batch_size=2,
                     grad_accum_steps=1, world_size=1, seq_len=32)
    job = tiny_gpt2_job(str(DATA), max_steps=2)
    job["data"]["max_seq_len"] = 32
    job["train"]["global_batch_size"] = 2
    run = write_run_dir(root / engine, job=job, plan=plan,
                        ds_config=ds_config_dict(plan) if engine == "deepspeed" else None)
    env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "LAUNCHER_CACHE": str(root / "cache"),
           "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-m", "launcher.worker.rank_entry", str(run)], env=env, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert (run / "checkpoint" / "step-00000002" / "trainer_state.json").is_file()
    return run


@pytest.fixture(scope="session")
def trained_runs(tmp_path_factory) -> dict[str, Path]:
    """A one-rank checkpoint of each engine (fsdp: a DCP dir; deepspeed: ZeRO-2 partitions), made once."""
    root = tmp_path_factory.mktemp("trained")
    return {engine: trained_run(root, engine) for engine in ("fsdp", "deepspeed")}
