"""RUN_DIR/state.json: where a run stands (submitted, running, or how it ended) and which processes own it.

The launch that writes the run dir records itself (pid and start time) and, once torchrun has started them, this
node's rank processes: whether any of them still runs is decided from those pairs (launcher.processes.procs), never
from a process's name. The run's last word is written by launcher.session.finish from the one verdict; a state still
"running" whose launch is gone is a launch that was killed before it could write one (``abandoned``).
"""

from __future__ import annotations

import dataclasses
import time
import typing
from dataclasses import dataclass, field
from typing import Literal

from launcher.processes.procs import ProcessRef
from launcher.records.shared import known_and_extra, set_fields

RUN_STATE_SCHEMA = 1
"""Version of state.json's layout; from_json refuses a newer one rather than misread it."""
RunStateName = Literal["", "submitted", "running", "completed", "interrupted", "failed", "over_budget", "cancelled"]
"""Where a run stands; "" before any run (a `launch plan --out` set)."""
LIVE_STATES: tuple[RunStateName, ...] = ("submitted", "running")
"""States in which a job or a launch may still be writing the run dir."""
KILLED = "killed"
"""What `launch status` shows for a run still marked running whose launch is gone: it was killed (SIGKILL, the
OOM killer, a reboot) before it could write a verdict. Never written to state.json: derived by whoever reads it."""
RESERVE_BYTES = 8192
"""Disk kept for state.json's next version, so a full disk cannot keep the verdict out: it is then rewritten in
place, in blocks the file already holds (launcher.files.fsutil.write_reserved)."""


@dataclass(kw_only=True, slots=True)
class RunState:
    """state.json: the run's state, why, and the processes (launch, ranks) that own the dir while it runs."""

    state: RunStateName = ""
    """submitted, running, completed, interrupted, failed, over_budget or cancelled; "" before any run."""
    updated: float = 0.0
    """When it was last written, seconds since the epoch."""
    message: str | None = None
    """Why the run ended so (a failure, an interrupt, a Slurm cancel)."""
    pid: int | None = None
    """The local launch process that owns the run dir."""
    pid_start_ticks: int | None = None
    """Its start, clock ticks after boot (launcher.processes.procs.start_ticks); None in files written before it was
    kept."""
    ranks: list[ProcessRef] = field(default_factory=list)
    """This node's rank processes of the current attempt, once started."""
    slurm_job_id: str | None = None
    """The Slurm job writing the dir (--slurm)."""
    host: str | None = None
    """The node a Slurm job's first task runs on."""
    attempt: int | None = None
    """The attempt running: the ladder's (--auto-fallback) or Slurm's restart count."""
    attempts: int | None = None
    """With --auto-fallback: attempts made in all."""
    extra: dict[str, object] = field(default_factory=dict)
    """Fields another writer added (a sweep's summary time, Slurm's requeue count), kept as they are."""
    schema: int = RUN_STATE_SCHEMA
    """Layout version of this file."""

    @property
    def launch(self) -> ProcessRef | None:
        """The owning launch process, as recorded; None without one."""
        return ProcessRef(pid=self.pid, start_ticks=self.pid_start_ticks) if self.pid else None

    def update(self, state: RunStateName, *, launch: ProcessRef | None = None, **fields) -> RunState:
        """This state moved on to ``state`` now: ``launch`` records the owning process, listed fields take their
        values and any other goes to ``extra``; returns self. ValueError for a state RunStateName does not list."""
        if state not in typing.get_args(RunStateName):
            raise ValueError(f"state.json: {state!r} is not a run state ({', '.join(typing.get_args(RunStateName))})")
        self.state, self.updated = state, time.time()
        if launch is not None:
            self.pid, self.pid_start_ticks = launch.pid, launch.start_ticks
        set_fields(self, fields, skip=("extra", "schema", "state", "updated"))
        return self

    def live_launch(self) -> ProcessRef | None:
        """The owning launch while it still runs (its pid and start time match a live process), else None."""
        ref = self.launch
        return ref if ref is not None and ref.alive() else None

    def live_ranks(self) -> list[ProcessRef]:
        """The recorded rank processes still alive."""
        return [r for r in self.ranks if r.alive()]

    def abandoned(self) -> bool:
        """Marked live by a local launch that is gone: it was killed before it wrote how the run ended."""
        return self.state in LIVE_STATES and not self.slurm_job_id and self.pid is not None and \
            self.live_launch() is None

    def to_json(self) -> dict:
        """state.json's dict: fields that are None or empty left out, the extra fields merged in at the top."""
        out: dict[str, object] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "extra" or value is None or (f.name == "ranks" and not value):
                continue
            out[f.name] = [r.to_json() for r in value] if f.name == "ranks" else value
        return {**out, **self.extra}

    @classmethod
    def from_json(cls, d: dict) -> RunState:
        """A state.json; one written before a field (the schema included) reads with that field's default."""
        known, extra = known_and_extra(cls, d, newest=RUN_STATE_SCHEMA, what="state.json")
        known["ranks"] = [ProcessRef.from_json(r) for r in d.get("ranks") or [] if isinstance(r, dict)]
        if "slurm_job_id" in known:
            known["slurm_job_id"] = str(known["slurm_job_id"])
        return cls(**known, extra=extra)
