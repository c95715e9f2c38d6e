"""The search: the fastest candidate that fits the usable budget, host RAM and NVMe chosen.

Candidates are scored for memory in order of predicted step time, until the choice and the plan's alternatives
are certain (launcher.planner.scoring.search); tests/planner/test_search_speed.py holds it to scoring all.

Pure: plain numbers in, a Plan (or NoPlanError with what would fit) out. The parts, one job each: the request
(launcher.planner.request), bucket sizing (buckets), the candidates the engine specs offer (candidates),
scoring (scoring), plan building (build) and the no-fit advice (advice).
"""

from __future__ import annotations

from launcher.errors import NoPlanError
from launcher.planner.advice import explain_no_fit
from launcher.planner.buckets import size_buckets
from launcher.planner.build import build_plan, top_rejected
from launcher.planner.candidates import candidates, pinned
from launcher.planner.plan import Plan
from launcher.planner.request import PlanRequest, batch_problem, context_problem, micro_batches
from launcher.planner.scoring import Scored, Searched, evaluate, score, search


def make_plan(req: PlanRequest) -> Plan:
    """The fastest strategy whose predicted peak fits the usable budget, host RAM and NVMe (on a tie, the one with
    the job's own math, then the mildest math levers, then the smaller peak: launcher.planner.scoring.Searched.best)."""
    found = search(req, top_rejected)
    best, scored = found.best, found.scored
    pins = pinned(req.pins)
    if best is None:  # nothing fits: every candidate was scored
        # Levers the job left free (launcher.planner.levers) still vary under a fully pinned layout: forcing runs
        # the layout with the levers that make it smallest.
        layouts = {(c.strategy.layout, c.strategy.micro_batch_size, c.strategy.grad_accum_steps,
                    c.strategy.activation_checkpointing) for c in scored}
        if req.force and len(layouts) == 1:
            smallest = min(scored, key=lambda c: c.estimate.peak_bytes)
            return build_plan(req, smallest, [], pins, status="forced")
        raise NoPlanError(explain_no_fit(req, scored))
    return build_plan(req, best, scored, pins, status="fits", total=found.total)


__all__ = ["PlanRequest", "Scored", "Searched", "batch_problem", "candidates", "context_problem", "evaluate",
           "make_plan", "micro_batches", "score", "search", "size_buckets"]
