"""Which process is which, and how long it lives: a pid with its start time, and the Linux switches that tie a
rank's life to the launcher's.

A pid alone names a process only while it lives: once it exits, the kernel hands the number to the next process.
The start time (/proc/PID/stat, field 22: clock ticks after boot) tells the recorded process from a later one
with the same number, so liveness is decided by the pair, never by what a command line happens to contain.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time
from dataclasses import dataclass

PR_SET_PDEATHSIG = 1
"""prctl(2): the signal this process gets when the thread that started it exits."""
PR_SET_CHILD_SUBREAPER = 36
"""prctl(2): orphaned descendants are handed to this process instead of init."""
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
"""Signals that ask a process to stop (a scheduler's preemption, Ctrl-C, a closed session): a rank ended by one
was interrupted, not broken."""


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat from field 3 on (the state), or None when there is no such process. The command name
    (field 2) is skipped whole: it sits in parentheses and may hold spaces and parentheses itself."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    return text[text.rfind(")") + 2:].split()


def start_ticks(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks after boot (field 22 of /proc/PID/stat); None when it does not exist."""
    fields = _stat_fields(pid)
    try:
        return int(fields[19]) if fields else None
    except (IndexError, ValueError):
        return None


def process_alive(pid: int, started: int | None) -> bool:
    """Whether the process ``pid`` that started at ``started`` (start_ticks) still runs: it exists, is no zombie
    and started then. Without a recorded start (a state.json written before it was recorded) any live process
    with that pid counts, so a dir is refused rather than taken from a run that may still write it."""
    if pid <= 0:
        return False
    fields = _stat_fields(pid)
    if not fields or fields[0] in ("Z", "X"):
        return False
    return started is None or start_ticks(pid) == started


@dataclass(kw_only=True, slots=True)
class ProcessRef:
    """One process as state.json records it: its pid and when it started, which together name it for good."""

    pid: int
    """Process id."""
    start_ticks: int | None = None
    """Its start, clock ticks after boot (/proc/PID/stat field 22); None when it could not be read."""

    @classmethod
    def of(cls, pid: int) -> ProcessRef:
        """The reference to the live process ``pid`` (its start read now)."""
        return cls(pid=pid, start_ticks=start_ticks(pid))

    def alive(self) -> bool:
        """Whether this very process still runs (process_alive)."""
        return process_alive(self.pid, self.start_ticks)

    def to_json(self) -> dict:
        """The reference as state.json's dict."""
        return {"pid": self.pid, "start_ticks": self.start_ticks}

    @classmethod
    def from_json(cls, d: dict) -> ProcessRef:
        """A reference read from state.json."""
        ticks = d.get("start_ticks")
        return cls(pid=int(d["pid"]), start_ticks=int(ticks) if ticks is not None else None)


def _prctl(option: int, arg: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0) == 0
    except (OSError, AttributeError):  # not Linux: no prctl
        return False


def die_with_parent(expected_parent: int | None = None, sig: int = signal.SIGKILL) -> bool:
    """Have the kernel send ``sig`` to this process when its parent (the thread that started it) exits; whether
    that holds. With ``expected_parent``, a parent already gone before the switch was set (the launcher killed
    while this process started) is caught too: this process then leaves at once, as the signal would have made it."""
    armed = _prctl(PR_SET_PDEATHSIG, int(sig))
    if armed and expected_parent is not None and os.getppid() != expected_parent:
        os.kill(os.getpid(), sig)
    return armed


def become_subreaper() -> bool:
    """Make this process the one its orphaned descendants are handed to, so end_descendants finds every one of
    them (a daemonized child included); whether that holds."""
    return _prctl(PR_SET_CHILD_SUBREAPER, 1)


def end_descendants(keep: set[int] | frozenset[int] = frozenset(), grace_s: float = 2.0) -> list[int]:
    """SIGTERM every live descendant of this process but those in ``keep``, then SIGKILL those still there after
    ``grace_s``; the pids ended."""
    import psutil

    try:
        procs = [p for p in psutil.Process().children(recursive=True) if p.pid not in keep]
    except psutil.Error:
        return []
    for p in procs:
        try:
            p.terminate()
        except psutil.Error:
            pass
    _, left = psutil.wait_procs(procs, timeout=grace_s)
    for p in left:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(left, timeout=grace_s)
    return [p.pid for p in procs]


def exit_words(exitcode: int) -> str:
    """How a process ended, in words: "killed by SIGKILL" for a signal (negative, as subprocess and torchrun
    report it), else "exit code N"."""
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit code {exitcode}"


def stopped_by_request(exitcode: int) -> bool:
    """Whether an exit code is a death by one of STOP_SIGNALS (asked to stop, not broken)."""
    return exitcode < 0 and -exitcode in {int(s) for s in STOP_SIGNALS}


def wait_gone(refs: list[ProcessRef], timeout_s: float, poll_s: float = 0.05) -> list[ProcessRef]:
    """Until none of ``refs`` is alive or ``timeout_s`` passes; the ones still alive."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = [r for r in refs if r.alive()]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(poll_s)
