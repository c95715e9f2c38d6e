"""Where the launcher keeps what it can rebuild: introspection, activation probes, calibrated profiles.

The one reader of the two environment variables that move it (tests/inputs/test_cache.py holds every other module to
that): they are read at each call, not at import, so a test or a benchmark that sets them in its own process is
seen, and nothing else in the launcher needs to know they exist.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from launcher.files.fsutil import DIR_MODE, atomic_write

CACHE_ENV = "LAUNCHER_CACHE"
"""The cache directory (default ~/.cache/launcher)."""
PROFILE_FILE_ENV = "LAUNCHER_PROFILE_FILE"
"""A calibrated hardware profile (the file `launch calibrate` writes) to use in place of the cache's own one for
the job's card; the benchmarks pin one this way."""


def cache_dir() -> Path:
    """The cache directory: $LAUNCHER_CACHE, else ~/.cache/launcher."""
    return Path(os.environ.get(CACHE_ENV, Path.home() / ".cache" / "launcher"))


def profile_file() -> Path | None:
    """The hardware profile file $LAUNCHER_PROFILE_FILE names, None when unset (then the cache's own applies)."""
    named = os.environ.get(PROFILE_FILE_ENV)
    return Path(named) if named else None


def private_dirs(path: Path) -> Path:
    """``path`` as a directory, every directory made for it DIR_MODE (0700, as files are 0600): the cache holds a
    dataset's tokens and the shapes of private models. A directory that exists keeps its mode: $LAUNCHER_CACHE
    may name one shared on purpose. OSError when it cannot be made."""
    missing = []
    p = path
    while not p.exists() and p != p.parent:
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        d.mkdir(mode=DIR_MODE, exist_ok=True)
    return path


def write_cache(path: Path, data: dict) -> None:
    """Write ``data`` as JSON to ``path`` atomically (0600, in directories made 0700); a cache that cannot be written
    is skipped silently."""
    try:
        private_dirs(path.parent)
        atomic_write(path, json.dumps(data))
    except OSError:
        pass  # a read-only cache only costs speed
