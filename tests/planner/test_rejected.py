"""The plan's alternatives not chosen: the nearest ones (closest to fitting, closest in speed), typed numbers."""

import dataclasses

from launcher.planner.build import NEAR_OVERRUN, overrun, top_rejected
from launcher.planner.plan import Estimate, Plan, Rejected, Strategy
from launcher.planner.scoring import Problem, Scored, evaluate
from launcher.planner.search import make_plan


def scored(name: str, step_s: float, need: int | None = None, have: int = 100) -> Scored:
    # micro_batch_size makes each label distinct; need=None fits.
    s = Strategy.from_json(dict(engine="deepspeed", zero_stage=2, fsdp_reshard_after_forward=False,
                                offload_optimizer="none", offload_params="none", activation_checkpointing=False,
                                micro_batch_size=len(name), grad_accum_steps=1))
    e = Estimate(breakdown={}, peak_bytes=need or 50, host_bytes_per_node=0, nvme_bytes_per_node=0,
                 step_time_s=step_s)
    p = None if need is None else Problem(resource="device", need_bytes=need, have_bytes=have, largest="params")
    return Scored(strategy=s, estimate=e, problem=p)


def test_faster_candidates_are_listed_nearest_to_fitting_first_and_extremes_left_out():
    best = scored("b", 1.0)
    # The fastest infeasible one is absurdly over (the old list put it first); two are near the budget.
    far, near1, near2 = scored("ffffff", 0.1, need=200_000), scored("nn", 0.9, need=120), scored("nnn", 0.5, need=150)
    runner = scored("rrrr", 1.2)
    out = top_rejected(best, [best, far, near1, near2, runner])
    assert [r.label for r in out] == [near1.strategy.label(), near2.strategy.label(), runner.strategy.label()]
    assert out[0].why == "device" and (out[0].need_bytes, out[0].have_bytes, out[0].largest) == (120, 100, "params")
    assert out[2].why == "slower" and out[2].step_time_s == 1.2


def test_when_every_faster_one_is_far_over_the_nearest_one_still_says_why():
    best = scored("b", 1.0)
    out = top_rejected(best, [best, scored("ffffff", 0.1, need=10**9), scored("ff", 0.2, need=10**6)])
    assert [r.label for r in out] == [scored("ff", 0.2).strategy.label()]


def test_the_near_ones_are_the_first_by_overrun_then_time_earlier_first_on_a_tie():
    """top_rejected picks the first few near ones from thousands (the search asks at each check): the same ones,
    in the same order, as sorting them all by (overrun, step time), stably, and taking the first."""
    import random

    rng = random.Random(21)
    for trial in range(200):
        best = scored("b", 10.0)
        # Few distinct needs and times, so ties are common; names distinct by length (micro_batch_size).
        faster = [scored("x" * (i + 2), rng.choice([1.0, 2.0, 3.0]), need=rng.choice([150, 150, 190, 250, 900, 10**6]))
                  for i in range(rng.randrange(0, 12))]
        runners = [scored("r" * (i + 40), 11.0 + i) for i in range(3)]
        pool = [best, *faster, *runners]
        rng.shuffle(pool)
        ranked = sorted((c for c in pool if c.problem), key=lambda c: (overrun(c), c.estimate.step_time_s))
        near = ([c for c in ranked if overrun(c) <= NEAR_OVERRUN] or ranked[:1])[:3]
        listed = [r.label for r in top_rejected(best, pool) if r.why != "slower"]
        assert listed == [c.strategy.label() for c in near], trial


def test_deferred_candidates_are_placed_by_their_exact_overrun_and_estimated_only_when_they_may_be_near():
    """A candidate the search deferred enters the near list by a lower bound of its overrun (its device floor):
    the list is the one every candidate estimated gives, and one whose bound is past the list is never estimated."""
    import random

    rng = random.Random(37)
    for trial in range(300):
        best = scored("b", 10.0)
        exact = [scored("x" * (i + 2), rng.choice([1.0, 2.0, 3.0]), need=rng.choice([150, 150, 190, 250, 900, 10**6]))
                 for i in range(rng.randrange(0, 14))]
        pool = [best, *exact, *[scored("r" * (i + 40), 11.0 + i) for i in range(3)]]
        rng.shuffle(pool)
        ranked = sorted((c for c in pool if c.problem), key=lambda c: (overrun(c), c.estimate.step_time_s))
        near = ([c for c in ranked if overrun(c) <= NEAR_OVERRUN] or ranked[:1])[:3]
        # The same candidates, some deferred with a floor at or below their peak.
        lazy = [Scored.defer(c.strategy, c.step_time_s, overrun(c) * rng.choice([1.0, 0.9, 0.5]), lambda c=c: c)
                if c.problem and rng.random() < 0.6 else c for c in pool]
        bounds = {id(c): c.overrun_at_least for c in lazy if c.deferred}
        listed = [r.label for r in top_rejected(lazy[pool.index(best)], lazy) if r.why != "slower"]
        assert listed == [c.strategy.label() for c in near], trial
        # Past the list's reach: NEAR_OVERRUN where a near one was listed, else the lone nearest one's overrun.
        reach = NEAR_OVERRUN if near and overrun(near[0]) <= NEAR_OVERRUN else max(map(overrun, near), default=0)
        assert not [c for c in lazy if id(c) in bounds and not c.deferred and bounds[id(c)] > reach], trial


def test_a_real_plan_lists_no_extremes(request_for):
    """7B on 8 x 24 GB: many faster layouts are terabytes over; the list keeps to the near ones."""
    req = request_for(budget_bytes=24 * 10**9)
    plan = make_plan(req)
    over = [r for r in plan.rejected if r.why == "device"]
    assert over and all(r.need_bytes > r.have_bytes for r in over)
    faster_far = [c for c in evaluate(req) if c.problem and c.estimate.step_time_s < plan.estimate.step_time_s
                  and overrun(c) > NEAR_OVERRUN]
    assert faster_far, "the case must have far-over faster candidates for the test to mean anything"
    assert len(over) == 1 or all(r.need_bytes / r.have_bytes <= NEAR_OVERRUN for r in over)
    slower = [r for r in plan.rejected if r.why == "slower"]
    assert [r.step_time_s for r in slower] == sorted(r.step_time_s for r in slower)


def test_plan_json_round_trips_the_typed_rejected_and_never_parses_an_old_reason(request_for):
    plan = make_plan(request_for(budget_bytes=24 * 10**9))
    back = Plan.from_json(plan.to_json())
    assert back.rejected == plan.rejected
    # An entry from before the typed fields has only a sentence: it is left out, not guessed from its words.
    old = dataclasses.asdict(plan.rejected[0]) | {"reason": "host RAM: needs 1 GB per node, has 0 B"}
    for k in ("why", "need_bytes", "have_bytes", "largest"):
        old.pop(k)
    assert Rejected.from_json(old) is None
    assert Plan.from_json(plan.to_json() | {"rejected": [old]}).rejected == []
