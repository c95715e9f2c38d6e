"""What every backend (torchrun here, Slurm through submitit) offers the CLI."""

from __future__ import annotations

import abc
from dataclasses import dataclass, field

from launcher.rundir import RunDir


@dataclass(kw_only=True, slots=True)
class RankFailure:
    rank: int
    exitcode: int
    """Process exit code; 75 means the rank ran out of memory (see launcher.runtime)."""
    host: str = "?"


@dataclass(kw_only=True, slots=True)
class Outcome:
    """How the ranks ended, before the memory verdict."""

    ok: bool
    failures: list[RankFailure] = field(default_factory=list)
    interrupted: bool = False
    message: str = ""


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


class Backend(abc.ABC):
    name: str

    @abc.abstractmethod
    def run(self, run: RunDir, spec: LaunchSpec) -> Outcome:
        """Start the ranks and block until they end."""
