"""The engines' plan side, found by name: ENGINES is the only place that lists them.

Each spec (launcher.engines.spec.EngineSpec) owns one engine's memory and cost terms, its candidates and
offload options, its fallback rungs, its config files and the name of its rank-side Engine
(launcher.worker.engines). Adding an engine is a module here plus one line below.
"""

from __future__ import annotations

from launcher.engines.deepspeed import DeepSpeedSpec
from launcher.engines.fsdp import FsdpSpec
from launcher.engines.spec import Candidate, EngineSpec

ENGINES: dict[str, EngineSpec] = {spec.name: spec for spec in (DeepSpeedSpec(), FsdpSpec())}
"""Registry name -> spec, in search order (the order ties are broken in)."""


def engine_spec(name: str) -> EngineSpec:
    """The spec registered as ``name``; ValueError naming the known ones otherwise."""
    try:
        return ENGINES[name]
    except KeyError:
        raise ValueError(f"engine {name!r} is not one of {', '.join(ENGINES)}") from None


__all__ = ["ENGINES", "Candidate", "EngineSpec", "engine_spec"]
