"""No-fit advice: when nothing fits, what one change would, each offer a re-plan through the same search."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal

from launcher.config.job import StrategyConfig
from launcher.errors import ConfigError
from launcher.model.lora import LORA_RANK, lora_suggestion
from launcher.planner.candidates import pinned
from launcher.planner.plan import Problem, Resource
from launcher.planner.request import PlanRequest
from launcher.planner.scoring import Scored, search


def _fits_with(req: PlanRequest, **changes) -> Scored | None:
    trial = dataclasses.replace(req, force=False, **changes)
    try:
        # Every candidate as fast as the fastest fit is scored, so this is the minimum over all of them; with the
        # plan's own tie-break (Searched.best), so a suggestion names the plan its change makes.
        return search(trial).best
    except ConfigError:
        return None


GPUS_PER_NODE_STEPS = (2, 4, 8)
"""GPUs per node the advice tries: what a node holds; past that the advice adds nodes."""
NODE_STEPS = (2, 4, 8, 16, 32, 64, 128, 256)


def _round_up(x: float, digits: int = 3) -> int:
    """``x`` rounded up to ``digits`` significant figures, so the printed figure is never below what fits."""
    scale = 10 ** max(0, len(str(int(x))) - digits)
    return -(-int(x) // scale) * scale


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


Change = Literal["budget", "unpin", "gpus", "nodes", "nvme", "seq_len", "lora", "micro_batch", "host_ram"]
"""What one suggestion changes: the per-GPU budget, the job's pins, GPUs per node, nodes, NVMe offload, the
sequence length, LoRA in place of full fine-tuning, the pinned micro-batch, or host RAM per node."""


@dataclass(kw_only=True, slots=True, frozen=True)
class Suggestion:
    """One change that makes the job fit, and the plan the re-plan then found (launch words it: cli/render)."""

    change: Change
    """What it changes (see Change)."""
    value: int = 0
    """budget: bytes per GPU; gpus: GPUs per node; nodes: nodes; seq_len: tokens; lora: trainable parameters;
    host_ram: bytes per node; 0 for the others."""
    world_size: int = 0
    """gpus, nodes: the GPUs in all after the change."""
    gpus_per_node: int = 0
    """nodes: GPUs per node (unchanged)."""
    names: tuple[str, ...] = ()
    """unpin: the pinned strategy fields it frees; lora: the modules it adapts."""
    lora_rank: int = 0
    """lora: the adapters' rank r."""
    card: str = ""
    """budget: the hardware profile whose card caps it ("" when the profile has no card memory)."""
    card_bytes: int = 0
    """budget: what that card holds, bytes."""
    label: str
    """The plan the re-plan found, as Strategy.label() writes it."""
    peak_bytes: int
    """Its predicted peak per GPU, bytes."""
    step_time_s: float
    """Its predicted seconds per step."""
    nvme_bytes_per_node: int = 0
    """nvme: the NVMe it swaps per node, bytes."""
    replan: dict = field(default_factory=dict, compare=False, hash=False)
    """The request with this change is ``dataclasses.replace(req, **replan)``: what was re-planned."""


@dataclass(kw_only=True, slots=True)
class NoFit:
    """Why nothing fits, and the changes that would: the search's answer when there is no plan."""

    budget_bytes: int
    """The per-GPU budget asked for, bytes."""
    world_size: int
    """GPUs in all."""
    tried: int
    """Candidates scored."""
    smallest_label: str
    """The candidate with the smallest predicted peak, as Strategy.label() writes it."""
    smallest_peak_bytes: int
    """Its predicted peak per GPU, bytes."""
    smallest: Problem
    """Why the smallest candidate does not fit: the resource it overruns (device, host RAM, NVMe)."""
    suggestions: list[Suggestion] = field(default_factory=list)
    """Each one change that re-plans to a fit; empty when none is within reach."""

    @property
    def short_of(self) -> Resource:
        """The resource the smallest candidate overruns (device, host RAM or NVMe)."""
        return self.smallest.resource


def explain_no_fit(req: PlanRequest, scored: list[Scored]) -> NoFit:
    """The smallest footprint, and what would make the job fit.

    Every suggestion is a re-plan: the request with that one change goes through the same search, and only a
    change that then fits is offered, with the plan it gets (strategy, peak, step time).
    """
    smallest = min(scored, key=lambda c: c.estimate.peak_bytes)
    no_fit = NoFit(budget_bytes=req.budget_bytes, world_size=req.world_size, tried=len(scored),
                   smallest_label=smallest.strategy.label(), smallest_peak_bytes=smallest.estimate.peak_bytes,
                   smallest=smallest.problem)

    def offer(change: Change, replan: dict, found: Scored | None = None, **what) -> bool:
        hit = found or _fits_with(req, **replan)
        if hit is not None:
            e = hit.estimate
            no_fit.suggestions.append(Suggestion(
                change=change, label=hit.strategy.label(), peak_bytes=e.peak_bytes, step_time_s=e.step_time_s,
                nvme_bytes_per_node=e.nvme_bytes_per_node if change == "nvme" else 0, replan=replan, **what))
        return hit is not None

    found = smallest_budget(req)
    if found:
        budget, hit = found
        offer("budget", {"budget_bytes": budget}, hit, value=budget, card=req.hardware.name if req.hardware.memory_bytes
              else "", card_bytes=req.hardware.memory_bytes or 0)
    pins = pinned(req.pins)
    if pins:
        offer("unpin", {"pins": StrategyConfig(safety_margin=req.pins.safety_margin)}, names=tuple(pins))
    for gpus in GPUS_PER_NODE_STEPS:
        world = gpus * req.nodes
        if gpus > req.gpus_per_node and req.global_batch_size % world == 0 and offer(
                "gpus", {"gpus_per_node": gpus}, value=gpus, world_size=world):
            break
    for nodes in NODE_STEPS:
        world = req.gpus_per_node * nodes
        if nodes > req.nodes and req.global_batch_size % world == 0 and offer(
                "nodes", {"nodes": nodes}, value=nodes, world_size=world, gpus_per_node=req.gpus_per_node):
            break
    if req.nvme_free_bytes is None:
        offer("nvme", {"nvme_free_bytes": 10**15})
    # Only shorter than now, and the current length is within the position table (checked by candidates()):
    # never a sequence past the model's context.
    seq = req.seq_len // 2
    while seq >= 16 and not offer("seq_len", {"seq_len": seq}, value=seq):
        seq //= 2
    m = req.model
    if m.trainable_params == m.num_params:
        targets, lora = lora_suggestion(m)
        offer("lora", {"model": dataclasses.replace(m, trainable_params=lora, lora_params=lora)}, value=lora,
              names=tuple(targets), lora_rank=LORA_RANK)
    if req.pins.micro_batch_size not in (None, 1):
        offer("micro_batch", {"pins": dataclasses.replace(req.pins, micro_batch_size=None)})
    if req.host_ram_per_node_bytes is not None:
        short = sorted((c for c in scored if c.problem and c.problem.resource == "host_ram"),
                       key=lambda c: c.estimate.host_bytes_per_node)
        for c in short[:1]:
            need = _round_up(c.estimate.host_bytes_per_node)
            offer("host_ram", {"host_ram_per_node_bytes": need}, value=need)
    return no_fit
