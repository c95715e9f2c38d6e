"""`launch run ... | head`: a reader that goes away mid-run must not end the run.

Python ignores SIGPIPE, so a write to a closed pipe raises BrokenPipeError wherever it happens: in the live view's
thread, in a flush after torchrun returns, in the table's print. Left alone, it unwinds `launch` mid-run (state.json
stuck at running, report.json half done). While a run goes on, stdout and stderr are wrapped: the first
BrokenPipeError points the descriptor at /dev/null and the run carries on to its verdict, whose exit code is the
run's (docs/reliability/verdicts.md); what could not be printed is in report.json and `launch status`.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time


class SurvivingStream:
    """A text stream that outlives its reader: after the first BrokenPipeError its output goes to /dev/null."""

    def __init__(self, stream):
        self._stream = stream
        self.dropped_at: float | None = None
        """When the reader went away (time.time()), or None while it reads."""

    def write(self, text: str) -> int:
        """Write ``text``; all of it counts as written once the reader has gone."""
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._drop()
            return len(text)

    def flush(self) -> None:
        """Flush, into /dev/null once the reader has gone."""
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._drop()

    def _drop(self) -> None:
        if self.dropped_at is None:
            self.dropped_at = time.time()
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())  # every writer of this descriptor, C and Python, from now on
            os.close(devnull)
            self._stream.flush()  # what the buffer still holds, now into /dev/null
        except (OSError, ValueError):
            pass

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


@contextlib.contextmanager
def outliving_closed_output():
    """Wrap sys.stdout and sys.stderr in SurvivingStream for the block; yields the (stdout, stderr) wrappers."""
    saved = sys.stdout, sys.stderr
    out, err = SurvivingStream(sys.stdout), SurvivingStream(sys.stderr)
    sys.stdout, sys.stderr = out, err
    try:
        yield out, err
    finally:
        sys.stdout, sys.stderr = saved


def closed_output_note(out: SurvivingStream) -> str | None:
    """The stderr line saying stdout's reader went away during the run, or None when it did not."""
    if out.dropped_at is None:
        return None
    return (f"launch: stdout was closed at {time.strftime('%H:%M:%S', time.localtime(out.dropped_at))} (its reader "
            "went away); the run went on to its verdict, which is the exit code: see report.json or launch status")
