"""The run directory: layout, exclusive lock, atomic writes, and the run's state.

    RUN/job.yaml  plan.json  ds_config.json | fsdp.yaml  state.json  report.json  memory.png
    RUN/ranks/rank-K.json    peak memory by phase and category, written by each rank
    RUN/steps/rank-K.jsonl   one line per optimizer step
    RUN/logs/rank-K.log      each rank's stdout and stderr
    RUN/checkpoint/          the last checkpoint (engine-native)
    RUN/control/             files the launcher drops to ask ranks for something (checkpoint)
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from launcher.errors import ConfigError
from launcher.fsutil import atomic_write


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-") or "job"


def default_run_dir(job_name: str, root: Path = Path("runs")) -> Path:
    return root / f"{slug(job_name)}-{time.strftime('%Y%m%d-%H%M%S')}"


@dataclass(slots=True)
class RunDir:
    path: Path
    _lock_fd: int | None = field(default=None, repr=False)

    @property
    def ranks(self) -> Path:
        return self.path / "ranks"

    @property
    def steps(self) -> Path:
        return self.path / "steps"

    @property
    def logs(self) -> Path:
        return self.path / "logs"

    @property
    def checkpoint(self) -> Path:
        return self.path / "checkpoint"

    @property
    def control(self) -> Path:
        return self.path / "control"

    def rank_log(self, rank: int) -> Path:
        return self.logs / f"rank-{rank}.log"

    @classmethod
    def create(cls, path: Path, *, overwrite: bool = False, resume: bool = False) -> RunDir:
        """Make (or reopen with resume) a run dir and hold its lock for this process's life."""
        path = Path(path)
        if path.exists() and not path.is_dir():
            raise ConfigError(f"--run-dir: {str(path)!r} exists and is not a directory; choose another path")
        existing = path.is_dir() and any(p.name != ".lock" for p in path.iterdir())
        if existing and not (overwrite or resume):
            raise ConfigError(f"--run-dir: {str(path)!r} already holds a run; pass --overwrite to replace it, "
                              "--resume to continue it, or choose another --run-dir")
        try:
            path.mkdir(parents=True, exist_ok=True)
            probe = path / f".write-test-{os.getpid()}"
            probe.write_text("")
            probe.unlink()
        except OSError as e:
            raise ConfigError(f"--run-dir: {str(path)!r} is not writable ({e.strerror}); "
                              "choose a directory you can write") from None
        run = cls(path.resolve())
        run.lock()
        if existing and overwrite and not resume:
            run.clear()
        for d in (run.ranks, run.steps, run.logs, run.control):
            d.mkdir(exist_ok=True)
        return run

    @classmethod
    def open(cls, path: Path) -> RunDir:
        path = Path(path)
        if not (path / "plan.json").is_file():
            raise ConfigError(f"RUN_DIR: {str(path)!r} holds no plan.json; give a directory made by `launch`")
        return cls(path.resolve())

    def lock(self) -> None:
        fd = os.open(self.path / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ConfigError(f"--run-dir: {str(self.path)!r} is in use by another launch (lock held); "
                              "wait for it or choose another --run-dir") from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._lock_fd = fd

    def clear(self) -> None:
        import shutil

        for p in self.path.iterdir():
            if p.name == ".lock":
                continue
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()

    def write_json(self, name: str, data) -> Path:
        return atomic_write(self.path / name, json.dumps(data, indent=2, default=str) + "\n")

    def write_text(self, name: str, text: str) -> Path:
        return atomic_write(self.path / name, text)

    def write_yaml(self, name: str, data) -> Path:
        return atomic_write(self.path / name, yaml.safe_dump(data, sort_keys=False))

    def read_json(self, name: str):
        return json.loads((self.path / name).read_text())

    def set_state(self, state: str, **extra) -> None:
        current = {}
        if (self.path / "state.json").is_file():
            current = self.read_json("state.json")
        current.update(state=state, updated=time.time(), **extra)
        self.write_json("state.json", current)

    def state(self) -> dict:
        p = self.path / "state.json"
        return json.loads(p.read_text()) if p.is_file() else {}

    def rank_files(self) -> list[Path]:
        return sorted(self.ranks.glob("rank-*.json"), key=lambda p: int(p.stem.split("-")[1]))

    def has_checkpoint(self) -> bool:
        return (self.checkpoint / "latest").is_file()
