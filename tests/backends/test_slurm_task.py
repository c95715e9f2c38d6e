import dataclasses
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from launcher.backends import slurm_task
from launcher.backends.slurm_task import (
    SlurmTask,
    outcome_from_results,
    ranks_shielded_from,
    wait_for_ranks,
)
from launcher.files.rundir import RunDir
from tests.slurm_fixtures import plan_text


def make_run(tmp_path) -> RunDir:
    run = RunDir(tmp_path)
    for d in (run.ranks, run.steps, run.logs, run.control, run.checkpoint):
        d.mkdir(parents=True, exist_ok=True)
    return run


def write_rank(run: RunDir, rank: int, status: str) -> None:
    (run.ranks / f"rank-{rank}.json").write_text(json.dumps({"rank": rank, "status": status}))


@pytest.fixture
def task(tmp_path):
    return SlurmTask(run_dir=str(tmp_path), nodes=1, gpus_per_node=2, max_requeues=2, signal_delay_s=30)


@pytest.fixture
def no_slurm(monkeypatch):
    """checkpoint() outside a job: no end time to read, ranks 'save' instantly, SIGTERM restored after."""
    monkeypatch.setattr(slurm_task, "job_end_time", lambda: None)
    old = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, old)


def test_checkpoint_asks_the_ranks_then_requeues_with_one_more_count(tmp_path, task, no_slurm, monkeypatch):
    run = make_run(tmp_path)
    (run.checkpoint / "latest").write_text("step-00000007\n")
    seen = {}

    def ranks_save(run_, world, since, budget_s):
        seen["control_file"] = (run_.control / "checkpoint").exists()
        seen["budget_s"] = budget_s
        for r in range(world):
            write_rank(run_, r, "checkpointed")
        return True

    monkeypatch.setattr(slurm_task, "wait_for_ranks", ranks_save)
    task.started_at_s = time.time() - 1
    delayed = task.checkpoint()
    assert seen == {"control_file": True, "budget_s": 27.0}  # signal_delay_s less the 3 s margin, no end time
    assert not (run.control / "checkpoint").exists()  # the resumed run must not stop at once
    assert delayed.function.requeues == 1 and delayed.function.run_dir == task.run_dir
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN  # scontrol requeue's SIGTERM must not end us early
    row = json.loads((tmp_path / "requeues.jsonl").read_text())
    assert row["decision"] == "requeue" and row["checkpoint"] == "step-00000007" and row["requeue"] == 1
    assert row["ranks"] == {"0": "checkpointed", "1": "checkpointed"}


def test_checkpoint_stops_requeueing_at_max_requeues(tmp_path, task, no_slurm, monkeypatch):
    make_run(tmp_path)
    monkeypatch.setattr(slurm_task, "wait_for_ranks", lambda *a: True)
    task.requeues = 2
    assert task.checkpoint() is None and task.decision == "limit"


def test_zero_max_requeues_never_requeues(tmp_path, no_slurm, monkeypatch):
    make_run(tmp_path)
    monkeypatch.setattr(slurm_task, "wait_for_ranks", lambda *a: True)
    t = SlurmTask(run_dir=str(tmp_path), nodes=1, gpus_per_node=1, max_requeues=0)
    assert t.checkpoint() is None


def test_no_requeue_when_the_run_completed_as_the_signal_came(tmp_path, task, no_slurm, monkeypatch):
    run = make_run(tmp_path)

    def completed(run_, world, since, budget_s):
        for r in range(world):
            write_rank(run_, r, "completed")
        return True

    monkeypatch.setattr(slurm_task, "wait_for_ranks", completed)
    task.started_at_s = time.time() - 1
    assert task.checkpoint() is None and task.decision == "completed"
    assert json.loads((run.path / "requeues.jsonl").read_text())["decision"] == "completed"


def test_budget_runs_to_the_job_end_time(monkeypatch):
    monkeypatch.setattr(slurm_task, "job_end_time", lambda: time.time() + 40)
    assert 36 < slurm_task.checkpoint_budget_s(90) <= 37
    monkeypatch.setattr(slurm_task, "job_end_time", lambda: time.time() + 2)
    assert slurm_task.checkpoint_budget_s(90) == 5.0


def test_rank_statuses_of_this_attempt_only(tmp_path):
    run = make_run(tmp_path)
    write_rank(run, 0, "checkpointed")
    old = time.time() - 100
    os.utime(run.ranks / "rank-0.json", (old, old))
    write_rank(run, 1, "completed")
    (run.ranks / "rank-2.json").write_text('{"status": "comp')  # torn: a rank killed while writing
    assert run.rank_statuses(2) == {0: "checkpointed", 1: "completed"}
    assert run.rank_statuses(3) == {0: "checkpointed", 1: "completed"}
    assert run.rank_statuses(2, since=time.time() - 10) == {1: "completed"}


def test_wait_for_rank_files_waits_for_final_statuses_only(tmp_path):
    run = make_run(tmp_path)
    write_rank(run, 0, "completed")
    write_rank(run, 1, "running")
    t0 = time.monotonic()
    assert run.wait_for_rank_files(2, timeout_s=0.5, poll_s=0.1) is False
    assert time.monotonic() - t0 >= 0.5
    write_rank(run, 1, "oom")
    assert run.wait_for_rank_files(2, timeout_s=5) is True


def test_wait_for_ranks_gives_up_soon_after_the_local_ranks_are_gone(tmp_path):
    run = make_run(tmp_path)  # no rank ever writes: they died before saving
    t0 = time.monotonic()
    assert wait_for_ranks(run, 2, since=time.time(), budget_s=30, grace_s=0.3) is True
    assert time.monotonic() - t0 < 5


def test_wait_for_ranks_waits_while_a_local_rank_lives_then_for_the_final_files(tmp_path, monkeypatch):
    """A live rank process (here a child that saves, i.e. writes its file, and exits after 1 s) holds the wait."""
    import psutil

    from launcher.backends import local

    run = make_run(tmp_path)
    write_rank(run, 1, "checkpointed")
    rank0 = subprocess.Popen([sys.executable, "-c", "import json, sys, time; time.sleep(1); "
                              "open(sys.argv[1], 'w').write(json.dumps({'rank': 0, 'status': 'checkpointed'}))",
                              str(run.ranks / "rank-0.json")])
    monkeypatch.setattr(local, "rank_processes", lambda: {0: psutil.Process(rank0.pid)})
    t0 = time.monotonic()
    try:
        assert wait_for_ranks(run, 2, since=time.time() - 5, budget_s=30, grace_s=10) is True
    finally:
        rank0.wait(timeout=10)
    waited = time.monotonic() - t0
    assert 0.8 < waited < 5, waited  # held by the live rank, released by its final file (not the 10 s grace)
    assert run.rank_statuses(2) == {0: "checkpointed", 1: "checkpointed"}


def test_ranks_start_with_usr2_blocked_while_this_process_still_handles_it():
    got = []
    old = signal.signal(signal.SIGUSR2, lambda s, f: got.append(s))
    try:
        with ranks_shielded_from(signal.SIGUSR2):
            child = subprocess.run([sys.executable, "-c", "print(open('/proc/self/status').read())"],
                                   capture_output=True, text=True, check=True).stdout
            os.kill(os.getpid(), signal.SIGUSR2)
            deadline = time.monotonic() + 5
            while not got and time.monotonic() < deadline:
                time.sleep(0.01)
        blocked = int(next(ln for ln in child.splitlines() if ln.startswith("SigBlk:")).split()[1], 16)
        assert blocked & (1 << (signal.SIGUSR2 - 1)), "the child must inherit a blocked USR2"
        assert got == [signal.SIGUSR2], "this process must still run its handler"
        assert signal.SIGUSR2 not in signal.pthread_sigmask(signal.SIG_BLOCK, set())  # mask restored
    finally:
        signal.signal(signal.SIGUSR2, old)


def test_outcome_merges_the_nodes():
    ok = {"node_rank": 0, "ok": True, "interrupted": False, "message": "", "failures": []}
    bad = {"node_rank": 1, "ok": False, "interrupted": False, "message": "boom",
           "failures": [{"rank": 3, "exitcode": 75, "host": "node2"}]}
    out = outcome_from_results([ok, bad])
    assert not out.ok and out.message == "boom" and out.failures[0].rank == 3 and out.failures[0].exitcode == 75
    assert outcome_from_results([ok, ok]).ok


def test_the_task_pickles_by_reference_to_the_launcher_package():
    import cloudpickle

    data = cloudpickle.dumps(SlurmTask(run_dir="/r", nodes=2, gpus_per_node=1))
    assert b"launcher.backends.slurm_task" in data  # importable in the job, not pickled by value


def test_a_job_of_the_wrong_shape_fails_at_once(tmp_path, monkeypatch):
    from launcher.backends.slurm_rdzv import RendezvousError

    make_run(tmp_path)
    for k, v in {"SLURM_JOB_NUM_NODES": "1", "SLURM_NODEID": "0", "SLURM_NTASKS": "1", "SLURM_JOB_ID": "5",
                 "SLURM_JOB_NODELIST": "node1"}.items():
        monkeypatch.setenv(k, v)
    (tmp_path / "plan.json").write_text(plan_text(nodes=2, gpus_per_node=1))
    task = SlurmTask(run_dir=str(tmp_path), nodes=2, gpus_per_node=1)
    t0 = time.monotonic()
    with pytest.raises(RendezvousError, match="SLURM_JOB_NUM_NODES: Slurm allocated 1 node.s. but the plan is for 2"):
        task()
    assert time.monotonic() - t0 < 5


def test_the_plan_in_the_run_dir_is_what_slurm_must_match(tmp_path):
    """The world size to check comes from plan.json, not from the task (where it is nodes x GPUs by definition)."""
    run = make_run(tmp_path)
    slurm_env = {"SLURM_JOB_NUM_NODES": "1", "SLURM_NTASKS": "1", "SLURM_TASKS_PER_NODE": "1",
                 "SLURM_GPUS_ON_NODE": "2", "SLURMD_NODENAME": "node1"}
    task = SlurmTask(run_dir=str(tmp_path), nodes=1, gpus_per_node=2)
    (tmp_path / "plan.json").write_text(plan_text(nodes=1, gpus_per_node=2))
    assert task.shape_problems(run, slurm_env) == []
    # Re-planned after submission for 4 ranks; the job Slurm runs still has 2 GPUs.
    (tmp_path / "plan.json").write_text(plan_text(nodes=1, gpus_per_node=4))
    text = "\n".join(task.shape_problems(run, slurm_env))
    assert "plan.json: 1 node(s) x 4 GPU(s) but this job was submitted for 1 x 2" in text
    assert "world size: Slurm gave 1 node(s) x 2 GPU(s) = 2 rank(s), but the plan needs 1 x 4 = 4" in text
    # A plan.json whose world size is not its own nodes x GPUs.
    (tmp_path / "plan.json").write_text(plan_text(nodes=1, gpus_per_node=2, world_size=3))
    problems = "\n".join(task.shape_problems(run, slurm_env))
    assert "plan.json: world_size 3 but nodes x gpus_per_node = 1 x 2 = 2" in problems


def test_attempt_state_lives_on_the_task_and_a_requeued_copy_starts_fresh(tmp_path, task, no_slurm, monkeypatch):
    """The hook's decision is the interrupted task's own state (no module global); the requeue's copy is clean."""
    make_run(tmp_path)
    monkeypatch.setattr(slurm_task, "wait_for_ranks", lambda *a: True)
    other = dataclasses.replace(task)
    task.started_at_s = time.time() - 1
    delayed = task.checkpoint()
    assert task.decision == "requeue" and other.decision is None
    assert delayed.function.decision is None and delayed.function.started_at_s == 0.0
    assert not hasattr(slurm_task, "_attempt")
