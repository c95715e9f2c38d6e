"""Where the launcher keeps what it can rebuild: introspection, activation probes, calibrated profiles."""

from __future__ import annotations

import json
import os
from pathlib import Path

from launcher.fsutil import atomic_write


def cache_dir() -> Path:
    """The cache's root: $LAUNCHER_CACHE, else ~/.cache/launcher."""
    return Path(os.environ.get("LAUNCHER_CACHE", Path.home() / ".cache" / "launcher"))


def write_cache(path: Path, data: dict) -> None:
    """Write ``data`` as JSON to ``path`` atomically; a cache that cannot be written is skipped silently."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, json.dumps(data))
    except OSError:
        pass  # a read-only cache only costs speed
