"""launch status / logs / cancel against a hand-made run dir, with sacct and scancel mocked."""

from __future__ import annotations

import json

import pytest

from launcher.backends import slurm_state
from launcher.backends.slurm_state import SlurmRecord, SweepRow, read_slurm_json
from launcher.cli import manage
from launcher.cli.main import main
from launcher.files.rundir import MARKER
from tests.slurm_fixtures import plan_text

SACCT = """JobID|JobName|State|ExitCode|Elapsed|NodeList|Start|End
77|t|REQUEUED|0:0|00:00:49|node[1-2]|x|y
77|t|RUNNING|0:0|00:00:10|node[1-2]|x|Unknown
77.batch|batch|RUNNING|0:0|00:00:10|node1|x|Unknown
77.0|python3|RUNNING|0:0|00:00:10|node[1-2]|x|Unknown
"""


@pytest.fixture
def run_dir(tmp_path):
    d = tmp_path / "run"
    for sub in ("ranks", "steps", "logs", "rdzv/77-1"):
        (d / sub).mkdir(parents=True)
    (d / MARKER).write_text("")  # a run dir launch made
    (d / "plan.json").write_text(plan_text(nodes=2, gpus_per_node=1))
    (d / "slurm.json").write_text(json.dumps(SlurmRecord(
        kind="job", job_id="77", job_ids=["77"], submitit_folder=str(d / "submitit"), submitted_at=0.0, nodes=2,
        gpus_per_node=1, timeout_min=60, signal_delay_s=90, max_requeues=3).to_json()))
    (d / "state.json").write_text(json.dumps({"state": "running"}))
    (d / "steps" / "rank-0.jsonl").write_text(json.dumps({"step": 3, "loss": 6.5}) + "\n")
    (d / "logs" / "rank-0.log").write_text("".join(f"line {i}\n" for i in range(50)))
    (d / "logs" / "rank-1.log").write_text("rank one\n")
    (d / "rdzv" / "77-1" / "node-1.json").write_text(json.dumps({"node_name": "node2"}))
    requeue = {"time": 0, "attempt": 0, "decision": "requeue", "checkpoint": "step-00000002",
               "ranks": {"0": "checkpointed"}}
    (d / "requeues.jsonl").write_text(json.dumps(requeue) + "\n")
    return d


@pytest.fixture
def sacct(monkeypatch):
    calls = []
    text = {"out": SACCT}

    def run(argv):
        calls.append(argv)
        return text["out"]

    monkeypatch.setattr(slurm_state, "_run", run)
    monkeypatch.setattr(slurm_state.sacct_rows, "__defaults__", (run,))
    return text


def test_status_per_task_and_rank(run_dir, sacct, capsys):
    assert main(["status", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "slurm job 77: RUNNING (requeued 1x)" in out
    assert "77.0" in out and "node[1-2]" in out
    assert "tasks (submitit): 0: result none; 1 on node2: result none" in out
    assert "rank 0: training, step 3 loss 6.5000" in out and "rank 1: starting" in out
    assert "requeue, checkpoint step-00000002" in out


def test_status_json(run_dir, sacct, capsys):
    assert main(["status", str(run_dir), "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    assert st["state"] == "RUNNING" and st["requeued"] == 1 and len(st["tasks"]) == 2
    assert [r["state"] for r in st["ranks"]] == ["training", "starting"]


def test_status_of_a_dir_that_is_no_run_dir(tmp_path, capsys):
    assert main(["status", str(tmp_path)]) == 2
    assert "holds no state.json, plan.json or slurm.json" in capsys.readouterr().err


def test_slurm_status_shows_the_progress_line(run_dir, sacct, capsys):
    (run_dir / "job.yaml").write_text("train:\n  max_steps: 6\n")
    assert main(["status", str(run_dir)]) == 0
    assert "progress: step 0/6 (0%), last loss 6.5000" in capsys.readouterr().out  # rank 1 has no step yet


def step(n: int, t: float, **extra) -> str:
    return json.dumps({"step": n, "time": t, "mem_peak_bytes": 300_000_000, "attempt": 0, **extra}) + "\n"


@pytest.fixture
def local_run(tmp_path):
    """A local run dir as launch run leaves it mid-run: no slurm.json; state.json running with launch's pid."""
    d = tmp_path / "local"
    for sub in ("ranks", "steps", "logs"):
        (d / sub).mkdir(parents=True)
    (d / "plan.json").write_text(plan_text(nodes=1, gpus_per_node=2, budget_bytes=10**9))
    (d / "state.json").write_text(json.dumps({"state": "running", "pid": 4242}))
    (d / "ranks" / "rank-0.json").write_text(json.dumps({"status": "running", "total_steps": 6}))
    (d / "steps" / "rank-0.jsonl").write_text(step(1, 10.0, loss=7.0) + step(2, 12.0) + step(3, 14.0, loss=6.25))
    (d / "steps" / "rank-1.jsonl").write_text(step(1, 10.0) + step(2, 12.0, mem_peak_bytes=450_000_000))
    (d / "logs" / "rank-0.log").write_text("".join(f"line {i}\n" for i in range(50)))
    (d / "logs" / "rank-1.log").write_text("rank one\n")
    return d


def test_local_status_says_state_progress_loss_and_peak_against_budget(local_run, capsys, monkeypatch):
    monkeypatch.setattr("launcher.processes.procs.process_alive", lambda pid, started: pid == 4242)
    assert main(["status", str(local_run)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"local run {local_run}: running (launch pid 4242)")
    # The slowest rank's step; rank 0's loss; the highest peak of any rank; 2 s a step since step 1, 4 to go.
    assert "progress: step 2/6 (33%), last loss 6.2500, peak memory so far 450.00 MB of 1.00 GB budget (45%), " \
           "ETA 8 s" in out
    assert "rank 0: running, step 3, peak 300.00 MB" in out and "rank 1: training, step 2" in out
    assert main(["status", str(local_run), "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    assert st["kind"] == "local" and st["progress"]["total_steps"] == 6 and st["progress"]["peak_bytes"] == 450_000_000


def test_local_status_of_a_launch_that_died_and_of_a_finished_run(local_run, capsys, monkeypatch):
    monkeypatch.setattr("launcher.processes.procs.process_alive", lambda pid, started: False)
    assert main(["status", str(local_run)]) == 0
    out = capsys.readouterr().out
    # Killed (SIGKILL, the OOM killer): never "running", and its ranks' own "running" was cut short with it.
    assert f"local run {local_run}: killed\n" in out
    assert "launch process 4242 is gone and never wrote how the run ended: it was killed" in out
    assert "its ranks are gone too" in out and "rank 0: killed, step 3" in out
    assert "no checkpoint was saved, so --resume cannot continue it" in out and "--overwrite" in out
    (local_run / "checkpoint").mkdir()
    (local_run / "checkpoint" / "latest").write_text("step-00000002\n")
    assert main(["status", str(local_run)]) == 0
    out = capsys.readouterr().out
    assert f"continue it with the same job file and --run-dir {local_run} --resume" in out, out
    (local_run / "state.json").write_text(json.dumps({"state": "completed"}))
    (local_run / "report.json").write_text(json.dumps({"verdict": "within_budget", "eval_loss": 0.5,
                                                       "eval_accuracy": 0.75}))
    assert main(["status", str(local_run)]) == 0
    out = capsys.readouterr().out
    assert ": completed" in out and "verdict: within_budget; eval loss 0.5000, eval accuracy 75.0% (report.json)" in out


def test_local_status_gives_each_rank_its_verdict_from_the_report(local_run, capsys):
    """A rank whose file still says running when the run has ended died: status shows the report's verdict beside
    it (failed, with its signal), as the table did, never a bare "running"."""
    (local_run / "state.json").write_text(json.dumps({"state": "failed", "message": "rank(s) ended with failed"}))
    (local_run / "report.json").write_text(json.dumps({"verdict": "failed", "ranks": [
        {"rank": 0, "status": "running", "verdict": "failed", "ended": "killed by SIGKILL"},
        {"rank": 1, "status": "failed", "verdict": "failed", "ended": "killed by SIGTERM"}]}))
    assert main(["status", str(local_run)]) == 0
    out = capsys.readouterr().out
    assert f"local run {local_run}: failed\n" in out and "verdict: failed (report.json)" in out
    assert "rank 0: running, step 3, peak 300.00 MB; verdict failed (killed by SIGKILL)" in out, out


def test_local_logs_tail_and_follow_until_the_launch_ends(local_run, capsys, monkeypatch):
    assert main(["logs", str(local_run), "--lines", "2"]) == 0
    out = capsys.readouterr().out
    assert "==> rank 0:" in out and "line 49" in out and "line 47" not in out and "rank one" in out
    assert "submitit" not in out
    assert main(["logs", str(local_run), "--rank", "2"]) == 2
    assert "--rank: 2 is not a rank of this run (0..1)" in capsys.readouterr().err
    log, polls = local_run / "logs" / "rank-1.log", {"n": 0}
    alive = {"v": True}
    monkeypatch.setattr("launcher.processes.procs.process_alive", lambda pid, started: alive["v"])

    def sleep(_s):
        polls["n"] += 1
        if polls["n"] == 1:
            log.write_text(log.read_text() + "step 3\n")
        if polls["n"] == 2:
            alive["v"] = False  # the launch ended
        assert polls["n"] < 20, "follow did not stop after the launch ended"

    monkeypatch.setattr(manage.time, "sleep", sleep)
    monkeypatch.setattr(manage.follow, "__defaults__", (0, 0))
    assert main(["logs", str(local_run), "--rank", "1", "--follow"]) == 0
    assert capsys.readouterr().out.endswith("[rank 1] step 3\n")


def test_cancel_of_a_local_run_says_how_to_stop_it(local_run, capsys, monkeypatch):
    monkeypatch.setattr("launcher.processes.procs.process_alive", lambda pid, started: True)
    assert main(["cancel", str(local_run)]) == 2
    assert "is a local run, not a Slurm job; stop it with kill -INT 4242" in capsys.readouterr().err


def test_logs_tails_ranks_and_submitit(run_dir, sacct, capsys):
    assert main(["logs", str(run_dir), "--lines", "3"]) == 0
    out = capsys.readouterr().out
    assert "==> rank 0:" in out and "line 49" in out and "line 46" not in out
    assert "==> rank 1:" in out and "rank one" in out
    assert "==> submitit task 1 stderr:" in out and "(not written yet)" in out


def test_logs_one_rank_and_a_wrong_rank(run_dir, sacct, capsys):
    assert main(["logs", str(run_dir), "--rank", "1"]) == 0
    out = capsys.readouterr().out
    assert "rank one" in out and "==> rank 0" not in out
    assert main(["logs", str(run_dir), "--rank", "5"]) == 2
    assert "--rank: 5 is not a rank of this run (0..1)" in capsys.readouterr().err


def test_follow_prints_whole_new_lines_and_stops_when_the_job_ends(run_dir, sacct, capsys, monkeypatch):
    log = run_dir / "logs" / "rank-1.log"
    polls = {"n": 0}

    def sleep(_s):
        polls["n"] += 1
        if polls["n"] == 1:
            log.write_text(log.read_text() + "new line\npartial")
        if polls["n"] == 2:
            sacct["out"] = SACCT.replace("RUNNING", "COMPLETED")
        assert polls["n"] < 20, "follow did not stop after the job ended"

    monkeypatch.setattr(manage.time, "sleep", sleep)
    rec = read_slurm_json(run_dir)
    manage.follow([("rank 1", log)], rec, poll_s=0, check_every_s=0)
    out = capsys.readouterr().out
    assert out == "[rank 1] new line\n"  # the partial line waits for its newline


def test_logs_never_print_a_secret_the_live_files_still_hold(run_dir, sacct, capsys, monkeypatch):
    token = "hf_fakeLiveToken1234567890"
    monkeypatch.setenv("HF_TOKEN", token)
    (run_dir / "logs" / "rank-0.log").write_text(f"logging in with {token}\n")
    (run_dir / "submitit").mkdir()
    (run_dir / "submitit" / "77_0_log.out").write_text(f"setup: HF_TOKEN={token}\n")
    assert main(["logs", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert token not in out
    assert "logging in with [redacted]" in out and "setup: HF_TOKEN=[redacted]" in out
    assert token in (run_dir / "logs" / "rank-0.log").read_text()  # the file is the job's until it ends

    log = run_dir / "logs" / "rank-1.log"
    polls = {"n": 0}

    def sleep(_s):
        polls["n"] += 1
        if polls["n"] == 1:
            log.write_text(log.read_text() + f"token {token} again\n")
        if polls["n"] == 2:
            sacct["out"] = SACCT.replace("RUNNING", "COMPLETED")
        assert polls["n"] < 20

    monkeypatch.setattr(manage.time, "sleep", sleep)
    manage.follow([("rank 1", log)], read_slurm_json(run_dir), poll_s=0, check_every_s=0)
    assert capsys.readouterr().out == "[rank 1] token [redacted] again\n"


def test_cancel_scancels_and_waits_for_cancelled(run_dir, sacct, capsys, monkeypatch):
    import subprocess

    sent = []

    def check_call(argv, shell=False):
        sent.append(argv)
        sacct["out"] = SACCT.replace("RUNNING", "CANCELLED by 0")
        return 0

    monkeypatch.setattr(subprocess, "check_call", check_call)
    assert main(["cancel", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert sent == [["scancel", "77"]]
    assert "slurm job 77: CANCELLED by 0" in out
    assert json.loads((run_dir / "state.json").read_text())["state"] == "cancelled"


def test_cancel_marks_only_the_variant_dirs_launch_made(run_dir, sacct, capsys, monkeypatch):
    # slurm.json is a file in the run dir: a variant path it names that launch did not make (no marker) gets no
    # state.json, whatever slurm.json says.
    import subprocess

    made, foreign = run_dir / "variants" / "0-a", run_dir.parent / "colleague"
    made.mkdir(parents=True)
    (made / MARKER).write_text("")
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    rec = SlurmRecord.from_json(json.loads((run_dir / "slurm.json").read_text()))
    rec.kind, rec.variants = "array", [
        SweepRow(index=i, name=n, overrides={}, run_dir=str(p), job_id=f"77_{i}", plan="ZeRO-2", predicted_peak_bytes=1)
        for i, (n, p) in enumerate((("a", made), ("b", foreign)))]
    (run_dir / "slurm.json").write_text(json.dumps(rec.to_json()))

    def check_call(argv, shell=False):
        sacct["out"] = SACCT.replace("RUNNING", "CANCELLED by 0")
        return 0

    monkeypatch.setattr(subprocess, "check_call", check_call)
    assert main(["cancel", str(run_dir)]) == 0
    assert json.loads((made / "state.json").read_text())["state"] == "cancelled"
    assert sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]
    assert "colleague' was not made by launch" in capsys.readouterr().err


def test_cancel_of_a_finished_job_does_nothing(run_dir, sacct, capsys, monkeypatch):
    import subprocess

    monkeypatch.setattr(subprocess, "check_call", lambda *a, **k: pytest.fail("scancel must not run"))
    sacct["out"] = SACCT.replace("RUNNING", "COMPLETED")
    assert main(["cancel", str(run_dir)]) == 0
    assert "already ended: COMPLETED; nothing to cancel" in capsys.readouterr().out


def test_logs_of_an_array_root_names_the_variants(tmp_path, capsys):
    row = SweepRow(index=0, name="a", overrides={}, run_dir="/r/variants/0-a", job_id="5_0", plan="ZeRO-2",
                   predicted_peak_bytes=1)
    (tmp_path / "slurm.json").write_text(json.dumps(SlurmRecord(
        kind="array", job_id="5", job_ids=["5_0"], submitit_folder=str(tmp_path / "submitit"), submitted_at=0.0,
        nodes=1, gpus_per_node=1, timeout_min=60, signal_delay_s=90, max_requeues=3, variants=[row]).to_json()))
    assert main(["logs", str(tmp_path)]) == 2
    assert "is an array; give one variant's run dir: /r/variants/0-a" in capsys.readouterr().err
