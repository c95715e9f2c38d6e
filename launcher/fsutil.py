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


def not_a_file(path: str | os.PathLike) -> str | None:
    """None when ``path`` is a regular file (symlinks followed); else what it is, for a message: "missing", "a
    broken symlink", "a directory", "a FIFO (named pipe)", "a character device (/dev/zero)", ... A FIFO or a
    device is not missing, and reading one could block or never end, so it is named rather than read."""
    import stat

    p = Path(path)
    try:
        st = p.stat()
    except FileNotFoundError:
        return "a broken symlink" if p.is_symlink() else "missing"
    except OSError as e:  # a name too long, a loop of symlinks, no permission on a parent
        return f"unreadable ({e.strerror or e})"
    mode = st.st_mode
    if stat.S_ISREG(mode):
        return None
    target = f" ({os.path.realpath(p)})" if p.is_symlink() else ""
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
    return next((f"{word}{target}" for test, word in kinds if test(mode)), f"not a regular file{target}")
