"""What a job's data.path may name, decided from the string alone (no reading): a local file of a known type, a
directory written by ``save_to_disk``, or a hub dataset id (``name`` or ``owner/name``) to load from the local
cache. The worker's reader (launcher.worker.sources) and the job checks share these rules."""

from __future__ import annotations

import os
import re
from pathlib import Path

FILE_SUFFIXES = (".jsonl", ".ndjson", ".json", ".csv", ".tsv", ".parquet", ".arrow")
"""Local file types data.path may name."""

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")
"""A hub dataset id: ``name`` or ``owner/name``."""


def looks_like_hub_id(raw: str) -> bool:
    """No local path but possibly a hub dataset id: not spelled as a path (., /, ~), no known file suffix."""
    if raw.startswith((".", "/", "~")) or Path(raw).suffix.lower() in FILE_SUFFIXES or os.path.exists(raw):
        return False
    return bool(HUB_ID.match(raw))


def download_line(repo_id: str) -> str:
    """The command that puts a hub dataset into the local cache."""
    return f"huggingface-cli download --repo-type dataset {repo_id}"
