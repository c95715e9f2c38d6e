"""DeepSpeed's layout: the ZeRO stage and what ZeRO-Offload and ZeRO-Infinity move to the host or NVMe."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from launcher.engines.layout import Layout

ZeroStage = Literal[0, 1, 2, 3]
"""DeepSpeed ZeRO stage: 0 replicates everything; 1 shards the optimizer state, 2 also the gradients, 3 also the
parameters [ZeRO, arXiv:1910.02054]."""


@dataclass(kw_only=True, slots=True, frozen=True)
class ZeroLayout(Layout):
    """A DeepSpeed ZeRO layout: its stage, optimizer offload from stage 2 on, parameter offload at stage 3."""

    engine = "deepspeed"

    zero_stage: ZeroStage = field(metadata={"pin": "DeepSpeed ZeRO stage.", "aliases": ("zero", "stage")})
    """ZeRO stage 0-3."""

    def name(self) -> str:
        """"ZeRO-<stage>"."""
        return f"ZeRO-{self.zero_stage}"

    def title(self, nodes: int) -> str:
        """"DeepSpeed ZeRO-<stage>", as launch plan prints it."""
        return f"DeepSpeed ZeRO-{self.zero_stage}"

    def change_words(self, old: Layout) -> list[str]:
        """"ZeRO stage 2 -> 3", then the offloads."""
        stage = [f"ZeRO stage {old.zero_stage} -> {self.zero_stage}"] if self.zero_stage != old.zero_stage else []
        return stage + Layout.change_words(self, old)


LAYOUT = ZeroLayout
"""The registered layout type (launcher.engines.LAYOUTS)."""
