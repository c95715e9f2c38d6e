"""Checkpoint-on-request: SIGUSR2 / SIGTERM or a control file ask every rank to save and exit.

Slurm (through submitit) sends USR2 before the time limit; torchrun forwards SIGTERM
when its agent is stopped; a user or the launcher can touch RUN_DIR/control/checkpoint.
A handler only sets a flag: the ranks act on it together at the next optimizer-step
boundary, after agreeing with one all_reduce(MAX), so no rank saves alone.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import torch
import torch.distributed as dist

from launcher.processes.rankenv import CONTROL_FILE  # rank 0 removes it once the checkpoint is saved


class CheckpointRequests:
    """A rank's checkpoint requests: a signal (SIGUSR2, SIGTERM) or RUN_DIR/control/checkpoint sets them; the
    ranks agree at a step boundary (agreed) and act together."""

    def __init__(self, run_dir: str | os.PathLike | None):
        self.control_file = Path(run_dir) / "control" / CONTROL_FILE if run_dir else None
        self.signal_name: str | None = None
        self._previous: dict[int, object] = {}

    def install(self, signals: tuple[int, ...] = (signal.SIGUSR2, signal.SIGTERM)) -> None:
        """Handle ``signals`` by noting the request (a second SIGTERM exits at once), keeping the old handlers."""
        for sig in signals:
            self._previous[sig] = signal.signal(sig, self._on_signal)

    def restore(self) -> None:
        """Put back the handlers install() replaced."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _on_signal(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        if name == "SIGTERM" and self.signal_name == "SIGTERM":
            # A second SIGTERM means "now": the first one's checkpoint is not coming (e.g. a peer died).
            raise SystemExit(128 + signum)
        self.signal_name = name

    def local(self) -> str | None:
        """Why this rank wants a checkpoint now (a signal or the control file), or None."""
        if self.signal_name:
            return self.signal_name
        if self.control_file is not None and self.control_file.exists():
            return "control file"
        return None

    def agreed(self, device: torch.device | str = "cpu") -> str | None:
        """Collective: any rank's request counts for all. Call at the same step boundary on every rank."""
        reason = self.local()
        if not (dist.is_available() and dist.is_initialized()):
            return reason
        flag = torch.tensor([1.0 if reason else 0.0], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item() > 0:
            return reason or "another rank asked"
        return None

    def consume(self) -> None:
        """Remove the control file so the resumed run does not stop again at once."""
        if self.control_file is not None:
            self.control_file.unlink(missing_ok=True)
        self.signal_name = None
