"""Where the launcher keeps what it can rebuild: introspection, activation probes, calibrated profiles.

The one reader of the two environment variables that move it (tests/test_cache.py holds every other module to
that): they are read at each call, not at import, so a test or a benchmark that sets them in its own process is
seen, and nothing else in the launcher needs to know they exist.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from launcher.fsutil import atomic_write

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


def write_cache(path: Path, data: dict) -> None:
    """Write ``data`` as JSON to ``path`` atomically; a cache that cannot be written is skipped silently."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, json.dumps(data))
    except OSError:
        pass  # a read-only cache only costs speed
