"""Every way a run ends gives one verdict (issue 35 §2): real 2-rank runs through the `launch` binary (gloo, CPU).

  - SIGTERM to one rank (a scheduler's preemption): the ranks checkpoint and stop; interrupted (130), never
    "every rank within budget", no model/, --resume offered;
  - SIGKILL of one rank while the ranks checkpoint every step: failed, the signal named, the checkpoint safe;
  - SIGKILL of `launch`: its ranks die with it within seconds, and `launch status` says it was killed;
  - stdout closed before the first line (`launch ... | head`): the run goes on to its verdict, and a --script
    rank's child does not outlive the finished run.

Each costs one launch (15-45 s on the 2-core machine); docs/reliability.md's "Faults tried" has the times.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil

from launcher.cli.main import main
from launcher.files.rundir import RunDir
from launcher.processes.procs import ProcessRef, process_alive
from tests.faults.test_fault_runs import ENV, LAUNCH, assert_no_secrets, job_file, steps

TRAIN = {"global_batch_size": 8, "precision": "fp32", "lr": 3e-3, "max_steps": 40}


def start(job: Path, run: Path, *extra: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([LAUNCH, str(job), "--run-dir", str(run), "--quiet", *extra], text=True, env=ENV,
                            **{"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, **kw})


def wait_until(cond, what: str, proc: subprocess.Popen, timeout_s: float = 180) -> None:
    t0 = time.monotonic()
    while not cond():
        assert proc.poll() is None, f"the run ended while waiting for {what}: {proc.communicate()}"
        assert time.monotonic() - t0 < timeout_s, f"timed out waiting for {what}"
        time.sleep(0.05)


def rank_procs(launch_pid: int) -> dict[int, psutil.Process]:
    """launch's rank processes by rank (torchrun's agent runs inside launch: they are its children)."""
    out = {}
    for child in psutil.Process(launch_pid).children():
        try:
            if "launcher.worker.rank_entry" in " ".join(child.cmdline()):
                out[int(child.environ()["RANK"])] = child
        except (psutil.Error, KeyError):
            continue
    return out


def living(procs) -> list[int]:
    return [p.pid for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def table_rows(out: str) -> dict[int, list[str]]:
    return {int(ln.split()[0]): ln.split() for ln in out.splitlines() if ln.split()[:1] in (["0"], ["1"])}


def test_sigterm_to_one_rank_is_an_interrupted_run_with_resume_offered(tmp_path):
    run = tmp_path / "run"
    proc = start(job_file(tmp_path, "preempt", train=TRAIN), run)
    wait_until(lambda: len(steps(run, 1)) >= 3, "rank 1 to train 3 steps", proc)
    rank_procs(proc.pid)[1].send_signal(signal.SIGTERM)  # what a preempting scheduler sends
    sent = time.monotonic()
    out, err = proc.communicate(timeout=180)
    print(f"SIGTERM to rank 1 to launch's exit: {time.monotonic() - sent:.1f} s")
    assert proc.returncode == 130, out + err
    report = json.loads((run / "report.json").read_text())
    assert (report["verdict"], report["within_budget"]) == ("interrupted", False), report
    rows = {r["rank"]: r for r in report["ranks"]}
    assert {(r["status"], r["verdict"], r["within_budget"]) for r in rows.values()} == {
        ("checkpointed", "interrupted", False)}
    assert rows[1]["stop_reason"] == "SIGTERM" and rows[1]["steps_done"] < 40
    assert all("interrupted" in row for row in table_rows(out).values()) and len(table_rows(out)) == 2, out
    assert "verdict: interrupted" in out and "every rank within budget" not in out
    state = json.loads((run / "state.json").read_text())
    assert state["state"] == "interrupted" and "rank 1 stopped on SIGTERM after step" in state["message"]
    tag = (run / "checkpoint" / "latest").read_text().strip()
    assert f"the ranks saved checkpoint {tag}" in err and f"--run-dir {run} --resume" in err, err
    assert not (run / "model").exists()  # only a completed run exports
    assert main(["status", str(run)]) == 0  # in-process: the same words from the run dir alone
    assert_no_secrets(run, out, err)


def test_sigkill_of_one_rank_mid_checkpoint_fails_the_run_and_names_the_signal(tmp_path, capsys):
    run = tmp_path / "run"
    proc = start(job_file(tmp_path, "killed", train={**TRAIN, "checkpoint_every_steps": 1}), run)
    wait_until(lambda: len(steps(run, 1)) >= 3, "rank 1 to train 3 steps", proc)
    ranks = rank_procs(proc.pid)
    ranks[1].send_signal(signal.SIGKILL)  # the OOM killer's way: no handler, no last word
    sent = time.monotonic()
    out, err = proc.communicate(timeout=180)
    stop_s = time.monotonic() - sent
    assert proc.returncode == 1, out + err
    assert "rank 1 on" in err and "was killed by SIGKILL (the OOM killer, a kill -9" in err, err
    report = json.loads((run / "report.json").read_text())
    rows = {r["rank"]: r for r in report["ranks"]}
    assert report["verdict"] == "failed" and not report["within_budget"]
    assert [(rows[r]["verdict"], rows[r]["within_budget"]) for r in (0, 1)] == [("failed", False)] * 2, rows
    assert rows[1]["status"] == "running" and rows[1]["ended"] == "killed by SIGKILL"
    last = [json.loads(ln) for ln in (run / "steps" / "rank-1.jsonl").read_text().splitlines() if ln.strip()][-1]
    assert rows[1]["steps_done"] == last["step"] and rows[1]["measured_peak_bytes"] >= last["mem_peak_bytes"]
    assert "failed" in table_rows(out)[1] and "every rank within budget" not in out
    assert json.loads((run / "state.json").read_text())["state"] == "failed"
    # The checkpoint stays safe: latest names one that every rank finished.
    tag = (run / "checkpoint" / "latest").read_text().strip()
    assert (run / "checkpoint" / tag / "trainer_state.json").is_file()
    time.sleep(1)
    assert living(ranks.values()) == []
    capsys.readouterr()
    assert main(["status", str(run)]) == 0
    assert "failed" in capsys.readouterr().out
    print(f"SIGKILL of rank 1 to launch's exit: {stop_s:.1f} s")  # after capsys's last read: -rP shows it


# Measures a little, starts a child that would sleep for minutes, then waits for the launch to go.
SLEEPER = """
import os, subprocess, sys, time
import torch
child = subprocess.Popen(["sleep", "300"])
open(os.path.join(sys.argv[1], f"child-{os.environ['RANK']}"), "w").write(str(child.pid))
x = torch.ones(250_000) * 2
time.sleep(float(sys.argv[2]))
"""


def test_sigkill_of_launch_takes_its_ranks_and_status_says_killed(tmp_path, capsys):
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    run = tmp_path / "run"
    proc = start(job_file(tmp_path, "orphans"), run, "--script", str(script), "--", str(tmp_path), "300")
    wait_until(lambda: len(RunDir(run).run_state().ranks) == 2 and all(
        (tmp_path / f"child-{r}").is_file() for r in (0, 1)), "both ranks recorded and running the script", proc)
    recorded = RunDir(run).run_state()
    ranks = rank_procs(proc.pid)
    assert sorted(r.pid for r in recorded.ranks) == sorted(p.pid for p in ranks.values())
    assert recorded.launch == ProcessRef.of(proc.pid)
    proc.kill()  # SIGKILL: no handler runs, nothing is written
    proc.wait()  # not communicate(): the children below hold the log redactors, which hold launch's stderr
    killed_at = time.monotonic()
    while living(ranks.values()) and time.monotonic() - killed_at < 10:
        time.sleep(0.05)
    gone_s = time.monotonic() - killed_at
    assert living(ranks.values()) == [] and gone_s < 5
    assert json.loads((run / "state.json").read_text())["state"] == "running"  # what launch last wrote
    assert main(["status", str(run)]) == 0
    out = capsys.readouterr().out
    assert f"local run {run}: killed\n" in out and f"launch process {proc.pid} is gone" in out, out
    assert "its ranks are gone too" in out and "rank 0: killed" in out and "running" not in out
    RunDir(run).refuse_if_live(overwrite=True)  # nothing of it runs: the dir may be taken again
    for r in (0, 1):  # a child of a SIGKILLed rank is not covered (docs/reliability/verdicts.md): end it here
        pid = int((tmp_path / f"child-{r}").read_text())
        if process_alive(pid, None):
            os.kill(pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    print(f"ranks gone {gone_s:.2f} s after SIGKILL of launch")  # after capsys's last read: -rP shows it


def test_a_closed_stdout_does_not_stop_the_run_and_a_scripts_child_does_not_outlive_it(tmp_path):
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    run = tmp_path / "run"
    r, w = os.pipe()
    os.close(r)  # `launch ... | head` whose head is gone before the first line
    proc = start(job_file(tmp_path, "piped"), run, "--script", str(script), "--", str(tmp_path), "0", stdout=w)
    os.close(w)
    t0 = time.monotonic()
    _, err = proc.communicate(timeout=300)
    print(f"a run with stdout closed: {time.monotonic() - t0:.1f} s to its verdict")
    assert proc.returncode == 0, err
    assert "stdout was closed at" in err and "Traceback" not in err, err
    assert json.loads((run / "state.json").read_text())["state"] == "completed"
    report = json.loads((run / "report.json").read_text())
    assert report["verdict"] == "within_budget" and all(r["verdict"] == "ok" for r in report["ranks"])
    children = [int((tmp_path / f"child-{r}").read_text()) for r in (0, 1)]
    assert not [pid for pid in children if process_alive(pid, None)], "a rank's child outlived the run"
