"""File writes that never leave a half-written file behind, and the run dir's permissions.

The policy (docs/reliability/verdicts.md): a run dir and every directory the launcher makes in it are 0700, and
every file the launcher or its ranks write there is 0600 from the moment it exists. Other users can then neither
list nor open anything in a run dir, whatever mode a third-party writer (an engine's checkpoint, Slurm's logs, a
training script) gives its own files.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

FILE_MODE = 0o600
"""Every file the launcher and its ranks write in a run dir (mkstemp's mode, which atomic_write inherits)."""
DIR_MODE = 0o700
"""A run dir and every directory the launcher makes in it."""
TMP_SUFFIX = ".launcher-tmp"
"""Every temporary file or dir the launcher makes ends so (``.NAME.XXXXXXXX.launcher-tmp``): its own leftovers are
told apart from a person's ``.model.v1`` or ``.report.json.notes`` by this suffix alone."""


def is_temporary(name: str) -> bool:
    """Whether ``name`` is one of the launcher's temporaries (a hidden name ending in TMP_SUFFIX)."""
    return name.startswith(".") and name.endswith(TMP_SUFFIX) and len(name) > len(TMP_SUFFIX) + 1


def has_marker(directory: str | os.PathLike, marker: str) -> bool:
    """Whether ``directory`` holds ``marker`` as a regular file of its own: a link named so does not count, so
    no link can lend a directory the launcher's mark."""
    path = Path(directory) / marker
    return path.is_file() and not path.is_symlink()


def stage_dir(beside: str | os.PathLike, mode: int = DIR_MODE) -> Path:
    """A new, empty directory beside ``beside`` (same filesystem, so a rename moves it in place), made exclusively
    under a temporary's name: never one that already existed, whoever made that. ``mode`` is masked by the umask
    as mkdir's is (0o777: the mode a plain mkdir gives, for an export dir others may read)."""
    beside = Path(beside)
    for _ in range(100):
        path = beside.parent / f".{beside.name}.{secrets.token_hex(4)}{TMP_SUFFIX}"
        try:
            os.mkdir(path, mode)
        except FileExistsError:
            continue
        return path
    raise FileExistsError(f"no free temporary name beside {beside}")


def write_marker(directory: str | os.PathLike, marker: str, by: str) -> Path:
    """Write ``marker`` into ``directory``: the launcher made it (``by``: the command), and may replace it."""
    return atomic_write(Path(directory) / marker, json.dumps({"made_by": by, "created": time.time()}) + "\n")


def replace_dir(stage: str | os.PathLike, path: str | os.PathLike) -> None:
    """Put the directory ``stage`` in ``path``'s place: what was there (a dir, or a link itself) is moved into a
    fresh temporary beside it, ``stage`` renamed in, then the old one deleted. A failed rename puts the old one
    back; readers see the old dir or the new one, and at worst for an instant neither."""
    stage, path = Path(stage), Path(path)
    if not (path.exists() or path.is_symlink()):
        os.rename(stage, path)
        return
    aside = stage_dir(path)
    try:
        os.rename(path, aside / path.name)
    except BaseException:
        aside.rmdir()
        raise
    try:
        os.rename(stage, path)
    except BaseException:
        os.rename(aside / path.name, path)  # should this fail too, the old one stays in ``aside``, never deleted
        aside.rmdir()
        raise
    shutil.rmtree(aside, ignore_errors=True)


def remove(path: str | os.PathLike) -> None:
    """Delete ``path``: a directory with what it holds, a file, or a link itself (never what it points to)."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


@contextmanager
def made_dirs(path: str | os.PathLike) -> Iterator[Path]:
    """Make ``path`` and its missing parents; if the block raises, remove again what this made (the topmost
    directory it created), so a refusal or a failure leaves no empty directory behind."""
    path = Path(path)
    top = None
    probe = path
    while not probe.exists() and not probe.is_symlink() and probe.parent != probe:
        top, probe = probe, probe.parent
    try:
        path.mkdir(parents=True, exist_ok=True)
        yield path
    except BaseException:
        if top is not None:
            shutil.rmtree(top, ignore_errors=True)
        raise


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


@contextmanager
def atomic_file(path: str | os.PathLike, mode: str = "wb", *, durable: bool = True) -> Iterator[IO]:
    """A file to write ``path``'s new content into: a temporary beside it (``.NAME.XXXXXXXX.launcher-tmp``, 0600),
    renamed into place when the block ends, removed if it raises. ``durable`` fsyncs before the rename."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TMP_SUFFIX)
    try:
        with os.fdopen(fd, mode) as f:
            yield f
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write(path: str | os.PathLike, data: str | bytes, *, durable: bool = True) -> Path:
    """Write to a temp file in the same directory, then rename into place: readers see the old file or the new
    one, never half of one. ``durable`` fsyncs first, so a crash cannot leave an empty file either (files
    rewritten every step skip it: the next write replaces them anyway)."""
    with atomic_file(path, "wb" if isinstance(data, bytes) else "w", durable=durable) as f:
        f.write(data)
    return Path(path)


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
