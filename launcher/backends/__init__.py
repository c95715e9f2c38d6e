"""The backends by name, each with what it can do: the session asks these flags, never a backend's name.

A job's ``launcher:`` names one (launcher.config.job.Job.launcher's Literal lists the same names; tests/backends
holds the two equal, test_registry.py). Importing this module imports no backend: ``BackendSpec.load`` does, when a run
needs it.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True, slots=True)
class BackendSpec:
    """One backend: its class and its capabilities (as submitit's executors and this project's engines have)."""

    name: str
    """The job's ``launcher:`` value."""
    module: str
    """The module that holds the Backend subclass."""
    cls: str
    """The Backend subclass's name."""
    queued: bool
    """A scheduler starts the ranks on its nodes, later: the job has an allocation and a time limit, the ranks find
    their own head node (no --node-rank/--rdzv-endpoint), and this machine's GPU, NVMe and flash-attn are not theirs
    (checked on the nodes). False: the ranks run here and the ladder (--auto-fallback) can relaunch them."""
    arrays: bool
    """A sweep's variants run as one array job."""
    cancel: bool
    """`launch cancel` stops its job (a local run stops with Ctrl-C or kill -INT)."""
    requeue: bool
    """A preempted job is requeued and resumes from its last checkpoint."""

    def load(self) -> type:
        """The Backend subclass (imports its module)."""
        return getattr(importlib.import_module(self.module), self.cls)


BACKENDS: dict[str, BackendSpec] = {spec.name: spec for spec in (
    BackendSpec(name="local", module="launcher.backends.local", cls="LocalBackend", queued=False, arrays=False,
                cancel=False, requeue=False),
    BackendSpec(name="slurm", module="launcher.backends.slurm", cls="SlurmBackend", queued=True, arrays=True,
                cancel=True, requeue=True),
)}
"""Every backend by its ``launcher:`` name."""


def backend_spec(name: str) -> BackendSpec:
    """The backend ``launcher:`` names; KeyError for a name not registered (the job's Literal refuses it first)."""
    return BACKENDS[name]
