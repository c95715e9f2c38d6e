"""File writes that never leave a half-written file behind, and the run dir's permissions.

The policy (docs/reliability/verdicts.md): a run dir and every directory the launcher makes in it are 0700, and
every file the launcher or its ranks write there is 0600 from the moment it exists. Other users can then neither
list nor open anything in a run dir, whatever mode a third-party writer (an engine's checkpoint, Slurm's logs, a
training script) gives its own files.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

FILE_MODE = 0o600
"""Every file the launcher and its ranks write in a run dir (mkstemp's mode, which atomic_write inherits)."""
DIR_MODE = 0o700
"""A run dir and every directory the launcher makes in it."""


def private_dir(path: str | os.PathLike, *, parents: bool = True) -> Path:
    """``path`` as a directory of DIR_MODE (made so, or set so if it exists); its parents keep their modes."""
    path = Path(path)
    path.mkdir(mode=DIR_MODE, parents=parents, exist_ok=True)
    if (path.stat().st_mode & 0o777) != DIR_MODE:
        path.chmod(DIR_MODE)
    return path


def open_private(path: str | os.PathLike, mode: str = "a"):
    """``open(path, mode)`` for text, the file created with FILE_MODE (never readable by others, not even briefly)."""
    return open(path, mode, opener=lambda p, flags: os.open(p, flags, FILE_MODE))  # noqa: SIM115 - the caller closes it


def atomic_write(path: str | os.PathLike, data: str | bytes, *, durable: bool = True) -> Path:
    """Write to a temp file in the same directory, then rename into place: readers see the old file or the new
    one, never half of one. ``durable`` fsyncs first, so a crash cannot leave an empty file either (files
    rewritten every step skip it: the next write replaces them anyway)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb" if isinstance(data, bytes) else "w") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_reserved(path: str | os.PathLike, text: str, reserve_bytes: int) -> Path:
    """``atomic_write`` of ``text``, keeping ``reserve_bytes`` of disk for the file's next version.

    When the disk is full and no new file can be made, that version is written over the old one in place instead
    (not atomic, so only then): into the blocks the file holds, whose room past its end is reserved here without
    changing its size (fallocate's KEEP_SIZE; a file system without it still keeps a whole block for a small file).
    OSError when it fits neither way."""
    path = Path(path)
    data = text.encode()
    try:
        atomic_write(path, data)
    except OSError:
        if not overwrite_in_place(path, data):
            raise
        return path
    _reserve(path, reserve_bytes)
    return path


FALLOC_FL_KEEP_SIZE = 1
"""fallocate(2): allocate the range without changing the file's size."""


def _reserve(path: Path, size: int) -> None:
    import ctypes

    try:
        fd = os.open(path, os.O_WRONLY)
    except OSError:
        return
    try:
        ctypes.CDLL(None, use_errno=True).fallocate(fd, FALLOC_FL_KEEP_SIZE, ctypes.c_long(0), ctypes.c_long(size))
    except (OSError, AttributeError):  # no fallocate (not Linux): the file keeps its own block
        pass
    finally:
        os.close(fd)


def overwrite_in_place(path: Path, data: bytes) -> bool:
    """Write ``data`` over ``path``'s own bytes and cut it to that length; False, the file untouched, when it is
    missing or its blocks cannot take ``data`` (a short write would leave it torn)."""
    try:
        fd = os.open(path, os.O_WRONLY)
    except OSError:
        return False
    try:
        if os.fstat(fd).st_blocks * 512 < len(data) or os.pwrite(fd, data, 0) != len(data):
            return False
        os.ftruncate(fd, len(data))
        os.fsync(fd)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
