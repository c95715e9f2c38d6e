"""Secret redaction: the values of secret-looking environment variables never land in a file the launcher writes.

Names with TOKEN, SECRET, KEY, PASSWORD, ... A value naming a path that exists is no secret (it says where something
is), and a string naming one (job.yaml's data.path) is never rewritten: the run reads it. The rank logs are redacted
as they are written (launcher.files.ranklog); they are scrubbed again when the run ends, as are submitit's own .out/.err
files on Slurm (by each task as it ends and again by `--wait`), which are written by Slurm itself.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from launcher.files.fsutil import atomic_write

# Names of environment variables whose values are secrets: HF_TOKEN, WANDB_API_KEY, AWS_SECRET_ACCESS_KEY,
# DB_PASSWORD, SSH_KEY. KEY only as a whole word, so KEYBOARD or MONKEY_PATCH stay readable; TOKEN only ending a
# word, so TOKENIZERS_PARALLELISM or TOKENIZER_PATH (settings, not secrets) do too.
SECRET_NAME = re.compile(r"TOKEN($|_)|SECRET|PASSWORD|PASSWD|PASSPHRASE|CREDENTIAL|"
                         r"(^|_)(API_?|ACCESS_?|PRIVATE_?)?KEY($|_)", re.IGNORECASE)
SECRET_MIN_CHARS = 8
"""Shorter values are not redacted: replacing every '1' or 'true' in a log would destroy it and hide nothing."""
REDACTED = "[redacted]"


def names_a_path(text: str) -> bool:
    """Whether ``text`` (``~`` expanded) is the path of something that exists: a place the run reads or writes
    (a data dir, GOOGLE_APPLICATION_CREDENTIALS' key file), never itself a secret."""
    try:
        return os.path.lexists(os.path.expanduser(text))
    except (ValueError, OSError):  # a NUL byte, a name too long
        return False


def secret_values(environ: dict[str, str] | None = None) -> list[str]:
    """Values of secret-looking environment variables, longest first (so a longer secret is replaced whole);
    a value naming an existing path is not one (redacting it would rewrite every path below it)."""
    env = os.environ if environ is None else environ
    values = {v for k, v in env.items() if SECRET_NAME.search(k) and len(v) >= SECRET_MIN_CHARS
              and not names_a_path(v)}
    return sorted(values, key=len, reverse=True)


def redact(text: str, secrets: list[str] | None = None) -> str:
    """``text`` with every secret value (default: the environment's, secret_values) replaced by the redaction mark."""
    for value in secret_values() if secrets is None else secrets:
        if value in text:
            text = text.replace(value, REDACTED)
    return text


def redact_data(obj, secrets: list[str] | None = None):
    """``redact`` applied to every string (keys included) in plain JSON/YAML data, before it is serialized:
    a secret holding a quote would be escaped in the JSON text and slip past a replace on the text. A string
    naming an existing path is a field the run reads (data.path, model) and is never rewritten."""
    secrets = secret_values() if secrets is None else secrets
    if not secrets:
        return obj
    if isinstance(obj, str):
        return obj if names_a_path(obj) else redact(obj, secrets)
    if isinstance(obj, dict):
        return {redact_data(k, secrets): redact_data(v, secrets) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [redact_data(v, secrets) for v in obj]
    return obj


def _scrubbed(data: bytes, secrets: list[str]) -> bytes | None:
    """``data`` with every secret value replaced, or None when it held none (the file stays untouched)."""
    needles = [v.encode() for v in secrets]
    if not any(n in data for n in needles):
        return None
    for n in needles:
        data = data.replace(n, REDACTED.encode())
    return data


def redact_file(path: Path, secrets: list[str] | None = None) -> bool:
    """Rewrite ``path`` (atomically) without secret values; True when it held one. Untouched otherwise."""
    secrets = secret_values() if secrets is None else secrets
    if not secrets:
        return False
    try:
        data = _scrubbed(path.read_bytes(), secrets)
    except OSError:
        return False
    if data is None:
        return False
    atomic_write(path, data)
    return True


def redact_file_in_place(path: Path, secrets: list[str] | None = None) -> bool:
    """``redact_file`` for a file another process may still append to (Slurm opens submitit's logs with
    --open-mode=append): the same inode is rewritten and truncated, so later appends land in the scrubbed file
    instead of an unlinked one that a rename would leave behind."""
    secrets = secret_values() if secrets is None else secrets
    if not secrets:
        return False
    try:
        with path.open("r+b") as f:
            data = _scrubbed(f.read(), secrets)
            if data is None:
                return False
            f.seek(0)
            f.write(data)
            f.truncate()
            f.flush()
            os.fsync(f.fileno())
    except OSError:
        return False
    return True
