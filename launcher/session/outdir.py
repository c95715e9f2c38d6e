"""`launch plan --out DIR`: a complete, consistent set of exports in DIR, or nothing.

Every file's text is built (and checked) before this runs. Then:
  1. DIR must be new, empty, or a dir launch made (the run dir's marker): a dir of someone's notes, the job
     file's own folder or a home directory is refused with the names it holds, before anything is written;
  2. the set is written into a temporary dir beside DIR (same filesystem), so a full disk or a bad path fails
     there and DIR keeps its old set;
  3. under DIR's run-dir lock (the lock a live launch holds for its whole run, so a live run dir is refused) the
     files are renamed into DIR one by one, and the other engine's files from an earlier plan are removed: two
     `plan --out` at once take turns, and neither leaves plan.json from one beside job.yaml from the other.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from launcher.backends.slurm_state import live_state
from launcher.errors import ConfigError
from launcher.fsutil import atomic_write
from launcher.rundir import EXPORT_FILES, MARKER, RunDir, foreign_dir, mark

FLAG = "--out"
LOCK_WAIT_S = 10.0
"""How long a `plan --out` waits for another one swapping its set into the same dir (milliseconds of work)."""


LIVE = "replacing its files would have the ranks train a plan the launcher did not check"


def check_out_dir(out: Path) -> None:
    """Refuse a path that is not a directory, or a non-empty directory launch did not make; touches nothing."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{FLAG}: {str(out)!r} exists and is not a directory; choose another path")
    error = foreign_dir(out, flag=FLAG)
    if error:
        raise error


def write_out_dir(out: Path, files: dict[str, str]) -> list[Path]:
    """Write ``files`` (name -> text) into ``out`` as one set; the paths written, in ``files``' order."""
    out = Path(out)
    check_out_dir(out)
    run = RunDir(out.resolve())
    if out.is_dir():  # a live run is refused at once, not after waiting for the lock it holds
        run.refuse_if_live(overwrite=False, job_state=live_state, flag=FLAG, what=LIVE)
    created = out  # the topmost dir this call makes, removed again if it fails
    while not created.parent.exists() and created.parent != created:
        created = created.parent
    created = None if out.exists() else created
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"{FLAG}: {str(out)!r} cannot be created ({e.strerror}); choose a directory you can "
                          "write") from None
    stage = None
    try:
        try:
            stage = Path(tempfile.mkdtemp(prefix=f".{out.resolve().name}.", suffix=".tmp", dir=out.resolve().parent))
            for name, text in files.items():
                atomic_write(stage / name, text)
        except OSError as e:
            raise ConfigError(f"{FLAG}: cannot write beside {str(out)!r} ({e.strerror}); choose a directory you "
                              "can write") from None
        return swap_in(out, stage, files)
    except BaseException:
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)  # refused or failed: leave no empty dir behind
        raise
    finally:
        if stage is not None:
            shutil.rmtree(stage, ignore_errors=True)


def swap_in(out: Path, stage: Path, files: dict[str, str]) -> list[Path]:
    """Move the staged set into ``out`` under its lock; a live run there is refused, untouched."""
    run = RunDir(out.resolve())
    run.lock(wait_s=LOCK_WAIT_S, flag=FLAG)
    try:
        run.refuse_if_live(overwrite=False, job_state=live_state, flag=FLAG, what=LIVE)
        check_out_dir(out)  # again under the lock: someone may have put files there meanwhile
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
