"""The engines, one package per engine; LAYOUTS is the registry, the only place that lists them.

An engine is a package launcher.engines.<name>: ``layout`` (its Layout type: how it shards and offloads, with its
label and words), ``spec`` (SPEC, the EngineSpec that owns its candidates, memory and cost terms, fallback rungs,
config files and the levers it offers) and its other plan-side modules, paired with its rank side,
launcher.worker.engines.<name>. Adding an engine is a package here plus its layout's line in LAYOUTS.

The layouts are light (the plan's types and the job schema read them); the specs import the planner, so they are
imported by name when first asked for (``engine_spec``), as the rank side's are (launcher.worker.engines
.engine_class).
"""

from __future__ import annotations

import dataclasses
import importlib
import typing

from launcher.engines.deepspeed.layout import ZeroLayout
from launcher.engines.fsdp.layout import FsdpLayout
from launcher.engines.layout import Layout
from launcher.engines.plain.layout import PlainLayout

LAYOUTS: dict[str, type[Layout]] = {layout.engine: layout for layout in (ZeroLayout, FsdpLayout, PlainLayout)}
"""Engine name -> its layout type, in search order (the order ties are broken in)."""
NAMES = tuple(LAYOUTS)
"""The registered engines' names, in search order: a job's strategy.engine and plan.json's engine say one."""

_SPECS: dict[str, object] = {}


def engine_spec(name: str):
    """The spec registered as ``name``, an EngineSpec (launcher.engines.<name>.spec.SPEC; imported by name, not
    here, since the specs import the planner); ValueError naming the known ones otherwise."""
    spec = _SPECS.get(name)
    if spec is None:
        if name not in LAYOUTS:
            raise ValueError(f"engine {name!r} is not one of {', '.join(NAMES)}")
        spec = _SPECS[name] = importlib.import_module(f"launcher.engines.{name}.spec").SPEC
    return spec


def layout_type(name: str) -> type[Layout]:
    """The layout type of the engine registered as ``name``; ValueError naming the known ones otherwise."""
    if name not in LAYOUTS:
        raise ValueError(f"engine {name!r} is not one of {', '.join(NAMES)}")
    return LAYOUTS[name]


def _flat_fields() -> tuple[tuple[str, object, str], ...]:
    """(name, type, the strategy: pin's words) of every layout field, flat: each engine's own fields in LAYOUTS'
    order, then every layout's (the offloads)."""
    out, seen = [], set()
    for cls in (*LAYOUTS.values(), Layout):
        hints = typing.get_type_hints(cls)
        for f in (cls.own_fields() if cls is not Layout else dataclasses.fields(Layout)):
            if f.name not in seen:
                seen.add(f.name)
                out.append((f.name, hints[f.name], f.metadata.get("pin", "")))
    return tuple(out)


LAYOUT_FIELDS = _flat_fields()
"""(name, type, pin words) of every registered layout's fields, flat, in plan.json's order: a Strategy's layout as
plan.json and report.json write it, and the job's strategy: pins of it."""
LAYOUT_KEYS = tuple(name for name, _, _ in LAYOUT_FIELDS)
"""The flat names of LAYOUT_FIELDS."""
LAYOUT_ALIASES = {alias: f.name for layout in LAYOUTS.values() for f in layout.own_fields()
                  for alias in f.metadata.get("aliases", ())}
"""Other tools' names for a layout field (a field's "aliases" metadata) -> its key: what a job file's unknown key
was most likely meant to be (launcher.config.load.KEY_ALIASES)."""


def flat_layout(layout: Layout) -> dict[str, object]:
    """Every LAYOUT_KEYS key with ``layout``'s value, None where its engine has no such field (plan.json's keys)."""
    return {key: getattr(layout, key, None) for key in LAYOUT_KEYS}


def __getattr__(attr: str):
    # ENGINES (name -> spec, in search order) is built on first use: the specs import the planner.
    if attr == "ENGINES":
        engines = {name: engine_spec(name) for name in NAMES}
        globals()["ENGINES"] = engines
        return engines
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")


__all__ = ["ENGINES", "LAYOUTS", "LAYOUT_ALIASES", "LAYOUT_FIELDS", "LAYOUT_KEYS", "NAMES", "Layout", "engine_spec",
           "flat_layout", "layout_type"]
