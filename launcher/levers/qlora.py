"""QLoRA: the frozen LoRA base's block linears quantized to 4-bit NF4 (torchao), dequantized one at a time in forward
and backward. It changes the math: train.allow_levers must list it.

The rank side: launcher.worker.qlora (FSDP2 only); which weights NF4 takes and their bytes: launcher.model.qlora;
the memory terms: launcher.engines.fsdp.memory; docs/memory-model.md, "QLoRA".
"""

from __future__ import annotations

from launcher.config.problem import Problem
from launcher.levers.spec import LeverSpec, Shape


class Qlora(LeverSpec):
    """An NF4 base under LoRA."""

    field = "qlora"
    off = False
    type = bool
    doc = "The frozen LoRA base quantized to 4-bit NF4."
    pin_doc = "The frozen LoRA base in 4-bit NF4 (train.allow_levers must list it)."
    title = "QLoRA (NF4 base)"
    exact = False
    permits = ("qlora",)

    def values(self, req, shape: Shape | None = None) -> tuple:
        """Off and on under LoRA, where some frozen block linear could be NF4 (none for Conv1D models, GPT-2)."""
        m = req.model
        return (False, True) if m.lora_params and m.block_linear_shapes else (False,)

    def word(self, value: object) -> str:
        """"QLoRA NF4"."""
        return "QLoRA NF4" if value else ""

    def pin_problems(self, job) -> list:
        """Only in a LoRA run."""
        if self.of(job.strategy) and job.train.lora is None:
            return [Problem(f"strategy.{self.field}", "true quantizes the frozen base of a LoRA run, but this job has "
                            f"no train.lora; add train.lora, or leave strategy.{self.field} out",
                            reads=("train.lora",))]
        return []


SPEC = Qlora()
"""The registered spec (launcher.levers.LEVERS)."""
