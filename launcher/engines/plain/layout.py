"""The plain engine's layout: one device with no wrapper, or whole replicas under DDP."""

from __future__ import annotations

from dataclasses import dataclass, field

from launcher.engines.layout import Layout


@dataclass(kw_only=True, slots=True, frozen=True)
class PlainLayout(Layout):
    """No sharding: the parameters, gradients and optimizer state whole on every rank; on more than one rank torch
    DistributedDataParallel all-reduces the gradients. Nothing is offloaded."""

    engine = "plain"

    ddp: bool = field(metadata={
        "pin": "plain: True replicates the whole model on every rank under torch DDP (2 or more ranks); False is "
               "one device with no wrapper."})
    """DDP replicas over several ranks (True), or one rank with no wrapper (False)."""

    def name(self) -> str:
        """"DDP" or "single device"."""
        return "DDP" if self.ddp else "single device"

    def title(self, nodes: int) -> str:
        """The layout as launch plan prints it: no wrapper, or whole replicas under DDP."""
        if self.ddp:
            return "plain DDP (a whole replica per rank, gradients all-reduced)"
        return "plain single device (no sharding wrapper)"


LAYOUT = PlainLayout
"""The registered layout type (launcher.engines.LAYOUTS)."""
