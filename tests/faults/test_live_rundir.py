"""A live run's dir through the real CLI (2 CPU ranks, gloo): `plan --out` into it is refused, and a plan.json
replaced behind the launcher's back anyway is refused by the ranks, which read only the plan of their attempt."""

from __future__ import annotations

import hashlib
import json
import subprocess
import time

from tests.faults.test_fault_runs import ENV, LAUNCH, job_file, launch

SCRIPT = """
import pathlib, sys, time
from launcher.runtime import load_plan
from launcher.processes.rankenv import rank_info

gate, rank = pathlib.Path(sys.argv[1]), rank_info()[0]
print("ready", flush=True)
for step in ("first", "second"):
    while not (gate / step).exists():
        time.sleep(0.1)
    plan = load_plan()  # $LAUNCHER_PLAN, checked against $LAUNCHER_PLAN_SHA256
    print(f"{step} read: {plan.strategy.label()}", flush=True)
    (gate / f"{step}-{rank}").touch()
"""


def wait_for(cond, what: str, proc, timeout_s: float = 180) -> None:
    t0 = time.monotonic()
    while not cond():
        assert proc.poll() is None, f"the run ended while waiting for {what}: {proc.communicate()}"
        assert time.monotonic() - t0 < timeout_s, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_a_live_run_dir_keeps_its_plan(tmp_path):
    script = tmp_path / "reads_plan.py"
    script.write_text(SCRIPT)
    gate = tmp_path / "gate"
    gate.mkdir()
    job = job_file(tmp_path, "live")
    other = job_file(tmp_path, "other", strategy={"engine": "deepspeed", "zero_stage": 0}, train={
        "global_batch_size": 8, "precision": "fp32", "lr": 3e-3, "max_steps": 20})
    run = tmp_path / "run"
    proc = subprocess.Popen([LAUNCH, str(job), "--run-dir", str(run), "--quiet", "--script", str(script), "--",
                             str(gate)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        logs = [run / "logs" / f"rank-{r}.log" for r in (0, 1)]
        wait_for(lambda: all(p.exists() and "ready" in p.read_text() for p in logs), "the ranks", proc)
        planned = (run / "plan.json").read_bytes()
        # Another `plan --out` into the live run dir: refused at once, nothing replaced.
        second = launch("plan", other, "--out", run, timeout=120)
        assert second.returncode == 2, second.stdout + second.stderr
        assert "is in use by launch process" in second.stderr and "Traceback" not in second.stderr
        assert (run / "plan.json").read_bytes() == planned and not (run / "ds_config.json").exists()
        (gate / "first").touch()
        wait_for(lambda: (gate / "first-0").exists() and (gate / "first-1").exists(), "the first read", proc)
        # Someone rewrites plan.json anyway (an editor, a tool that ignores the lock): the ranks refuse it.
        data = json.loads(planned)
        data["micro_batch_size"] = 1
        (run / "plan.json").write_text(json.dumps(data, indent=2) + "\n")
        (gate / "second").touch()
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1, out + err
    texts = [log.read_text() for log in logs]
    for text in texts:
        assert "first read: " in text and "second read" not in text, text
    # The first rank to refuse ends the run: torchrun stops the other, which may not have got to its own refusal.
    assert any("this plan.json is not the one the launcher wrote for this run" in t for t in texts), texts
    assert not any((gate / f"second-{r}").exists() for r in (0, 1))
    report = json.loads((run / "report.json").read_text())
    assert report["plan_sha256"] == hashlib.sha256(planned).hexdigest() and report["outcome"]["ok"] is False
