"""Atomic JSON files and append-only JSONL logs under the run dir."""

from __future__ import annotations

import json
import os
from pathlib import Path

from launcher.files.fsutil import atomic_write, open_private


def atomic_write_json(path: str | os.PathLike, data: object) -> None:
    """Write ``data`` as JSON so readers see the old file or the new one, never half of one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(data, indent=2, sort_keys=False, default=str) + "\n", durable=False)


class JsonlLog:
    """One JSON object per line, flushed line by line so a live view can tail it."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = None

    def append(self, row: dict) -> None:
        """Append one row as a JSON line and flush it (the file is opened 0600 on first use)."""
        if self._f is None:
            self._f = open_private(self.path, "a")  # kept open for the run, closed in close(); 0600 (fsutil)
        self._f.write(json.dumps(row) + "\n")
        self._f.flush()

    def close(self) -> None:
        """Close the file; a later append opens it again."""
        if self._f is not None:
            self._f.close()
            self._f = None


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """The rows of a JSONL file; [] when it does not exist."""
    p = Path(path)
    if not p.exists():
        return []
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
