"""The data's DataSummary (launcher.records.datasummary), counted from token lists with the ranks' own rules: the same
eval split, the same clipping, truncation, drops and packing bins (launcher.worker.examples), so what the launcher
says before the launch is what the ranks train on. No tensors: the byte tokenizer's jobs import no torch here."""

from __future__ import annotations

from launcher.config.job import DataConfig
from launcher.records.datasummary import DataSummary, DroppedExamples
from launcher.worker.chat import drop_reason, trained_count
from launcher.worker.data import split
from launcher.worker.examples import CHUNK_ROWS, clip_row, example_ids, next_fit
from launcher.worker.tokenizer import ByteTokenizer

ROWS_SHOWN = 5
"""Row numbers a DroppedExamples keeps, for the message."""


def _text_length(tok, text: str, seq_len: int) -> int:
    """Tokens of ``text`` as encode_texts makes them (special tokens included), cut at ``seq_len`` + 1 so a text
    longer than the sequence shows as one."""
    if isinstance(tok, ByteTokenizer):
        return len(tok.encode(text, seq_len + 1))
    return len(tok(text, truncation=True, max_length=seq_len + 1)["input_ids"])


def chat_template_source(tok, fmt: str, rows: list[dict]) -> str:
    """Which template renders the conversations: tokenizer, chatml (the default) or "" (no conversations)."""
    conversational = fmt == "messages" or (fmt == "prompt_completion" and rows
                                           and isinstance(rows[0].get("prompt"), list))
    if not conversational:
        return ""
    return "tokenizer" if getattr(tok, "chat_template", None) else "chatml"


def summarize(task: str, data: DataConfig, fmt: str, tok, rows: list[dict], seq_len: int) -> DataSummary:
    """Count ``rows`` (all of them, checked: launcher.worker.formats.check_rows) of row format ``fmt`` as the ranks
    will encode them for ``task`` at ``seq_len``."""
    causal = task == "causal_lm"
    fmt = fmt if causal else "text"
    train_idx, eval_idx = split(list(range(len(rows))), data.eval_fraction)
    dropped: dict[str, list[int]] = {}
    kept = {"train": 0, "eval": 0}
    tokens = trained = truncated = sequences = 0
    for part, idxs in (("train", train_idx), ("eval", eval_idx)):
        for start in range(0, len(idxs), CHUNK_ROWS):  # packing packs within a chunk, as the ranks encode
            lengths = []
            for i in idxs[start:start + CHUNK_ROWS]:
                row = clip_row(rows[i], fmt, data, seq_len)
                if causal:
                    ids, labels = example_ids(tok, row, fmt, data.text_field, seq_len + 1)
                    reason = drop_reason(fmt, labels[:seq_len])
                    if reason:
                        dropped.setdefault(reason, []).append(i + 1)
                        continue
                    n, n_trained = min(len(ids), seq_len), trained_count(labels[:seq_len])
                else:
                    lengths_full = [_text_length(tok, str(row[data.text_field]), seq_len)]
                    if task == "sentence_embedding":
                        lengths_full.append(_text_length(tok, str(row[data.pair_field]), seq_len))
                    ids = [0] * max(lengths_full)
                    n, n_trained = sum(min(k, seq_len) for k in lengths_full), 0
                kept[part] += 1
                if part == "train":
                    lengths.append(n)
                    tokens += n
                    trained += n_trained
                    truncated += len(ids) > seq_len
            if part == "train":
                sequences += len(next_fit(lengths, seq_len)) if causal and data.packing else len(lengths)
    return DataSummary(
        format=fmt, task=task, rows=len(rows), train_examples=kept["train"], eval_examples=kept["eval"],
        dropped=[DroppedExamples(reason=r, count=len(at), rows=sorted(at)[:ROWS_SHOWN]) for r, at in dropped.items()],
        truncated=truncated, tokens=tokens, trained_tokens=trained, sequences=sequences,
        packed=bool(causal and data.packing), chat_template=chat_template_source(tok, fmt, rows),
        max_seq_len=seq_len)
