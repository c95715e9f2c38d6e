"""Plan building: the chosen candidate as a Plan, with the reasons and the alternatives not chosen."""

from __future__ import annotations

import dataclasses
from typing import Literal

from launcher.planner.lever_choice import decide
from launcher.planner.memory import ActivationConstants
from launcher.planner.plan import Plan, Rejected
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
    faster = sum(1 for c in scored if c.problem is not None and c.estimate.step_time_s < b.step_time_s)
    reasons = []
    if status == "forced":
        reasons.append(f"forced: every strategy field is pinned and the prediction is {best.problem.describe()}")
    else:
        reasons.append(
            f"fastest fitting candidate of {total} ({faster} predicted faster do not fit): "
            f"predicted {b.step_time_s:.3g} s/step, "
            f"peak {format_bytes(b.peak_bytes)} of {format_bytes(req.usable_bytes)} usable "
            f"(budget {format_bytes(req.budget_bytes)} less {req.pins.safety_margin:.0%} margin)"
        )
        dominant = max(b.step_time_terms, key=b.step_time_terms.get)
        reasons.append(f"step time is dominated by {dominant} ({b.step_time_terms[dominant]:.3g} s)")
        moments = b.moment_bytes
        if moments and max(moments, key=moments.get) == "init":
            training = max(v for k, v in moments.items() if k != "init")
            reasons.append(f"the peak is rank 0 loading the weights, {format_bytes(moments['init'])} (the checkpoint "
                           f"it reads counts where host memory is the device), above training's "
                           f"{format_bytes(training)}")
        hw = req.hardware
        if req.precision == "bf16" and hw.flops_bf16 < hw.flops_fp32:
            # CPUs without AMX / AVX512-BF16 emulate bf16 matmuls (~13x slower): `launch calibrate` measures it.
            reasons.append(f"bf16 matmuls run {hw.flops_fp32 / hw.flops_bf16:.1f}x slower than fp32 on the "
                           f"{hw.name} profile ({hw.flops_bf16:.3g} vs {hw.flops_fp32:.3g} FLOP/s); the compute "
                           "term uses the bf16 rate, and precision: fp32 would step faster")
        if pinned:
            reasons.append(f"kept as pinned by the job: {', '.join(pinned)}")
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
        largest_layer_params=req.model.largest_layer_params, block_class=req.model.block_class,
        precision_reason=req.precision_reason, levers=decide(req, best),
    )


def activation_reasons(c: ActivationConstants) -> list[str]:
    """What the activation term assumed: the attention kernel, and a probe that failed (never silently)."""
    scores = "a·s² score matrices saved per block" if c.attention == "eager" else "fused, no a·s² scores saved"
    out = [f"activations assume {c.attention} attention ({scores})"]
    if c.probe_error:
        out.append(f"activation probe FAILED ({c.probe_error}): activations use Korthikanti et al.'s per-layer "
                   "constants, not measured ones; expect a larger error")
    return out


def top_rejected(best: Scored, scored: list[Scored], limit: int = 6) -> list[Rejected]:
    """The alternatives a user would ask about: faster ones that do not fit, then the runners-up."""
    t0 = best.estimate.step_time_s
    faster = sorted((c for c in scored if c.problem and c.estimate.step_time_s < t0),
                    key=lambda c: c.estimate.step_time_s)
    runners = sorted((c for c in scored if c.problem is None and c is not best),
                     key=lambda c: c.estimate.step_time_s)
    out, seen = [], set()
    for c in faster[: limit // 2] + runners:
        label = c.strategy.label()
        if label in seen:
            continue
        seen.add(label)
        if c.problem:
            reason = c.problem.describe()
        else:
            slower = (c.estimate.step_time_s / t0 - 1) if t0 else 0.0
            reason = f"fits but slower: {c.estimate.step_time_s:.3g} s/step (+{slower:.0%})"
        out.append(Rejected(label=label, reason=reason, peak_bytes=c.estimate.peak_bytes,
                            step_time_s=c.estimate.step_time_s))
        if len(out) >= limit:
            break
    return out
