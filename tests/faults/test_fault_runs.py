"""Faults injected into real multi-rank runs (gloo, CPU ranks) through the `launch` binary.

Each test costs one to two real launches (~15-30 s each on a 2-core machine), so each checks several things:
  - an OOM at micro-batch 8 under --enforce: the ladder relaunches and ends within budget, same global batch;
  - a rank that never reaches a collective: --hang-timeout names it, no process is left, and meanwhile a second
    launch on the same run dir is refused;
  - SIGINT to a job with checkpoint_on_interrupt: true: the ranks checkpoint, --resume continues, no step repeats;
  - in all of them, fake secrets in the environment appear in no file of the run dir and in no output.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import yaml

from launcher.files.redact import REDACTED
from tests.conftest import REPO, TINY_GPT2

LAUNCH = str(REPO / ".venv" / "bin" / "launch")
SECRETS = {"HF_TOKEN": "hf_FAKE_SECRET_123", "MY_API_KEY": "sk-fake-api-key-456",
           "DATABASE_PASSWORD": "correct-horse-battery"}
ENV = {**os.environ, **SECRETS}


def job_file(tmp_path: Path, name: str, **over) -> Path:
    job = {
        "name": name, "model": dict(TINY_GPT2), "task": "causal_lm",
        "data": {"path": str(REPO / "examples" / "data" / "causal.jsonl"), "max_seq_len": 64},
        "train": {"global_batch_size": 8, "precision": "fp32", "lr": 3e-3, "max_steps": 8},
        "gpus": 2, "budget": "1GB",
    }
    job.update(over)
    p = tmp_path / f"{name}.yaml"
    p.write_text(yaml.safe_dump(job, sort_keys=False))
    return p


def launch(*argv, timeout=420) -> subprocess.CompletedProcess:
    return subprocess.run([LAUNCH, *map(str, argv)], capture_output=True, text=True, timeout=timeout, env=ENV)


def steps(run_dir: Path, rank: int = 0) -> list[int]:
    p = run_dir / "steps" / f"rank-{rank}.jsonl"
    if not p.exists():
        return []
    return [json.loads(ln)["step"] for ln in p.read_text().splitlines() if ln.strip().endswith("}")]


def assert_no_secrets(run_dir: Path, *outputs: str) -> None:
    for p in run_dir.rglob("*"):
        if p.is_file():
            data = p.read_bytes()
            for name, value in SECRETS.items():
                assert value.encode() not in data, f"{name}'s value is in {p}"
    for text in outputs:
        for name, value in SECRETS.items():
            assert value not in text, f"{name}'s value is in the output"


def alive(pattern: str) -> list[str]:
    return subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.split()


# -- 1. the OOM ladder --------------------------------------------------------------------------------------------

def test_oom_at_micro_batch_8_falls_back_and_ends_within_budget(tmp_path):
    """Tiny GPT-2 at seq 128, global batch 16 on 2 ranks, budget 16 MB enforced by the probe: micro-batch 8 is
    predicted at 36 MB and crosses the cap in the first forward; the ladder's next rung (micro-batch 2 x 4
    accumulation, predicted 10.5 MB) runs to the end within budget."""
    # The exact levers pinned off as well: with chunked loss free the ladder's rung would be micro-batch 4.
    pins = {"engine": "fsdp", "fsdp_reshard_after_forward": False, "offload_optimizer": "none",
            "offload_params": "none", "micro_batch_size": 8, "activation_checkpointing": False,
            "loss_chunks": 0, "activation_offload": False, "optimizer_in_backward": False}
    job = job_file(tmp_path, "ladder", strategy=pins, budget="16MB",
                   data={"path": str(REPO / "examples" / "data" / "causal.jsonl"), "max_seq_len": 128},
                   # bf16: the predictions above (and the rung the ladder takes) are bf16 figures.
                   train={"global_batch_size": 16, "precision": "bf16", "lr": 1e-3, "max_steps": 2})
    run = tmp_path / "run"
    res = launch(job, "--run-dir", run, "--quiet", "--enforce", "--force", "--auto-fallback", "3")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "rank 0 on" in res.stderr and "ran out of memory" in res.stderr
    assert "launch: auto-fallback 1/3: " in res.stderr and "micro-batch 8 -> 2" in res.stderr
    assert "ended within budget on attempt 2" in res.stderr

    report = json.loads((run / "report.json").read_text())
    attempts = report["attempts"]
    assert [a["outcome"] for a in attempts] == ["oom", "ok"], attempts
    first, last = attempts[0], attempts[-1]
    assert first["strategy"]["micro_batch_size"] == 8 and first["oom"]["phase"] == "forward"
    assert first["measured_peak_bytes"] > first["budget_bytes"] == 16_000_000
    assert first["next"]["rung"] == "micro_batch" and first["next"]["label"] == last["label"]
    assert first["dir"] == "attempts/1" and last["dir"] == "."
    for a in attempts:  # the global batch never changes
        s = a["strategy"]
        assert a["global_batch_size"] == 16 == s["micro_batch_size"] * s["grad_accum_steps"] * 2
    assert last["strategy"]["micro_batch_size"] < 8
    assert report["within_budget"] is True and report["auto_fallback"]["ended_within_budget"] is True
    assert all(r["measured_peak_bytes"] <= 16_000_000 for r in report["ranks"])
    assert steps(run) == [1, 2]

    # Attempt 1 is kept whole beside the final one.
    kept = run / "attempts" / "1"
    assert json.loads((kept / "plan.json").read_text())["micro_batch_size"] == 8
    assert {json.loads(p.read_text())["status"] for p in (kept / "ranks").glob("rank-*.json")} >= {"oom"}
    assert json.loads((run / "state.json").read_text())["state"] == "completed"
    assert_no_secrets(run, res.stdout, res.stderr)


# -- 2. a hang in a collective ------------------------------------------------------------------------------------

HANG_SCRIPT = """
import os, time
import torch
import torch.distributed as dist
print(dict(os.environ), flush=True)  # an environment dump: the secrets must not survive in the log
dist.init_process_group("gloo")
rank = dist.get_rank()
print(f"rank {rank} ready", flush=True)
if rank == 1:
    time.sleep(3600)  # never arrives at the all_reduce
t = torch.ones(1)
dist.all_reduce(t)
print("all_reduce done", flush=True)
"""


def test_hang_in_a_collective_names_the_rank_that_did_not_arrive(tmp_path):
    script = tmp_path / "hang_in_allreduce.py"
    script.write_text(HANG_SCRIPT)
    job = job_file(tmp_path, "hang")
    run = tmp_path / "run"
    timeout_s = 15
    t0 = time.monotonic()
    proc = subprocess.Popen([LAUNCH, str(job), "--run-dir", str(run), "--quiet", "--script", str(script),
                             "--hang-timeout", str(timeout_s)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=ENV)
    ready = None
    while proc.poll() is None and time.monotonic() - t0 < 120:
        logs = [run / "logs" / f"rank-{r}.log" for r in (0, 1)]
        if all(p.exists() and "ready" in p.read_text(errors="replace") for p in logs):
            ready = time.monotonic()
            break
        time.sleep(0.2)
    assert ready is not None, "the ranks never got going"
    # Meanwhile a second launch on the same run dir must not proceed (nor clear it, even with --overwrite).
    second = launch(job, "--run-dir", run, "--overwrite", "--quiet", timeout=120)
    assert second.returncode == 2, second.stdout + second.stderr
    assert "is in use by another launch (lock held)" in second.stderr
    assert proc.poll() is None, "the first run ended before the second launch was refused"

    out, err = proc.communicate(timeout=120)
    stopped_after = time.monotonic() - ready
    assert proc.returncode == 1, out + err
    # The message states the idle time it measured: the timeout, or a little more when the watchdog's poll is late.
    idle = re.search(rf"hang: no rank made progress for (\d+) s \(--hang-timeout {timeout_s}\)", err)
    assert idle and timeout_s <= int(idle.group(1)) < timeout_s + 20, err
    assert "rank(s) [1] did not arrive at the collective (all_reduce) that rank(s) [0] waited in" in err
    assert f"rank 1 was at {script}:10 in <module>" in err
    assert stopped_after < timeout_s + 20, f"took {stopped_after:.0f} s to stop"
    state = json.loads((run / "state.json").read_text())
    assert state["state"] == "failed" and "did not arrive" in state["message"]
    time.sleep(1)
    assert alive(str(script)) == [], "rank processes left behind"
    assert not list(tmp_path.glob("core*")) and not list(Path.cwd().glob("core.*"))
    # The env dump was there, and it is scrubbed.
    assert REDACTED in (run / "logs" / "rank-0.log").read_text()
    assert_no_secrets(run, out, err, second.stdout, second.stderr)
    print(f"hang stopped {stopped_after - timeout_s:.1f} s after the timeout")


# -- 3. interrupt with a checkpoint, then resume ------------------------------------------------------------------

def test_sigint_checkpoints_and_resume_continues_without_repeating_a_step(tmp_path):
    # The job asks for the checkpoint (checkpoint_on_interrupt: true); --checkpoint-on-interrupt is the same switch.
    job = job_file(tmp_path, "interrupt", train={"global_batch_size": 8, "precision": "fp32", "lr": 3e-3,
                                                 "max_steps": 14}, checkpoint_on_interrupt=True)
    run = tmp_path / "run"
    proc = subprocess.Popen([LAUNCH, str(job), "--run-dir", str(run), "--quiet"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    t0 = time.monotonic()
    while proc.poll() is None and len(steps(run)) < 3 and time.monotonic() - t0 < 180:
        time.sleep(0.1)
    assert proc.poll() is None and len(steps(run)) >= 3
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=180)
    stop_s = time.monotonic() - sent
    assert proc.returncode == 130, out + err
    assert "SIGINT: asked the ranks to checkpoint at the next step" in err
    assert "the ranks saved checkpoint step-" in err
    state = json.loads((run / "state.json").read_text())
    assert state["state"] == "interrupted"
    tag = (run / "checkpoint" / "latest").read_text().strip()
    saved = int(tag.split("-")[1])
    done = steps(run)
    assert done == list(range(1, saved + 1)) and saved < 14, (tag, done)
    assert {json.loads(p.read_text())["status"] for p in (run / "ranks").glob("rank-*.json")} == {"checkpointed"}
    assert not (run / "control" / "checkpoint").exists()

    res = launch(job, "--run-dir", run, "--quiet", "--resume")
    assert res.returncode == 0, res.stdout + res.stderr
    for rank in (0, 1):
        assert steps(run, rank) == list(range(1, 15)), steps(run, rank)  # continued; none repeated
    rank0 = json.loads((run / "ranks" / "rank-0.json").read_text())
    assert rank0["resumed_from_step"] == saved and rank0["status"] == "completed"
    assert json.loads((run / "state.json").read_text())["state"] == "completed"
    assert alive(f"launcher.worker.rank_entry {run}") == []
    assert_no_secrets(run, out, err, res.stdout, res.stderr)
    print(f"checkpointed at step {saved}, {stop_s:.1f} s after SIGINT")
