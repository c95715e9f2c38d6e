"""One example's tokens as plain lists (no torch), and the rules every encode shares: a row's strings clipped before
tokenizing, an example with nothing to train on dropped, packing's next-fit bins.

The ranks (launcher.worker.recipes) and the launcher's data check (launcher.worker.summary) both apply these, so
the examples the launcher counts before the launch are the ones the ranks train on. What makes an example drop
(launcher.worker.chat.drop_reason) lives beside the labels it reads.
"""

from __future__ import annotations

from launcher.config.job import DataConfig
from launcher.worker.chat import encode_segments, row_segments
from launcher.worker.tokenizer import ByteTokenizer

CHUNK_ROWS = 1024
"""Rows encoded at a time (one progress-bar tick on rank 0); packing packs within a chunk."""
CHARS_PER_TOKEN = 32
"""A string of a row is cut to this many characters per token of data.max_seq_len before it is tokenized: no real
tokenizer's tokens average near it (English text averages about 4 characters a token, the byte tokenizer 1 or
less), so the first max_seq_len tokens, all the sequence keeps, come out the same, and a 100 MB row costs what a
row of max_seq_len tokens costs."""


def clip(text: str, seq_len: int) -> str:
    """``text`` cut to CHARS_PER_TOKEN characters per token of ``seq_len``."""
    limit = CHARS_PER_TOKEN * seq_len
    return text if len(text) <= limit else text[:limit]


def _clip_messages(msgs, seq_len: int):
    if not isinstance(msgs, list):
        return msgs
    return [dict(m, content=clip(m["content"], seq_len)) if isinstance(m, dict) and isinstance(m.get("content"), str)
            else m for m in msgs]


def clip_row(row: dict, fmt: str, data: DataConfig, seq_len: int) -> dict:
    """The row with every string the job reads clipped (clip); the row itself when nothing is long."""
    if fmt == "messages":
        return {**row, "messages": _clip_messages(row.get("messages"), seq_len)}
    if fmt == "prompt_completion":
        out = dict(row)
        for name in ("prompt", "completion"):
            value = row.get(name)
            out[name] = clip(value, seq_len) if isinstance(value, str) else _clip_messages(value, seq_len)
        return out
    out = dict(row)
    for name in (data.text_field, data.pair_field):
        if isinstance(row.get(name), str):
            out[name] = clip(row[name], seq_len)
    return out


def example_ids(tok, row: dict, fmt: str, text_field: str, seq_len: int) -> tuple[list[int], list[int]]:
    """(ids, labels) of one example, unpadded, truncated to ``seq_len``; a text example's labels are its ids."""
    if fmt != "text":
        return encode_segments(tok, row_segments(tok, row, fmt), seq_len, byte_eos_trained=fmt == "prompt_completion")
    text = str(row[text_field])
    if isinstance(tok, ByteTokenizer):
        ids = tok.encode(text, seq_len)
    else:
        ids = tok(text, truncation=True, max_length=seq_len)["input_ids"]
    return ids, list(ids)


def next_fit(lengths: list[int], seq_len: int) -> list[list[int]]:
    """Packing's bins: indices of the examples in each sequence, taken in order while they fit (the first example
    of a sequence always goes in: it is truncated to ``seq_len`` already)."""
    bins: list[list[int]] = []
    used = seq_len
    for i, n in enumerate(lengths):
        if used + n > seq_len or not bins:
            bins.append([])
            used = 0
        bins[-1].append(i)
        used += n
    return bins
