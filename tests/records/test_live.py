"""The live view: what it reads from a run dir, what it draws, and when it stays quiet."""

import json
import os
import select
import subprocess
import time

import yaml
from rich.console import Console

from launcher.records.live import LiveView, StepLines, rank_rows, view_mode
from tests.conftest import REPO

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


def line(n: int, t: float, **extra) -> str:
    return json.dumps({"step": n, "step_time_s": 2.0, "mem_current_bytes": 1_000_000, "mem_peak_bytes": 250_000_000,
                       "time": t, **extra}) + "\n"


def test_lines_print_each_log_step_once_with_peak_against_budget_and_eta(tmp_path, capsys):
    (tmp_path / "steps").mkdir()
    rank0 = tmp_path / "steps" / "rank-0.jsonl"
    rank0.write_text(line(1, 100.0, loss=6.9, lr=1e-4, tokens_per_s=2188.0) + line(2, 102.0))
    # rank 1 peaks higher: the line shows the highest peak of any rank.
    (tmp_path / "steps" / "rank-1.jsonl").write_text(line(2, 102.0, mem_peak_bytes=400_000_000))
    view = StepLines(tmp_path, 2, 10, budget_bytes=10**9, since=0.0)
    assert view.print_new() == 1  # step 2 is not a log step (no loss): no line of its own
    with rank0.open("a") as f:
        f.write(line(3, 104.0, loss=6.5, lr=1e-4, tokens_per_s=2000.0) + '{"step": 4, "lo')  # 4 is mid-write
    assert view.print_new() == 1 and view.print_new() == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2
    assert out[0].endswith("step 1/10  loss 6.9000  lr 0.0001  tok/s 2188  peak 400.00 MB of 1.00 GB budget (40%)  "
                           "ETA 18 s")  # 9 steps left x the first step's own 2 s
    # From step 1 to step 3 took 4 s: 2 s a step, 7 steps left.
    assert out[1].endswith("step 3/10  loss 6.5000  lr 0.0001  tok/s 2000  peak 400.00 MB of 1.00 GB budget (40%)  "
                           "ETA 14 s")


def test_a_run_without_losses_still_prints_its_progress(tmp_path, capsys):
    """A --script run whose library logs no loss to the launcher (a plain accelerate loop): its first step, one
    every LOSSLESS_EVERY_S and its last are printed, with the peak and the ETA, instead of nothing."""
    (tmp_path / "steps").mkdir()
    (tmp_path / "steps" / "rank-0.jsonl").write_text("".join(line(n, 100.0 + 3 * n) for n in range(1, 9)))
    assert StepLines(tmp_path, 1, 8, since=0.0).print_new() == 3
    out = capsys.readouterr().out.splitlines()
    assert [ln.split("  ")[0].split()[-1] for ln in out] == ["1/8", "5/8", "8/8"]  # 103 s, 115 s (12 s on), the last
    assert "peak 250.00 MB" in out[0] and "ETA" in out[0] and "loss" not in out[0]


def test_the_total_rank_0_recorded_is_the_runs(tmp_path):
    """A --script run's Trainer records its own step count, which may differ from the job's train.max_steps."""
    (tmp_path / "ranks").mkdir()
    view = StepLines(tmp_path, 1, 5, since=0.0)
    assert view.total() == 5
    (tmp_path / "ranks" / "rank-0.json").write_text(json.dumps({"status": "running", "total_steps": 3}))
    assert view.total() == 3


def test_lines_skip_steps_written_before_the_view_and_read_the_total_of_an_epochs_run(tmp_path, capsys):
    (tmp_path / "steps").mkdir()
    (tmp_path / "ranks").mkdir()
    (tmp_path / "steps" / "rank-0.jsonl").write_text(line(1, 10.0, loss=7.0) + line(2, 30.0, loss=6.0))
    (tmp_path / "ranks" / "rank-0.json").write_text(json.dumps({"status": "running", "total_steps": 40}))
    view = StepLines(tmp_path, 1, None, since=20.0)  # a resumed run: step 1 was an earlier launch's
    assert view.print_new() == 1
    assert "step 2/40  loss 6.0000" in capsys.readouterr().out


def test_table_of_an_epochs_run_counts_to_the_total_rank0_recorded(tmp_path):
    """train.epochs: no max_steps; the table shows the total_steps rank 0 wrote, not '?' and no bar."""
    run = fake_run(tmp_path)
    (run / "ranks" / "rank-0.json").write_text(json.dumps({"status": "running", "total_steps": 8}))
    console = Console(record=True, width=140, color_system=None)
    console.print(LiveView(run, 3, None, mode="tty").table())
    text = console.export_text()
    assert "3/8" in text and "━" in text


def test_modes(monkeypatch):
    assert view_mode(quiet=True, verbose=False) == "off"
    # pytest captures stdout, so this is the "not a terminal" case: CI, nohup and pipes get the step lines.
    assert view_mode(quiet=False, verbose=False) == "lines"
    assert view_mode(quiet=False, verbose=True) == "lines"
    monkeypatch.setattr("sys.stdout.isatty", lambda: True)
    assert view_mode(quiet=False, verbose=False) == "tty"
    assert view_mode(quiet=False, verbose=True) == "lines"


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


def cls_job(tmp_path):
    """A seq_cls job (tiny random BERT on the example sentiment data) whose eval split gets an accuracy."""
    p = tmp_path / "cls.yaml"
    p.write_text(yaml.safe_dump({
        "name": "live-cls", "task": "seq_cls",
        "model": {"family": "bert", "hidden_size": 32, "num_layers": 2, "num_heads": 2, "vocab_size": 512,
                  "max_position_embeddings": 64},
        "data": {"path": str(REPO / "examples" / "data" / "sentiment.jsonl"), "max_seq_len": 32},
        "train": {"global_batch_size": 8, "max_steps": 6, "log_every_steps": 2, "precision": "fp32", "lr": 1e-3},
        "gpus": 2, "budget": "1GB", "strategy": {"engine": "fsdp"}}))
    return p


def accuracy_of_export(run) -> tuple[float, int]:
    """The reloaded export's accuracy on the run's eval split, every example once, in one process."""
    import torch

    from launcher.worker.data import read_records, split
    from launcher.worker.main import load_run_dir
    from launcher.worker.model import tokenizer_for
    from launcher.worker.recipes import make_recipe
    from tests.worker.export_checks import load_export

    job, plan = load_run_dir(run)[:2]
    recipe = make_recipe(job.task, job.data)
    rows = read_records(job.data.path)
    recipe.fit_labels(rows)
    data = recipe.encode(split(rows, job.data.eval_fraction)[1], tokenizer_for(job), plan.seq_len)
    with torch.no_grad():
        logits = load_export(run)(input_ids=data["input_ids"], attention_mask=data["attention_mask"]).logits
    return (logits.argmax(-1) == data["labels"]).float().mean().item(), len(data["labels"])


def test_a_terminal_gets_the_live_table_and_a_pipe_gets_step_lines(terminal_run, tmp_path):
    import re

    from tests.cli.test_run_cli import check_report

    # The `run` verb without --run-dir, under a budget near its prediction (tests/shared_runs.py terminal_run): this
    # run is also the one that checks the default run dir (runs/NAME-STAMP under the working dir) and the report.
    out, run_dir = terminal_run.out, terminal_run.run
    assert "tok/s" in out and "peak" in out and "6/6" in out, out[-3000:]
    name = yaml.safe_load(terminal_run.job.read_text())["name"]
    assert run_dir.parent == terminal_run.cwd / "runs" and re.fullmatch(rf"{name}-\d{{8}}-\d{{6}}", run_dir.name)
    assert "run dir: " in out and str(run_dir) in out, out[-3000:]
    check_report(run_dir, 2)
    for name in ("job.yaml", "plan.json", "state.json", "report.json", "memory.png"):
        assert (run_dir / name).is_file(), name

    # A pipe (CI, nohup): no table, one plain line per log step (every 2nd, the first and the last).
    run = tmp_path / "pipe"
    piped = subprocess.run([LAUNCH, str(cls_job(tmp_path)), "--run-dir", str(run)], capture_output=True,
                           text=True, timeout=300)
    assert piped.returncode == 0, piped.stderr
    assert "verdict: every rank within budget" in piped.stdout and "━" not in piped.stdout
    lines = [ln for ln in piped.stdout.splitlines() if "] step " in ln]
    assert [ln.split("] step ")[1].split()[0] for ln in lines] == ["1/6", "2/6", "4/6", "6/6"], piped.stdout
    assert all(" loss " in ln and " tok/s " in ln and " of 1.00 GB budget (" in ln and " ETA " in ln for ln in lines)
    assert "predicted training time: " in piped.stdout and "x 6 steps, train.max_steps" in piped.stdout

    # seq_cls: report.json carries the eval accuracy, and it is the reloaded export's on the eval split.
    report = json.loads((run / "report.json").read_text())
    acc, n_eval = accuracy_of_export(run)
    assert n_eval == 36 and abs(report["eval_accuracy"] - acc) < 1e-9, (report["eval_accuracy"], acc)
    assert f"accuracy {acc:.1%}" in piped.stdout

    # launch status / logs read the finished local run from its dir alone.
    st = subprocess.run([LAUNCH, "status", str(run)], capture_output=True, text=True, timeout=60)
    assert st.returncode == 0, st.stderr
    assert st.stdout.startswith(f"local run {run}: completed") and "progress: step 6/6 (100%)" in st.stdout
    assert " of 1.00 GB budget" in st.stdout and "eval accuracy" in st.stdout
    logs = subprocess.run([LAUNCH, "logs", str(run), "--rank", "1", "--follow"], capture_output=True, text=True,
                          timeout=60)  # a finished run: --follow prints what is there and returns
    assert logs.returncode == 0 and logs.stdout.startswith(f"==> rank 1: {run}/logs/rank-1.log <==")
    # Every log step is a plain line in the rank logs too (issue 19 §4), the last one with nothing left to run.
    assert "launcher: step 1/6, loss " in logs.stdout and "launcher: step 6/6, loss " in logs.stdout
    assert "step 3/6" not in logs.stdout and "of 1.00 GB, eta 0 s" in logs.stdout


def test_steps_between_log_steps_show_the_latest_loss(tmp_path):
    # train.log_every_steps: only log steps carry loss and tokens/s; the view keeps the last ones it saw.
    (tmp_path / "steps").mkdir()
    quiet = json.dumps({"step": 3, "mem_current_bytes": 1_000_000, "mem_peak_bytes": 2_000_000}) + "\n"
    (tmp_path / "steps" / "rank-0.jsonl").write_text(step(2, 6.69) + quiet)
    row = rank_rows(tmp_path, 1)[0]
    assert row["step"] == 3 and row["loss"] == 6.69 and row["tokens_per_s"] == 2188.0
    assert row["mem_current_bytes"] == 1_000_000
