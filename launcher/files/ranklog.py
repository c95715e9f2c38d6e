"""A rank's log, RUN/logs/rank-K.log: private from its creation, and no secret value ever written into it.

Everything a rank prints (Python, C++ extensions, NCCL/gloo, faulthandler's stack dumps) goes to its file
descriptors 1 and 2. When secret-looking environment variables are set (launcher.files.redact.secret_values), those
descriptors are a pipe to a small redactor process, `python -m launcher.files.ranklog LOG`, which replaces each secret
value by "[redacted]" before a byte reaches the file; a value split across two reads is held back until it can be
told apart. Without secrets the rank writes the file directly (nothing to redact, no extra process).

The redactor runs in its own session (torchrun stops a rank's process group with killpg; the redactor must
outlive the rank to write its last words) and ends at end of file, when the rank and every process that
inherited its output have exited. It holds an exclusive flock on the log while it runs: ``wait_settled`` lets a
reader that needs the whole log (the hang watchdog's stack dumps, the failure tail) wait for the last bytes.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from launcher.files.fsutil import FILE_MODE, private_dir
from launcher.files.redact import REDACTED, secret_values
from launcher.processes.rankenv import safe_python

_redactors: list[subprocess.Popen] = []
"""Kept referenced for the rank's life (a dropped Popen of a running child warns)."""


def open_log(log: Path) -> int:
    """The log's descriptor for appending, 0600 even if an earlier attempt left it with another mode."""
    private_dir(log.parent)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, FILE_MODE)
    os.fchmod(fd, FILE_MODE)
    return fd


def log_fd(log: Path) -> int:
    """What a rank's stdout and stderr should be: the log itself, or a pipe to a redactor writing it."""
    if not secret_values():
        return open_log(log)
    read_end, write_end = os.pipe()
    try:
        _redactors.append(subprocess.Popen(
            [*safe_python(), "-m", "launcher.files.ranklog", str(log)], stdin=read_end, start_new_session=True,
            stdout=subprocess.DEVNULL, close_fds=True))
    finally:
        os.close(read_end)
    return write_end


def redactor_pids() -> set[int]:
    """The pids of this process's log redactors: what a rank leaving keeps (launcher.worker.rank_entry.exit_rank)."""
    return {p.pid for p in _redactors}


def _held_back(data: bytes, needles: list[bytes]) -> int:
    """Length of the longest tail of ``data`` that begins some secret: it may be completed by the next read."""
    for k in range(min(len(data), max(len(n) for n in needles) - 1), 0, -1):
        tail = data[-k:]
        if any(n.startswith(tail) for n in needles):
            return k
    return 0


def _write_all(fd: int, data: bytes) -> None:
    try:
        while data:
            data = data[os.write(fd, data):]
    except OSError:
        pass  # a full disk must not block the rank: keep draining the pipe, drop what cannot be written


def copy_redacted(src: int, dst: int, secrets: list[str]) -> None:
    """Copy ``src`` to ``dst`` until end of file with every secret value replaced."""
    needles = [s.encode() for s in secrets if s]  # longest first (secret_values), so a longer secret goes whole
    mark = REDACTED.encode()
    pending = b""
    while True:
        chunk = os.read(src, 1 << 16)
        if not chunk:
            break
        if not needles:
            _write_all(dst, chunk)
            continue
        pending += chunk
        for n in needles:
            pending = pending.replace(n, mark)
        cut = len(pending) - _held_back(pending, needles)
        _write_all(dst, pending[:cut])
        pending = pending[cut:]
    _write_all(dst, pending)


def wait_settled(*logs: Path, timeout_s: float = 2.0) -> bool:
    """Until no redactor writes any of ``logs`` any more, or ``timeout_s`` in all; whether they all settled."""
    deadline = time.monotonic() + timeout_s
    settled = True
    for log in logs:
        try:
            fd = os.open(log, os.O_RDONLY)
        except OSError:
            continue
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        settled = False
                        break
                    time.sleep(0.02)
                except OSError:  # a filesystem without locks: nothing to wait for
                    break
        finally:
            os.close(fd)
    return settled


def main(argv: list[str]) -> int:
    """The redactor process: copy stdin to the log file with secret values replaced, holding the log's lock until
    end of file; signals are ignored so no byte is lost."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # end only at end of file, with every byte written
    fd = open_log(Path(argv[0]))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError:  # a filesystem without locks: readers then do not wait, the log is still redacted
        pass
    copy_redacted(0, fd, secret_values())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
