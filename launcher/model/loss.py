"""Each task's training loss from a forward function and a batch: what the worker trains on and what the
planner's fake-tensor probe (launcher.model.activations) runs, so both measure the same graph."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from launcher.model.chunked_loss import loss_labels

Forward = Callable[..., object]

SIMILARITY_SCALE = 20.0
"""MultipleNegativesRankingLoss scale: cosine similarities are multiplied by this before the softmax."""


def task_loss(task: str, forward: Forward, batch: dict[str, torch.Tensor], *, loss_chunks: int = 0) -> torch.Tensor:
    """The micro-batch's mean loss alone: no host sync, so it also runs on fake tensors (the planner's probe).

    ``loss_chunks`` (causal_lm): the model's head was made a ChunkedLossHead (launcher.model.chunked_loss); the
    labels go to it, not to transformers' loss, and the model's "logits" are the loss."""
    mask = batch["attention_mask"]
    if task == "causal_lm":
        # Chat and prompt-completion batches carry their own labels (-100 on prompts and padding): the loss is on
        # the trained tokens only. Plain text trains on every real token.
        labels = batch.get("labels")
        if labels is None:
            labels = batch["input_ids"].masked_fill(mask == 0, -100)
        # Packed examples: no mask, restarted positions; flash_attention_2 then attends within each example
        # (launcher.worker.packing says what sdpa and eager do).
        inputs = ({"position_ids": batch["position_ids"]} if "position_ids" in batch else {"attention_mask": mask})
        if loss_chunks:
            with loss_labels(labels):
                loss = forward(input_ids=batch["input_ids"], **inputs).logits
            if loss.dim():
                raise RuntimeError("loss_chunks is set but the model's head returned logits: it is no "
                                   "ChunkedLossHead (launcher.model.chunked_loss.enable_chunked_loss)")
            return loss
        return forward(input_ids=batch["input_ids"], **inputs, labels=labels).loss
    if task == "seq_cls":
        return forward(input_ids=batch["input_ids"], attention_mask=mask, labels=batch["labels"]).loss
    return contrastive_loss(forward, batch)


def contrastive_loss(forward: Forward, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """In-batch-negatives contrastive loss (MultipleNegativesRankingLoss) over mean-pooled, normalized embeddings of
    texts and their positives, scaled by SIMILARITY_SCALE."""
    # One forward over texts and positives together: half the collectives, same activations.
    ids = torch.cat([batch["input_ids"], batch["pair_input_ids"]])
    mask = torch.cat([batch["attention_mask"], batch["pair_attention_mask"]])
    hidden = forward(input_ids=ids, attention_mask=mask).last_hidden_state
    emb = F.normalize(mean_pool(hidden, mask), dim=-1)
    a, b = emb.chunk(2)
    scores = a @ b.T * SIMILARITY_SCALE
    target = torch.arange(a.shape[0], device=scores.device)
    return F.cross_entropy(scores, target)


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Average of the real tokens' hidden states, in fp32 so bf16 runs pool as precisely as fp32 ones."""
    m = mask.unsqueeze(-1).to(torch.float32)
    return (hidden.to(torch.float32) * m).sum(1) / m.sum(1).clamp(min=1.0)
