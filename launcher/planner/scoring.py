"""Scoring: one candidate's memory and step-time estimate against the budget, host RAM and NVMe."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from launcher.engines import engine_spec
from launcher.planner.buckets import size_buckets
from launcher.planner.candidates import candidates
from launcher.planner.cost import step_time_terms
from launcher.planner.memory import ActivationConstants, MemoryInputs, analytic_constants, estimate_memory
from launcher.planner.plan import Buckets, Estimate, Strategy
from launcher.planner.request import PlanRequest
from launcher.units import format_bytes


def memory_inputs(req: PlanRequest) -> MemoryInputs:
    """The request as the memory and cost models read it."""
    return MemoryInputs(model=req.model, world_size=req.world_size, gpus_per_node=req.gpus_per_node,
                        nodes=req.nodes, seq_len=req.seq_len, precision=req.precision, optimizer=req.optimizer,
                        hardware=req.hardware, activations=activation_constants(req),
                        device_room_bytes=req.usable_bytes)


def activation_constants(req: PlanRequest) -> ActivationConstants:
    """The measured activation constants, or the paper's for this model and dtype."""
    return req.activations or analytic_constants(req.model, req.precision)


Resource = Literal["device", "host_ram", "nvme"]


@dataclass(kw_only=True, slots=True, frozen=True)
class Problem:
    """Why a candidate does not fit: the resource it overruns, what it needs and what there is, bytes."""

    resource: Resource
    """device: the usable per-GPU budget; host_ram: host RAM per node; nvme: free NVMe per node."""
    need_bytes: int
    """Device: the predicted peak per rank; host RAM and NVMe: bytes per node."""
    have_bytes: int
    """What there is of that resource, bytes (the usable budget for device)."""
    largest: str = ""
    """Device: the largest category of the predicted peak."""

    def describe(self) -> str:
        """The sentence plan.json's reasons and rejected alternatives carry."""
        need, have = format_bytes(self.need_bytes), format_bytes(self.have_bytes)
        if self.resource == "device":
            return (f"over budget by {format_bytes(self.need_bytes - self.have_bytes)} "
                    f"(peak {need}, largest: {self.largest})")
        if self.resource == "host_ram":
            return f"host RAM: needs {need} per node, has {have}"
        return f"NVMe: needs {need}, has {have} free"


@dataclass(slots=True)
class Scored:
    """One candidate's estimate, and why it does not fit (None when it does)."""

    strategy: Strategy
    estimate: Estimate
    problem: Problem | None
    buckets: Buckets | None = None


def score(req: PlanRequest, s: Strategy) -> Scored:
    """Estimate with budget-sized buckets; if that misses, with the smallest buckets."""
    first = _score(req, s, size_buckets(req))
    if first.problem is None or not engine_spec(s.engine).uses_buckets:
        return first
    second = _score(req, s, size_buckets(req, smallest=True))
    return second if second.problem is None else first


def _score(req: PlanRequest, s: Strategy, buckets: Buckets) -> Scored:
    inp = memory_inputs(req)
    mem = estimate_memory(inp, s, buckets)
    terms = step_time_terms(inp, s, buckets.reduce_bucket_size)
    est = Estimate(breakdown=mem.breakdown, peak_bytes=mem.peak_bytes, host_bytes_per_node=mem.host_bytes_per_node,
                   nvme_bytes_per_node=mem.nvme_bytes_per_node, step_time_s=sum(terms.values()),
                   step_time_terms=terms, basis=mem.basis, overhead=mem.overhead,
                   moment_bytes=mem.moment_bytes)
    problem = None
    if mem.peak_bytes > req.usable_bytes:
        problem = Problem(resource="device", need_bytes=mem.peak_bytes, have_bytes=req.usable_bytes,
                          largest=max(mem.breakdown, key=mem.breakdown.get))
    elif req.host_ram_per_node_bytes is not None and mem.host_bytes_per_node > req.host_ram_per_node_bytes:
        problem = Problem(resource="host_ram", need_bytes=mem.host_bytes_per_node,
                          have_bytes=req.host_ram_per_node_bytes)
    elif mem.nvme_bytes_per_node and mem.nvme_bytes_per_node > (req.nvme_free_bytes or 0):
        problem = Problem(resource="nvme", need_bytes=mem.nvme_bytes_per_node, have_bytes=req.nvme_free_bytes or 0)
    return Scored(s, est, problem, buckets)


def evaluate(req: PlanRequest) -> list[Scored]:
    """Every candidate of the request, scored."""
    return [score(req, s) for s in candidates(req)]
