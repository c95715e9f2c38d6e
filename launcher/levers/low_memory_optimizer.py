"""Low-memory optimizers in place of the job's Adam/AdamW: torchao's 8-bit and 4-bit AdamW (block-quantized moments)
and Adafactor (a factored second moment, no first). They change the math: train.allow_levers must list each.

The rank side: launcher.worker.engines.optimizers (the optimizers over FSDP2's shards or DeepSpeed's client
partition); the memory terms: launcher.planner.terms (optimizer_state_bytes, the step's copies) and the engines'
specs; docs/memory-model.md, "Low-memory optimizers".
"""

from __future__ import annotations

from typing import Literal

from launcher.levers.spec import LeverSpec, Shape

LowMemoryOptimizer = Literal["none", "adamw8bit", "adamw4bit", "adafactor"]
"""An optimizer that keeps less state than fp32 Adam: none keeps the job's optimizer."""


class LowMemoryOptimizerSpec(LeverSpec):
    """adamw8bit, adamw4bit or adafactor for the job's Adam/AdamW, in that order of departure from its math."""

    field = "low_memory_optimizer"
    off = "none"
    type = LowMemoryOptimizer
    doc = "adamw8bit, adamw4bit or adafactor in place of the job's optimizer; none keeps the job's."
    pin_doc = ("adamw8bit, adamw4bit or adafactor in place of the job's optimizer (train.allow_levers must list it); "
               "none keeps the job's.")
    title = "low-memory optimizer"
    exact = False
    permits = ("adamw8bit", "adamw4bit", "adafactor")

    def values(self, req, shape: Shape | None = None) -> tuple:
        """Each of them in place of Adam or AdamW only, and not under LoRA: its adapters' state is already small."""
        if req.optimizer in ("adamw", "adam") and not req.model.lora_params:
            return ("none", *self.permits)
        return ("none",)

    def permit_word(self, value: object) -> str | None:
        """The optimizer's own name (adamw8bit, ...)."""
        return None if value == self.off else str(value)

    def departure(self, value: object) -> int:
        """Its rank in ``permits``: 8-bit moments 1, 4-bit 2, Adafactor's factored second moment and no first 3."""
        return 0 if value == self.off else self.permits.index(value) + 1

    def word(self, value: object) -> str:
        """The optimizer's name."""
        return "" if value == self.off else str(value)


SPEC = LowMemoryOptimizerSpec()
"""The registered spec (launcher.levers.LEVERS)."""
