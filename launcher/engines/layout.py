"""A layout: how an engine shards the model and what it offloads, the part of a Strategy its engine owns.

Each engine's package defines its Layout subclass (launcher.engines.<name>.layout, found through the registry):
its own fields, its label and its words. A Strategy carries one (Strategy.layout), never every engine's fields.
On disk (plan.json, report.json) and in the job's strategy: pins the fields stay flat, by the same names: a field
another engine's layout lacks is null there. Pure and light: the plan's types and the job schema import this.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import ClassVar, Literal

Offload = Literal["none", "cpu", "nvme"]
"""Where state lives between uses: none (the device), cpu (host RAM) or nvme."""

_OFFLOAD_DEPTH = {"none": 0, "cpu": 1, "nvme": 2}


@dataclass(kw_only=True, slots=True, frozen=True)
class Layout:
    """What every engine's layout holds: where the optimizer state and the parameters live. Subclasses add the
    engine's own fields (each with a ``pin`` metadata: the strategy: key's documentation) and fill the methods."""

    engine: ClassVar[str]
    """The engine's registry name (launcher.engines.NAMES)."""

    offload_optimizer: Offload = field(default="none", metadata={
        "pin": "Where optimizer states live: none (GPU), cpu or nvme."})
    """Where the optimizer state lives: none (device), cpu or nvme."""
    offload_params: Offload = field(default="none", metadata={
        "pin": "Where parameters live between uses: none, cpu or nvme."})
    """Where the parameters live between uses: none (device), cpu or nvme."""

    def label(self) -> str:
        """The layout as a plan's label starts, e.g. "ZeRO-3 +opt->cpu" (Strategy.label adds the rest)."""
        return self.name() + self.offload_words()

    def name(self) -> str:
        """The engine's sharding in a label's words, e.g. "ZeRO-3" or "FSDP2 full-shard"."""
        raise NotImplementedError

    def offload_words(self) -> str:
        """" +opt->cpu +params->nvme": what the layout offloads, in a label's words ("" for nothing)."""
        out = f" +opt->{self.offload_optimizer}" if self.offload_optimizer != "none" else ""
        return out + (f" +params->{self.offload_params}" if self.offload_params != "none" else "")

    def title(self, nodes: int) -> str:
        """The sharding in the engine's own words, for `launch plan`'s strategy line (``nodes``: the plan's)."""
        raise NotImplementedError

    def change_words(self, old: Layout) -> list[str]:
        """What differs from ``old`` (a layout of the same engine), in the job file's words: the fallback ladder's
        message. The offload parts are every engine's; subclasses put their own first."""
        out = []
        if self.offload_optimizer != old.offload_optimizer:
            out.append(f"optimizer state -> {self.offload_optimizer}")
        if self.offload_params != old.offload_params:
            out.append(f"parameters -> {self.offload_params}")
        return out

    def offloads_further(self, old: Layout) -> bool:
        """Whether this layout moves state only further out than ``old`` (nothing comes back to the device or the
        host, and something new goes to NVMe or the host)."""
        moves = (_OFFLOAD_DEPTH[self.offload_optimizer] - _OFFLOAD_DEPTH[old.offload_optimizer],
                 _OFFLOAD_DEPTH[self.offload_params] - _OFFLOAD_DEPTH[old.offload_params])
        return min(moves) >= 0 and max(moves) > 0

    @classmethod
    def pin_problem(cls, pins, nodes: int) -> str:
        """Why the job's strategy: pins of this engine's fields cannot be planned on ``nodes`` machines (a
        ConfigError's line), "" when they can."""
        return ""

    @classmethod
    def own_fields(cls) -> tuple[dataclasses.Field, ...]:
        """The engine's own fields (the offload fields apart), in definition order."""
        shared = {f.name for f in dataclasses.fields(Layout)}
        return tuple(f for f in dataclasses.fields(cls) if f.name not in shared)

    @classmethod
    def from_flat(cls, d: dict) -> Layout:
        """The layout from flat keys (plan.json's, report.json's): its fields that ``d`` has; a field added later
        takes its default where an older file lacks it."""
        return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls) if f.name in d})

    def to_flat(self) -> dict[str, object]:
        """The layout's fields by name (the flat keys of plan.json)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
