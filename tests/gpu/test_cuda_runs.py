"""The run issue's GPU checks, through the real CLI on every GPU of the machine (nccl).

They run wherever CUDA is present (`pytest -m gpu`) and skip, saying so, elsewhere (tests/conftest.py).
"""

import json

import pytest

from tests.cli.test_run_cli import LAUNCH, check_report, job_file, launch  # noqa: F401

pytestmark = pytest.mark.gpu


def gpus() -> int:
    import torch

    return torch.cuda.device_count()


def run_pinned(tmp_path, name: str, strategy: dict, *extra, budget: str = "8GB"):
    n = gpus()
    job = job_file(tmp_path, name, strategy=strategy, gpus=n, budget=budget,
                   train={"global_batch_size": 4 * n, "precision": "bf16", "lr": 3e-3, "max_steps": 8})
    return launch(job, "--run-dir", tmp_path / name, "--quiet", *extra), tmp_path / name


@pytest.mark.parametrize("name, strategy", [
    ("zero2", {"engine": "deepspeed", "zero_stage": 2}),
    ("zero3-offload", {"engine": "deepspeed", "zero_stage": 3, "offload_optimizer": "cpu"}),
    ("fsdp2", {"engine": "fsdp", "fsdp_reshard_after_forward": True, "activation_checkpointing": True}),
])
def test_engines_on_cuda_report_allocated_and_reserved(tmp_path, name, strategy):
    res, run = run_pinned(tmp_path, name, strategy)
    assert res.returncode == 0, res.stdout + res.stderr
    report = json.loads((run / "report.json").read_text())
    assert sorted(r["rank"] for r in report["ranks"]) == list(range(gpus()))
    for r in report["ranks"]:
        assert r["device"].startswith("cuda")
        assert 0 < r["max_memory_allocated_bytes"] <= r["max_memory_reserved_bytes"]
        assert r["within_budget"]


def test_enforce_caps_each_process_at_the_budget(tmp_path):
    pins = {"engine": "deepspeed", "zero_stage": 0, "offload_optimizer": "none", "offload_params": "none",
            "micro_batch_size": 4, "activation_checkpointing": False}
    res, run = run_pinned(tmp_path, "enforce-ok", pins, "--enforce")
    assert res.returncode == 0, res.stdout + res.stderr
    for r in json.loads((run / "report.json").read_text())["ranks"]:
        assert r["max_memory_reserved_bytes"] <= 8e9
    # A 4 MB cap cannot hold the CUDA context's first allocations: the allocator raises, the rank reports OOM.
    res, run = run_pinned(tmp_path, "enforce-oom", pins, "--enforce", "--force", budget="4MB")
    assert res.returncode == 1, res.stdout + res.stderr
    assert "ran out of memory" in res.stderr
    rank = json.loads((run / "ranks" / "rank-0.json").read_text())
    assert rank["status"] == "oom" and "memory_summary" in json.dumps(rank)


def test_memory_snapshot_is_written_per_rank(tmp_path):
    res, run = run_pinned(tmp_path, "snap", {"engine": "fsdp"}, "--memory-snapshot")
    assert res.returncode == 0, res.stdout + res.stderr
    assert sorted(p.name for p in (run / "memory-snapshot").iterdir()) == \
        [f"rank-{r}.pickle" for r in range(gpus())]
