"""Checks of the real dev Slurm cluster started by slurm/dev-cluster/start.sh.

Skipped, saying why, unless the cluster answers (`sinfo`); in CI (CI=true) an unreachable cluster fails them
instead. They submit real jobs, so they take some seconds each.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import require_cluster

REPO = Path(__file__).resolve().parents[2]
DEV_CLUSTER = REPO / "slurm" / "dev-cluster"
STATE_DIR = Path(os.environ.get("LAUNCHER_SLURM_STATE", "/var/tmp/launcher-slurm"))
DEADLINE_S = 90


def _cluster_up() -> bool:
    if shutil.which("sinfo") is None:
        return False
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and bool(out.stdout.strip())


pytestmark = [pytest.mark.slurm]
CLUSTER_UP = _cluster_up()


@pytest.fixture(autouse=True)
def _cluster_reachable():
    require_cluster(None if CLUSTER_UP else "dev Slurm cluster not running (bash slurm/dev-cluster/start.sh)")


def _run(*cmd: str) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=60).stdout


def _sacct_state(job_id: str) -> str:
    out = _run("sacct", "-n", "-X", "-P", "-o", "State", "-j", job_id)
    return out.strip().splitlines()[0] if out.strip() else ""


def _wait_sacct(job_id: str, pred) -> str:
    deadline = time.monotonic() + DEADLINE_S
    state = ""
    while time.monotonic() < deadline:
        state = _sacct_state(job_id)
        if pred(state):
            return state
        time.sleep(0.5)
    raise AssertionError(f"job {job_id}: sacct state {state!r} after {DEADLINE_S}s")


def _wait_done(job) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not job.done():
        assert time.monotonic() < deadline, f"submitit job {job.job_id} not done after {DEADLINE_S}s: {job.state}"
        time.sleep(0.5)


def _node_names() -> list[str]:
    return _run("sinfo", "-h", "-N", "-p", "debug", "-o", "%N").split()


# What the job sees. A library function pickles by reference; a function
# defined in this test module would not import inside the job.
_WHERE = ["bash", "-c", "echo $SLURMD_NODENAME ${CUDA_VISIBLE_DEVICES:-none}"]


def test_sbatch_completes_and_sacct_reports_it(tmp_path):
    job_id = _run("sbatch", "--parsable", "-o", str(tmp_path / "out"), "--wrap", "hostname").strip().split(";")[0]
    assert _wait_sacct(job_id, lambda s: s and s not in {"PENDING", "RUNNING", "COMPLETING"}) == "COMPLETED"
    assert (tmp_path / "out").read_text().strip()


def test_srun_gets_fake_gpus():
    out = subprocess.run(
        ["srun", "-N1", "--gpus=2", "printenv", "CUDA_VISIBLE_DEVICES"],
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
    )
    assert out.returncode == 0, out.stderr
    # Two of the node's 8 fake GPUs, bound to the step; which two depends on what other jobs hold.
    ids = out.stdout.strip().split(",")
    assert len(ids) == 2 and len(set(ids)) == 2 and all(i in {str(n) for n in range(8)} for i in ids), out.stdout


def test_scancel_shows_cancelled_in_sacct(tmp_path):
    job_id = _run("sbatch", "--parsable", "-o", "/dev/null", "--wrap", "sleep 100").strip().split(";")[0]
    _wait_sacct(job_id, lambda s: s == "RUNNING")
    _run("scancel", job_id)
    # sacct says "CANCELLED by <uid>" for the job allocation
    assert _wait_sacct(job_id, lambda s: s.startswith("CANCELLED")).startswith("CANCELLED")


def test_submitit_function_and_cancel(tmp_path):
    import submitit
    ex = submitit.AutoExecutor(folder=tmp_path / "submitit")
    assert ex.cluster == "slurm"
    ex.update_parameters(slurm_partition="debug", timeout_min=5, nodes=1, tasks_per_node=1, gpus_per_node=2)
    job = ex.submit(subprocess.check_output, _WHERE, text=True)
    _wait_done(job)
    node, gpus = job.result().split()
    assert node in _node_names()
    assert gpus == "0,1"

    job = ex.submit(time.sleep, 100)
    deadline = time.monotonic() + DEADLINE_S
    while job.state != "RUNNING":
        assert time.monotonic() < deadline, job.state
        time.sleep(0.5)
    job.cancel()
    _wait_done(job)
    assert job.state.startswith("CANCELLED")


def test_two_node_job(tmp_path):
    nodes = _node_names()
    if len(nodes) < 2:
        require_cluster(f"the cluster has {len(nodes)} node(s); start.sh starts two")
    import submitit
    ex = submitit.AutoExecutor(folder=tmp_path / "submitit")
    ex.update_parameters(slurm_partition="debug", timeout_min=5, nodes=2, tasks_per_node=1)
    job = ex.submit(subprocess.check_output, _WHERE, text=True)
    _wait_done(job)
    assert sorted(out.split()[0] for out in job.results()) == sorted(nodes[:2])


@pytest.mark.skipif(os.geteuid() != 0, reason="start.sh needs root")
def test_start_is_idempotent():
    def pids():
        return {p.name: p.read_text().strip() for p in (STATE_DIR / "run").glob("*.pid")}

    before = pids()
    assert before, f"no pid files in {STATE_DIR}/run"
    subprocess.run(["bash", str(DEV_CLUSTER / "start.sh")], check=True, capture_output=True, timeout=300)
    assert pids() == before
    status = subprocess.run(["bash", str(DEV_CLUSTER / "status.sh")], capture_output=True, text=True, timeout=60)
    assert status.returncode == 0, status.stdout
