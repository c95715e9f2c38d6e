"""What a run is asked to do beyond the job file: the run flags, typed, with no argparse in sight."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


def own_lines(e: Exception) -> list[str]:
    """An error's lines as its message says them (RunOptions.error_lines' default)."""
    return str(e).splitlines()


@dataclass(kw_only=True, slots=True)
class RunOptions:
    """What `launch run` was asked besides the job file: run dir handling, budget enforcement, the node's part in a
    multi-node run, the user's script, following and output."""

    run_dir: Path | None = None
    """Where the run writes; None: runs/<name>-<timestamp>."""
    overwrite: bool = False
    """Replace an existing run dir."""
    resume: bool = False
    """Continue the run dir from its last checkpoint."""
    force: bool = False
    """Run a fully pinned plan even if it is predicted over budget."""
    enforce: bool = False
    """Cap each rank at the budget (CUDA: memory fraction; CPU: the probe raises OOM)."""
    memory_snapshot: bool = False
    """CUDA: record the allocator's history through the first step."""
    node_rank: int = 0
    """This node's rank in a multi-node local run (no unit)."""
    rdzv_endpoint: str | None = None
    """host:port of the c10d rendezvous of a multi-node local run."""
    script: str | None = None
    """A training script run instead of the built-in recipe (path)."""
    script_args: list[str] = field(default_factory=list)
    """Arguments for the script."""
    hang_timeout_s: float = 0.0
    """End the run when no rank progresses for this many seconds; 0: off."""
    checkpoint_on_interrupt: bool = False
    """On Ctrl-C/SIGTERM ask the ranks to checkpoint (the job's checkpoint_on_interrupt asks too)."""
    checkpoint_timeout_s: float = 120.0
    """How long an interrupt waits for that checkpoint, seconds."""
    wait: bool = False
    """Slurm: follow the job to its report instead of returning after submission."""
    quiet: bool = False
    """No live view and no step lines."""
    verbose: bool = False
    """Plain step lines even on a terminal (a console that is not one gets them anyway)."""
    error_lines: Callable[[Exception], list[str]] = own_lines
    """How an error that leaves a sweep variant unplanned is worded: the CLI passes launcher.cli.render.error_lines
    (a no-plan answer is typed, and only the CLI words it); the default is the error's own message."""
