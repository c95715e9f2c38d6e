"""The engines' plan side, one package per engine, found by name: NAMES is the only place that lists them.

An engine is a package launcher.engines.<name> (its ``spec`` module defines SPEC, the EngineSpec that owns its
layouts, memory and cost terms, fallback rungs, config files and words) paired with its rank side,
launcher.worker.engines.<name>. Adding an engine is a package here plus its name in NAMES. The packages are
imported by name when first asked for, as the rank side's are (launcher.worker.engines.engine_class): importing
this registry costs nothing, so the job schema and the plan's types can read it without importing the planner.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from launcher.engines.spec import EngineSpec

NAMES = ("deepspeed", "fsdp")
"""The registered engines, in search order (the order ties are broken in)."""

_SPECS: dict[str, EngineSpec] = {}


def engine_spec(name: str) -> EngineSpec:
    """The spec registered as ``name`` (launcher.engines.<name>.spec.SPEC); ValueError naming the known ones
    otherwise."""
    spec = _SPECS.get(name)
    if spec is None:
        if name not in NAMES:
            raise ValueError(f"engine {name!r} is not one of {', '.join(NAMES)}")
        spec = _SPECS[name] = importlib.import_module(f"launcher.engines.{name}.spec").SPEC
    return spec


def __getattr__(attr: str):
    # ENGINES (name -> spec, in search order) is built on first use: the specs import the planner.
    if attr == "ENGINES":
        engines = {name: engine_spec(name) for name in NAMES}
        globals()["ENGINES"] = engines
        return engines
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")


__all__ = ["ENGINES", "NAMES", "engine_spec"]
