"""The run directory: layout, exclusive lock, atomic writes, and the run's state.

    RUN/job.yaml  plan.json  ds_config.json | fsdp.yaml  state.json  report.json  memory.png
    RUN/ranks/rank-K.json    peak memory by phase and category, written by each rank
    RUN/steps/rank-K.jsonl   one line per optimizer step, stamped with the attempt that ran it
    RUN/steps/rank-K.discarded.jsonl  lines a resume set aside: steps logged after the checkpoint it resumed from
    RUN/logs/rank-K.log      each rank's stdout and stderr
    RUN/checkpoint/          the last checkpoint (engine-native)
    RUN/model/               the Hugging Face model dir a completed run exports (docs/export.md)
    RUN/control/             files the launcher drops to ask ranks for something (checkpoint)
    RUN/heartbeat/rank-K     optional: a script touches it to tell the hang watchdog it is alive
    RUN/attempts/<k>/        with --auto-fallback: attempt k's plan, job, ranks/, steps/, logs/ and report,
                             moved aside before the next attempt; RUN itself always holds the latest attempt
    RUN/.launcher-run        the marker: launch made this dir (written when it creates a run dir, before any file
                             but the lock, and by `launch plan --out`); --overwrite and --resume take only a dir
                             that holds it, as a regular file
    RUN/.lock                flock'd by the launch that writes here (and by `plan --out` while it swaps files)

--overwrite deletes only what the launcher writes (RUN_ENTRIES and its temporaries, launcher.files.fsutil.TMP_SUFFIX):
files a person put into a run dir stay and are named, and a non-empty dir without the marker is refused
(launcher.errors.ConfigError), as --resume refuses a dir without it. docs/reliability/writes.md lists what each
command may write.

What the launcher writes here passes through launcher.files.redact (secret values never land in a file).
The dir is 0700 and every file the launcher and its ranks write here 0600 (launcher.files.fsutil).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from launcher.engines import ENGINES
from launcher.errors import ConfigError
from launcher.files.fsutil import (
    FILE_MODE,
    TMP_SUFFIX,
    atomic_write,
    has_marker,
    is_temporary,
    private_dir,
    remove,
    write_marker,
    write_reserved,
)
from launcher.files.redact import redact, redact_data, redact_file, redact_file_in_place, secret_values
from launcher.records.rankreport import RankReport
from launcher.records.runstate import LIVE_STATES, RESERVE_BYTES, RunState, RunStateName

__all__ = ["LIVE_STATES", "RunState"]  # state.json's type (launcher.records.runstate), re-exported for its readers

ATTEMPT_ITEMS = ("job.yaml", "plan.json", *(n for spec in ENGINES.values() for n in spec.config_names), "report.json",
                 "memory.png", "ranks", "steps", "logs", "checkpoint", "heartbeat")
"""What one attempt of the fallback ladder leaves in RUN; moved to RUN/attempts/<k>/ before the next."""

MARKER = ".launcher-run"
"""The file that says launch made this dir: --overwrite and `plan --out` replace nothing in a dir without it."""
ENGINE_FILES = tuple(n for spec in ENGINES.values() for n in (*spec.config_names, *spec.export_names))
"""The engines' configs and exports (EngineSpec.config_names, export_names): a plan for one engine removes the
other's, so a dir never holds both."""
EXPORT_FILES = ("plan.json", "job.yaml", "accelerate.yaml", "job.sbatch", *ENGINE_FILES)
"""What `launch plan --out` writes."""
RUN_ENTRIES = (*EXPORT_FILES, "state.json", "report.json", "data.json", "memory.png", "slurm.json", "sweep.json",
               "requeues.jsonl", "ranks", "steps", "logs", "checkpoint", "control", "heartbeat", "attempts",
               "submitit", "memory-snapshot", "rdzv", "variants", "model")
"""Every name the launcher writes at the top of a run dir: all that --overwrite may delete (with its temporaries,
launcher.files.fsutil.is_temporary, and Slurm's output file below)."""
SLURM_OUTPUT = re.compile(r"slurm-\d+\.out")
"""The sbatch script's own output file (#SBATCH --output=RUN/slurm-%j.out)."""
PLAN_OUT_ENTRIES = (MARKER, ".lock", *EXPORT_FILES)
"""What a dir `launch plan --out` made holds; any other launcher name in it is a run's."""
FINAL_STATUSES = ("completed", "checkpointed", "failed", "oom")
"""A rank file with one of these is the rank's last word for its attempt."""


SLUG_MAX_CHARS = 64
"""Longest slug: a file name (255 bytes at most) has room for it, a timestamp and a variant index."""


def slug(name: str) -> str:
    """The one file-name form of a job or variant name, for every path built from one (run dirs, the sbatch
    script's RUN_DIR, Slurm's job name): letters, digits, '.', '_' and '-', never starting with '.' or '-', so
    neither '..' nor a '/' nor a hidden or option-like name can come out of it."""
    text = re.sub(r"[^A-Za-z0-9._-]+", "-", name[:SLUG_MAX_CHARS * 16]).strip("-.")
    return text[:SLUG_MAX_CHARS].strip("-.") or "job"


def default_run_dir(job_name: str, root: Path = Path("runs")) -> Path:
    """runs/<job slug>-<local date-time>: the run dir when --run-dir is not given."""
    return root / f"{slug(job_name)}-{time.strftime('%Y%m%d-%H%M%S')}"


def contents(path: Path) -> list[str]:
    """The names in ``path`` besides the lock file, sorted; [] when it is missing or empty (OSError when it
    cannot be listed)."""
    try:
        return sorted(p.name for p in path.iterdir() if p.name != ".lock")
    except (FileNotFoundError, NotADirectoryError):
        return []


def few(names: list[str], n: int = 4) -> str:
    """The first ``n`` names joined, with "and K more" for the rest: for messages."""
    return ", ".join(names[:n]) + (f" and {len(names) - n} more" if len(names) > n else "")


def is_own(p: Path) -> bool:
    """Whether ``p``, an entry at the top of a run dir carrying the marker, is one the launcher writes: an exact
    launcher name, one of its temporaries, or the sbatch script's output file; never ``.<name>.<anything>``."""
    return p.name in RUN_ENTRIES or is_temporary(p.name) or bool(SLURM_OUTPUT.fullmatch(p.name))


def is_marked(path: Path) -> bool:
    """Whether ``path`` carries the marker of a dir launch made (a regular file: a link does not count)."""
    return has_marker(path, MARKER)


def run_entries(path: Path) -> list[str]:
    """The names in ``path`` only a run writes (state.json, ranks/, checkpoint/, ...), not `plan --out`."""
    try:
        return [n for n in contents(path) if n in RUN_ENTRIES and n not in PLAN_OUT_ENTRIES]
    except OSError:
        return []


def unmarked_for_resume(path: Path) -> ConfigError | None:
    """The error for --resume of a dir launch did not make, else None: a dir holding ``checkpoint/latest`` is
    not a run dir for that (DeepSpeed's own save_checkpoint leaves one), and --resume would write into it. A new
    or empty dir holds nothing of anyone's (a sweep's variant dir planned for the first time)."""
    if is_marked(path):
        return None
    try:
        if not contents(path):
            return None
    except OSError:  # unreadable: what it holds cannot be known, so it is not taken
        pass
    return ConfigError(
        f"--resume: {str(path)!r} was not made by launch (no {MARKER} in it; DeepSpeed's own save_checkpoint "
        "leaves a checkpoint/latest too), and --resume continues only a run dir launch made; start afresh with "
        f"another --run-dir, or, if an older launch made this one, mark it with touch {str(path / MARKER)!r}")


def foreign_dir(path: Path, *, flag: str) -> ConfigError | None:
    """The error for a non-empty dir launch did not make (no MARKER), else None. Nothing in it is touched:
    a directory of notes, data or a home directory is never a run dir, with --overwrite or without."""
    try:
        names = contents(path)
    except OSError as e:  # a dir this user may not list: what it holds cannot be known, so it is not taken
        return ConfigError(f"{flag}: {str(path)!r} cannot be read ({e.strerror}); choose a directory you can "
                           "write")
    if not names or is_marked(path):
        return None
    return ConfigError(
        f"{flag}: {str(path)!r} is not empty and was not made by launch (it holds {few(names)}); launch writes "
        f"only into a new or empty directory or one it made ({MARKER} in it), and --overwrite replaces only "
        f"those; choose another {flag}")


def refuse_protected(path: Path, *, flag: str = "--run-dir", by: str = "--overwrite") -> None:
    """``by`` (--overwrite, or launch export replacing its --out) never clears the working directory, a directory
    above it, the home directory or /, whatever marker it holds."""
    target = path.resolve()
    cwd = Path.cwd().resolve()
    if target == cwd or target in cwd.parents:
        raise ConfigError(f"{flag}: {str(path)!r} is the current directory or holds it ({cwd}); {by} "
                          f"would delete files you are working in; choose another {flag}")
    if target in (Path.home().resolve(), Path("/")):
        raise ConfigError(f"{flag}: {str(path)!r} is {target}; {by} never clears it; choose another {flag}")


def mark(path: Path, by: str = "launch run") -> None:
    """Write the marker: this dir is launch's own (what --overwrite, --resume and `plan --out` check)."""
    if not is_marked(path):
        write_marker(path, MARKER, by)


LATEST = "latest"
"""The file in RUN/checkpoint/ naming the newest complete checkpoint (written by the ranks after every rank saved)."""


def latest_checkpoint_tag(checkpoint_dir: Path) -> str | None:
    """The tag ``checkpoint/latest`` names (``step-00000007``), or None when there is no complete checkpoint; the one
    reader of that file for the launcher, the backends and the ranks."""
    try:
        return (Path(checkpoint_dir) / LATEST).read_text().strip() or None
    except OSError:
        return None


@dataclass(slots=True)
class RunDir:
    """A run directory: its layout (ranks/, steps/, logs/, checkpoint/, control/), its lock, redacted writes, state
    and the readers of the rank files."""

    path: Path
    _lock_fd: int | None = field(default=None, repr=False)

    @property
    def ranks(self) -> Path:
        """ranks/: each rank's final memory file, rank-K.json."""
        return self.path / "ranks"

    @property
    def steps(self) -> Path:
        """steps/: each rank's step lines, rank-K.jsonl."""
        return self.path / "steps"

    @property
    def logs(self) -> Path:
        """logs/: each rank's redacted output, rank-K.log."""
        return self.path / "logs"

    @property
    def checkpoint(self) -> Path:
        """checkpoint/: the training checkpoints a resume starts from."""
        return self.path / "checkpoint"

    @property
    def latest_checkpoint(self) -> str | None:
        """The newest complete checkpoint's tag, or None (see latest_checkpoint_tag)."""
        return latest_checkpoint_tag(self.checkpoint)

    @property
    def control(self) -> Path:
        """control/: requests to the ranks (a checkpoint request file)."""
        return self.path / "control"

    def rank_log(self, rank: int) -> Path:
        """The log file of rank ``rank``."""
        return self.logs / f"rank-{rank}.log"

    @classmethod
    def create(cls, path: Path, *, overwrite: bool = False, resume: bool = False,
               job_state: Callable[[str], str | None] | None = None) -> RunDir:
        """Make (or reopen with resume) a run dir and hold its lock for this process's life. ``job_state`` asks
        the scheduler whether a job that wrote here still runs (launcher.backends.slurm_state.live_state).

        A non-empty dir is taken only when launch made it (MARKER): with --overwrite its own files are replaced,
        with --resume it continues. Anything else is refused before a file is touched.
        """
        path = Path(path)
        if path.exists() and not path.is_dir():
            raise ConfigError(f"--run-dir: {str(path)!r} exists and is not a directory; choose another path")
        foreign = unmarked_for_resume(path) if resume else foreign_dir(path, flag="--run-dir")
        if foreign:
            raise foreign
        existing = any(n != MARKER for n in contents(path))
        if existing and not (overwrite or resume):
            raise ConfigError(f"--run-dir: {str(path)!r} already holds a run; pass --overwrite to replace it, "
                              "--resume to continue it, or choose another --run-dir")
        if existing and overwrite and not resume:
            refuse_protected(path)
        try:
            private_dir(path)  # 0700 before anything is written in it (launcher.files.fsutil: the permissions policy)
            probe = path / f".write-test.{os.getpid()}{TMP_SUFFIX}"
            probe.write_text("")
            probe.unlink()
        except OSError as e:
            raise ConfigError(f"--run-dir: {str(path)!r} is not writable ({e.strerror}); "
                              "choose a directory you can write") from None
        run = cls(path.resolve())
        run.lock()
        if existing:
            try:
                run.refuse_if_live(overwrite=overwrite and not resume, job_state=job_state)
            except ConfigError:
                run.unlock()
                raise
        if existing and overwrite and not resume:
            kept = run.clear()
            if kept:
                print(f"launch: --overwrite kept what launch did not write in {str(run.path)!r}: "
                      f"{', '.join(kept)}", file=sys.stderr)
        mark(run.path)
        for d in (run.ranks, run.steps, run.logs, run.control):
            private_dir(d, parents=False)
        # A checkpoint request left by a launch that died before the ranks saw it would stop this run at once.
        (run.control / "checkpoint").unlink(missing_ok=True)
        return run

    @classmethod
    def open(cls, path: Path) -> RunDir:
        """An existing run dir (it must hold plan.json), without taking its lock; ConfigError otherwise."""
        path = Path(path)
        if not (path / "plan.json").is_file():
            raise ConfigError(f"RUN_DIR: {str(path)!r} holds no plan.json; give a directory made by `launch`")
        return cls(path.resolve())

    def lock(self, *, wait_s: float = 0.0, flag: str = "--run-dir") -> None:
        """Take the run dir's lock, waiting up to ``wait_s`` for another holder (`plan --out` swaps in
        milliseconds; a launch holds it for its whole run); ConfigError when it stays held."""
        fd = os.open(self.path / ".lock", os.O_RDWR | os.O_CREAT, FILE_MODE)
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() < deadline:
                    time.sleep(0.05)
                    continue
                os.close(fd)
                raise ConfigError(f"{flag}: {str(self.path)!r} is in use by another launch (lock held); "
                                  f"wait for it or choose another {flag}") from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._lock_fd = fd

    def unlock(self) -> None:
        """Release the run dir's lock if this process holds it."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def refuse_if_live(self, *, overwrite: bool, job_state: Callable[[str], str | None] | None = None,
                       flag: str = "--run-dir", what: str | None = None) -> None:
        """Refuse a run dir whose job still runs: the lock lives only as long as the process that launched it.

        After `launch --slurm` returns, the job it queued writes here on its own; a local launch holds the lock
        itself, but it is checked too (its pid and start time, launcher.processes.procs) in case the dir is reached
        through another mount, and so are the rank processes it recorded, which must never outlive it.
        """
        st = self.run_state()
        what = what or ("--overwrite would delete the files it is writing" if overwrite else
                        "a second launch would write into the same files")
        job_id = st.slurm_job_id
        if job_id and st.state in LIVE_STATES:
            try:
                if job_state is None:
                    raise ConfigError("nothing here can ask Slurm")
                live = job_state(str(job_id))
            except ConfigError as e:
                raise ConfigError(
                    f"{flag}: {str(self.path)!r} belongs to slurm job {job_id} (state.json: {st.state}) and "
                    f"whether it still runs cannot be checked ({e}); {what}. Stop it with `launch cancel "
                    f"{self.path}` where Slurm answers, or choose another {flag}") from None
            if live:
                raise ConfigError(
                    f"{flag}: {str(self.path)!r} belongs to slurm job {job_id}, which is still {live}; {what}. "
                    f"Stop it first with `launch cancel {self.path}`, or choose another {flag}")
            return
        launch = st.live_launch() if st.state in LIVE_STATES else None
        if launch is not None:
            raise ConfigError(
                f"{flag}: {str(self.path)!r} is in use by launch process {launch.pid}, which is still running; "
                f"{what}. Stop it first (kill -INT {launch.pid}), or choose another {flag}")
        ranks = [r.pid for r in st.live_ranks()]
        if ranks:  # whatever state.json says: a rank that outlived its launch still writes here
            pids = " ".join(map(str, ranks))
            raise ConfigError(
                f"{flag}: {str(self.path)!r} has rank processes still running ({pids}) though their launch is "
                f"gone; {what}. Stop them first (kill {pids}), or choose another {flag}")

    def clear(self) -> list[str]:
        """Delete what the launcher wrote here (never following a link out of the dir); every name it kept."""
        # Defence in depth (create() has refused these already): never clear a filesystem root, HOME, or a dir
        # without the marker, whoever calls this.
        here = self.path.resolve()
        if here == Path(here.anchor) or here == Path.home().resolve() or not is_marked(here):
            raise ConfigError(f"--run-dir: {str(self.path)!r} is not a run dir the launcher made (no {MARKER}); "
                              "--overwrite never clears it; choose another --run-dir")
        kept = []
        for p in sorted(self.path.iterdir()):
            if p.name in (".lock", MARKER):
                continue
            if not is_own(p):
                kept.append(p.name)
                continue
            remove(p)
        return kept

    def write_json(self, name: str, data) -> Path:
        """Write ``data`` as indented JSON, secret values redacted, atomically; returns the path."""
        data = json.loads(json.dumps(data, default=str))  # plain data first, so every string can be redacted
        return atomic_write(self.path / name, json.dumps(redact_data(data), indent=2) + "\n")

    def write_text(self, name: str, text: str) -> Path:
        """Write ``text`` with secret values redacted, atomically; returns the path."""
        return atomic_write(self.path / name, redact(text))

    def write_yaml(self, name: str, data) -> Path:
        """Write ``data`` as YAML (keys in order), secret values redacted, atomically; returns the path."""
        return atomic_write(self.path / name, yaml.safe_dump(redact_data(data), sort_keys=False))

    def redact_logs(self) -> list[Path]:
        """Scrub secret values from what the ranks printed (they write their logs directly); the files changed."""
        secrets = secret_values()
        if not secrets:
            return []
        files = [p for d in (self.logs, self.path / "attempts") if d.is_dir() for p in d.rglob("*.log")]
        return [p for p in files if p.is_file() and redact_file(p, secrets)]

    def redact_submitit_logs(self, files: list[Path] | None = None) -> list[Path]:
        """Scrub submitit's stdout/stderr files (the torchrun agent's and submitit's own output); the files changed.

        ``files`` limits it to those (a task scrubs only its own, which nothing else writes); by default every
        ``*_log.out``/``*_log.err`` under RUN/submitit, for when the job has ended.
        """
        secrets = secret_values()
        if not secrets:
            return []
        if files is None:
            folder = self.path / "submitit"
            files = sorted(folder.glob("*_log.out")) + sorted(folder.glob("*_log.err")) if folder.is_dir() else []
        return [p for p in files if p.is_file() and redact_file_in_place(p, secrets)]

    def archive_attempt(self, attempt: int) -> Path:
        """Move attempt ``attempt``'s outputs to RUN/attempts/<attempt>/ and leave RUN ready for the next one."""
        dest = private_dir(private_dir(self.path / "attempts", parents=False) / str(attempt), parents=False)
        for name in ATTEMPT_ITEMS:
            src = self.path / name
            if src.exists() or src.is_symlink():
                os.replace(src, dest / name)
        for d in (self.ranks, self.steps, self.logs, self.control):
            private_dir(d, parents=False)
        (self.control / "checkpoint").unlink(missing_ok=True)
        return dest

    def read_json(self, name: str):
        """A JSON file of the run dir, parsed."""
        return json.loads((self.path / name).read_text())

    def set_state(self, state: RunStateName, **fields) -> RunState:
        """Update state.json (launcher.records.runstate.RunState.update: ``launch=ProcessRef``, listed fields, the rest
        kept as extra) and write it, secret values redacted, with room kept so a full disk cannot keep the next
        state out (launcher.files.fsutil.write_reserved). Returns the state written."""
        current = self.run_state().update(state, **fields)
        text = json.dumps(redact_data(json.loads(json.dumps(current.to_json(), default=str))), indent=2) + "\n"
        write_reserved(self.path / "state.json", text, RESERVE_BYTES)
        return current

    def state(self) -> dict:
        """state.json's contents; {} before it exists."""
        return self.run_state().to_json() if (self.path / "state.json").is_file() else {}

    def run_state(self) -> RunState:
        """state.json as a RunState; an empty one before it exists or when it cannot be read."""
        try:
            return RunState.from_json(json.loads((self.path / "state.json").read_text()))
        except (OSError, ValueError, TypeError, KeyError):
            return RunState()

    def rank_files(self) -> list[Path]:
        """The rank memory files ranks/rank-K.json, by rank."""
        return sorted(self.ranks.glob("rank-*.json"), key=lambda p: int(p.stem.split("-")[1]))

    def rank_reports(self, since: float | None = None) -> dict[int, RankReport]:
        """rank -> its ranks/rank-K.json; with ``since``, only files written after it (this attempt). A file that
        cannot be read (a rank killed while writing it, or not a rank report) is left out: the others still tell
        what happened."""
        out = {}
        for p in self.rank_files():
            try:
                if since is not None and p.stat().st_mtime < since:
                    continue
                rank = int(p.stem.split("-")[1])
                out[rank] = RankReport.from_json({"rank": rank, **json.loads(p.read_text())})
            except (OSError, ValueError, TypeError, KeyError):
                continue
        return out

    def rank_statuses(self, world_size: int, since: float | None = None) -> dict[int, str]:
        """rank -> the status its file records, for ranks 0..world_size-1."""
        return {r: d.status for r, d in self.rank_reports(since).items() if r < world_size}

    def wait_for_rank_files(self, world_size: int, timeout_s: float, poll_s: float = 0.5) -> bool:
        """Until every rank's file holds a final status (ranks on other nodes may still be writing theirs when
        this node's agent returns), or ``timeout_s`` passes; whether they all did."""
        deadline = time.monotonic() + timeout_s
        while True:
            statuses = self.rank_statuses(world_size)
            if len(statuses) == world_size and all(s in FINAL_STATUSES for s in statuses.values()):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll_s)
