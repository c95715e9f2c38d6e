"""Tokenize once per dataset: rank 0 encodes (with a progress bar in its log) and saves the tensors in the
launcher's cache while the other ranks wait at a barrier, then load them.

The key is a hash of the rows themselves (whatever file, directory or hub dataset they came from), the
tokenizer (its full definition and chat template), and every setting that changes the tensors: task, format,
packing, fields, sequence length, eval split and label ids. A rank that cannot read rank 0's file (a cache
that is not shared between nodes) encodes for itself.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from launcher.files.fsutil import atomic_file
from launcher.inputs.cache import cache_dir, private_dirs
from launcher.worker.data import SPLIT_SEED
from launcher.worker.examples import CHUNK_ROWS
from launcher.worker.tokenizer import ByteTokenizer

CACHE_VERSION = 2
"""Bumped when the encoding itself changes, so older cached tensors are never read (2: long strings clipped, an
example with nothing to train on dropped)."""

Tensors = dict[str, torch.Tensor]


def tokenizer_fingerprint(tok) -> str:
    """A hash of what in the tokenizer decides its ids: class, size, chat template, EOS and pad tokens, and
    the backend's full definition (else its name)."""
    if isinstance(tok, ByteTokenizer):
        return f"byte:{tok.vocab_size}"
    backend = getattr(tok, "backend_tokenizer", None)
    parts = [type(tok).__name__, str(len(tok)), str(getattr(tok, "chat_template", None)),
             str(tok.eos_token), str(tok.pad_token), backend.to_str() if backend is not None else tok.name_or_path]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def cache_key(recipe, tok, rows: list[dict], seq_len: int) -> str:
    """The tokenized-data cache key: a hash of the rows, the tokenizer and every setting that changes the tensors."""
    h = hashlib.sha256()
    for row in rows:
        h.update(json.dumps(row, sort_keys=True, default=str).encode())
        h.update(b"\n")
    d = recipe.data
    settings = {"v": CACHE_VERSION, "task": recipe.task, "format": recipe.format, "packing": d.packing,
                "fields": [d.text_field, d.label_field, d.pair_field], "seq_len": seq_len,
                "eval_fraction": d.eval_fraction, "split_seed": SPLIT_SEED, "labels": recipe.label_ids,
                "tokenizer": tokenizer_fingerprint(tok)}
    h.update(json.dumps(settings, sort_keys=True).encode())
    return h.hexdigest()[:32]


def encode_chunked(recipe, tok, rows: list[dict], seq_len: int, *, progress: bool, desc: str) -> Tensors:
    """Encode ``rows`` through the recipe CHUNK_ROWS at a time (with a progress bar when asked) and join the tensors."""
    if not rows:
        return {}
    chunks = range(0, len(rows), CHUNK_ROWS)
    if progress:
        from tqdm.auto import tqdm

        chunks = tqdm(chunks, desc=f"tokenizing {desc}", unit="chunk", file=sys.stderr, mininterval=2.0)
    parts = [recipe.encode(rows[i : i + CHUNK_ROWS], tok, seq_len) for i in chunks]
    return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}


def tokenized(recipe, tok, rows: list[dict], train_rows: list[dict], eval_rows: list[dict], seq_len: int,
              ) -> tuple[Tensors, Tensors]:
    """(train tensors, eval tensors), encoded once per dataset and tokenizer and cached."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    path = cache_dir() / "tokenized" / f"{cache_key(recipe, tok, rows, seq_len)}.pt"
    mine: tuple[Tensors, Tensors] | None = None
    if rank == 0 and not path.is_file():
        mine = (encode_chunked(recipe, tok, train_rows, seq_len, progress=True, desc="train"),
                encode_chunked(recipe, tok, eval_rows, seq_len, progress=True, desc="eval"))
        _save(path, {"train": mine[0], "eval": mine[1]})
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()
    if mine is not None:
        return mine
    try:
        saved = torch.load(path, weights_only=True)
        return saved["train"], saved["eval"]
    except (OSError, RuntimeError, KeyError, EOFError):  # not shared with this node, or damaged: encode here
        return (encode_chunked(recipe, tok, train_rows, seq_len, progress=False, desc="train"),
                encode_chunked(recipe, tok, eval_rows, seq_len, progress=False, desc="eval"))


def _save(path: Path, data: dict) -> None:
    """Save the tensors 0600 in directories made 0700, as every cache file (launcher.inputs.cache.private_dirs), through
    the launcher's temporary (launcher.files.fsutil.atomic_file): readers never see half a file, and a crash leaves a
    ``.launcher-tmp`` that the cleanup rules know."""
    try:
        private_dirs(path.parent)
        with atomic_file(path) as f:
            torch.save(data, f)
    except OSError as e:  # a read-only cache costs a re-tokenization next time, never the run
        print(f"launcher: tokenized data not cached ({e}); set LAUNCHER_CACHE to a writable directory",
              file=sys.stderr)
