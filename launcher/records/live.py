"""The live view: each rank's state, step / total with a bar, loss, tokens/s, current and peak memory.

Reads only the files the ranks write (steps/rank-K.jsonl, ranks/rank-K.json), so it works the same for a
local run and a Slurm job followed with --wait. A terminal gets the live table; any other stdout (CI, nohup, a
pipe) gets one plain line per log step (train.log_every_steps) instead: step/total, loss, lr, tokens/s, the
peak memory so far against the budget, and the ETA (a --script run with no loss in its lines: its first and last
step and one every LOSSLESS_EVERY_S). --quiet turns both off.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import threading
import time
from pathlib import Path

from launcher.records.rankreport import RankReport
from launcher.records.steprow import StepRow, read_rows
from launcher.units import format_bytes, format_duration

CARRIED = ("loss", "tokens_per_s")
"""Step-line fields only log steps have (train.log_every_steps); between them the view shows the latest."""
LOSSLESS_EVERY_S = 10.0
"""A run whose lines carry no loss (a --script run whose library does not log one to the launcher): the plain view
prints its first step, its last, and a step at most this often, seconds, so a pipe still shows progress."""


def last_line(path: Path) -> StepRow | None:
    """The last complete step line, with loss and tokens/s carried from the latest log step before it."""
    try:
        with path.open("rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - 4096))
            lines = [ln for ln in f.read().splitlines() if ln.strip()]
    except OSError:
        return None
    rows = read_rows(lines)
    if not rows:
        return None
    last = dataclasses.replace(rows[-1], extra=dict(rows[-1].extra))
    for key in CARRIED:
        seen = [getattr(r, key) for r in rows if getattr(r, key) is not None]
        if getattr(last, key) is None and seen:
            setattr(last, key, seen[-1])
    return last


def rank_rows(run_dir: Path, world_size: int) -> list[dict]:
    """One row per rank for the live table: its state (starting, training, or its rank file's status) and its latest
    step line's fields."""
    rows = []
    for r in range(world_size):
        final = run_dir / "ranks" / f"rank-{r}.json"
        step = last_line(run_dir / "steps" / f"rank-{r}.jsonl")
        state = "starting"
        if step:
            state = "training"
        if final.is_file():
            try:
                state = RankReport.from_json({"rank": r, **json.loads(final.read_text())}).status
            except (ValueError, TypeError):
                pass
        rows.append({"rank": r, "state": state, **(step.to_json() if step else {})})
    return rows


class LiveView(threading.Thread):
    """The live view's thread: a rich table per rank, redrawn on a terminal (mode "tty"), or StepLines' plain
    lines (mode "lines"), until stop()."""

    def __init__(self, run_dir: Path, world_size: int, max_steps: int | None, *, mode: str,
                 budget_bytes: int | None = None):
        super().__init__(daemon=True)
        self.run_dir, self.world_size, self.mode = run_dir, world_size, mode
        self.budget_bytes = budget_bytes
        self._stop_event = threading.Event()
        self.lines = StepLines(run_dir, world_size, max_steps, budget_bytes=budget_bytes)

    def stop(self) -> None:
        """End the view after one last update, waiting up to 2 s for the thread."""
        self._stop_event.set()
        if self.is_alive():  # a view never started (a Slurm job not followed) has nothing to join
            self.join(timeout=2)

    def table(self):
        """The rich table: per rank its state, step of total with a bar, loss, tokens/s, current and peak memory."""
        from rich.progress_bar import ProgressBar
        from rich.table import Table

        t = Table(title=f"run {self.run_dir.name}", expand=False)
        for col in ("rank", "state", "step", "progress", "loss", "tok/s", "mem", "peak"):
            t.add_column(col, justify="right" if col not in ("state", "progress") else "left")
        total = self.lines.total() or 0
        for row in rank_rows(self.run_dir, self.world_size):
            step = row.get("step")
            bar = ProgressBar(total=max(total, 1), completed=min(step or 0, total), width=20) if total else "-"
            t.add_row(str(row["rank"]), row["state"], f"{step}/{total or '?'}" if step else "-", bar,
                      f"{row['loss']:.4f}" if "loss" in row else "-",
                      f"{row['tokens_per_s']:.0f}" if "tokens_per_s" in row else "-",
                      format_bytes(row["mem_current_bytes"]) if "mem_current_bytes" in row else "-",
                      format_bytes(row["mem_peak_bytes"]) if "mem_peak_bytes" in row else "-")
        return t

    def run(self) -> None:
        """The thread: redraw the table every 0.5 s ("tty") or print new step lines every second ("lines") until
        stopped."""
        if self.mode == "tty":
            from rich.console import Console
            from rich.live import Live

            with Live(self.table(), console=Console(), refresh_per_second=4, transient=False) as live:
                while not self._stop_event.wait(0.5):
                    live.update(self.table())
                live.update(self.table())
        elif self.mode == "lines":
            while not self._stop_event.wait(1.0):
                self.lines.print_new()
            self.lines.print_new()


class StepLines:
    """Plain step lines for a console that is not a terminal: one per log step of rank 0 (its loss and tokens/s
    are already reduced over the ranks), each step printed once, only steps this view saw written (a resumed
    run's earlier steps are not printed again)."""

    def __init__(self, run_dir: Path, world_size: int, max_steps: int | None, *, budget_bytes: int | None = None,
                 since: float | None = None):
        self.run_dir, self.world_size, self.max_steps, self.budget_bytes = run_dir, world_size, max_steps, budget_bytes
        """max_steps: the job's train.max_steps; None for a train.epochs job, whose total_steps rank 0 records
        once it knows its data (total())."""
        self.since = time.time() if since is None else since
        self._offset, self._inode = 0, None
        self._last_step = 0
        self._first: tuple[int, float] | None = None  # (step, time) of the first line seen: the ETA's base
        self._loss_seen = False  # a line with a loss was seen: only those print from then on
        self._printed_at: float | None = None  # the time of the last line printed without a loss

    def new_rows(self) -> list[StepRow]:
        """Rank 0's step lines written since the last call (whole lines only)."""
        path = self.run_dir / "steps" / "rank-0.jsonl"
        try:
            st = path.stat()
            if st.st_ino != self._inode or st.st_size < self._offset:  # replaced (a resume trims it): read again
                self._inode, self._offset = st.st_ino, 0
            with path.open("rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except OSError:
            return []
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self._offset += len(complete)
        return [r for r in read_rows(complete.splitlines()) if r.step and (r.time or self.since) >= self.since]

    def total(self) -> int | None:
        """The run's total_steps: the count rank 0 recorded (a train.epochs job's once it knew its data, a --script
        run's Trainer's), else train.max_steps."""
        try:
            data = json.loads((self.run_dir / "ranks" / "rank-0.json").read_text())
            recorded = RankReport.from_json({"rank": 0, **data}).total_steps
        except (OSError, ValueError, TypeError):
            recorded = None
        return recorded or self.max_steps

    def peak_bytes(self) -> int | None:
        """The highest peak memory any rank's latest step line reports, bytes; None before any."""
        peaks = [r.mem_peak_bytes for r in (last_line(self.run_dir / "steps" / f"rank-{k}.jsonl")
                                            for k in range(self.world_size)) if r and r.mem_peak_bytes is not None]
        return max(peaks) if peaks else None

    def format(self, row: StepRow, total: int | None, peak: int | None) -> str:
        """One plain line for a step row: step/total, loss, lr, tokens/s, peak against the budget, and the ETA."""
        parts = [f"step {row.step}/{total or '?'}"]
        if row.loss is not None:
            parts.append(f"loss {row.loss:.4f}")
        if isinstance(row.lr, (int, float)):
            parts.append(f"lr {row.lr:.3g}")
        if row.tokens_per_s is not None:
            parts.append(f"tok/s {row.tokens_per_s:.0f}")
        if peak is not None:
            budget = (f" of {format_bytes(self.budget_bytes)} budget ({peak / self.budget_bytes:.0%})"
                      if self.budget_bytes else "")
            parts.append(f"peak {format_bytes(peak)}{budget}")
        eta = self.eta_s(row, total)
        parts.append(f"ETA {format_duration(eta)}" if eta is not None else "ETA ?")
        return "  ".join(parts)

    def eta_s(self, row: StepRow, total: int | None) -> float | None:
        """Steps left x the mean step time since the first step this view saw (the first step's own time holds
        the warm-up, so it is the fallback only)."""
        if not total:
            return None
        step, t = row.step, row.time
        per_step = row.step_time_s
        if self._first is not None and t is not None and step > self._first[0]:
            per_step = (t - self._first[1]) / (step - self._first[0])
        return None if per_step is None else max(0, total - step) * per_step

    def print_new(self) -> int:
        """Print a line for each new log step (a line with a loss), or, in a run whose lines carry no loss, for its
        first and last step and one every LOSSLESS_EVERY_S; returns how many."""
        rows = self.new_rows()
        if not rows:
            return 0
        total, peak, printed = self.total(), self.peak_bytes(), 0
        for row in rows:
            if self._first is None and row.time is not None:
                self._first = (row.step, row.time)
            self._loss_seen = self._loss_seen or row.log_step
            if row.step <= self._last_step or not (row.log_step or self._lossless_due(row, total)):
                continue
            self._last_step = row.step
            print(f"[{time.strftime('%H:%M:%S')}] {self.format(row, total, peak)}", flush=True)
            printed += 1
        return printed


    def _lossless_due(self, row: StepRow, total: int | None) -> bool:
        """A line without a loss prints only in a run that has none: its first, its last, then every
        LOSSLESS_EVERY_S by the lines' own times."""
        if self._loss_seen:
            return False
        t = row.time or 0.0
        if self._printed_at is None or row.step == total or t - self._printed_at >= LOSSLESS_EVERY_S:
            self._printed_at = t
            return True
        return False


def view_mode(quiet: bool, verbose: bool) -> str:
    """off with --quiet; lines when stdout is not a terminal (CI, nohup, a pipe) or with --verbose; else tty."""
    if quiet:
        return "off"
    if sys.stdout.isatty() and not verbose:
        return "tty"
    return "lines"
