"""Plan building: the chosen candidate as a Plan, with the reasons and the alternatives not chosen."""

from __future__ import annotations

import dataclasses
import heapq
from collections import Counter
from typing import Literal

from launcher.levers import LEVER_FIELDS, LEVERS, LEVERS_OFF
from launcher.planner.lever_choice import decide
from launcher.planner.memory import ActivationConstants
from launcher.planner.plan import Plan, Rejected, Strategy
from launcher.planner.request import PlanRequest
from launcher.planner.scoring import Scored, activation_constants
from launcher.units import format_bytes


def build_plan(req: PlanRequest, best: Scored, scored: list[Scored], pinned: list[str], *,
               status: Literal["fits", "forced"], total: int | None = None) -> Plan:
    """The Plan for ``best``, with the reasons: why it won among ``scored``, what it assumed, what was pinned.

    ``scored``: every candidate predicted faster than ``best`` and the runners-up at least (the search scores
    in order of step time); ``total``: the candidates in the search space (len(scored) when None).
    """
    total = len(scored) if total is None else total
    b = best.estimate
    faster = sum(1 for c in scored if not c.fits and c.step_time_s < b.step_time_s)
    reasons = []
    # A forced plan's first reason words its typed Problem (Plan.problem): launcher.planner.plan_words.forced_reason,
    # put first where every plan is made (launcher.inputs.plan_inputs.plan_job), outside the planner.
    if status != "forced":
        reasons.append(
            f"fastest fitting candidate of {total} ({faster} predicted faster do not fit): "
            f"predicted {b.step_time_s:.3g} s/step, "
            f"peak {format_bytes(b.peak_bytes)} of {format_bytes(req.usable_bytes)} usable "
            f"(budget {format_bytes(req.budget_bytes)} less {req.pins.safety_margin:.0%} margin)"
        )
        dominant = max(b.step_time_terms, key=b.step_time_terms.get)
        reasons.append(f"step time is dominated by {dominant} ({b.step_time_terms[dominant]:.3g} s)")
        moments = b.moment_bytes
        peak_at = max(moments, key=moments.get) if moments else None
        if peak_at in ("init", "export"):
            training = format_bytes(max(v for k, v in moments.items() if k not in ("init", "export")))
            reasons.append(
                f"the peak is rank 0 loading the weights, {format_bytes(moments['init'])} (the checkpoint it reads "
                f"counts where host memory is the device), above training's {training}" if peak_at == "init" else
                f"the peak is rank 0's end-of-run export copy, {format_bytes(moments['export'])} (host memory, the "
                f"device on CPU ranks), above training's {training}")
        hw = req.hardware
        if req.precision == "bf16" and hw.flops_bf16 < hw.flops_fp32:
            # CPUs without AMX / AVX512-BF16 emulate bf16 matmuls (~13x slower): `launch calibrate` measures it.
            reasons.append(f"bf16 matmuls run {hw.flops_fp32 / hw.flops_bf16:.1f}x slower than fp32 on the "
                           f"{hw.name} profile ({hw.flops_bf16:.3g} vs {hw.flops_fp32:.3g} FLOP/s); the compute "
                           "term uses the bf16 rate, and precision: fp32 would step faster")
        if pinned:
            reasons.append(f"kept as pinned by the job: {', '.join(pinned)}")
    # What the plan's levers turn off in the job's math (LeverSpec.strategy_note), in the registry's order.
    s = best.strategy
    math_notes = [note for spec in LEVERS.values() if spec.on(s) and (note := spec.strategy_note(req, s))]
    reasons += math_notes
    if req.precision_reason:
        reasons.append(req.precision_reason)
    reasons += activation_reasons(activation_constants(req))
    m = req.model
    if m.num_experts:
        reasons.append(f"MoE: {m.num_params:,} total, {m.active_params:,} active (top-{m.experts_per_token} of "
                       f"{m.num_experts} experts): memory counts every expert, compute only the active ones, "
                       "activations the top-k experts' MLP width")
    return Plan(
        strategy=best.strategy, estimate=dataclasses.replace(b),
        buckets=best.buckets and dataclasses.replace(best.buckets), num_params=req.model.num_params,
        trainable_params=req.model.trainable_params, budget_bytes=req.budget_bytes, usable_bytes=req.usable_bytes,
        world_size=req.world_size, nodes=req.nodes, gpus_per_node=req.gpus_per_node,
        global_batch_size=req.global_batch_size, seq_len=req.seq_len, precision=req.precision,
        hardware=req.hardware.name, reasons=reasons, rejected=top_rejected(best, scored), pinned=pinned,
        constants={"activations": dataclasses.asdict(activation_constants(req))}, status=status,
        problem=best.problem if status == "forced" else None,
        largest_layer_params=req.model.largest_layer_params, block_class=req.model.block_class,
        precision_reason=req.precision_reason, levers=decide(req, best), math_notes=math_notes,
        script=req.script,
    )


def activation_reasons(c: ActivationConstants) -> list[str]:
    """What the activation term assumed: the attention kernel, and a probe that failed (never silently)."""
    scores = "a·s² score matrices saved per block" if c.attention == "eager" else "fused, no a·s² scores saved"
    out = [f"activations assume {c.attention} attention ({scores})"]
    if c.probe_error:
        out.append(f"activation probe FAILED ({c.probe_error}): activations use Korthikanti et al.'s per-layer "
                   "constants, not measured ones; expect a larger error")
    return out


NEAR_OVERRUN = 2.0
"""A faster candidate that does not fit is listed when it needs at most this many times what there is (the
budget, host RAM, NVMe): close enough that a larger budget, a smaller batch or a node more would bring it in.
Beyond it an alternative is no alternative (ZeRO-0 of a 70B model: 'over budget by 21.25 TB'); only the one
nearest to fitting is listed then, so the plan still says why nothing faster runs."""


def overrun(c: Scored) -> float:
    """How far a candidate is from fitting: need / have of the resource it overruns (1.0 is at the limit)."""
    return c.problem.need_bytes / max(c.problem.have_bytes, 1)


def without_levers(s: Strategy) -> str:
    """The strategy's label with every lever off: what an alternative is, apart from its levers."""
    return dataclasses.replace(s, **{name: LEVERS_OFF[name] for name in LEVER_FIELDS}).label()


PER_LAYOUT = 2
"""Fitting alternatives listed per layout (engine, sharding, offload) at most."""


def layout(s: Strategy) -> str:
    """What engine layout ``s`` is (its sharding and offload), apart from micro-batch, checkpointing and levers."""
    return s.layout.label()


def nearest(faster: list[Scored], count: int) -> list[Scored]:
    """The candidates of ``faster`` (none fits) closest to fitting, by (overrun, step time), the earlier on a tie:
    up to ``count`` of those within NEAR_OVERRUN, else the nearest one alone; sorted(...)[:count] of the exact keys."""
    # The search asks this of thousands at each check: a heap, not a sort. A deferred candidate (Scored.defer)
    # enters by its overrun's lower bound and is estimated only when it reaches the top: the exact key it then
    # enters with is at least the bound, so nothing it could precede has been taken yet.
    heap = [(c.overrun_at_least, c.step_time_s, i, c.deferred) for i, c in enumerate(faster)]
    heapq.heapify(heap)
    out: list[Scored] = []
    while heap and len(out) < count:
        over, step_time_s, i, bound = heapq.heappop(heap)
        if out and over > NEAR_OVERRUN:
            break  # every one left is past NEAR_OVERRUN (its overrun at least this key's)
        if bound:  # its exact key is at least this one: back in the heap with it
            heapq.heappush(heap, (overrun(faster[i]), step_time_s, i, False))
            continue
        out.append(faster[i])
        if over > NEAR_OVERRUN:
            break  # none within NEAR_OVERRUN: the nearest alone
    return out


def top_rejected(best: Scored, scored: list[Scored], limit: int = 6) -> list[Rejected]:
    """The nearest alternatives: the faster candidates closest to fitting (at most half the list), then the
    fastest fitting ones, at most PER_LAYOUT of a layout. Typed; worded by launch plan."""
    t0 = best.estimate.step_time_s
    near = nearest([c for c in scored if not c.fits and c is not best and c.step_time_s < t0], limit // 2)
    runners = sorted((c for c in scored if c.fits and c is not best), key=lambda c: c.step_time_s)
    # Each once apart from its levers (the plan's lever lines say what the levers do), and at most PER_LAYOUT
    # fitting ones of one layout, so other engines and shardings are not crowded out by one layout's
    # micro-batches (and the list still fills, which lets the search stop early: launcher.planner.scoring.search).
    out, seen, per_layout = [], {without_levers(best.strategy)}, Counter()
    for c in near[: limit // 2] + runners:
        key = without_levers(c.strategy)
        if key in seen or (c.problem is None and per_layout[layout(c.strategy)] >= PER_LAYOUT):
            continue
        seen.add(key)
        if c.problem is None:
            per_layout[layout(c.strategy)] += 1
        label = c.strategy.label()
        p = c.problem
        out.append(Rejected(label=label, why=p.resource if p else "slower", peak_bytes=c.estimate.peak_bytes,
                            step_time_s=c.estimate.step_time_s, need_bytes=p.need_bytes if p else 0,
                            have_bytes=p.have_bytes if p else 0, largest=p.largest if p else ""))
        if len(out) >= limit:
            break
    return out
