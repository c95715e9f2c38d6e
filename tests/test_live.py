"""The live view: what it reads from a run dir, what it draws, and when it stays quiet."""

import json
import os
import select
import subprocess
import time

from rich.console import Console

from launcher.live import LiveView, rank_rows, view_mode
from tests.conftest import REPO, TINY_GPT2

LAUNCH = str(REPO / ".venv" / "bin" / "launch")


def step(n: int, loss: float) -> str:
    return json.dumps({"step": n, "loss": loss, "tokens_per_s": 2188.0, "mem_current_bytes": 1_092_208,
                       "mem_peak_bytes": 8_343_548, "time": 0.0}) + "\n"


def fake_run(tmp_path):
    (tmp_path / "steps").mkdir()
    (tmp_path / "ranks").mkdir()
    (tmp_path / "steps" / "rank-0.jsonl").write_text(step(1, 6.93) + step(2, 6.69) + step(3, 6.51))
    (tmp_path / "steps" / "rank-1.jsonl").write_text(step(1, 6.93) + '{"step": 2, "lo')  # mid-write
    (tmp_path / "ranks" / "rank-1.json").write_text(json.dumps({"status": "oom"}))
    return tmp_path


def test_rows_follow_the_rank_files(tmp_path):
    rows = rank_rows(fake_run(tmp_path), 3)
    assert [r["state"] for r in rows] == ["training", "oom", "starting"]
    assert rows[0]["step"] == 3 and rows[0]["loss"] == 6.51
    assert rows[1]["step"] == 1  # the torn last line is skipped, not an error


def test_table_shows_state_progress_loss_throughput_and_memory(tmp_path):
    view = LiveView(fake_run(tmp_path), 3, 8, mode="tty")
    console = Console(record=True, width=140, color_system=None)
    console.print(view.table())
    text = console.export_text()
    for cell in ("training", "oom", "starting", "3/8", "6.5100", "2188", "1.09 MB", "8.34 MB"):
        assert cell in text, cell
    assert "━" in text  # the progress bar


def test_lines_mode_prints_each_new_step_once(tmp_path, capsys):
    view = LiveView(fake_run(tmp_path), 2, 8, mode="lines")
    view.print_lines()
    view.print_lines()
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1
    assert "step 1/8" in out[0] and "tok/s=2188" in out[0] and "mem=1.09 MB" in out[0] and "peak=8.34 MB" in out[0]


def test_modes():
    assert view_mode(quiet=True, verbose=False) == "off"
    # pytest captures stdout, so this is the "not a terminal" case
    assert view_mode(quiet=False, verbose=False) == "off"
    assert view_mode(quiet=False, verbose=True) == "lines"


def job(tmp_path):
    import yaml

    p = tmp_path / "job.yaml"
    p.write_text(yaml.safe_dump({
        "name": "live", "model": dict(TINY_GPT2), "task": "causal_lm",
        "data": {"path": str(REPO / "examples" / "data" / "causal.jsonl"), "max_seq_len": 32},
        "train": {"global_batch_size": 4, "max_steps": 6, "precision": "fp32"}, "gpus": 2, "budget": "1GB",
        "strategy": {"engine": "fsdp"}}))
    return p


def read_all(fd: int, proc: subprocess.Popen, timeout_s: float) -> str:
    chunks, deadline = [], time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            try:
                data = os.read(fd, 65536)
            except OSError:  # the other side closed
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    return b"".join(chunks).decode(errors="replace")


def test_a_terminal_gets_the_live_table_and_a_pipe_gets_none(tmp_path):
    primary, secondary = os.openpty()
    env = {**os.environ, "COLUMNS": "140", "TERM": "xterm"}
    proc = subprocess.Popen([LAUNCH, str(job(tmp_path)), "--run-dir", str(tmp_path / "tty")], stdin=secondary,
                            stdout=secondary, stderr=secondary, env=env, close_fds=True)
    os.close(secondary)
    out = read_all(primary, proc, 300)
    assert proc.wait(timeout=60) == 0, out[-3000:]
    os.close(primary)
    assert "tok/s" in out and "peak" in out and "6/6" in out, out[-3000:]

    piped = subprocess.run([LAUNCH, str(job(tmp_path)), "--run-dir", str(tmp_path / "pipe")], capture_output=True,
                           text=True, timeout=300)
    assert piped.returncode == 0, piped.stderr
    assert "tok/s" not in piped.stdout and "verdict: every rank within budget" in piped.stdout


def test_steps_between_log_steps_show_the_latest_loss(tmp_path):
    # train.log_every_steps: only log steps carry loss and tokens/s; the view keeps the last ones it saw.
    (tmp_path / "steps").mkdir()
    quiet = json.dumps({"step": 3, "mem_current_bytes": 1_000_000, "mem_peak_bytes": 2_000_000}) + "\n"
    (tmp_path / "steps" / "rank-0.jsonl").write_text(step(2, 6.69) + quiet)
    row = rank_rows(tmp_path, 1)[0]
    assert row["step"] == 3 and row["loss"] == 6.69 and row["tokens_per_s"] == 2188.0
    assert row["mem_current_bytes"] == 1_000_000
