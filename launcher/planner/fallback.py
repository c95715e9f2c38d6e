"""The OOM ladder: from a strategy that ran out of memory (or measured over budget) to the next one to try.

Pure: the failed Strategy, the PlanRequest it was planned from and what its ranks measured go in; the next
Strategy and a one-line reason come out. Nothing here starts a process or reads a file (launcher.session does).

The rungs, in order, each trading speed for memory while the global batch stays the same:

  1. micro_batch               a smaller micro-batch with more gradient accumulation
  2. activation_checkpointing  recompute each block's activations in backward
  3. sharding                  a higher ZeRO stage, or FSDP2 FULL_SHARD (reshard after forward)
  4. optimizer_offload         optimizer state to host RAM (ZeRO stage >= 2; FSDP2 moves params with it)
  5. param_offload             parameters to host RAM (ZeRO-3)
  6. nvme                      offloaded state to NVMe instead of host RAM (ZeRO-3 with cluster.nvme_path)

The planner predicted the failed strategy to fit (or was forced past its prediction), so its numbers are
corrected first: each memory category is scaled by how far the measurement exceeded its prediction, and what
the categories cannot explain scales the whole peak. Walking the rungs from the failed strategy, the first
change whose corrected prediction fits the usable budget is the next attempt. A rung none of whose options
fits is taken at its most frugal and the walk goes on, so one relaunch can combine rungs instead of spending an
attempt on a change already predicted to fail. When even the end of the walk is predicted over the budget there
is no next attempt: a relaunch predicted over budget is never made. Options that host RAM or NVMe cannot hold are
skipped (those checks keep the planner's own numbers: the measurement says nothing about host memory). The engine never
changes (DeepSpeed and FSDP2 checkpoints and configs differ); every other pinned field may.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal

from launcher.config.job import StrategyConfig
from launcher.engines import engine_spec, flat_layout
from launcher.levers import LEVERS, REFINEMENTS
from launcher.planner.plan import Estimate, Strategy
from launcher.planner.search import PlanRequest, candidates, micro_batches, score
from launcher.records.categories import CATEGORY_GROUPS, measured_bytes, predicted_bytes
from launcher.units import format_bytes

RUNGS = ("micro_batch", "activation_checkpointing", "sharding", "optimizer_offload", "param_offload", "nvme")

@dataclass(kw_only=True, slots=True)
class Measurement:
    """What the failed attempt's ranks measured."""

    kind: Literal["oom", "over_budget"]
    """oom: a rank ran out of memory (exit 75); over_budget: the run ended with a rank's peak over the budget."""
    peak_bytes: int
    """Worst rank's measured peak, bytes. For an OOM it is where the rank stopped: a lower bound."""
    by_category: dict[str, int] = field(default_factory=dict)
    """Measured bytes by category at that peak (params, grads, optimizer, activations, temp, buffers, other)."""
    rank: int | None = None
    phase: str | None = None
    """Phase the OOM struck in (forward, backward, optimizer_step, ...)."""
    step: int | None = None

    def describe(self) -> str:
        """What the failed attempt measured, as one clause: the rank's OOM (phase, step) or its peak."""
        who = f"rank {self.rank}" if self.rank is not None else "a rank"
        if self.kind == "oom":
            where = f" in {self.phase}" if self.phase else ""
            when = f" at step {self.step}" if self.step else ""
            return f"{who} ran out of memory{where}{when} at {format_bytes(self.peak_bytes)}"
        return f"{who} peaked at {format_bytes(self.peak_bytes)}"


@dataclass(kw_only=True, slots=True)
class Correction:
    """Scales predictions by what the failed attempt measured; every factor is at least 1."""

    ratios: dict[str, float]
    """Per category group: measured / predicted for the failed strategy."""
    uniform: float = 1.0
    """Applied to the whole corrected peak for what the categories do not explain."""

    def apply(self, est: Estimate) -> int:
        """A plan's corrected peak, bytes: each category group's predicted bytes at training's largest moment
        scaled by its ratio, then the whole by the uniform factor; at least the plan's own peak (rank 0's load or
        export, which a training measurement does not correct)."""
        return max(self.training_peak(est), est.peak_bytes)

    def training_peak(self, est: Estimate) -> int:
        """The corrected bytes of training's largest moment alone."""
        bd = training_breakdown(est)
        extra = sum((r - 1.0) * predicted_bytes(bd, g) for g, r in self.ratios.items())
        return int((sum(bd.values()) + extra) * self.uniform)

    def describe(self) -> str:
        """The factors above 1 as "group xR", for the ladder's message; says so when none is."""
        parts = [f"{g} x{r:.2f}" for g, r in self.ratios.items() if r > 1.0]
        if self.uniform > 1.0:
            parts.append(f"all x{self.uniform:.2f}")
        return ", ".join(parts) if parts else "none (no category above its prediction)"


@dataclass(kw_only=True, slots=True)
class Fallback:
    """The next attempt, or (strategy None) why there is none."""

    strategy: Strategy | None
    rung: str | None
    """The rung whose change made it fit (or the last rung taken); None when there is no next attempt."""
    reason: str
    """One line: what failed, what changes, the corrected prediction against the usable budget."""
    predicted_peak_bytes: int = 0
    """The planner's prediction for the next strategy."""
    corrected_peak_bytes: int = 0
    """The same, corrected by the measurement."""
    skipped: list[str] = field(default_factory=list)
    """Rungs or options passed over on the way, each with why."""
    correction: Correction | None = None


def training_breakdown(est: Estimate) -> dict[str, int]:
    """The breakdown at training's largest moment: the peak's, unless the peak is rank 0's load or export."""
    return est.training_breakdown or est.breakdown


def correction_for(predicted: Estimate, measured: Measurement) -> Correction:
    """Per-category ratios from the measurement, then a uniform factor so the failed strategy's corrected peak
    is at least what was measured (an OOM's breakdown stops where the rank died, so categories under-explain).
    No correction when the measured peak did not exceed the prediction."""
    ratios = dict.fromkeys(CATEGORY_GROUPS, 1.0)
    bd = training_breakdown(predicted)
    if measured.peak_bytes <= sum(bd.values()):
        # The total was not under-predicted (a forced plan, or an OOM that struck below the prediction): a
        # category above its prediction is offset by another below it, and scaling it alone would over-correct.
        return Correction(ratios=ratios)
    for g in CATEGORY_GROUPS:
        pred = predicted_bytes(bd, g)
        meas = measured_bytes(measured.by_category, g)
        ratios[g] = max(1.0, meas / pred) if pred > 0 else 1.0
    c = Correction(ratios=ratios)
    corrected = c.training_peak(predicted)
    if corrected > 0 and measured.peak_bytes > corrected:
        c.uniform = measured.peak_bytes / corrected
    return c


def unpinned(req: PlanRequest) -> PlanRequest:
    """The request without the job's strategy pins (the ladder may change them), keeping the safety margin."""
    return dataclasses.replace(req, pins=StrategyConfig(safety_margin=req.pins.safety_margin), force=False)


def _with_micro_batch(s: Strategy, mb: int, per_rank: int) -> Strategy:
    return dataclasses.replace(s, micro_batch_size=mb, grad_accum_steps=per_rank // mb)


def rung_options(rung: str, s: Strategy, req: PlanRequest) -> list[Strategy]:
    """This rung's changes to ``s``, least disruptive first; [] when the rung does not apply or is used up.

    Micro-batch and checkpointing are every engine's; the others are the engine's own (EngineSpec.rung_options).
    """
    if rung == "micro_batch":
        per_rank = req.global_batch_size // req.world_size
        smaller = sorted((mb for mb in micro_batches(req) if mb < s.micro_batch_size), reverse=True)
        return [_with_micro_batch(s, mb, per_rank) for mb in smaller]
    if rung == "activation_checkpointing":
        # Selective checkpointing (every k-th block, or the op policy) still has full recompute left to try.
        full = s.activation_checkpointing and not any(spec.on(s) for spec in REFINEMENTS)
        return [] if full else [dataclasses.replace(s, activation_checkpointing=True,
                                                    **{spec.field: spec.off for spec in REFINEMENTS})]
    if rung not in RUNGS:
        raise ValueError(f"unknown rung {rung!r}")
    return engine_spec(s.engine).rung_options(rung, s, nvme=req.nvme_free_bytes is not None)


def host_problem(req: PlanRequest, est: Estimate) -> str | None:
    """Why host RAM or NVMe cannot hold this estimate's offloaded state, or None."""
    if req.host_ram_per_node_bytes is not None and est.host_bytes_per_node > req.host_ram_per_node_bytes:
        return (f"needs {format_bytes(est.host_bytes_per_node)} of host RAM per node, "
                f"cluster.host_ram_per_node is {format_bytes(req.host_ram_per_node_bytes)}")
    if est.nvme_bytes_per_node and est.nvme_bytes_per_node > (req.nvme_free_bytes or 0):
        return (f"needs {format_bytes(est.nvme_bytes_per_node)} of NVMe, "
                f"{format_bytes(req.nvme_free_bytes or 0)} free at cluster.nvme_path")
    return None


def describe_change(old: Strategy, new: Strategy) -> str:
    """What differs, in the job file's words."""
    parts = []
    if new.micro_batch_size != old.micro_batch_size:
        parts.append(f"micro-batch {old.micro_batch_size} -> {new.micro_batch_size} "
                     f"(accumulation {old.grad_accum_steps} -> {new.grad_accum_steps})")
    turned_on = new.activation_checkpointing != old.activation_checkpointing
    if turned_on:
        parts.append("activation checkpointing on")
    if new.activation_checkpointing:
        parts += [words for spec in REFINEMENTS if (words := spec.change_words(spec.of(old), spec.of(new), turned_on))]
    parts += new.layout.change_words(old.layout)  # the engine's words (the ladder never changes the engine)
    return ", ".join(parts) or "no change"


def next_strategy(failed: Strategy, failed_estimate: Estimate, req: PlanRequest, measured: Measurement,
                  tried: list[Strategy] | None = None) -> Fallback:
    """The next rung for ``failed``; ``Fallback.strategy`` is None when no rung is left or none is predicted to fit
    (the returned strategy's corrected prediction is always within ``req.usable_bytes``).

    ``failed_estimate`` is the planner's estimate for ``failed`` (plan.json), ``req`` the request it was
    planned from (its pins are ignored), ``tried`` every strategy already run (never proposed again).
    """
    req = unpinned(req)

    def scored(s: Strategy) -> Estimate:
        return score(req, s).estimate

    tried = list(tried or []) + [failed]
    valid = candidates(req)
    fix = correction_for(failed_estimate, measured)
    usable = req.usable_bytes
    skipped: list[str] = []
    cur = failed
    host_blocked = "nvme" in (failed.layout.offload_optimizer, failed.layout.offload_params)
    for rung in RUNGS:
        if rung == "nvme" and not host_blocked:
            continue  # NVMe frees host RAM, not device memory: only a way round offload that host RAM cannot hold
        options = [s for s in rung_options(rung, cur, req) if s in valid and s not in tried]
        if not options:
            continue
        held = []
        for s in options:
            why = host_problem(req, scored(s))
            if why:
                skipped.append(f"{rung} ({s.label()}): {why}")
                host_blocked = host_blocked or rung in ("optimizer_offload", "param_offload")
            else:
                held.append(s)
        if not held:
            continue
        for s in held:
            est = scored(s)
            corrected = fix.apply(est)
            if corrected <= usable:
                reason = (f"{measured.describe()} with {failed.label()}; next: {describe_change(failed, s)}, "
                          f"predicted {format_bytes(corrected)} of {format_bytes(usable)} usable "
                          f"(planner {format_bytes(est.peak_bytes)}, corrected by the measurement: {fix.describe()})")
                return Fallback(strategy=s, rung=rung, reason=reason, predicted_peak_bytes=est.peak_bytes,
                                corrected_peak_bytes=corrected, skipped=skipped, correction=fix)
            skipped.append(f"{rung} ({s.label()}): predicted {format_bytes(corrected)} corrected, over "
                           f"{format_bytes(usable)} usable")
        cur = held[-1]  # the rung's most frugal option; later rungs build on it
    if cur == failed:
        return Fallback(strategy=None, rung=None, skipped=skipped, correction=fix,
                        reason=(f"{measured.describe()} with {failed.label()}; no rung of the ladder is left to try "
                                f"({'; '.join(skipped) or 'every rung is used up for this engine'})"))
    # Walked to the end without a fit: the most frugal strategy reachable is still predicted over the budget, and
    # a relaunch predicted over budget is never made (under --enforce it would only run out of memory again).
    est = scored(cur)
    corrected = fix.apply(est)
    reason = (f"{measured.describe()} with {failed.label()}; no rung of the ladder is left that is predicted to "
              f"fit: the most frugal reachable ({describe_change(failed, cur)}) is predicted "
              f"{format_bytes(corrected)} of {format_bytes(usable)} usable (corrected by the measurement: "
              f"{fix.describe()}), so it is not launched; raise the budget or run on more GPUs")
    return Fallback(strategy=None, rung=None, reason=reason, predicted_peak_bytes=est.peak_bytes,
                    corrected_peak_bytes=corrected, skipped=skipped, correction=fix)


def pins_for(s: Strategy, safety_margin: float) -> StrategyConfig:
    """A job's strategy: section that pins every field to ``s`` (so the planner reproduces it)."""
    return StrategyConfig(engine=s.engine, **flat_layout(s.layout),
                          micro_batch_size=s.micro_batch_size, activation_checkpointing=s.activation_checkpointing,
                          safety_margin=safety_margin, **{spec.field: spec.of(s) for spec in LEVERS.values()})


__all__ = ["RUNGS", "Correction", "Fallback", "Measurement", "correction_for", "next_strategy",
           "pins_for", "rung_options", "unpinned"]
