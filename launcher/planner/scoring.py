"""Scoring: one candidate's memory and step-time estimate against the budget, host RAM and NVMe."""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass

from launcher.engines import engine_spec
from launcher.planner.buckets import size_buckets
from launcher.planner.candidates import candidates
from launcher.planner.cost import RankTerms, exposed_communication, rank_terms, step_seconds, terms_of
from launcher.planner.levers import math_departure, ranked_step_time
from launcher.planner.memory import (
    ActivationConstants,
    Held,
    MemoryEstimate,
    MemoryInputs,
    analytic_constants,
    device_floor,
    estimate_memory,
    held_bytes,
)
from launcher.planner.plan import Buckets, Estimate, Problem, Strategy
from launcher.planner.request import PlanRequest


def memory_inputs(req: PlanRequest) -> MemoryInputs:
    """The request as the memory and cost models read it."""
    return MemoryInputs(model=req.model, world_size=req.world_size, gpus_per_node=req.gpus_per_node,
                        nodes=req.nodes, seq_len=req.seq_len, precision=req.precision, optimizer=req.optimizer,
                        hardware=req.hardware, activations=activation_constants(req),
                        device_room_bytes=req.usable_bytes, script=req.script)


def activation_constants(req: PlanRequest) -> ActivationConstants:
    """The measured activation constants, or the paper's for this model and dtype."""
    return req.activations or analytic_constants(req.model, req.precision)


class Scored:
    """One candidate's estimate, and why it does not fit (None when it does). The search defers the memory estimate
    of a candidate its device floor rules out (``defer``): it never fits, its step time is known, and its
    estimate is made when first read, the one scoring it at once gives. ``step_time_s``: the estimate's;
    ``overrun_at_least``: need / have of the resource it overruns (0 when it fits), a lower bound while deferred."""

    __slots__ = ("strategy", "step_time_s", "overrun_at_least", "_estimate", "_problem", "_buckets", "_finish")

    def __init__(self, strategy: Strategy, estimate: Estimate, problem: Problem | None,
                 buckets: Buckets | None = None) -> None:
        self.strategy, self._estimate, self._problem, self._buckets = strategy, estimate, problem, buckets
        self.step_time_s = estimate.step_time_s
        self.overrun_at_least = problem.need_bytes / max(problem.have_bytes, 1) if problem else 0.0
        self._finish: Callable[[], Scored] | None = None

    @classmethod
    def defer(cls, strategy: Strategy, step_time_s: float, overrun_at_least: float,
              finish: Callable[[], Scored]) -> Scored:
        """A candidate over the usable budget whose estimate ``finish`` makes when first read."""
        self = cls.__new__(cls)
        self.strategy, self.step_time_s, self.overrun_at_least = strategy, step_time_s, overrun_at_least
        self._finish = finish
        return self

    @property
    def deferred(self) -> bool:
        """Its memory estimate not made yet (``defer``, not read since)."""
        return self._finish is not None

    @property
    def fits(self) -> bool:
        """No problem: within the usable budget, host RAM and NVMe (a deferred candidate never is)."""
        return self._finish is None and self._problem is None

    @property
    def estimate(self) -> Estimate:
        """The memory and step-time estimate."""
        return self._made()._estimate

    @property
    def problem(self) -> Problem | None:
        """Why it does not fit; None when it does."""
        return self._made()._problem

    @property
    def buckets(self) -> Buckets | None:
        """The bucket sizes the estimate assumed."""
        return self._made()._buckets

    def _made(self) -> Scored:
        if self._finish is not None:
            done, self._finish = self._finish(), None
            self._estimate, self._problem, self._buckets = done._estimate, done._problem, done._buckets
            self.overrun_at_least = done.overrun_at_least
        return self

    def __repr__(self) -> str:
        return f"Scored({self.strategy.label()!r}, {self.step_time_s:.4g} s, fits={self.fits})"


def score(req: PlanRequest, s: Strategy) -> Scored:
    """Estimate with budget-sized buckets; if that misses, with the smallest buckets."""
    return _Scorer(req, memo=False).score(s)


class _Scorer:
    """One request's scoring: its MemoryInputs and buckets made once, and the engine specs' terms memoized by the
    strategy fields they read (launcher.planner.memo): strategies that differ only in fields a term does not read
    share its answer. Every number is the one scoring alone gives.

    Only the engine terms are traced: the step time reads nearly every field, so no two candidates share it
    (the search computes it once per candidate and bucket size, for the bound, and keeps it for the score), and
    the memory model's own arithmetic costs less than tracing it would (on the 70B every-lever search, 7 % of its
    estimates were shared, for 20 % more time)."""

    def __init__(self, req: PlanRequest, *, memo: bool = True) -> None:
        self.req = req
        self.inp = memory_inputs(req)
        self.memo = memo
        if memo:
            self.inp.memo = {}
        self.budget_buckets = size_buckets(req)
        self.smallest_buckets = size_buckets(req, smallest=True)
        self._times: dict[int, tuple[Strategy, RankTerms, dict[int, float]]] = {}
        """id(strategy) -> (the strategy, its rank_terms, bucket elements -> its exposed communication); the
        strategy is kept so that its id stays its own while the entry lives."""

    def _time(self, s: Strategy, bucket_elems: int) -> tuple[RankTerms, float]:
        """``s``'s rank_terms and exposed communication with ``bucket_elems``: computed once per candidate and bucket
        size, for the bound, and kept for the score (afresh without the memo)."""
        entry = self._times.get(id(s)) if self.memo else None
        if entry is None or entry[0] is not s:
            entry = (s, rank_terms(self.inp, s), {})
            if self.memo:
                self._times[id(s)] = entry
        exposed = entry[2].get(bucket_elems)
        if exposed is None:
            exposed = entry[2][bucket_elems] = exposed_communication(self.inp, s, bucket_elems, entry[1])
        return entry[1], exposed

    def _seconds(self, s: Strategy, bucket_elems: int) -> float:
        """The step time of ``s`` with ``bucket_elems``: the sum of the terms its Estimate will hold."""
        return step_seconds(*self._time(s, bucket_elems))

    def fastest_possible(self, s: Strategy) -> float:
        """A lower bound of the step time ``score`` will give ``s``: it is the time with one of the two bucket
        sizes (what its Estimate will say with them), so the smaller of the two."""
        t = self._seconds(s, self.budget_buckets.reduce_bucket_size)
        if engine_spec(s.layout.engine).uses_buckets:
            t = min(t, self._seconds(s, self.smallest_buckets.reduce_bucket_size))
        return t

    def score(self, s: Strategy, held: Held | None = None) -> Scored:
        """Budget-sized buckets; if that misses, the smallest buckets. ``held``: held_bytes with the budget's."""
        mem, problem, buckets = self._memory(s, self.budget_buckets, held)
        if problem is not None and engine_spec(s.layout.engine).uses_buckets:
            second = self._memory(s, self.smallest_buckets)
            if second[1] is None:
                mem, problem, buckets = second
        return Scored(s, Estimate.of(mem, terms_of(*self._time(s, buckets.reduce_bucket_size))), problem, buckets)

    def score_or_defer(self, s: Strategy) -> Scored:
        """``score``, or deferred where the device floor (memory.device_floor, a lower bound of the peak) is over the
        usable budget with each bucket size ``score`` may use: then ``score`` says it does not fit, with the
        budget's buckets, and only a list of alternatives can ask for more (build.top_rejected)."""
        held = held_bytes(self.inp, s, self.budget_buckets)
        usable = self.req.usable_bytes
        floor = device_floor(held)
        if floor <= usable or (engine_spec(s.layout.engine).uses_buckets
                               and device_floor(held_bytes(self.inp, s, self.smallest_buckets, held)) <= usable):
            return self.score(s, held)
        step_time_s = self._seconds(s, self.budget_buckets.reduce_bucket_size)
        # The held bytes kept for the estimate, should it be read (top_rejected reads those its floor leaves near).
        return Scored.defer(s, step_time_s, floor / max(usable, 1), functools.partial(self.score, s, held))

    def _memory(self, s: Strategy, buckets: Buckets,
                held: Held | None = None) -> tuple[MemoryEstimate, Problem | None, Buckets]:
        """The memory estimate with ``buckets`` (``held``: its held_bytes, where made) and what it overruns."""
        req = self.req
        mem = estimate_memory(self.inp, s, buckets, held)
        problem = None
        if mem.peak_bytes > req.usable_bytes:
            problem = Problem(resource="device", need_bytes=mem.peak_bytes, have_bytes=req.usable_bytes,
                              largest=max(mem.breakdown, key=mem.breakdown.get))
        elif req.host_ram_per_node_bytes is not None and mem.host_bytes_per_node > req.host_ram_per_node_bytes:
            problem = Problem(resource="host_ram", need_bytes=mem.host_bytes_per_node,
                              have_bytes=req.host_ram_per_node_bytes)
        elif mem.nvme_bytes_per_node and mem.nvme_bytes_per_node > (req.nvme_free_bytes or 0):
            problem = Problem(resource="nvme", need_bytes=mem.nvme_bytes_per_node,
                              have_bytes=req.nvme_free_bytes or 0)
        return mem, problem, buckets


def evaluate(req: PlanRequest, *, memo: bool = True) -> list[Scored]:
    """Every candidate of the request, scored: what ``search`` must agree with. ``memo=False`` computes every
    term afresh (the reference tests/planner/test_search_speed.py holds the memo to)."""
    scorer = _Scorer(req, memo=memo)
    return [scorer.score(s) for s in candidates(req)]


@dataclass(kw_only=True, slots=True)
class Searched:
    """What the search scored: enough to choose exactly what scoring every candidate would."""

    scored: list[Scored]
    """The candidates scored, in candidate order: every one predicted faster than the chosen plan and the
    runners-up (all of them when nothing fits); those the device floor rules out deferred (Scored.defer)."""
    total: int
    """Candidates in the search space."""

    @property
    def best(self) -> Scored | None:
        """The fastest fitting candidate, a plan that departs further from the job's math only where it is more
        than levers.MATH_LEVER_MARGIN faster per unit of departure (levers.ranked_step_time); on a tie the job's
        own math, then the fewest and mildest math levers (levers.math_departure), then the smaller peak, then the
        earlier candidate."""
        fits = [c for c in self.scored if c.fits]
        return min(fits, key=_rank) if fits else None


def search(req: PlanRequest, alternatives: Alternatives | None = None) -> Searched:
    """Score candidates in order of their predicted step time until the fastest fit is certain, and with
    ``alternatives`` (launcher.planner.build.top_rejected) until the alternatives it lists are too.

    Sound because step time does not depend on memory: a candidate's step time is known before its memory
    estimate, and its scored time is one of its two buckets' times (``score``), so their minimum is a lower
    bound. Once that bound passes a time T, every candidate faster than T has been scored: the choice (a minimum)
    and the faster ones that do not fit are complete, and a list of alternatives is final once it is full and
    every fitting one on it is faster than T. The memory model, which the levers keep extending, may then be
    anything: nothing here assumes it falls or rises with a field. A candidate whose device floor (a lower bound
    of its peak, memory.device_floor) is over the budget is deferred, not estimated: it cannot fit, and what the
    alternatives read of it is its step time, or its estimate where its floor leaves it near enough to be listed.
    """
    scorer = _Scorer(req)
    cands = candidates(req)
    bounds = [scorer.fastest_possible(s) for s in cands]
    order = sorted(range(len(cands)), key=bounds.__getitem__)
    done: dict[int, Scored] = {}
    best: tuple | None = None  # (*_rank, index) of the fastest fit so far
    fits = 0
    retry: tuple[int, float] = (0, 0.0)  # recheck once there are more fits than this, or the bound passes this
    for i in order:
        bound = bounds[i]
        if best is not None and bound > best[0] and (fits > retry[0] or bound > retry[1]):
            blocking = _blocking(done, best, bound, alternatives)
            if blocking is None:
                break
            # Listing the alternatives reads every scored candidate: ask again only once the fits have doubled
            # (or the bound passed what blocked), so the checks cost O(log n) listings. Scoring a few more
            # candidates than needed changes nothing: the stop is still taken only when the list is final.
            retry = (2 * fits, blocking)
        c = done[i] = scorer.score_or_defer(cands[i])
        if c.fits:
            fits += 1
            key = (*_rank(c), i)
            best = key if best is None or key < best else best
    return Searched(scored=[done[i] for i in sorted(done)], total=len(cands))


Alternatives = Callable[[Scored, list[Scored]], list]
"""build.top_rejected's shape: (the chosen one, the scored ones) -> up to ``limit`` alternatives, each with
``why`` ("slower" for a fitting one) and ``step_time_s``, the list stopping at ``limit``."""


def _rank(c: Scored) -> tuple[float, int, int]:
    # A math lever's plan ranks by its time over (1 - MATH_LEVER_MARGIN) ** departure (levers.ranked_step_time): at
    # least its own time, so a candidate whose bound passes the best's ranked time cannot rank before it.
    return ranked_step_time(c.estimate.step_time_s, c.strategy), math_departure(c.strategy), c.estimate.peak_bytes


def _blocking(done: dict[int, Scored], best: tuple, bound: float,
              alternatives: Alternatives | None) -> float | None:
    """None when the alternatives listed from the scored ones are final, given that every candidate faster than
    ``bound`` has been scored: the list is full and every fitting one on it is faster than ``bound``. Else the
    bound to pass before that can change without another fit (inf: only another fit can)."""
    if alternatives is None:
        return None
    scored = [done[i] for i in sorted(done)]
    listed = alternatives(done[best[-1]], scored)
    slowest = max((r.step_time_s for r in listed if r.why == "slower"), default=-math.inf)
    if slowest >= bound:
        return slowest  # a fitting one not yet scored may come before it
    return None if len(listed) >= alternatives_limit(alternatives) else math.inf


def alternatives_limit(alternatives: Alternatives) -> int:
    """How many alternatives ``alternatives`` lists at most (its ``limit`` default)."""
    return inspect.signature(alternatives).parameters["limit"].default
