"""glibc's count of the heap in use: an instrument independent of the tensor tracker, for CPU ranks.

The tracker (launcher.runtime.tracker) counts the storages of the tensors torch's dispatcher shows it, and the
planner's terms were fitted against the same tracker, so the two cannot disagree about a tensor neither sees.
glibc's mallinfo2 counts every byte malloc has handed out and not taken back, in every thread: torch's CPU
allocator (posix_memalign) and everything else. With $LAUNCHER_HEAP_CHECK=1 a CPU rank samples it beside every
tracked op of the training phases and reports it beside the tracker's peak (RankReport.heap_check), so a tensor
the tracker missed, or one it counted twice, shows as a gap between the two (docs/testing.md).
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable


class _MallInfo2(ctypes.Structure):
    # glibc's struct mallinfo2 (2.33+): every field a size_t.
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


@functools.cache
def _mallinfo2() -> Callable[[], _MallInfo2] | None:
    # The process's own symbols (CDLL(None)): libc is among them, and ctypes.util.find_library would start
    # ldconfig and gcc to look for it.
    try:
        fn = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):  # not glibc, or a glibc older than 2.33
        return None
    fn.restype = _MallInfo2
    fn.argtypes = []
    return fn


def heap_in_use_bytes() -> int | None:
    """Bytes malloc has handed out and not taken back, now: allocated from its arenas (uordblks) plus its
    mmap'ed chunks (hblkhd). None where the C library has no mallinfo2 (musl, macOS, glibc before 2.33)."""
    mallinfo2 = _mallinfo2()
    if mallinfo2 is None:
        return None
    info = mallinfo2()
    return int(info.uordblks + info.hblkhd)
