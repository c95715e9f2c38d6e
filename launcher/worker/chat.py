"""Conversations and prompt-completion pairs as token ids with labels: -100 everywhere but the trained tokens.

A row becomes text segments, each marked trained or not. With a Hugging Face tokenizer the segments are joined,
rendered exactly as the chat template writes the whole conversation, and tokenized once; a token is trained when
its first character lies in a trained segment (offsets of a fast tokenizer). The byte tokenizer is
concatenative, so there the segments are encoded one by one.

An assistant turn is what the template adds between the conversation before it (with the generation prompt) and
the conversation including it: its content and the end-of-turn marker, so the model learns to stop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from launcher.errors import ConfigError
from launcher.worker.formats import CHATML_TEMPLATE
from launcher.worker.tokenizer import ByteTokenizer

IGNORE = -100
"""The label of a token the loss skips (torch.nn.CrossEntropyLoss's ignore_index, as transformers uses)."""

Segments = list[tuple[str, bool]]

if TYPE_CHECKING:  # torch is imported where tensors are made: the launcher's data check counts lists
    import torch


def trained_count(labels: list[int]) -> int:
    """Tokens a causal-LM loss is on: labels other than IGNORE after the first (the first token is never a
    target: transformers' loss predicts token i+1 from the tokens up to i)."""
    return sum(1 for lab in labels[1:] if lab != IGNORE)


def drop_reason(fmt: str, labels: list[int]) -> str | None:
    """Why an example cannot train, or None when it can: ``too_short`` (a text of fewer than 2 tokens: nothing to
    predict) or ``prompt_fills_max_seq_len`` (truncation cut every trained token)."""
    if trained_count(labels):
        return None
    return "too_short" if fmt == "text" else "prompt_fills_max_seq_len"


def chat_template(tok) -> str:
    """The tokenizer's own chat template, or the documented ChatML default."""
    return getattr(tok, "chat_template", None) or CHATML_TEMPLATE


def render(tok, messages: list[dict], *, add_generation_prompt: bool) -> str:
    """A conversation as text through the tokenizer's chat template (ChatML for the byte tokenizer), with the
    assistant's generation prompt when asked."""
    if isinstance(tok, ByteTokenizer):
        from transformers.utils.chat_template_utils import render_jinja_template

        out, _ = render_jinja_template(conversations=[messages], chat_template=CHATML_TEMPLATE,
                                       add_generation_prompt=add_generation_prompt)
        return out[0]
    return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                                   chat_template=chat_template(tok))


def conversation_segments(tok, messages: list[dict], context: list[dict] | None = None) -> Segments:
    """``context`` (a conversational prompt) then ``messages``; only the assistant turns of ``messages`` train."""
    context = context or []
    full = context + messages
    trained = {len(context) + i for i, m in enumerate(messages) if m["role"] == "assistant"}
    segs: Segments = []
    done = ""
    for i in sorted(trained):
        before = render(tok, full[:i], add_generation_prompt=True)
        upto = render(tok, full[: i + 1], add_generation_prompt=False)
        if not (before.startswith(done) and upto.startswith(before)):
            raise ConfigError("the tokenizer's chat template does not render a conversation as the prefix of a "
                              "longer one, so the assistant tokens cannot be found; use a template that does "
                              "(e.g. delete chat_template from tokenizer_config.json to get the ChatML default)")
        segs += [(before[len(done):], False), (upto[len(before):], True)]
        done = upto
    whole = render(tok, full, add_generation_prompt=False)
    if whole.startswith(done) and len(whole) > len(done):
        segs.append((whole[len(done):], False))
    return [s for s in segs if s[0]]


def row_segments(tok, row: dict, fmt: str) -> Segments:
    """A messages or prompt-completion row as (text, trained) segments; a plain-text completion gets the EOS token
    appended, as TRL does."""
    if fmt == "messages":
        return conversation_segments(tok, row["messages"])
    prompt, completion = row["prompt"], row["completion"]
    if isinstance(prompt, list):
        return conversation_segments(tok, completion, context=prompt)
    eos = "" if isinstance(tok, ByteTokenizer) else (tok.eos_token or "")
    # TRL appends the end-of-sequence token to a completion, so the model learns where a completion ends.
    return [(prompt, False), (completion if completion.endswith(eos) else completion + eos, True)]


def encode_segments(tok, segs: Segments, seq_len: int, *, byte_eos_trained: bool) -> tuple[list[int], list[int]]:
    """(ids, labels) of one example, truncated to ``seq_len``."""
    if isinstance(tok, ByteTokenizer):
        ids, labels = [tok.bos_token_id], [IGNORE]
        for text, train in segs:
            part = tok.encode(text, len(text.encode("utf-8")) + 2)[1:-1]  # no bos/eos inside the sequence
            ids += part
            labels += part if train else [IGNORE] * len(part)
        ids.append(tok.eos_token_id)
        labels.append(tok.eos_token_id if byte_eos_trained else IGNORE)
        return ids[:seq_len], labels[:seq_len]
    text = "".join(s for s, _ in segs)
    if getattr(tok, "is_fast", False):
        enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        spans, pos = [], 0
        for s, train in segs:
            if train:
                spans.append((pos, pos + len(s)))
            pos += len(s)
        ids = list(enc["input_ids"])
        labels = [i if any(a <= start < b for a, b in spans) else IGNORE
                  for i, (start, _) in zip(ids, enc["offset_mapping"], strict=True)]
    else:  # a slow tokenizer has no offsets: encode segment by segment (boundaries may tokenize differently)
        ids, labels = [], []
        for s, train in segs:
            part = tok(s, add_special_tokens=False)["input_ids"]
            ids += part
            labels += part if train else [IGNORE] * len(part)
    return ids[:seq_len], labels[:seq_len]


def encode_rows(tok, rows: list[dict], fmts: list[str], seq_len: int) -> dict[str, torch.Tensor]:
    """input_ids, attention_mask and labels, right-padded to exactly ``seq_len``, one row per example that trains:
    an example whose trained tokens were all cut by truncation is dropped (its loss would be empty; the launcher
    counted it before the launch, launcher.worker.summary)."""
    import torch

    encoded = [encode_segments(tok, row_segments(tok, row, fmt), seq_len, byte_eos_trained=fmt == "prompt_completion")
               for row, fmt in zip(rows, fmts, strict=True)]
    kept = [(ids, labels) for (ids, labels), fmt in zip(encoded, fmts, strict=True) if not drop_reason(fmt, labels)]
    n = len(kept)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    ids_t = torch.full((n, seq_len), pad, dtype=torch.long)
    mask_t = torch.zeros((n, seq_len), dtype=torch.long)
    labels_t = torch.full((n, seq_len), IGNORE, dtype=torch.long)
    for i, (ids, labels) in enumerate(kept):
        ids_t[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        mask_t[i, : len(ids)] = 1
        labels_t[i, : len(labels)] = torch.tensor(labels, dtype=torch.long)
    return {"input_ids": ids_t, "attention_mask": mask_t, "labels": labels_t}
