"""No-fit advice: when nothing fits, what one change would, each offer a re-plan through the same search."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from launcher.config.job import StrategyConfig
from launcher.errors import ConfigError
from launcher.model.lora import LORA_RANK, lora_suggestion
from launcher.planner.candidates import pinned
from launcher.planner.request import PlanRequest
from launcher.planner.scoring import Problem, Resource, Scored, search
from launcher.units import format_bytes


def _fits_with(req: PlanRequest, **changes) -> Scored | None:
    trial = dataclasses.replace(req, force=False, **changes)
    try:
        # Every candidate as fast as the fastest fit is scored, so this is the minimum over all of them.
        scored = search(trial).scored
    except ConfigError:
        return None
    fits = [c for c in scored if c.problem is None]
    return min(fits, key=lambda c: c.estimate.step_time_s) if fits else None


GPUS_PER_NODE_STEPS = (2, 4, 8)
"""GPUs per node the advice tries: what a node holds; past that the advice adds nodes."""
NODE_STEPS = (2, 4, 8, 16, 32, 64, 128, 256)


def _round_up(x: float, digits: int = 3) -> int:
    """``x`` rounded up to ``digits`` significant figures, so the printed figure is never below what fits."""
    scale = 10 ** max(0, len(str(int(x))) - digits)
    return -(-int(x) // scale) * scale


def _outcome(hit: Scored) -> str:
    e = hit.estimate
    return f"{hit.strategy.label()}, peak {format_bytes(e.peak_bytes)} per GPU, {e.step_time_s:.3g} s/step"


def smallest_budget(req: PlanRequest) -> tuple[int, Scored] | None:
    """The smallest per-GPU budget at which the planner finds a plan, never more than the card holds (on CPU
    ranks, more than the node's host RAM shared by its ranks); None when even that does not fit.

    Bisection is sound because feasibility is monotone in the budget (tests/planner/test_search.py's property
    test: more budget never loses a plan).
    """
    if req.hardware.memory_bytes:
        cap = req.hardware.memory_bytes
    elif req.host_ram_per_node_bytes:
        cap = req.host_ram_per_node_bytes // req.gpus_per_node
    else:
        cap = 10_000 * 10**9
    if cap <= req.budget_bytes or _fits_with(req, budget_bytes=cap) is None:
        return None
    lo, hi = req.budget_bytes, cap
    while hi - lo > max(10**6, lo // 200):
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if _fits_with(req, budget_bytes=mid) else (mid, hi)
    budget = min(cap, _round_up(hi))
    hit = _fits_with(req, budget_bytes=budget)
    return (budget, hit) if hit else None


@dataclass(kw_only=True, slots=True, frozen=True)
class Suggestion:
    """One change that makes the job fit, and the plan the re-plan then found."""

    change: str
    """The change, in the job file's and the CLI's words."""
    outcome: str
    """The plan it gets: strategy, peak per GPU, seconds per step (and NVMe per node where it swaps)."""

    def describe(self) -> str:
        """The change and the plan it gets, as one suggestion line."""
        return f"{self.change}: {self.outcome}"


@dataclass(kw_only=True, slots=True)
class NoFit:
    """Why nothing fits, and the changes that would: the search's answer when there is no plan."""

    reasons: list[str]
    """What was tried and the smallest footprint, one sentence each."""
    smallest: Problem
    """Why the smallest candidate does not fit: the resource it overruns (device, host RAM, NVMe)."""
    suggestions: list[Suggestion] = field(default_factory=list)
    """Each one change that re-plans to a fit; empty when none is within reach."""

    @property
    def short_of(self) -> Resource:
        """The resource the smallest candidate overruns (device, host RAM or NVMe)."""
        return self.smallest.resource

    def suggestion_lines(self) -> list[str]:
        """One line per suggested change, or one line saying no single change is within reach."""
        if not self.suggestions:
            return ["nothing within reach by one change; combine more GPUs with LoRA or a shorter sequence"]
        return [s.describe() for s in self.suggestions]


def explain_no_fit(req: PlanRequest, scored: list[Scored]) -> NoFit:
    """The smallest footprint, and what would make the job fit.

    Every suggestion is a re-plan: the request with that one change goes through the same search, and only a
    change that then fits is offered, with the plan it gets (strategy, peak, step time).
    """
    smallest = min(scored, key=lambda c: c.estimate.peak_bytes)
    no_fit = NoFit(reasons=[
        f"no plan fits {format_bytes(req.budget_bytes)} per GPU on {req.world_size} GPUs "
        f"({len(scored)} candidates tried); smallest footprint: {format_bytes(smallest.estimate.peak_bytes)} "
        f"with {smallest.strategy.label()} ({smallest.problem.describe()})",
    ], smallest=smallest.problem)

    def offer(text: str, hit: Scored | None, extra: str = "") -> bool:
        if hit is not None:
            no_fit.suggestions.append(Suggestion(change=text, outcome=f"{_outcome(hit)}{extra}"))
        return hit is not None

    found = smallest_budget(req)
    if found:
        budget, hit = found
        card = (f" ({req.hardware.name} holds {format_bytes(req.hardware.memory_bytes)})"
                if req.hardware.memory_bytes else "")
        offer(f"a budget of {format_bytes(budget)} per GPU{card} (--budget {format_bytes(budget).replace(' ', '')})",
              hit)
    pins = pinned(req.pins)
    if pins:
        free = dataclasses.replace(req, pins=StrategyConfig(safety_margin=req.pins.safety_margin))
        offer(f"unpinning {', '.join(pins)}", _fits_with(free))
    for gpus in GPUS_PER_NODE_STEPS:
        world = gpus * req.nodes
        if gpus > req.gpus_per_node and req.global_batch_size % world == 0 and offer(
                f"{world} GPUs, {gpus} per node (--gpus {gpus})", _fits_with(req, gpus_per_node=gpus)):
            break
    for nodes in NODE_STEPS:
        world = req.gpus_per_node * nodes
        if nodes > req.nodes and req.global_batch_size % world == 0 and offer(
                f"{nodes} nodes of {req.gpus_per_node} GPUs, {world} in all (--nodes {nodes})",
                _fits_with(req, nodes=nodes)):
            break
    if req.nvme_free_bytes is None:
        hit = _fits_with(req, nvme_free_bytes=10**15)
        if hit:
            offer("NVMe offload (set cluster.nvme_path and nvme_free)", hit,
                  f", {format_bytes(hit.estimate.nvme_bytes_per_node)} of NVMe per node")
    # Only shorter than now, and the current length is within the position table (checked by candidates()):
    # never a sequence past the model's context.
    seq = req.seq_len // 2
    while seq >= 16 and not offer(f"a shorter sequence: max_seq_len {seq} (--seq-len {seq})",
                                  _fits_with(req, seq_len=seq)):
        seq //= 2
    m = req.model
    if m.trainable_params == m.num_params:
        targets, lora = lora_suggestion(m)
        offer(f"LoRA (train.lora: {{r: {LORA_RANK}, target_modules: [{', '.join(targets)}]}}, ~{lora:,} trainable)",
              _fits_with(req, model=dataclasses.replace(m, trainable_params=lora, lora_params=lora)))
    if req.pins.micro_batch_size not in (None, 1):
        offer("a smaller micro-batch", _fits_with(req, pins=dataclasses.replace(req.pins, micro_batch_size=None)))
    if req.host_ram_per_node_bytes is not None:
        short = sorted((c for c in scored if c.problem and c.problem.resource == "host_ram"),
                       key=lambda c: c.estimate.host_bytes_per_node)
        for c in short[:1]:
            need = _round_up(c.estimate.host_bytes_per_node)
            offer(f"more host RAM per node: {format_bytes(need)} (cluster.host_ram_per_node)",
                  _fits_with(req, host_ram_per_node_bytes=need))
    return no_fit
