"""The lever settings the search tries for one layout and micro-batch, from the registered levers' specs.

Two kinds (docs/levers.md): exact levers keep the training math, so the planner chooses them freely; math levers
change it, so only a job whose train.allow_levers lists them gets them. Each lever's spec (launcher.levers) says
which values the search tries for a request (LeverSpec.values: also where the lever applies, which the lever
decisions read), and which combinations it leaves out (LeverSpec.excludes). An engine offers a lever only when its
rank side implements it (EngineSpec.levers); a lever the job pinned is kept. Pure: plain data in, settings out.
"""

from __future__ import annotations

import itertools
import operator
from dataclasses import dataclass

from launcher.levers import LEVER_FIELDS, LEVERS, SCRIPT_LEVERS, LeverSpec, Shape, with_lever_fields
from launcher.planner.request import PlanRequest

_EXCLUDES = tuple(spec.excludes for spec in LEVERS.values() if type(spec).excludes is not LeverSpec.excludes)
"""The ``excludes`` rules of the specs that have their own (the others exclude nothing): the only ones asked per
setting."""


@dataclass(kw_only=True, slots=True, frozen=True)
@with_lever_fields()
class LeverSetting:
    """One combination of the levers for a candidate: activation checkpointing and a field per registered lever
    (launcher.levers), each off by default."""

    activation_checkpointing: bool = False
    """Recompute of blocks in backward (the refinements among the levers say which and how)."""

    def fields(self) -> dict[str, object]:
        """The setting as Strategy keyword arguments: activation_checkpointing and every lever's field."""
        return dict(zip(_SETTING_FIELDS, _setting_values(self), strict=True))


_SETTING_FIELDS = ("activation_checkpointing", *LEVER_FIELDS)
_setting_values = operator.attrgetter(*_SETTING_FIELDS)


def allowed(req: PlanRequest, field_name: str, value: object) -> bool:
    """Whether the job's train.allow_levers permits ``value`` of a lever's field (off, and exact levers, always)."""
    return LEVERS[field_name].permitted(req, value)


def math_departure(fields) -> int:
    """How far a Strategy (or LeverSetting) departs from the job's training math, for the planner's ranking
    (ranked_step_time) and tie-break (launcher.planner.scoring.Searched.best): the sum of its levers'
    LeverSpec.departure, 0 for none. Each math lever used adds 1, a low-memory optimizer its rank (8-bit moments 1,
    4-bit 2, Adafactor 3). Each unit must buy MATH_LEVER_MARGIN of step time, and among plans that rank alike the
    job's own math wins, then the fewest and mildest departures (8-bit AdamW before 4-bit, either alone before with
    pure bf16): a job that allows 4-bit gets it only where it is more than the margin faster or alone fits."""
    return sum(spec.departure(spec.of(fields)) for spec in _MATH)


_MATH = tuple(spec for spec in LEVERS.values() if not spec.exact)

MATH_LEVER_MARGIN = 0.05
"""How much faster a plan must be to depart further from the job's training math where both fit: more than 5 % of
step time per unit of math_departure (issue 37 §6; docs/levers.md). So a math lever wins over every plan with the
job's own math only by being more than 5 % faster, 4-bit AdamW over 8-bit likewise, and two levers over one: a
change of the math buys memory or speed, and a gain within the step-time model's own error buys nothing."""


def ranked_step_time(step_time_s: float, fields) -> float:
    """The step time the planner ranks a plan by (launcher.planner.scoring.Searched.best): its own over
    (1 - MATH_LEVER_MARGIN) to the power of its math_departure, so its own for the job's math. Never below the
    plan's own time: the search's stop on step-time bounds stays sound."""
    return step_time_s / (1 - MATH_LEVER_MARGIN) ** math_departure(fields)


def reachable(req: PlanRequest, supported: frozenset[str]) -> frozenset[str]:
    """The levers of ``supported`` (an engine's) the search may try for this job: all of them for the launcher's
    recipes; for a user's script (PlanRequest.script) those it receives (SCRIPT_LEVERS) and those the job pins."""
    if not req.script:
        return supported
    pinned_levers = {spec.field for spec in LEVERS.values() if spec.of(req.pins) is not None}
    return supported & (SCRIPT_LEVERS | pinned_levers)


def options(req: PlanRequest, supported: frozenset[str], grad_accum_steps: int,
            limits: dict[str, tuple[object, ...]] | None = None,
            pure_bf16_optimizers: frozenset[str] = frozenset()) -> list[LeverSetting]:
    """Every lever setting the search tries for one layout and micro-batch, the pins and permissions applied.

    ``supported``: the lever fields the engine implements (EngineSpec.levers); a lever it does not implement
    stays off. ``grad_accum_steps``: the plan's shape, with activation checkpointing on or off (LeverSpec.values).
    ``limits``: field -> the only values this layout offers (EngineSpec.lever_values), a pin outside them admits
    nothing. ``pure_bf16_optimizers``: the low-memory optimizers the engine pairs with pure bf16
    (EngineSpec.pure_bf16_optimizers).
    """
    return expand(axes(req, supported, grad_accum_steps, limits), pure_bf16_optimizers)


Axes = tuple[tuple[bool, tuple[tuple, ...]], ...]
"""Per activation checkpointing setting tried, the values of each lever (in LEVERS' order) tried with it."""


def axes(req: PlanRequest, supported: frozenset[str], grad_accum_steps: int,
         limits: dict[str, tuple[object, ...]] | None = None) -> Axes:
    """The values ``options`` tries of each lever, per checkpointing setting (its arguments); () where a pin admits
    no setting."""
    limits = limits or {}
    p = req.pins
    ac = [False, True] if p.activation_checkpointing is None else [p.activation_checkpointing]
    if p.activation_checkpointing is None and any(spec.forces_checkpointing(spec.of(p)) for spec in LEVERS.values()):
        ac = [True]  # a pinned refinement chooses what checkpointed blocks keep: it needs checkpointing
    per_ac = []
    for on in ac:
        shape = Shape(grad_accum_steps, on)
        values = [_axis(req, spec, shape, supported, limits) for spec in LEVERS.values()]
        if any(axis is None for axis in values):
            return ()
        per_ac.append((on, tuple(tuple(axis) for axis in values)))
    return tuple(per_ac)


def expand(per_ac: Axes, pure_bf16_optimizers: frozenset[str] = frozenset()) -> list[LeverSetting]:
    """Every combination of ``per_ac``'s values that no lever's rule (LeverSpec.excludes) leaves out: a function of
    its arguments alone, which the search's candidates share between micro-batches with the same axes."""
    out = []
    for on, values_per_lever in per_ac:
        for values in itertools.product(*values_per_lever):
            setting = LeverSetting(activation_checkpointing=on, **dict(zip(LEVERS, values, strict=True)))
            for excludes in _EXCLUDES:
                if excludes(setting, pure_bf16_optimizers):
                    break
            else:
                out.append(setting)
    return out


def _axis(req: PlanRequest, spec: LeverSpec, shape: Shape, supported: frozenset[str],
          limits: dict[str, tuple[object, ...]]) -> list | None:
    """The values of one lever the search tries at ``shape``; None where a pin admits no setting at all (pinned on
    where the engine does not implement it, where the shape cannot run it, or outside the layout's limits)."""
    pin, name = spec.of(req.pins), spec.field
    if pin is not None and name not in supported and pin != spec.off:
        return None  # pinned on, and this engine does not implement it
    if pin is not None and spec.pin_refused(req, shape, pin):
        return None  # pinned on where this shape cannot run it
    if name in limits and pin is not None and pin not in limits[name]:
        return None  # pinned to a value this layout does not offer
    if spec.refines_checkpointing and not shape.activation_checkpointing:
        return [spec.off]  # without checkpointing its refinements are off, pinned or not
    if pin is not None:
        return [pin]
    values = spec.values(req, shape) if name in supported else (spec.off,)
    if name in limits:
        values = [v for v in values if v in limits[name]]
    return [v for v in values if spec.permitted(req, v)]


__all__ = ["MATH_LEVER_MARGIN", "Axes", "LeverSetting", "allowed", "axes", "expand", "math_departure", "options",
           "ranked_step_time", "reachable"]
