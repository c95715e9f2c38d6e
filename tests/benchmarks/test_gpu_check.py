"""scripts/gpu-check.sh: says so and exits 0 without CUDA; its report writer, on a real (CPU) run dir."""

import json
import os
import shutil
import subprocess

import pytest

from benchmarks.accuracy.compare import MOMENT_PHASES
from benchmarks.gpu.report import main, render, run_row
from tests.cli.test_run_cli import job_file, launch
from tests.conftest import REPO

RESULTS = REPO / "benchmarks" / "results" / "gpu.md"


def test_without_cuda_it_says_so_and_exits_0(tmp_path):
    before = RESULTS.stat().st_mtime_ns if RESULTS.exists() else None
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "GPU_CHECK_RESULTS": str(tmp_path / "gpu.md")}
    res = subprocess.run(["bash", str(REPO / "scripts" / "gpu-check.sh")], env=env, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "gpu-check: no CUDA device on this machine" in res.stdout
    assert not (tmp_path / "gpu.md").exists()  # nothing ran, nothing written
    assert (RESULTS.stat().st_mtime_ns if RESULTS.exists() else None) == before


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gpu-report")
    job = job_file(tmp, "fsdp-1", gpus=1, strategy={"engine": "fsdp"},
                   train={"global_batch_size": 4, "precision": "fp32", "lr": 3e-3, "max_steps": 2})
    res = launch(job, "--run-dir", tmp / "fsdp-1", "--quiet")
    assert res.returncode == 0, res.stdout + res.stderr
    return tmp / "fsdp-1"


def test_each_planned_moment_sits_beside_its_measured_phase(cpu_run):
    plan = json.loads((cpu_run / "plan.json").read_text())
    rank = json.loads((cpu_run / "ranks" / "rank-0.json").read_text())
    row = run_row(cpu_run, 0)
    assert set(row["moments"]) == set(plan["moment_bytes"]) and row["moments"]
    for moment, m in row["moments"].items():
        assert m["predicted_bytes"] == plan["moment_bytes"][moment]
        phase_peak = max(rank["phases"][p] for p in MOMENT_PHASES[moment] if p in rank["phases"])
        assert m["measured_bytes"] == phase_peak and m["measured_phase"] in MOMENT_PHASES[moment]
    assert row["engine"] == "fsdp" and row["world_size"] == 1 and row["within_budget"] is True
    # A CPU run is on the CPU basis: the GPU page says so rather than passing it off as a CUDA figure.
    assert row["basis"] == "cpu_tensor_bytes" and "not a CUDA run" in row["problem"]
    page = render([row], tests_rc=0, machine="1 x CPU")
    assert "| fsdp-1 | backward |" in page and "`pytest tests/gpu`: passed" in page


def test_the_page_names_runs_that_failed_and_the_exit_says_so(cpu_run, tmp_path):
    (tmp_path / "oom-run").mkdir()
    out = tmp_path / "gpu.md"
    rc = main(["--out", str(out), "--tests-rc", "1", "--run", str(cpu_run), "0", "--run", str(tmp_path / "oom-run"),
               "1"])
    page = out.read_text()
    assert rc == 1
    assert "FAILED (exit 1)" in page and "| oom-run | - | - | 1 |" in page and "stopped before its verdict" in page
    assert page.count("| fsdp-1 |") == 1 + len(json.loads((cpu_run / "plan.json").read_text())["moment_bytes"])


H100_RUNS = REPO / "benchmarks" / "results" / "gpu-runs" / "2026-11-26-h100"


def test_on_the_h100_runs_moments_are_compared_on_the_allocated_basis(tmp_path):
    """The first GPU check's run dirs (kept in benchmarks/results): reserved segments stay cached, so every phase
    after the largest reads the largest on the verdict basis; the allocated basis tells the moments apart."""
    row = run_row(H100_RUNS / "levers-sac-ops-fsdp-fp32-build", 0)
    assert {m["measured_bytes"] for m in row["moments"].values()} >= {row["measured_peak_bytes"]}
    step = row["allocated_moments"]["step"]
    rank = json.loads((H100_RUNS / "levers-sac-ops-fsdp-fp32-build" / "ranks" / "rank-0.json").read_text())
    assert step["measured_bytes"] == rank["phases_allocated"]["optimizer_step"]
    assert abs(step["error"]) < 0.01  # the fp32-master run: 21.94 GB predicted and measured
    assert row["outside_bytes"] == rank["outside_allocator_bytes"] > row["predicted_outside_bytes"] > 0
    # A run of the validation split is judged by its criteria (this one, renamed, fails: it is not in the split,
    # and its outside-allocator bytes were what the split's terms were derived from).
    shutil.copytree(H100_RUNS / "fsdp-1", tmp_path / "zero3-offload-1")
    page = render([run_row(tmp_path / "zero3-offload-1", 0)], tests_rc=None, machine="1 x H100")
    line = next(ln for ln in page.splitlines() if ln.startswith("| zero3-offload-1 | ") and "/" in ln)
    assert line.rstrip().endswith("| NO |") and "GPU_VALIDATION_1" in page


def test_the_side_stream_split_is_judged_on_reserved_minus_allocated_too(tmp_path):
    """GPU_VALIDATION_2 adds a criterion: the predicted allocator_reserve + stream_pools against reserved -
    allocated. The H100's llama-1b run, renamed, was planned before the pools existed: 8 % of its tensors (1.7 GB)
    against the 6.5 GB its reduce-scatter stream kept, so it fails that criterion."""
    shutil.copytree(H100_RUNS / "levers-sac-ops-fsdp-fp32-build", tmp_path / "pool-llama-1b-ac-fsdp")
    row = run_row(tmp_path / "pool-llama-1b-ac-fsdp", 0)
    page = render([row], tests_rc=None, machine="1 x H100")
    assert "## Validation split GPU_VALIDATION_2" in page and "GPU_VALIDATION_1" not in page
    line = next(ln for ln in page.splitlines() if ln.startswith("| pool-llama-1b-ac-fsdp | ") and "/" in ln)
    cache = row["reserved_bytes"] - row["allocated_bytes"]
    assert row["predicted_cache_bytes"] < 0.3 * cache and "-7" in line.split("|")[5]  # about -73 %
    assert line.rstrip().endswith("| NO |")
