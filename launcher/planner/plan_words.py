"""The planner's typed overrun (launcher.planner.plan.Problem) in words: plan.json's reason for a forced plan and
the no-plan answer's smallest footprint (pure: numbers in, text out).

Not in launcher.cli.render, which words everything else the planner returns: a forced plan's reason is part of
plan.json, which the session writes (run dir, ladder, sweep) and the sbatch emitter embeds, and neither may import
the CLI (tests/test_layers.py); it is put in where every plan is made, launcher.inputs.plan_inputs.plan_job. Not in the
planner, which returns the numbers only.
"""

from __future__ import annotations

import dataclasses

from launcher.planner.plan import Plan, Problem
from launcher.units import format_bytes


def problem_words(p: Problem) -> str:
    """What a candidate overruns, e.g. "over budget by 1.00 GB (peak 3.00 GB, largest: params)"."""
    need, have = format_bytes(p.need_bytes), format_bytes(p.have_bytes)
    if p.resource == "device":
        return f"over budget by {format_bytes(p.need_bytes - p.have_bytes)} (peak {need}, largest: {p.largest})"
    if p.resource == "host_ram":
        return f"host RAM: needs {need} per node, has {have}"
    return f"NVMe: needs {need}, has {have} free"


def forced_reason(p: Problem) -> str:
    """A forced plan's first reason: it runs over what the prediction says it needs."""
    return f"forced: every strategy field is pinned and the prediction is {problem_words(p)}"


def with_forced_reason(plan: Plan) -> Plan:
    """``plan`` with its forced reason first when it is forced (Plan.problem set); as it is otherwise."""
    if plan.problem is None:
        return plan
    return dataclasses.replace(plan, reasons=[forced_reason(plan.problem), *plan.reasons])
