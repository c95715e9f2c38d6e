"""FSDP2's layout: resharding after forward or not, full or hybrid sharding, and CPUOffloadPolicy."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from launcher.engines.layout import Layout

FsdpSharding = Literal["full", "hybrid"]
"""FSDP2 sharding group: full shards over every rank; hybrid shards within a node and replicates across nodes
(HSDP, FSDP1's HYBRID_SHARD)."""


@dataclass(kw_only=True, slots=True, frozen=True)
class FsdpLayout(Layout):
    """An FSDP2 (fully_shard) layout: FULL_SHARD or SHARD_GRAD_OP, full or hybrid, with CPUOffloadPolicy (the
    parameters and the optimizer state go together) or without."""

    engine = "fsdp"

    fsdp_reshard_after_forward: bool = field(metadata={"pin": "FSDP2: True is FULL_SHARD, False is SHARD_GRAD_OP."})
    """FULL_SHARD (True: unsharded copies freed after forward) / SHARD_GRAD_OP (False)."""
    fsdp_sharding: FsdpSharding | None = field(default=None, metadata={
        "pin": "FSDP2: full shards over all ranks; hybrid shards within a node and replicates across nodes "
               "(nodes > 1)."})
    """The shard group: full (all ranks) or hybrid (the ranks of one node, replicated across nodes); read as full
    (None) where an older plan.json lacks it."""

    @classmethod
    def pin_problem(cls, pins, nodes: int) -> str:
        """Hybrid sharding replicates across nodes: it needs two or more."""
        if pins.fsdp_sharding == "hybrid" and nodes == 1:
            return ("strategy.fsdp_sharding: 'hybrid' shards within a node and replicates across nodes, but this job "
                    "runs on 1 node; use fsdp_sharding: full, or --nodes 2 or more")
        return ""

    @property
    def hybrid(self) -> bool:
        """True for hybrid sharding (shard within a node, replicate across nodes)."""
        return self.fsdp_sharding == "hybrid"

    def name(self) -> str:
        """"FSDP2 full-shard", "FSDP2 hybrid grad-op-shard", ..."""
        return "FSDP2 " + ("hybrid " if self.hybrid else "") + (
            "full-shard" if self.fsdp_reshard_after_forward else "grad-op-shard")

    def title(self, nodes: int) -> str:
        """The sharding in FSDP's words (FULL_SHARD / SHARD_GRAD_OP, HYBRID_SHARD), as launch plan prints it."""
        words = "FSDP2 " + ("FULL_SHARD (reshard after forward)" if self.fsdp_reshard_after_forward
                            else "SHARD_GRAD_OP (keep params after forward)")
        if self.hybrid:
            words += f", HYBRID_SHARD (shard within each node, replicate across the {nodes} nodes)"
        return words

    def change_words(self, old: Layout) -> list[str]:
        """"FSDP2 full-shard (reshard after forward)" where it came on, then the offloads."""
        reshard = self.fsdp_reshard_after_forward != old.fsdp_reshard_after_forward
        return (["FSDP2 full-shard (reshard after forward)"] if reshard else []) + Layout.change_words(self, old)


LAYOUT = FsdpLayout
"""The registered layout type (launcher.engines.LAYOUTS)."""
