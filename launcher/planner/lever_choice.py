"""Why each lever was used or not: the chosen strategy scored once more with each lever switched the other way.

Typed values only (LeverDecision); launcher.cli.render turns them into sentences. Pure: scoring is the planner's
own (launcher.planner.scoring), so the deltas are the memory and cost models' and nothing else.
"""

from __future__ import annotations

import dataclasses

from launcher.engines import engine_spec
from launcher.planner.levers import (
    LOSS_CHUNKS,
    MATH_LEVERS,
    allowed,
    frozen_inputs_measured,
    in_backward_possible,
    reachable,
    sac_measured,
    unpaired,
)
from launcher.planner.plan import LEVER_FIELDS, LEVERS_OFF, LeverDecision, Strategy, Why
from launcher.planner.request import PlanRequest
from launcher.planner.scoring import Scored, score

EXACT = ("loss_chunks", "checkpoint_every", "checkpoint_policy", "activation_offload", "optimizer_in_backward",
         "release_frozen_weights")
"""The levers that keep the training math; the others (MATH_LEVERS) need the job's permission."""


def _on_value(lever: str, s: Strategy, req: PlanRequest) -> object:
    """The value a lever takes when switched on from the chosen plan (the search's first non-default one)."""
    if lever == "loss_chunks":
        return LOSS_CHUNKS
    if lever == "checkpoint_every":
        return 2 if s.checkpoint_every == 1 else 1
    if lever == "checkpoint_policy":
        return "ops" if s.checkpoint_policy == "full" else "full"
    if lever == "low_memory_optimizer":
        return next((o for o in MATH_LEVERS[lever] if o in req.allow_levers), MATH_LEVERS[lever][0])
    return True


def _applicable(lever: str, s: Strategy, req: PlanRequest) -> bool:
    m = req.model
    return {
        "loss_chunks": m.task == "causal_lm",
        "checkpoint_every": s.activation_checkpointing and m.num_blocks > 1,
        "checkpoint_policy": s.activation_checkpointing and "checkpoint_policy" in engine_spec(s.engine).levers
        and sac_measured(req),
        "optimizer_in_backward": in_backward_possible(req, s.grad_accum_steps),
        "low_memory_optimizer": req.optimizer in ("adamw", "adam") and not m.lora_params,
        "pure_bf16": req.precision == "bf16",
        "qlora": bool(m.lora_params and m.block_linear_shapes),  # some frozen block linear NF4 could take
        "release_frozen_weights": frozen_inputs_measured(req),
    }.get(lever, True)


def _job_applicable(lever: str, req: PlanRequest) -> bool:
    """Whether some plan of this job could use the lever, where _applicable says the chosen one cannot: the
    refinements of checkpointing need it on, the optimizer step in backward needs no accumulation."""
    return {
        "checkpoint_every": req.model.num_blocks > 1,
        "checkpoint_policy": sac_measured(req),
        "optimizer_in_backward": in_backward_possible(req, 1),
    }.get(lever, False)


def _off_value(lever: str) -> object:
    return LEVERS_OFF[lever]


def decide(req: PlanRequest, best: Scored) -> list[LeverDecision]:
    """For each lever: used or not in ``best``, why, and what the other setting would predict."""
    s, spec = best.strategy, engine_spec(best.strategy.engine)
    tried = reachable(req, frozenset(LEVER_FIELDS))  # the levers the search may try for this job
    out = []
    for lever in (*EXACT, *MATH_LEVERS):
        used = getattr(s, lever) != _off_value(lever)
        exact = lever in EXACT
        if getattr(req.pins, lever) is not None:
            out.append(LeverDecision(lever=lever, exact=exact, used=used, why="pinned"))
            continue
        if not used and not _applicable(lever, s, req):
            # Not for this job at all, or not for the chosen plan's shape (what a faster plan gave up for it).
            out.append(LeverDecision(lever=lever, exact=exact, used=False, why=(
                "not_applicable" if not _job_applicable(lever, req) else "script_lacks" if lever not in tried
                else "engine_lacks" if lever not in spec.levers else "plan_lacks")))
            continue
        if not used and lever not in tried:  # a --script run's: what the search left off for the script
            out.append(LeverDecision(lever=lever, exact=exact, used=False, why="script_lacks"))
            continue
        other = _off_value(lever) if used else _on_value(lever, s, req)
        if not used and not exact and not allowed(req, lever, other):
            out.append(LeverDecision(lever=lever, exact=exact, used=False, why="not_allowed", other_value=other))
            continue
        limited = spec.lever_values(s)
        offered = limited.get(lever, ((other,), ""))[0]
        switched = dataclasses.replace(s, **{lever: other})
        if not used and (lever not in spec.levers or other not in offered):
            # The layout's own refusal, where the engine implements the lever elsewhere (ZeRO-Offload's CPU Adam).
            reason = limited[lever][1] if lever in spec.levers else ""
            out.append(LeverDecision(lever=lever, exact=exact, used=False, why="engine_lacks", layout_reason=reason))
            continue
        if not used and unpaired(switched, spec.pure_bf16_optimizers):
            out.append(LeverDecision(lever=lever, exact=exact, used=False, why="not_paired", other_value=other))
            continue
        alt = score(req, switched)
        if used:
            why: Why = ("needed_to_fit" if alt.problem is not None
                        else "faster" if alt.estimate.step_time_s > best.estimate.step_time_s else "lower_peak")
        elif best.problem is None:
            # Switching it on would fit too (the fastest plan did not need it), or it would not (selective
            # checkpointing keeps more than full checkpointing).
            why = "fits_without" if alt.problem is None else "would_not_fit"
        else:
            why = "would_fit" if alt.problem is None else "no_fit_either"
        out.append(LeverDecision(lever=lever, exact=exact, used=used, why=why, other_value=other,
                                 peak_delta_bytes=int(alt.estimate.peak_bytes - best.estimate.peak_bytes),
                                 step_time_delta_s=alt.estimate.step_time_s - best.estimate.step_time_s,
                                 other_problem=alt.problem))
    return out


__all__ = ["EXACT", "LeverDecision", "Why", "decide"]
