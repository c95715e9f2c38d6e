"""`launch --slurm` against the real dev cluster (slurm/dev-cluster/start.sh): real sbatch, sacct, scancel, requeue.

Every job is the tiny inline GPT-2 on CPU ranks (gloo), FSDP pinned (no DeepSpeed op build), budget 1 GB. They run
when `sinfo` answers; when it does not they skip saying why, and fail in CI (CI=true). The module takes about 4 to 6
minutes on the 2-core dev machine, the timeout -> requeue -> resume test the longest.
"""

from __future__ import annotations

import itertools
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

from launcher.config.jobfile import set_dotted
from tests.conftest import require_cluster

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
pytestmark = [pytest.mark.slurm]


@pytest.fixture(autouse=True)
def _cluster_reachable():
    require_cluster(REASON)


def job_file(tmp_path: Path, name: str = "job.yaml", **over) -> Path:
    job = {"name": f"t-{uuid.uuid4().hex[:6]}", "model": dict(TINY_GPT2), "task": "causal_lm",
           "data": {"path": str(DATA), "max_seq_len": 64},
           "train": {"global_batch_size": 8, "precision": "fp32", "lr": 1e-3, "max_steps": 4},
           "strategy": {"engine": "fsdp"}, "gpus": 1, "budget": "1GB", "launcher": "slurm",
           "slurm": {"timeout_min": 10}}
    for dotted, value in over.items():
        set_dotted(job, dotted, value)
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


def step_rows(run_dir: Path, rank: int = 0) -> list[dict]:
    p = run_dir / "steps" / f"rank-{rank}.jsonl"
    return [json.loads(ln) for ln in p.read_text().splitlines() if ln.strip()]


def wait_for(pred, what: str, timeout_s: float = JOB_DEADLINE_S, poll_s: float = 0.5):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def job_state(job_id: str) -> str:
    """squeue's state of the job ("" once it has left the queue)."""
    return subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True,
                          timeout=30).stdout.strip()


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
    out = launch(job, "--slurm", "--wait", "--array-parallelism", "2", "--run-dir", run_dir)
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
    # The cap: Slurm's own start and end times of the four tasks never have three running at once.
    array_id = rec["job_id"]
    assert "--array=0-3%2" in (run_dir / "submitit" / f"{array_id}_submission.sh").read_text()
    spans = task_spans(array_id)
    assert sorted(spans) == [f"{array_id}_{k}" for k in range(4)], spans
    assert max_running_at_once(list(spans.values())) <= 2, spans


def task_spans(array_id: str) -> dict[str, tuple[float, float]]:
    """Array task -> (start, end) in epoch seconds from sacct (one-second resolution), last run of each."""
    out = subprocess.run(["sacct", "-n", "-X", "-P", "-o", "JobID,Start,End", "-j", array_id], capture_output=True,
                         text=True, timeout=30, check=True).stdout

    def epoch(t: str) -> float:
        return time.mktime(time.strptime(t, "%Y-%m-%dT%H:%M:%S"))

    return {jid: (epoch(a), epoch(b)) for jid, a, b in (ln.split("|") for ln in out.splitlines() if ln.strip())}


def max_running_at_once(spans: list[tuple[float, float]]) -> int:
    # A task that ends in the second another starts is not counted with it: Slurm starts the next task of a
    # throttled array only after one has ended, and both times fall in the same second.
    events = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans], key=lambda e: (e[0], e[1]))
    running = most = 0
    for _, delta in events:
        running += delta
        most = max(most, running)
    return most


def test_max_running_at_once_counts_overlaps():
    assert max_running_at_once([(0, 10), (0, 10), (10, 20), (10, 20)]) == 2
    assert max_running_at_once([(0, 10), (1, 11), (2, 12), (12, 13)]) == 3


def test_cancel_a_running_job(tmp_path):
    run_dir = tmp_path / "run"
    job = job_file(tmp_path, **{"train.max_steps": 100000})
    follower = subprocess.Popen([sys.executable, "-m", "launcher", str(job),
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


TRAIN_BEFORE_SIGNAL_S = 60.0
"""Seconds of training the requeue test's job holds at the pace last measured: more than its first attempt can
train before Slurm's time-limit signal (25-55 s into the job, ~10 s of it starting the rank), so the signal meets
it mid-run, and little more, so the resumed attempt is short: 15-45 s of training at that pace (it was 90 s, and
the resumed part took over 7 minutes under a load of 10; docs/testing.md)."""
STALL_S = 240.0
"""The requeue test fails when nothing moves for this long: no new step, no change of the job's state, no new
requeue line. It covers Slurm's ~30 s hold of a requeued job and a rank's start under load; a slow run that still
advances is waited for (the slow tier's own timeout, 900 s, is the last bound)."""


def wait_moving(pred, what: str, moved, stall_s: float = STALL_S, poll_s: float = 1.0):
    """pred()'s first truthy value; AssertionError only once ``moved()`` (what shows the job's progress) has not
    changed for ``stall_s``, so a run slowed by load is waited for and a stuck one is not."""
    last, since = moved(), time.monotonic()
    while not (value := pred()):
        now = moved()
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since > stall_s:
            raise AssertionError(f"nothing moved for {stall_s:.0f} s while waiting for {what} (last seen: {now})")
        time.sleep(poll_s)
    return value


def requeue_rows(run_dir: Path) -> list[dict]:
    p = run_dir / "requeues.jsonl"
    return [json.loads(ln) for ln in p.read_text().splitlines() if ln.strip()] if p.is_file() else []


def progress(run_dir: Path, job_id: str) -> tuple:
    """What moves while a job runs: its step log's size, its queue state, its requeue decisions."""
    log = run_dir / "steps" / "rank-0.jsonl"
    return log.stat().st_size if log.is_file() else 0, job_state(job_id), len(requeue_rows(run_dir))


def first_requeue(run_dir: Path, job_id: str) -> dict | None:
    """The first requeue decision that saved a checkpoint, or None when the run ended (report.json) without one."""
    def requeued_or_ended():
        found = next((r for r in requeue_rows(run_dir) if r["decision"] == "requeue" and r["checkpoint"]), None)
        return found or ((run_dir / "report.json").is_file() and "ended")

    found = wait_moving(requeued_or_ended, "a requeue after a checkpoint", lambda: progress(run_dir, job_id))
    return None if found == "ended" else found


def test_timeout_requeue_resumes_at_the_exact_next_step(tmp_path, single_task):
    """The real time-limit path: timeout_min=1 and signal_delay_s=5, so Slurm's USR2 comes 25-55 s into the run
    (its timer ticks every 30 s). The ranks save, submitit requeues, the job resumes from the checkpoint. Once
    a requeue with a checkpoint has happened, the test raises the time limit so the resumed run can finish.

    The work is TRAIN_BEFORE_SIGNAL_S at the pace single_task measured. A machine faster now than then can finish
    it before the signal: that run's own pace sizes one more job. Every wait is on progress (wait_moving)."""
    step_s = single_task["step_s"] or 0.5
    for _ in range(2):
        max_steps = min(3000, max(60, math.ceil(TRAIN_BEFORE_SIGNAL_S / step_s)))
        run_dir = tmp_path / f"run-{max_steps}"
        out = launch(job_file(tmp_path, **{"train.max_steps": max_steps, "slurm.timeout_min": 1,
                                           "slurm.signal_delay_s": 5, "slurm.max_requeues": 3}),
                     "--slurm", "--run-dir", run_dir, timeout=120)
        assert out.returncode == 0, out.stdout + out.stderr
        job_id = json.loads((run_dir / "slurm.json").read_text())["job_id"]
        first = first_requeue(run_dir, job_id)
        if first is not None:
            break
        # It trained every step before the signal: its own pace, measured now, sizes the next job (twice as long).
        assert steps(run_dir) == list(range(1, max_steps + 1)), (run_dir / "report.json").read_text()
        step_s = min(step_s / 2, statistics.median(r["step_time_s"] for r in step_rows(run_dir)[2:]))
    else:
        pytest.fail(f"twice the run finished its {max_steps} steps before Slurm's time-limit signal, the second "
                    f"sized by the first's own pace: {step_s:.3f} s/step")
    subprocess.run(["scontrol", "update", f"JobId={job_id}", "TimeLimit=15"], check=True, timeout=30)
    # Slurm holds a requeued job ~30 s before it is eligible again (measured: requeued 12:26:43, eligible 12:27:14,
    # started 12:27:36); what the test checks starts after that, so the wait is moved up to now once it is pending.
    wait_moving(lambda: job_state(job_id) not in ("RUNNING", "COMPLETING"), "the requeued job to leave the node",
                lambda: progress(run_dir, job_id))
    subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], capture_output=True, timeout=30)
    # Until the job has left the queue with its report written (squeue and a file, not a `launch status` process per
    # poll: a requeued attempt writes no report); then sacct's word on it.
    wait_moving(lambda: job_state(job_id) == "" and (run_dir / "report.json").is_file(), "the resumed run to complete",
                lambda: progress(run_dir, job_id))
    wait_for(lambda: status(run_dir)["state"] == "COMPLETED", "sacct to record the job's end", timeout_s=60, poll_s=2)

    saved_at = int(first["checkpoint"].split("-")[-1])
    assert 1 <= saved_at < max_steps
    assert steps(run_dir) == list(range(1, max_steps + 1)), "every step exactly once, none lost"
    # Which attempt ran each step (the per-step log is stamped with SLURM_RESTART_COUNT): the first attempt ran
    # up to the step it saved at the signal, and each requeued attempt began at exactly the next step.
    rows = step_rows(run_dir)
    runs_of: dict[int, list[int]] = {}
    for r in rows:
        assert r["slurm_job_id"] == job_id, r
        runs_of.setdefault(r["attempt"], []).append(r["step"])
    order = list(runs_of)
    assert order[0] == 0 and len(order) >= 2 and order == sorted(order), runs_of.keys()
    assert runs_of[0][-1] == saved_at, (runs_of[0][-1], saved_at)
    for before, after in itertools.pairwise(order):
        assert runs_of[after][0] == runs_of[before][-1] + 1, (before, after, runs_of[before][-1], runs_of[after][0])
    # The checkpoint was taken at the signal, so no step ran past it and had to be redone.
    discarded = run_dir / "steps" / "rank-0.discarded.jsonl"
    assert not discarded.exists() or discarded.read_text().strip() == "", discarded.read_text()
    rank0 = json.loads((run_dir / "ranks" / "rank-0.json").read_text())
    assert rank0["status"] == "completed" and rank0["steps_done"] == max_steps
    assert rank0["resumed_from_step"] >= saved_at  # the last resume started right after a saved step
    assert "REQUEUED" in sacct_states(job_id) and sacct_states(job_id)[-1] == "COMPLETED"
    assert json.loads((run_dir / "state.json").read_text())["state"] == "completed"
    assert report_ranks(run_dir) == [0]
    log = (run_dir / "submitit" / f"{job_id}_0_log.out").read_text()
    assert "this job is timed-out" in log and f"Requeued job {job_id}" in log


WAITING_SCRIPT = """
import os, sys, time
from pathlib import Path

# Prints a secret the way a careless script would, then waits for the test to say go.
print("rank sees HF_TOKEN=" + os.environ.get("HF_TOKEN", "<unset>"), flush=True)
go = Path(sys.argv[1])
deadline = time.monotonic() + float(sys.argv[2])
while not go.exists() and time.monotonic() < deadline:
    time.sleep(0.5)
if sys.argv[3] == "train":
    from launcher.worker.main import main
    sys.exit(main([os.environ["LAUNCHER_RUN_DIR"]]))
"""


def file_tree(run_dir: Path) -> dict[str, int]:
    return {str(p.relative_to(run_dir)): p.stat().st_size for p in run_dir.rglob("*") if p.is_file()}


def test_overwrite_refuses_the_run_dir_of_a_live_job(tmp_path):
    script = tmp_path / "wait.py"
    script.write_text(WAITING_SCRIPT)
    run_dir = tmp_path / "run"
    job = job_file(tmp_path)
    out = launch(job, "--slurm", "--run-dir", run_dir, "--script", script, "--", tmp_path / "never", 300, "idle",
                 timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    job_id = json.loads((run_dir / "slurm.json").read_text())["job_id"]
    try:
        wait_for(lambda: (run_dir / "logs" / "rank-0.log").is_file(), "the rank to start", timeout_s=120)
        before = file_tree(run_dir)
        again = launch(job, "--slurm", "--run-dir", run_dir, "--overwrite", timeout=120)
        assert again.returncode == 2, again.stdout + again.stderr
        refusal = again.stderr
        assert f"belongs to slurm job {job_id}, which is still RUNNING; --overwrite would delete the files it is " \
               "writing" in refusal
        assert f"launch cancel {run_dir}" in refusal and "another --run-dir" in refusal
        assert "submitted slurm job" not in again.stdout and "Traceback" not in refusal
        second = launch(job, "--slurm", "--run-dir", run_dir, timeout=120)  # a second submission, no flags
        assert second.returncode == 2 and "already holds a run" in second.stderr, second.stderr
        after = file_tree(run_dir)
        assert set(before) <= set(after), sorted(set(before) - set(after))  # nothing cleared
        assert json.loads((run_dir / "slurm.json").read_text())["job_id"] == job_id
        # Still running after both refusals (squeue: sacct's record lags slurmctld by seconds).
        assert subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True,
                              timeout=30).stdout.split() == ["RUNNING"]
    finally:
        cancel = launch("cancel", run_dir, timeout=120)
    assert cancel.returncode == 0, cancel.stdout + cancel.stderr
    # Once the job has ended, the same run dir may be replaced.
    from launcher.backends.slurm_state import live_state
    from launcher.files.rundir import RunDir

    RunDir.create(run_dir, overwrite=True, job_state=live_state).unlock()
    assert not (run_dir / "slurm.json").exists()


def test_a_secret_a_rank_prints_is_in_no_file_and_no_logs_output(tmp_path):
    token = f"hf_fake{uuid.uuid4().hex}"
    script = tmp_path / "leak.py"
    script.write_text(WAITING_SCRIPT)
    go = tmp_path / "go"
    run_dir = tmp_path / "run"
    job = job_file(tmp_path, **{"slurm.setup": ["echo setup sees HF_TOKEN=$HF_TOKEN"]})
    secret_env = {**env(), "HF_TOKEN": token}

    def launch_with_token(*argv, timeout=120):
        return subprocess.run([sys.executable, "-m", "launcher", *map(str, argv)], capture_output=True, text=True,
                              timeout=timeout, env=secret_env, cwd=REPO)

    out = launch_with_token(job, "--slurm", "--run-dir", run_dir, "--script", script, "--", go, 240, "train")
    assert out.returncode == 0, out.stdout + out.stderr
    job_id = json.loads((run_dir / "slurm.json").read_text())["job_id"]
    rank_log = run_dir / "logs" / "rank-0.log"
    submitit_out = run_dir / "submitit" / f"{job_id}_0_log.out"
    try:
        # While the job runs, the rank log is already redacted: it is written through launcher.files.ranklog's
        # redactor...
        wait_for(lambda: rank_log.is_file() and "rank sees HF_TOKEN=[redacted]" in rank_log.read_text(),
                 "the rank to print the token", timeout_s=180)
        assert token not in rank_log.read_text()
        # ...while submitit's .out, which Slurm writes itself, holds the setup line's secret until the task ends
        # (docs/reliability/verdicts.md), and `launch logs` never shows it.
        assert token in submitit_out.read_text()
        live = launch_with_token("logs", run_dir, "--lines", "50")
        assert live.returncode == 0, live.stderr
        assert token not in live.stdout + live.stderr
        assert "rank sees HF_TOKEN=[redacted]" in live.stdout and "setup sees HF_TOKEN=[redacted]" in live.stdout
    finally:
        go.touch()
    wait_for(lambda: status(run_dir)["state"] == "COMPLETED", "the job to complete", timeout_s=240, poll_s=2)
    wait_for(lambda: (run_dir / "submitit" / f"{job_id}_0_result.pkl").is_file(), "submitit's result", timeout_s=60)
    assert json.loads((run_dir / "state.json").read_text())["state"] == "completed"
    leaked = [str(p) for p in run_dir.rglob("*") if p.is_file() and token.encode() in p.read_bytes()]
    assert leaked == []
    assert "rank sees HF_TOKEN=[redacted]" in rank_log.read_text()
    assert "setup sees HF_TOKEN=[redacted]" in submitit_out.read_text()
    # submitit's lines after the task returned were appended to the scrubbed file, not lost with an old inode.
    assert "completed successfully" in submitit_out.read_text() or "Exiting after successful completion" in \
        submitit_out.read_text() + (run_dir / "submitit" / f"{job_id}_0_log.err").read_text()
    after = launch_with_token("logs", run_dir, "--lines", "50")
    assert after.returncode == 0 and token not in after.stdout + after.stderr
