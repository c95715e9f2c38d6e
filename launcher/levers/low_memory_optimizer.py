"""Low-memory optimizers in place of the job's Adam/AdamW: torchao's 8-bit and 4-bit AdamW (block-quantized moments),
bitsandbytes' paged 8-bit AdamW (the same kind of moments, kept in host memory and stepped on the device) and
Adafactor (a factored second moment, no first). They change the math: train.allow_levers must list each.

The rank side: launcher.worker.engines.optimizers (the optimizers over FSDP2's shards or DeepSpeed's client
partition); the memory terms: launcher.planner.terms (optimizer_state_bytes, the step's copies, the paged state's
host bytes and PCIe seconds) and the engines' specs; docs/memory-model.md, "Low-memory optimizers".
"""

from __future__ import annotations

from typing import Literal

from launcher.levers.spec import LeverSpec, Shape

LowMemoryOptimizer = Literal["none", "adamw8bit", "adamw4bit", "adafactor", "paged_adamw8bit"]
"""An optimizer that keeps less state than fp32 Adam: none keeps the job's optimizer."""

PAGED = "paged_adamw8bit"
"""bitsandbytes' PagedAdamW8bit: 8-bit moments in CUDA managed memory, paged to the device for each tensor's step and
evicted back to the host when the device needs the room (bitsandbytes/functional.py get_paged: cudaMallocManaged).
A one-device tool (torchtune's single-device recipes): offered where the job runs on one rank, whose FSDP2 shard is
the whole tensor."""


class LowMemoryOptimizerSpec(LeverSpec):
    """adamw8bit, adamw4bit or adafactor for the job's Adam/AdamW, in that order of departure from its math; and on
    one rank paged_adamw8bit, the 8-bit AdamW whose state lives in host memory."""

    field = "low_memory_optimizer"
    off = "none"
    type = LowMemoryOptimizer
    doc = ("adamw8bit, adamw4bit or adafactor in place of the job's optimizer, or paged_adamw8bit (8-bit AdamW whose "
           "state lives in host memory, stepped on the device); none keeps the job's.")
    pin_doc = ("adamw8bit, adamw4bit, adafactor or paged_adamw8bit in place of the job's optimizer (train.allow_levers "
               "must list it; adamw8bit permits paged_adamw8bit too); none keeps the job's.")
    title = "low-memory optimizer"
    exact = False
    permits = ("adamw8bit", "adamw4bit", "adafactor")

    def values(self, req, shape: Shape | None = None) -> tuple:
        """Each of them in place of Adam or AdamW only, and not under LoRA: its adapters' state is already small.
        The paged one on one rank only (PAGED)."""
        if req.optimizer in ("adamw", "adam") and not req.model.lora_params:
            paged = (PAGED,) if req.gpus_per_node * req.nodes == 1 else ()
            return ("none", *self.permits, *paged)
        return ("none",)

    def permit_word(self, value: object) -> str | None:
        """The optimizer's own name (adamw8bit, ...); the paged 8-bit AdamW is adamw8bit's math, so adamw8bit."""
        if value == self.off:
            return None
        return "adamw8bit" if value == PAGED else str(value)

    def departure(self, value: object) -> int:
        """Its rank in ``permits``: 8-bit moments 1 (paged or not), 4-bit 2, Adafactor's factored second moment and
        no first 3."""
        if value == self.off:
            return 0
        return self.permits.index(self.permit_word(value)) + 1

    def offload_words(self, value: object) -> str:
        """The paged optimizer's state: in host memory, stepped on the device."""
        return f"{PAGED}'s state in host memory, stepped on the device" if value == PAGED else ""

    def word(self, value: object) -> str:
        """The optimizer's name."""
        return "" if value == self.off else str(value)

    def request_problem(self, req) -> str:
        """paged_adamw8bit pinned for more than one rank (PAGED: a one-device optimizer here)."""
        ranks = req.gpus_per_node * req.nodes
        if self.of(req.pins) == PAGED and ranks > 1:
            return (f"strategy.{self.field}: {PAGED} keeps one device's state in its host's memory and runs on one "
                    f"rank only, but the job has {ranks}; use adamw8bit (its moments shard with the ranks), or "
                    "--gpus 1")
        return ""


SPEC = LowMemoryOptimizerSpec()
"""The registered spec (launcher.levers.LEVERS)."""
