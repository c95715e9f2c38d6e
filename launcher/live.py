"""The live view: each rank's state, step / total with a bar, loss, tokens/s, current and peak memory.

Reads only the files the ranks write (steps/rank-K.jsonl, ranks/rank-K.json), so it works the same for a
local run and a Slurm job followed with --wait. Quiet unless stdout is a terminal or --verbose is given.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

from launcher.units import format_bytes

CARRIED = ("loss", "tokens_per_s")
"""Step-line fields only log steps have (train.log_every_steps); between them the view shows the latest."""


def last_line(path: Path) -> dict | None:
    """The last complete step line, with loss and tokens/s carried from the latest log step before it."""
    try:
        with path.open("rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - 4096))
            lines = [ln for ln in f.read().splitlines() if ln.strip()]
    except OSError:
        return None
    rows = []
    for ln in lines:
        try:
            rows.append(json.loads(ln))
        except ValueError:
            continue  # a line being written right now (or cut by the 4 KiB window)
    if not rows:
        return None
    last = dict(rows[-1])
    for key in CARRIED:
        seen = [r[key] for r in rows if key in r]
        if key not in last and seen:
            last[key] = seen[-1]
    return last


def rank_rows(run_dir: Path, world_size: int) -> list[dict]:
    rows = []
    for r in range(world_size):
        final = run_dir / "ranks" / f"rank-{r}.json"
        step = last_line(run_dir / "steps" / f"rank-{r}.jsonl")
        state = "starting"
        if step:
            state = "training"
        if final.is_file():
            try:
                state = json.loads(final.read_text()).get("status", "done")
            except ValueError:
                pass
        rows.append({"rank": r, "state": state, **(step or {})})
    return rows


class LiveView(threading.Thread):
    def __init__(self, run_dir: Path, world_size: int, total_steps: int | None, *, mode: str):
        super().__init__(daemon=True)
        self.run_dir, self.world_size, self.total_steps, self.mode = run_dir, world_size, total_steps, mode
        self._stop_event = threading.Event()
        self._last_printed = -1

    def stop(self) -> None:
        self._stop_event.set()
        if self.is_alive():  # a view never started (a Slurm job not followed) has nothing to join
            self.join(timeout=2)

    def table(self):
        from rich.progress_bar import ProgressBar
        from rich.table import Table

        t = Table(title=f"run {self.run_dir.name}", expand=False)
        for col in ("rank", "state", "step", "progress", "loss", "tok/s", "mem", "peak"):
            t.add_column(col, justify="right" if col not in ("state", "progress") else "left")
        for row in rank_rows(self.run_dir, self.world_size):
            step = row.get("step")
            total = self.total_steps or 0
            bar = ProgressBar(total=max(total, 1), completed=min(step or 0, total), width=20) if total else "-"
            t.add_row(str(row["rank"]), row["state"], f"{step}/{self.total_steps or '?'}" if step else "-", bar,
                      f"{row['loss']:.4f}" if "loss" in row else "-",
                      f"{row['tokens_per_s']:.0f}" if "tokens_per_s" in row else "-",
                      format_bytes(row["mem_current_bytes"]) if "mem_current_bytes" in row else "-",
                      format_bytes(row["mem_peak_bytes"]) if "mem_peak_bytes" in row else "-")
        return t

    def run(self) -> None:
        if self.mode == "tty":
            from rich.console import Console
            from rich.live import Live

            with Live(self.table(), console=Console(), refresh_per_second=4, transient=False) as live:
                while not self._stop_event.wait(0.5):
                    live.update(self.table())
                live.update(self.table())
        elif self.mode == "lines":
            while not self._stop_event.wait(1.0):
                self.print_lines()
            self.print_lines()

    def print_lines(self) -> None:
        rows = rank_rows(self.run_dir, self.world_size)
        step = min((r.get("step") or 0) for r in rows)
        if step == self._last_printed:
            return
        self._last_printed = step
        parts = [f"r{r['rank']} {r['state']} loss={r.get('loss', float('nan')):.4f} "
                 f"tok/s={r.get('tokens_per_s', 0):.0f} mem={format_bytes(r.get('mem_current_bytes', 0))} "
                 f"peak={format_bytes(r.get('mem_peak_bytes', 0))}" for r in rows]
        print(f"[{time.strftime('%H:%M:%S')}] step {step}/{self.total_steps or '?'}: " + "; ".join(parts), flush=True)


def view_mode(quiet: bool, verbose: bool) -> str:
    if quiet:
        return "off"
    if sys.stdout.isatty():
        return "tty"
    return "lines" if verbose else "off"
