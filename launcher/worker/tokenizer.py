"""Tokenizers the worker can use without the network.

A model dir that ships tokenizer files gets its own (AutoTokenizer, local only).
A random-weight model with no tokenizer gets ByteTokenizer: UTF-8 bytes shifted
past three special ids, folded into the vocabulary. It is deterministic and has
no files, which is all a memory-budget run needs from it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from launcher.errors import ConfigError

if TYPE_CHECKING:  # torch only where tensors are made: the launcher's data check encodes lists
    import torch

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json", "tokenizer.model")


class ByteTokenizer:
    """UTF-8 byte-level tokenizer: id = 3 + byte mod (vocab_size - 3); 0 pad, 1 bos, 2 eos."""

    pad_token_id = 0
    bos_token_id = 1
    eos_token_id = 2
    offset = 3

    def __init__(self, vocab_size: int):
        if vocab_size < self.offset + 1:
            raise ConfigError(
                f"model vocab_size: {vocab_size} is too small for the byte tokenizer; it needs at least 4 "
                "(3 special ids and one byte id); use a vocab_size of 259 or more to keep bytes distinct"
            )
        self.vocab_size = vocab_size
        self._span = vocab_size - self.offset

    def encode(self, text: str, max_len: int) -> list[int]:
        """bos, the text's bytes, eos; truncated to ``max_len`` ids (eos is dropped first)."""
        ids = [self.bos_token_id] + [self.offset + b % self._span for b in text.encode("utf-8")]
        ids.append(self.eos_token_id)
        return ids[:max_len]

    def decode(self, ids: list[int]) -> str:
        """The text of ``ids``; special and out-of-range ids are dropped, bad UTF-8 replaced."""
        raw = bytes((i - self.offset) for i in ids if self.offset <= i < self.offset + 256)
        return raw.decode("utf-8", errors="replace")

    def __len__(self) -> int:
        return self.vocab_size


def has_tokenizer_files(model_dir: Path | None) -> bool:
    """True when the model dir ships tokenizer files."""
    return model_dir is not None and any((model_dir / f).exists() for f in TOKENIZER_FILES)


def load_tokenizer(model_dir: Path | None, vocab_size: int):
    """The model dir's own tokenizer when it has one, else ByteTokenizer(vocab_size)."""
    if not has_tokenizer_files(model_dir):
        return ByteTokenizer(vocab_size)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    if tok.pad_token_id is None:
        # GPT-2 style tokenizers ship without a pad token; the mask hides pads, so any id works.
        tok.pad_token = tok.eos_token or tok.unk_token
    if len(tok) > vocab_size:
        raise ConfigError(
            f"model: the tokenizer in {model_dir} has {len(tok)} ids but the model's vocab_size is {vocab_size}; "
            "use a model dir whose config.json matches its tokenizer"
        )
    return tok


def encode_texts(tok, texts: list[str], seq_len: int) -> dict[str, torch.Tensor]:
    """input_ids and attention_mask, truncated and right-padded to exactly ``seq_len`` (fixed shapes)."""
    import torch

    if isinstance(tok, ByteTokenizer):
        ids = torch.full((len(texts), seq_len), tok.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(texts), seq_len), dtype=torch.long)
        for i, text in enumerate(texts):
            row = tok.encode(text, seq_len)
            ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
            mask[i, : len(row)] = 1
        return {"input_ids": ids, "attention_mask": mask}
    enc = tok(texts, truncation=True, max_length=seq_len, padding="max_length", return_tensors="pt")
    return {"input_ids": enc["input_ids"].long(), "attention_mask": enc["attention_mask"].long()}
