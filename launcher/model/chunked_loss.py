"""Chunked cross-entropy (Strategy.loss_chunks): a causal LM's loss without the whole sequence's logits.

The model's output embedding (its lm_head, an nn.Linear) becomes a ``ChunkedLossHead``: the same module and the
same Parameter objects (class swapped in place: parameter names, tied embeddings, ZeRO-3's partitioned
parameters and the hooks DeepSpeed or FSDP2 put on the module are untouched), whose forward, while
``loss_labels`` holds the batch's labels, returns the mean loss instead of logits. Computing the loss inside the
head's own forward matters: ZeRO-3 gathers a module's parameters only around that module's forward and
backward, and FSDP2's root unit (embeddings and head) stays unsharded from the forward to the end of backward.

The tokens are cut into ``loss_chunks`` pieces. One autograd function runs them all (as fused linear
cross-entropy does: Liger's, torchtune's chunked loss): forward computes each piece's (matmul, fp32 upcast,
cross-entropy) and keeps only the hidden states; backward recomputes one piece's logits at a time, turns them into
the logits' gradient, and adds the piece's head weight gradient in place into one buffer (``addmm_``). So one
piece's logits and one head gradient are live at a time: autograd's own sum of per-piece weight gradients (under
non-reentrant checkpoint per piece) held the first out-of-place sum, three gradients at once. The result is
transformers' ForCausalLMLoss exactly: labels shifted by one (-100 appended), -100 ignored, the sum over all
pieces divided by the micro-batch's trained tokens (not a mean of per-piece means).

Models that transform the logits after the head (Gemma 2's final_logit_softcapping, Cohere's logit_scale,
Granite's logits_scaling) would apply it to the returned loss: ``enable_chunked_loss`` refuses them, as it refuses
a head LoRA wraps. A ``--script`` run computes its own loss: it gets no chunking.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
import torch.nn.functional as F
from torch import nn

from launcher.errors import ConfigError

IGNORE_INDEX = -100
"""transformers' ignore_index: prompt, padding and the last position carry no loss."""

_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling")
"""Config fields of models that change the logits after lm_head (transformers' modeling code)."""

_LABELS: ContextVar[torch.Tensor | None] = ContextVar("launcher_chunked_loss_labels", default=None)


@contextmanager
def loss_labels(labels: torch.Tensor) -> Iterator[None]:
    """While inside, a ChunkedLossHead returns the loss of these (unshifted, HF-style) labels."""
    token = _LABELS.set(labels)
    try:
        yield
    finally:
        _LABELS.reset(token)


def _piece_logits(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    # As ForCausalLMLoss: logits in the working dtype, upcast to fp32.
    return F.linear(hidden, weight, bias).float()


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    """Summed cross-entropy of ``hidden @ weight.T + bias`` against ``labels``, piece by piece, with the head's
    gradients accumulated in place in backward (one weight gradient, one piece's logits)."""

    @staticmethod
    def forward(ctx, hidden, labels, weight, bias, chunks):  # noqa: D102 - torch's contract
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        for h, y in zip(torch.tensor_split(hidden, chunks), torch.tensor_split(labels, chunks), strict=True):
            if y.numel():
                total += F.cross_entropy(_piece_logits(h, weight, bias), y, ignore_index=IGNORE_INDEX,
                                         reduction="sum")
        ctx.chunks = chunks
        ctx.save_for_backward(hidden, labels, weight, bias)
        return total

    @staticmethod
    def backward(ctx, grad_total):  # noqa: D102 - torch's contract
        hidden, labels, weight, bias = ctx.saved_tensors
        need_h, _, need_w, need_b, _ = ctx.needs_input_grad
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = None  # the one buffer every piece adds into, made by the first (after its logits are freed)
        grad_b = torch.zeros_like(bias) if need_b and bias is not None else None
        pieces = zip(torch.tensor_split(hidden, ctx.chunks), torch.tensor_split(labels, ctx.chunks),
                     torch.tensor_split(grad_h, ctx.chunks) if need_h else [None] * ctx.chunks, strict=True)
        for h, y, gh in pieces:
            if not y.numel():
                continue
            # d(sum of CE)/d logits = softmax - one-hot on trained rows, 0 on ignored ones, times the sum's gradient.
            g = torch.softmax(_piece_logits(h, weight, bias), dim=-1)
            trained = y != IGNORE_INDEX
            g[trained.nonzero().squeeze(-1), y[trained]] -= 1.0
            g[~trained] = 0.0
            g = g.mul_(grad_total).to(h.dtype)  # the gradient .float() hands back to the working-dtype logits
            if gh is not None:
                torch.mm(g, weight, out=gh)
            if need_w:
                grad_w = torch.mm(g.t(), h) if grad_w is None else grad_w.addmm_(g.t(), h)
            if grad_b is not None:
                grad_b += g.sum(0)
        if need_w and grad_w is None:  # no trained piece at all
            grad_w = torch.zeros_like(weight)
        return grad_h, None, grad_w, grad_b, None


def chunked_causal_lm_loss(hidden: torch.Tensor, labels: torch.Tensor, weight: torch.Tensor,
                           bias: torch.Tensor | None, chunks: int) -> torch.Tensor:
    """Mean next-token loss of ``hidden`` (batch, seq, h) against ``labels`` (batch, seq), ``chunks`` pieces."""
    shifted = F.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:].reshape(-1)
    flat = hidden.reshape(-1, hidden.shape[-1])
    total = _ChunkedLinearCrossEntropy.apply(flat, shifted, weight, bias, chunks)
    # The trained tokens of the whole micro-batch (0/0 = nan for none, as transformers' mean gives).
    return total / (shifted != IGNORE_INDEX).sum()


class ChunkedLossHead(nn.Linear):
    """An output embedding that returns the chunked loss while ``loss_labels`` is set, logits otherwise."""

    loss_chunks: int

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """The chunked causal-LM loss (a 0-dim tensor) while loss_labels holds labels; the plain logits otherwise."""
        labels = _LABELS.get()
        if labels is None:
            return super().forward(hidden)
        return chunked_causal_lm_loss(hidden, labels.to(hidden.device), self.weight, self.bias, self.loss_chunks)


def _fix(where: str) -> str:
    return f"{where}; pin strategy.loss_chunks: 0 in the job"


def output_head(model: nn.Module) -> nn.Module | None:
    """The module that turns hidden states into logits (through a peft wrapper too), or None."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    get = getattr(inner, "get_output_embeddings", None)
    return get() if get is not None else None


def chunk_problem(model: nn.Module) -> str:
    """Why this (LoRA-wrapped) model's head cannot compute a chunked loss; "" when it can. The planner reads it
    from ModelStats.chunk_problem and then never offers the lever."""
    head = output_head(model)
    if head is None or type(head) not in (nn.Linear, ChunkedLossHead):
        kind = "no output embedding" if head is None else f"a {type(head).__name__} head (LoRA on lm_head?)"
        return f"needs an nn.Linear lm_head, and this model has {kind}"
    config = getattr(model, "config", None)
    for name in _LOGIT_TRANSFORMS:
        value = getattr(config, name, None)
        if value not in (None, 1, 1.0):
            return f"cannot chunk a model whose logits are transformed after the head ({name} = {value})"
    return ""


def enable_chunked_loss(model: nn.Module, chunks: int) -> nn.Module:
    """Make ``model``'s head compute the loss in ``chunks`` pieces (in place); ConfigError where it cannot."""
    problem = chunk_problem(model)
    if problem:
        raise ConfigError(_fix(f"strategy.loss_chunks: {chunks} {problem}"))
    head = output_head(model)
    head.__class__ = ChunkedLossHead
    head.loss_chunks = chunks
    return model


__all__ = ["ChunkedLossHead", "chunk_problem", "chunked_causal_lm_loss", "enable_chunked_loss", "loss_labels",
           "output_head"]
