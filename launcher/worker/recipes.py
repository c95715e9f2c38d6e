"""The three built-in recipes: how rows become tensors and how a micro-batch becomes a loss.

A recipe never owns the model: ``loss(forward, batch)`` calls whatever runs the
model (a DeepSpeed engine, an FSDP module, a plain module), so one recipe serves
every engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from launcher.config.job import DataConfig
from launcher.errors import ConfigError
from launcher.model.loss import Forward, task_loss
from launcher.worker.chat import drop_reason, encode_rows
from launcher.worker.data import column
from launcher.worker.examples import clip_row, example_ids
from launcher.worker.formats import check_rows, fit_label_ids, is_int_label, row_format
from launcher.worker.packing import pack
from launcher.worker.tokenizer import encode_texts


@dataclass(kw_only=True, slots=True)
class Recipe:
    """A task's training recipe: how rows become tensors, the loss and tokens of a batch, and the evaluation step."""

    task: str
    """causal_lm, seq_cls or sentence_embedding."""
    data: DataConfig
    """The job's data section: which fields hold text, label and pair."""
    num_labels: int | None = None
    """seq_cls: classes, from the job or counted in the data."""
    label_ids: dict[str, int] = field(default_factory=dict)
    """seq_cls: label text to class id, sorted so every rank agrees."""

    sequences_per_example: int = 1
    """Sequences one example runs through the model: 2 for sentence_embedding (text and positive)."""
    format: str = "text"
    """causal_lm: text, messages or prompt_completion (launcher.worker.formats), settled by fit_labels."""
    loss_chunks: int = 0
    """causal_lm: the plan's chunked cross-entropy pieces (0: whole logits); the model's head must be chunked
    to match (launcher.worker.model.build)."""

    def fit_labels(self, rows: list[dict]) -> None:
        """Check every row (all of them, train and eval) and settle the row format; seq_cls: map labels to ids
        and settle num_labels."""
        check_rows(rows, self.task, self.data, self.data.path)
        if self.task == "causal_lm":
            self.format = row_format(rows[0], self.data)
        if self.task == "seq_cls":
            self.label_ids, self.num_labels = fit_label_ids(rows, self.data)

    def encode(self, rows: list[dict], tokenizer, seq_len: int) -> dict[str, torch.Tensor]:
        """Tensors for ``rows``, one leading row per example, every sequence exactly ``seq_len`` tokens.

        Each string is clipped first (launcher.worker.examples.clip_row). Conversations and prompt-completion pairs
        also get ``labels`` (-100 outside the trained tokens); packed causal_lm data gets fewer rows than examples,
        with ``labels`` and ``position_ids`` (launcher.worker.packing). A causal_lm example with nothing to train
        on is dropped (launcher.worker.chat.drop_reason), as the launcher counted before the launch."""
        fmt = self.format if self.task == "causal_lm" else "text"
        rows = [clip_row(r, fmt, self.data, seq_len) for r in rows]
        if self.task == "causal_lm" and self.data.packing:
            pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
            examples = [example_ids(tokenizer, r, fmt, self.data.text_field, seq_len) for r in rows]
            return pack([e for e in examples if not drop_reason(fmt, e[1])], seq_len, pad)
        if self.task == "causal_lm" and fmt != "text":
            return encode_rows(tokenizer, rows, [fmt] * len(rows), seq_len)
        texts = [str(t) for t in column(rows, self.data.text_field, self.data.path, "data.text_field")]
        enc = encode_texts(tokenizer, texts, seq_len)
        if self.task == "causal_lm":  # a text of one token or none has no next token to predict
            keep = (enc["attention_mask"].sum(dim=1) >= 2).nonzero().flatten()
            return {k: v.index_select(0, keep) for k, v in enc.items()}
        if self.task == "seq_cls":
            raw = column(rows, self.data.label_field, self.data.path, "data.label_field")
            key = (lambda v: str(int(v))) if all(is_int_label(v) for v in raw) else str
            enc["labels"] = torch.tensor([self.label_ids[key(v)] for v in raw], dtype=torch.long)
        elif self.task == "sentence_embedding":
            pairs = [str(t) for t in column(rows, self.data.pair_field, self.data.path, "data.pair_field")]
            other = encode_texts(tokenizer, pairs, seq_len)
            enc["pair_input_ids"] = other["input_ids"]
            enc["pair_attention_mask"] = other["attention_mask"]
        return enc

    def loss(self, forward: Forward, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, int]:
        """(mean loss of the micro-batch, real tokens in it)."""
        return self.loss_tensor(forward, batch), self.tokens(batch)

    def tokens(self, batch: dict[str, torch.Tensor]) -> int:
        """Real (unpadded) tokens in ``batch``; a host sync unless the batch is still on the host."""
        tokens = batch["attention_mask"].sum()
        if self.task == "sentence_embedding":
            tokens = tokens + batch["pair_attention_mask"].sum()
        return int(tokens)

    def eval_step(self, forward: Forward, batch: dict[str, torch.Tensor],
                  counted: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(the micro-batch's mean loss, seq_cls: how many of the ``counted`` examples the model classifies right,
        as a device tensor; None for the other tasks). One forward: the loss and the logits come from it."""
        if self.task != "seq_cls":
            return self.loss_tensor(forward, batch), None
        out = forward(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"])
        right = (out.logits.argmax(-1) == batch["labels"]) & counted.to(batch["labels"].device)
        return out.loss, right.sum()

    def loss_tensor(self, forward: Forward, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The micro-batch's mean loss alone: no host sync, so it also runs on fake tensors (the planner's probe)."""
        return task_loss(self.task, forward, batch, loss_chunks=self.loss_chunks)


def make_recipe(task: str, data: DataConfig) -> Recipe:
    """The Recipe for a task (causal_lm, seq_cls or sentence_embedding); ConfigError for another."""
    if task not in ("causal_lm", "seq_cls", "sentence_embedding"):
        raise ConfigError(f"task: {task!r} has no recipe; use causal_lm, seq_cls or sentence_embedding")
    return Recipe(task=task, data=data, sequences_per_example=2 if task == "sentence_embedding" else 1)

