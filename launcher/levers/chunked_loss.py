"""Chunked cross-entropy: the head and the loss over pieces of the tokens, one piece's logits at a time (exact).

The rank side: launcher.model.chunked_loss (the head that computes it, and ``chunk_problem``: where a head cannot),
which the recipes switch on; docs/memory-model.md, "Chunked cross-entropy".
"""

from __future__ import annotations

from launcher.levers.spec import LEVER_COUNT_MAX, LeverSpec, Shape, count_problems

CHUNKS = 8
"""Chunks of the chunked cross-entropy: torchtune's CEWithChunkedOutputLoss uses 8 (its num_output_chunks)."""


def chunked_head_bytes(c, head_per_token: float, tokens: int, chunks: int) -> float:
    """The head's bytes at the backward peak with the loss in ``chunks`` pieces (launcher.model.chunked_loss), from
    the activation constants ``c``: one piece's vocabulary-sized tensors beside the head's one weight gradient, linear
    in the constants (docs/memory-model.md#chunked-cross-entropy-loss_chunks)."""
    logits = min(c.head_logit_bytes_per_token, head_per_token)
    rest = tokens * (head_per_token - logits)
    piece = tokens * logits / chunks
    g = c.head_weight_grad_bytes
    if chunks == 1:
        return rest + max(piece, piece / 3 + g)
    return rest + piece + g


def recompute_flops_per_token(m) -> float:
    """FLOPs per token the lever adds to model ``m``'s step: the head's matmul runs again in backward (2·h·V)."""
    return 2.0 * m.hidden_size * m.vocab_size


class ChunkedLoss(LeverSpec):
    """The loss in pieces: one piece's fp32 logits live at a time, the head's matmul recomputed."""

    field = "loss_chunks"
    off = 0
    type = int
    doc = "Chunked cross-entropy over this many chunks of tokens, each recomputed in backward; 0: whole logits."
    pin_doc = ("Chunked cross-entropy: the head and the loss run over this many chunks of tokens, each recomputed "
               "in backward, so one chunk's fp32 logits exist at a time; 0 computes the whole logits at once (no "
               "unit).")
    title = "chunked cross-entropy"

    def values(self, req, shape: Shape | None = None) -> tuple:
        """0 and CHUNKS for a causal LM whose head can compute it (not a LoRA-wrapped head, not soft-capped logits:
        ModelStats.chunk_problem)."""
        m = req.model
        return (0, CHUNKS) if m.task == "causal_lm" and not m.chunk_problem else (0,)

    def word(self, value: object) -> str:
        """"chunked loss/8"."""
        return f"chunked loss/{value}" if value else ""

    def pin_problems(self, job) -> list:
        """0 to LEVER_COUNT_MAX chunks."""
        return count_problems(self, self.of(job.strategy), 0, f"0 (whole logits) to {LEVER_COUNT_MAX}", CHUNKS)


SPEC = ChunkedLoss()
"""The registered spec (launcher.levers.LEVERS)."""
