"""`launch plan --out DIR`: a complete, consistent set of exports in DIR, or nothing.

Every file's text is built (and checked) before this runs. Then:
  1. DIR must be new, empty, or a dir an earlier `plan --out` made (the run dir's marker, and none of a run's
     files): a dir of someone's notes, the job file's own folder, a home directory or a run's dir (live or
     finished) is refused with the names it holds, before anything is written;
  2. the set is written into a temporary dir beside DIR (same filesystem, made exclusively), so a full disk or a
     bad path fails there and DIR keeps its old set;
  3. under DIR's run-dir lock (the lock a live launch holds for its whole run) the checks are made again and the
     files are renamed into DIR one by one, and the other engine's files from an earlier plan are removed: two
     `plan --out` at once take turns, and neither leaves plan.json from one beside job.yaml from the other.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

from launcher.backends.slurm_state import live_state
from launcher.errors import ConfigError
from launcher.files.fsutil import atomic_write, made_dirs, stage_dir
from launcher.files.rundir import EXPORT_FILES, MARKER, RunDir, few, foreign_dir, mark, run_entries

FLAG = "--out"
LOCK_WAIT_S = 10.0
"""How long a `plan --out` waits for another one swapping its set into the same dir (milliseconds of work)."""


LIVE = "replacing its files would have the ranks train a plan the launcher did not check"


def check_out_dir(out: Path) -> None:
    """Refuse a path that is not a directory, a non-empty directory launch did not make, the dir of a live run
    and the dir of any run (its job.yaml and plan.json are what export, status and --resume read); touches
    nothing."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{FLAG}: {str(out)!r} exists and is not a directory; choose another path")
    error = foreign_dir(out, flag=FLAG)
    if error:
        raise error
    if not out.is_dir():
        return
    run = RunDir(out.resolve())
    run.refuse_if_live(overwrite=False, job_state=live_state, flag=FLAG, what=LIVE)
    held = run_entries(out)
    if held:
        state = run.run_state().state if "state.json" in held else None
        raise ConfigError(
            f"{FLAG}: {str(out)!r} holds a run{f' (state.json: {state})' if state else ''}: {few(held)}; "
            f"plan --out replaces only the set an earlier plan --out wrote, never a run's job.yaml and plan.json; "
            f"choose another {FLAG}")


def write_out_dir(out: Path, files: dict[str, str]) -> list[Path]:
    """Write ``files`` (name -> text) into ``out`` as one set; the paths written, in ``files``' order."""
    out = Path(out)
    check_out_dir(out)
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(made_dirs(out))  # refused or failed: leave no empty dir behind
        except OSError as e:
            raise ConfigError(f"{FLAG}: {str(out)!r} cannot be created ({e.strerror}); choose a directory you "
                              "can write") from None
        stage = None
        try:
            try:
                stage = stage_dir(out.resolve())
                for name, text in files.items():
                    atomic_write(stage / name, text)
            except OSError as e:
                raise ConfigError(f"{FLAG}: cannot write beside {str(out)!r} ({e.strerror}); choose a directory "
                                  "you can write") from None
            return swap_in(out, stage, files)
        finally:
            if stage is not None:
                shutil.rmtree(stage, ignore_errors=True)


def swap_in(out: Path, stage: Path, files: dict[str, str]) -> list[Path]:
    """Move the staged set into ``out`` under its lock; a run there is refused, untouched."""
    run = RunDir(out.resolve())
    run.lock(wait_s=LOCK_WAIT_S, flag=FLAG)
    try:
        check_out_dir(out)  # again under the lock: someone may have put files there or started a run meanwhile
        mark(run.path, by="launch plan --out")
        written = []
        for name in files:
            os.replace(stage / name, run.path / name)
            written.append(out / name)
        for name in EXPORT_FILES:  # the other engine's config, a job.sbatch from an earlier --sbatch
            if name not in files:
                (run.path / name).unlink(missing_ok=True)
        return written
    finally:
        run.unlock()


__all__ = ["MARKER", "check_out_dir", "write_out_dir"]
