"""What every backend (torchrun here, Slurm through submitit) offers the run session (launcher.session)."""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from launcher.files.rundir import RunDir
from launcher.records.runreport import RunOutcome

if TYPE_CHECKING:
    from launcher.config.job import Job
    from launcher.emit.slurm_alloc import SlurmResources
    from launcher.planner.plan import Plan


@dataclass(kw_only=True, slots=True)
class LaunchSpec:
    """What to start on each node."""

    gpus_per_node: int
    nodes: int
    node_rank: int = 0
    rdzv_endpoint: str | None = None
    """host:port of the c10d rendezvous; None on one node (standalone)."""
    script: str | None = None
    """A user script to run instead of the built-in worker."""
    script_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment for every rank."""
    hang_timeout_s: float = 0.0
    """End the run when no rank makes progress for this long; 0 disables the watchdog."""
    checkpoint_on_interrupt_s: float = 0.0
    """0: Ctrl-C/SIGTERM stops the ranks at once; else ask them for a checkpoint and wait this long first."""


class Backend(abc.ABC):
    """One way to start the ranks. The session calls run() the same way for every backend and judges the RunOutcome."""

    name: str
    on_start: Callable[[str], None] | None = None
    """Called once the ranks are on their way, with the scheduler's job id ('' when they run here); the session
    prints and starts its live view there."""

    @classmethod
    def create(cls, job: Job, plan: Plan, *, follow: bool, report: Callable | None,
               resources: SlurmResources | None) -> Backend:
        """The backend for one run of ``plan``, its own settings checked before a run dir exists (ConfigError).
        ``follow``: a queued job is waited for (--wait); ``report``: the session's finish, for a job that writes
        its own verdict; ``resources``: a queued job's allocation (launcher.backends.BackendSpec.queued)."""
        return cls()

    @abc.abstractmethod
    def run(self, run: RunDir, spec: LaunchSpec) -> RunOutcome:
        """Start the ranks and block until they end (or, for a scheduler, until the job is submitted and, when
        followed, ended)."""

    def time_limit_min(self) -> int | None:
        """The scheduler's time limit for the job, minutes; None where the ranks run here without one."""
        return None

    def started(self, job_id: str = "") -> None:
        """Tell the session (on_start) that the ranks are on their way; a backend calls it once."""
        if self.on_start is not None:
            self.on_start(job_id)
