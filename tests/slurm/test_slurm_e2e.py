"""`launch --slurm` against the real dev cluster (slurm/dev-cluster/start.sh): real sbatch, sacct, scancel, requeue.

Every job is the tiny inline GPT-2 on CPU ranks (gloo), FSDP pinned (no DeepSpeed op build), budget 1 GB. They run
when `sinfo` answers and skip, saying why, when it does not. The module takes about 5 to 8 minutes on the 2-core
dev machine, most of it the timeout -> requeue -> resume test.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "examples" / "data" / "causal.jsonl"
TINY_GPT2 = {"family": "gpt2", "hidden_size": 64, "num_layers": 2, "num_heads": 4, "vocab_size": 1024,
             "max_position_embeddings": 256}
JOB_DEADLINE_S = 300


def _cluster_reason() -> str | None:
    if shutil.which("sinfo") is None:
        return "sinfo not found: Slurm client tools not installed (run: sudo bash slurm/dev-cluster/start.sh)"
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"sinfo did not answer ({e}); start the dev cluster: sudo bash slurm/dev-cluster/start.sh"
    if out.returncode != 0 or not out.stdout.strip():
        return f"sinfo failed: {out.stderr.strip() or 'no partitions'}; start it: sudo bash slurm/dev-cluster/start.sh"
    return None


REASON = _cluster_reason()
pytestmark = [pytest.mark.slurm, pytest.mark.skipif(REASON is not None, reason=REASON or "")]


def job_file(tmp_path: Path, name: str = "job.yaml", **over) -> Path:
    job = {"name": f"t-{uuid.uuid4().hex[:6]}", "model": dict(TINY_GPT2), "task": "causal_lm",
           "data": {"path": str(DATA), "max_seq_len": 64},
           "train": {"global_batch_size": 8, "precision": "bf16", "lr": 1e-3, "max_steps": 4},
           "strategy": {"engine": "fsdp"}, "gpus": 1, "budget": "1GB", "launcher": "slurm",
           "slurm": {"timeout_min": 10}}
    for dotted, value in over.items():
        node = job
        *path, last = dotted.split(".")
        for k in path:
            node = node.setdefault(k, {})
        node[last] = value
    p = tmp_path / name
    p.write_text(yaml.safe_dump(job, sort_keys=False))
    return p


def env() -> dict[str, str]:
    e = dict(os.environ)
    e.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".cache" / "torch_extensions"))
    e.setdefault("HF_HUB_OFFLINE", "1")
    return e


def launch(*argv, timeout: float = JOB_DEADLINE_S) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "launcher", *map(str, argv)], capture_output=True, text=True,
                          timeout=timeout, env=env(), cwd=REPO)


def status(run_dir: Path) -> dict:
    out = launch("status", run_dir, "--json", timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def steps(run_dir: Path, rank: int = 0) -> list[int]:
    p = run_dir / "steps" / f"rank-{rank}.jsonl"
    return [json.loads(ln)["step"] for ln in p.read_text().splitlines() if ln.strip()] if p.is_file() else []


def wait_for(pred, what: str, timeout_s: float = JOB_DEADLINE_S, poll_s: float = 0.5):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def sacct_states(job_id: str) -> list[str]:
    out = subprocess.run(["sacct", "-D", "-n", "-X", "-P", "-o", "State", "-j", job_id], capture_output=True,
                         text=True, timeout=30).stdout
    return [s for s in out.split() if s]


def report_ranks(run_dir: Path) -> list[int]:
    return sorted(r["rank"] for r in json.loads((run_dir / "report.json").read_text())["ranks"])


@pytest.fixture(scope="module")
def single_task(tmp_path_factory):
    """One rank, one node, --wait: the plainest job (its step time also sizes the timeout test)."""
    tmp = tmp_path_factory.mktemp("single")
    run_dir = tmp / "run"
    t0 = time.monotonic()
    out = launch(job_file(tmp, **{"train.max_steps": 12}), "--slurm", "--wait", "--run-dir", run_dir)
    rows = [json.loads(ln) for ln in (run_dir / "steps" / "rank-0.jsonl").read_text().splitlines()] \
        if (run_dir / "steps" / "rank-0.jsonl").is_file() else []
    step_s = statistics.median(r["step_time_s"] for r in rows[2:]) if len(rows) > 3 else None
    return {"out": out, "run_dir": run_dir, "wall_s": time.monotonic() - t0, "step_s": step_s}


def test_single_task_job(single_task):
    out, run_dir = single_task["out"], single_task["run_dir"]
    assert out.returncode == 0, out.stdout + out.stderr
    assert "submitted slurm job" in out.stdout and "verdict: every rank within budget" in out.stdout
    assert report_ranks(run_dir) == [0] and steps(run_dir) == list(range(1, 13))
    st = status(run_dir)
    assert st["state"] == "COMPLETED" and [t["result"] for t in st["tasks"]] == ["success"]
    assert json.loads((run_dir / "slurm.json").read_text())["job_id"] == st["job_id"]
    logs = launch("logs", run_dir, "--lines", "5", timeout=60)
    assert logs.returncode == 0 and "==> rank 0:" in logs.stdout and "submitit task 0 stdout" in logs.stdout


def test_two_rank_job_ends_in_a_memory_report(tmp_path):
    run_dir = tmp_path / "run"
    out = launch(job_file(tmp_path, gpus=2), "--slurm", "--wait", "--run-dir", run_dir)
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads((run_dir / "report.json").read_text())
    assert report_ranks(run_dir) == [0, 1] and report["within_budget"] and report["world_size"] == 2
    assert all(r["measured_peak_bytes"] > 0 for r in report["ranks"])
    assert "verdict: every rank within budget" in out.stdout
    assert steps(run_dir, 0) == steps(run_dir, 1) == [1, 2, 3, 4]
    assert status(run_dir)["state"] == "COMPLETED"


def test_two_nodes_meet_at_the_head_node(tmp_path):
    run_dir = tmp_path / "run"
    out = launch(job_file(tmp_path, gpus=1, nodes=2), "--slurm", "--wait", "--run-dir", run_dir)
    assert out.returncode == 0, out.stdout + out.stderr
    assert report_ranks(run_dir) == [0, 1]
    views = [json.loads(p.read_text()) for p in sorted((run_dir / "rdzv").glob("*/node-*.json"))]
    assert [v["node_name"] for v in views] == ["node1", "node2"]
    assert {(v["head_host"], v["head_addr"], v["port"], v["world_size"]) for v in views} == \
        {("node1", "127.0.0.1", 20000 + int(views[0]["job_id"]) % 20000, 2)}
    st = status(run_dir)
    assert st["allocations"][-1]["NodeList"] == "node[1-2]"
    assert sorted(t["node"] for t in st["tasks"]) == ["node1", "node2"]


def test_array_of_four_variants_with_a_summary(tmp_path):
    run_dir = tmp_path / "array"
    job = job_file(tmp_path, **{"train.max_steps": 3, "sweep": {
        "grid": {"train.lr": [1.0e-4, 3.0e-4], "train.seed": [0, 1]},
        "list": [{"model": "gpt2-124m", "budget": "100MB"}]}})  # cannot fit: listed, not submitted
    out = launch(job, "--slurm", "--wait", "--array-parallelism", "4", "--run-dir", run_dir)
    # Exit 2: every submitted variant is fine, but one could not be planned, and a script must notice.
    assert out.returncode == 2, out.stdout + out.stderr
    assert "variant 4 (model=gpt2-124m,budget=100MB) not submitted" in out.stderr
    table = out.stdout[out.stdout.index("variant "):]
    rows = [ln for ln in table.splitlines()[1:] if ln.strip()]
    assert len(rows) == 5
    for k, name in enumerate(["lr=0.0001,seed=0", "lr=0.0001,seed=1", "lr=0.0003,seed=0", "lr=0.0003,seed=1"]):
        assert rows[k].startswith(f"{k}-{name}") and " ok " in rows[k], rows[k]
        assert "FSDP2" in rows[k] and float(rows[k].split()[-1]) > 0  # plan label, final loss
    assert "not planned" in rows[4]
    rec = json.loads((run_dir / "slurm.json").read_text())
    assert len(rec["job_ids"]) == 4 and len({j.split("_")[0] for j in rec["job_ids"]}) == 1  # one array
    for v in rec["variants"]:
        assert report_ranks(Path(v["run_dir"])) == [0]
    st = status(run_dir)
    assert [v["state"] for v in st["variants"]] == ["COMPLETED"] * 4


def test_cancel_a_running_job(tmp_path):
    run_dir = tmp_path / "run"
    follower = subprocess.Popen([sys.executable, "-m", "launcher", str(job_file(tmp_path, **{"train.max_steps": 100000})),
                                 "--slurm", "--wait", "--run-dir", str(run_dir)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env(), cwd=REPO)
    try:
        wait_for(lambda: steps(run_dir), "the first training step", timeout_s=180)
        t0 = time.monotonic()
        out = launch("cancel", run_dir, timeout=90)
        assert out.returncode == 0, out.stdout + out.stderr
        assert "CANCELLED" in out.stdout
        assert time.monotonic() - t0 < 60
        assert status(run_dir)["state"].startswith("CANCELLED")
        stdout, stderr = follower.communicate(timeout=90)  # the --wait follower ends too: no hang
        assert follower.returncode == 130, stdout + stderr
        assert "CANCELLED" in stderr
    finally:
        if follower.poll() is None:
            follower.kill()


def test_plan_that_cannot_fit_is_refused_before_submission(tmp_path):
    name = f"nofit-{uuid.uuid4().hex[:8]}"
    run_dir = tmp_path / "run"
    start = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - 5))
    out = launch(job_file(tmp_path, name=name, model="gpt2-124m", budget="100MB"), "--slurm", "--run-dir", run_dir)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "submitted" not in out.stdout and not run_dir.exists()
    assert subprocess.run(["squeue", "-h", "-n", name], capture_output=True, text=True).stdout.strip() == ""
    acct = subprocess.run(["sacct", "-n", "-X", "-S", start, "--name", name], capture_output=True, text=True)
    assert acct.returncode == 0 and acct.stdout.strip() == ""


def test_timeout_requeue_resumes_at_the_exact_next_step(tmp_path, single_task):
    """The real time-limit path: timeout_min=1 and signal_delay_s=5, so Slurm's USR2 comes 25-55 s into the run
    (its timer ticks every 30 s). The ranks save, submitit requeues, the job resumes from the checkpoint. Once
    a requeue with a checkpoint has happened, the test raises the time limit so the resumed run can finish."""
    step_s = single_task["step_s"] or 0.5
    max_steps = min(3000, max(40, math.ceil(60.0 / step_s)))  # ~60 s of training: more than one run can do
    run_dir = tmp_path / "run"
    out = launch(job_file(tmp_path, **{"train.max_steps": max_steps, "slurm.timeout_min": 1,
                                       "slurm.signal_delay_s": 5, "slurm.max_requeues": 3}),
                 "--slurm", "--run-dir", run_dir, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    job_id = json.loads((run_dir / "slurm.json").read_text())["job_id"]

    def requeued_with_checkpoint():
        rows = [json.loads(ln) for ln in (run_dir / "requeues.jsonl").read_text().splitlines()] \
            if (run_dir / "requeues.jsonl").is_file() else []
        found = next((r for r in rows if r["decision"] == "requeue" and r["checkpoint"]), None)
        if not found and (run_dir / "report.json").is_file():
            pytest.fail(f"the run finished {len(steps(run_dir))} steps before Slurm's time-limit signal: the machine "
                        f"is faster now than the {step_s:.3f} s/step measured by test_single_task_job")
        return found

    first = wait_for(requeued_with_checkpoint, "a requeue after a checkpoint", timeout_s=600)
    subprocess.run(["scontrol", "update", f"JobId={job_id}", "TimeLimit=15"], check=True, timeout=30)
    wait_for(lambda: status(run_dir)["state"] == "COMPLETED", "the resumed run to complete", timeout_s=420, poll_s=3)

    saved_at = int(first["checkpoint"].split("-")[-1])
    assert 1 <= saved_at < max_steps
    assert steps(run_dir) == list(range(1, max_steps + 1)), "every step exactly once, none lost"
    rank0 = json.loads((run_dir / "ranks" / "rank-0.json").read_text())
    assert rank0["status"] == "completed" and rank0["steps_done"] == max_steps
    assert rank0["resumed_from_step"] >= saved_at  # the last resume started right after a saved step
    assert "REQUEUED" in sacct_states(job_id) and sacct_states(job_id)[-1] == "COMPLETED"
    assert json.loads((run_dir / "state.json").read_text())["state"] == "completed"
    assert report_ranks(run_dir) == [0]
    log = (run_dir / "submitit" / f"{job_id}_0_log.out").read_text()
    assert "this job is timed-out" in log and f"Requeued job {job_id}" in log
