"""Fixtures for worker tests: hand-made run dirs and an in-process 1-rank gloo group."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import torch.distributed as dist

from tests.worker.run_dirs import write_run_dir

EXAMPLES_DATA = Path(__file__).resolve().parents[2] / "examples" / "data"


@pytest.fixture
def examples_data() -> Path:
    return EXAMPLES_DATA


@pytest.fixture
def make_run_dir(tmp_path):
    """make_run_dir(job_dict, plan_dict, ds_config_dict=None, name="run") -> Path of a run dir the worker reads.

    Build the dicts with tests.worker.run_dirs (plan_dict, ds_config_dict, tiny_gpt2_job).
    """

    def _make(job: dict, plan: dict, ds_config: dict | None = None, name: str = "run") -> Path:
        return write_run_dir(tmp_path / name, job=job, plan=plan, ds_config=ds_config)

    return _make


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def single_rank(monkeypatch):
    """torchrun's variables for a world of one, and a gloo group torn down after the test."""
    for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


@pytest.fixture(autouse=True)
def _own_launcher_cache(tmp_path, monkeypatch):
    """The ranks' tokenized-data cache (launcher.worker.tokcache) goes to the test's own dir, not ~/.cache."""
    monkeypatch.setenv("LAUNCHER_CACHE", str(tmp_path / "launcher-cache"))


@pytest.fixture(autouse=True)
def _torch_linear_restored():
    """DeepSpeed's zero.Init with memory_efficient_linear (its default, and what the emitter writes for a full
    fine-tune) replaces torch.nn.functional.linear for the rest of the process (partition_parameters.py
    _enable_mem_efficient_linear): a test that builds a ZeRO-3 engine in-process must not hand the tests after it
    DeepSpeed's linear (an op-counting test saw LinearFunctionForZeroStage3's ops instead of aten's)."""
    import torch.nn.functional as F

    linear = F.linear
    yield
    F.linear = linear
