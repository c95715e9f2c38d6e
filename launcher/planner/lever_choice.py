"""Why each lever was used or not: the chosen strategy scored once more with each lever switched the other way.

Typed values only (LeverDecision); launcher.cli.render turns them into sentences. Pure: scoring is the planner's
own (launcher.planner.scoring), so the deltas are the memory and cost models' and nothing else. A lever is scored
only with a value the search could have tried for the chosen plan's shape (its LeverSpec.values, the rule the
search's settings come from): a plan never lists an alternative the ranks would refuse.
"""

from __future__ import annotations

import dataclasses

from launcher.engines import engine_spec
from launcher.errors import ConfigError
from launcher.levers import DECIDED, EXACT, LEVER_FIELDS, LeverSpec, Shape
from launcher.levers.pure_bf16 import unpaired
from launcher.planner.levers import reachable
from launcher.planner.plan import LeverDecision, Strategy, Why
from launcher.planner.request import PlanRequest
from launcher.planner.scoring import Scored, score, search


def shape_of(s: Strategy) -> Shape:
    """The strategy's micro-batch and checkpointing, as the levers' values depend on them."""
    return Shape(s.grad_accum_steps, s.activation_checkpointing)


def _not_at_this_shape(lever: LeverSpec, req: PlanRequest, s: Strategy, tried: frozenset[str]) -> Why:
    """Why a lever that has no other value at the chosen plan's shape is not used: no plan of the job could use it
    (not_applicable), or another could, which this one's script, engine or shape excludes."""
    if len(lever.values(req)) < 2:
        return "not_applicable"
    if lever.field not in tried:
        return "script_lacks"
    return "engine_lacks" if lever.field not in engine_spec(s.engine).levers else "plan_lacks"


def _fits_without(req: PlanRequest, lever: LeverSpec) -> bool:
    """Whether any plan of the job fits without math lever ``lever``: the search again with the train.allow_levers
    words that permit it taken away (issue 37 §6: needed_to_fit means no plan without it fits)."""
    rest = tuple(word for word in req.allow_levers if word not in lever.permits)
    try:
        return search(dataclasses.replace(req, allow_levers=rest)).best is not None
    except ConfigError:  # the job's pins admit no strategy without it
        return False


def decide(req: PlanRequest, best: Scored) -> list[LeverDecision]:
    """For each lever: used or not in ``best``, why, and what the other setting would predict."""
    s, spec = best.strategy, engine_spec(best.strategy.engine)
    tried = reachable(req, frozenset(LEVER_FIELDS))  # the levers the search may try for this job
    out = []
    for lever in DECIDED:
        name = lever.field
        used, exact = bool(lever.on(s)), lever.exact
        if lever.of(req.pins) is not None:
            out.append(LeverDecision(lever=name, exact=exact, used=used, why="pinned"))
            continue
        other = lever.off if used else lever.switched_on(req, s, lever.values(req, shape_of(s)))
        if other is None:
            # Not for this job at all, or not for the chosen plan's shape (what a faster plan gave up for it).
            out.append(LeverDecision(lever=name, exact=exact, used=False, why=_not_at_this_shape(lever, req, s, tried)))
            continue
        if not used and name not in tried:  # a --script run's: what the search left off for the script
            out.append(LeverDecision(lever=name, exact=exact, used=False, why="script_lacks"))
            continue
        if not used and not lever.permitted(req, other):
            out.append(LeverDecision(lever=name, exact=exact, used=False, why="not_allowed", other_value=other))
            continue
        limited = spec.lever_values(s.layout)
        offered = limited.get(name, ((other,), ""))[0]
        switched = dataclasses.replace(s, **{name: other})
        if not used and (name not in spec.levers or other not in offered):
            # The layout's own refusal, where the engine implements the lever elsewhere (ZeRO-Offload's CPU Adam).
            reason = limited[name][1] if name in spec.levers else ""
            out.append(LeverDecision(lever=name, exact=exact, used=False, why="engine_lacks", layout_reason=reason))
            continue
        if not used and unpaired(switched, spec.pure_bf16_optimizers):
            out.append(LeverDecision(lever=name, exact=exact, used=False, why="not_paired", other_value=other))
            continue
        alt = score(req, switched)
        if used and alt.problem is not None and not exact and _fits_without(req, lever):
            # This plan needs it, but another plan without it fits: it is used for its speed (by more than
            # levers.MATH_LEVER_MARGIN per unit of departure, or the search would have chosen that plan), not to fit.
            why: Why = "faster_than_without"
        elif used:
            why = ("needed_to_fit" if alt.problem is not None
                   else "faster" if alt.estimate.step_time_s > best.estimate.step_time_s else "lower_peak")
        elif best.problem is None:
            # Switching it on would fit too (the fastest plan did not need it), or it would not (selective
            # checkpointing keeps more than full checkpointing).
            why = "fits_without" if alt.problem is None else "would_not_fit"
        else:
            why = "would_fit" if alt.problem is None else "no_fit_either"
        out.append(LeverDecision(lever=name, exact=exact, used=used, why=why, other_value=other,
                                 peak_delta_bytes=int(alt.estimate.peak_bytes - best.estimate.peak_bytes),
                                 step_time_delta_s=alt.estimate.step_time_s - best.estimate.step_time_s,
                                 other_problem=alt.problem))
    return out


__all__ = ["EXACT", "LeverDecision", "Why", "decide", "shape_of"]
