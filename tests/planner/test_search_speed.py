"""The fast search (scoring in order of step time, engine terms memoized) chooses exactly what scoring every
candidate chooses: the plan, its numbers, its rejected alternatives, and the no-fit advice."""

import dataclasses

import pytest

from launcher.config.job import StrategyConfig
from launcher.engines import ENGINES
from launcher.errors import NoPlanError
from launcher.levers import LEVER_FIELDS, MATH_LEVERS
from launcher.planner import advice, scoring
from launcher.planner.build import build_plan, top_rejected
from launcher.planner.candidates import pinned
from launcher.planner.hardware import PROFILES
from launcher.planner.levers import math_departure, ranked_step_time
from launcher.planner.memo import TracedMemo
from launcher.planner.plan import Strategy
from launcher.planner.search import candidates, evaluate, make_plan, search
from tests.planner.conftest import llama_stats

ALLOW_ALL = tuple(w for ws in MATH_LEVERS.values() for w in ws)


@pytest.fixture
def every_lever(monkeypatch):
    """Every engine offering every lever, as the specs will once each lever's rank side lands."""
    for spec in ENGINES.values():
        monkeypatch.setattr(type(spec), "levers", frozenset(LEVER_FIELDS))
        # on every layout (DeepSpeed's limits)
        monkeypatch.setattr(type(spec), "lever_values", lambda self, c, lora=False: {})


def with_lever_terms(monkeypatch):
    """Stand-in memory and step-time terms for the levers, so that lever settings differ as they will: some save
    memory for time, the low-memory optimizers save memory at no time (ties in time that the peak breaks)."""
    memory, time, floor = scoring.estimate_memory, scoring.rank_terms, scoring.device_floor

    def estimate_memory(inp, s, buckets, held=None):
        mem = memory(inp, s, buckets, held)
        b = dict(mem.breakdown)
        if s.loss_chunks:
            b["logits"] //= 5
        if s.activation_offload:
            b["activations"] //= 2
        if s.activation_checkpointing and s.checkpoint_every > 1:
            b["activations"] += b["activations"] * (s.checkpoint_every - 1) // 8
        if s.low_memory_optimizer != "none":
            b["optimizer"] = b["optimizer"] * {"adamw8bit": 5, "adamw4bit": 4, "adafactor": 2, "paged_adamw8bit": 1}[
                s.low_memory_optimizer] // 8
        if s.optimizer_in_backward:
            b["grads"] //= 3
        return dataclasses.replace(mem, breakdown=b, peak_bytes=sum(b.values()))

    def rank_terms(inp, s):
        r = time(inp, s)
        return r._replace(compute=r.compute * (1 + 0.01 * bool(s.loss_chunks) + 0.05 * s.activation_offload
                                               - 0.1 * (s.activation_checkpointing and s.checkpoint_every > 1)
                                               / s.checkpoint_every))

    monkeypatch.setattr(scoring, "estimate_memory", estimate_memory)
    monkeypatch.setattr(scoring, "rank_terms", rank_terms)
    # The stand-in divides a category by 8 at most, so an eighth of the real floor stays below its peak.
    monkeypatch.setattr(scoring, "device_floor", lambda held: floor(held) / 8)


@pytest.fixture(params=["no levers", "every lever, no terms yet", "every lever with terms"])
def levers(request, monkeypatch):
    if request.param != "no levers":
        for spec in ENGINES.values():
            monkeypatch.setattr(type(spec), "levers", frozenset(LEVER_FIELDS))
    if request.param == "every lever with terms":
        with_lever_terms(monkeypatch)
    return request.param


def exhaustive_search(req, alternatives=None):
    """Every candidate scored, every term afresh, as the search did before it stopped early or memoized."""
    scored = evaluate(req, memo=False)
    return scoring.Searched(scored=scored, total=len(scored))


def exhaustive_plan(req):
    scored = evaluate(req, memo=False)
    fits = sorted((c for c in scored if c.problem is None),
                  key=lambda c: (ranked_step_time(c.estimate.step_time_s, c.strategy), math_departure(c.strategy),
                                 c.estimate.peak_bytes))
    if not fits:
        return None
    return build_plan(req, fits[0], scored, pinned(req.pins), status="fits", total=len(scored))


def outcome(req, monkeypatch=None):
    """plan.json, or the no-fit answer (its numbers and every suggestion's)."""
    try:
        return make_plan(req).to_json()
    except NoPlanError as e:
        return e.no_fit


def assert_same_as_exhaustive(req, monkeypatch):
    fast = outcome(req)
    reference = exhaustive_plan(req)
    if reference is not None:
        assert fast == reference.to_json()
        return
    # No fit: the advice re-plans through the search; against scoring every candidate each time.
    with monkeypatch.context() as m:
        m.setattr(advice, "search", exhaustive_search)
        assert fast == outcome(req)


LORA = llama_stats(trainable=20_000_000)
SMALL = llama_stats(num_params=1_235_814_400, blocks=16, h=2048, inter=8192, vocab=128256)


@pytest.mark.parametrize("kw", [
    dict(),  # roomy: the fastest fit is among the first scored
    dict(budget_bytes=30 * 10**9),
    dict(budget_bytes=18 * 10**9, global_batch_size=32),  # tight: offload and checkpointing
    dict(budget_bytes=24 * 10**9, gpus_per_node=1, global_batch_size=8, model=LORA),
    dict(budget_bytes=8 * 10**9, gpus_per_node=2, global_batch_size=8, model=SMALL),
    dict(nodes=2, budget_bytes=40 * 10**9, global_batch_size=32),  # hybrid sharding
    dict(budget_bytes=40 * 10**9, host_ram_per_node_bytes=100 * 10**9, global_batch_size=16),  # host RAM bites
    dict(budget_bytes=60 * 10**9, nvme_free_bytes=10**13, host_ram_per_node_bytes=60 * 10**9, global_batch_size=16),
    dict(hardware=PROFILES["cpu"], budget_bytes=120 * 10**9, gpus_per_node=2, global_batch_size=4, seq_len=512),
    dict(pins=StrategyConfig(engine="fsdp"), budget_bytes=30 * 10**9, global_batch_size=16),
    dict(budget_bytes=6 * 10**9, gpus_per_node=1, global_batch_size=4, seq_len=1024),  # no fit: advice
])
def test_fast_search_chooses_what_scoring_every_candidate_chooses(request_for, levers, monkeypatch, kw):
    req = request_for(allow_levers=ALLOW_ALL, **kw)
    assert_same_as_exhaustive(req, monkeypatch)


def test_tight_budgets_in_steps_choose_the_same(request_for, every_lever, monkeypatch):
    """Each budget from where nothing fits to where everything does: the boundary is where early stopping bites."""
    with_lever_terms(monkeypatch)
    for gb in (10, 13, 16, 19, 22, 26, 32, 45):
        req = request_for(budget_bytes=gb * 10**9, global_batch_size=16, allow_levers=ALLOW_ALL)
        assert_same_as_exhaustive(req, monkeypatch)


def test_a_large_per_rank_batch_is_searched_early_and_chooses_the_same(request_for, every_lever, monkeypatch):
    req = request_for(global_batch_size=8 * 64, budget_bytes=40 * 10**9, allow_levers=ALLOW_ALL)
    found = search(req, top_rejected)
    assert len(candidates(req)) == found.total > 5_000
    assert len(found.scored) < found.total / 2  # it did stop early
    assert_same_as_exhaustive(req, monkeypatch)


def test_the_engine_terms_run_once_per_distinct_reading_not_per_candidate(request_for, every_lever, monkeypatch):
    """Thousands of candidates, many differing only in fields an engine's term does not read (the micro-batch and
    the levers, for its states): the terms run far fewer times than candidates are scored."""
    calls = []
    for spec in ENGINES.values():
        real = type(spec).states
        monkeypatch.setattr(type(spec), "states", lambda self, *a, real=real: calls.append(1) or real(self, *a))
    req = request_for(global_batch_size=8 * 64, budget_bytes=40 * 10**9, allow_levers=ALLOW_ALL)
    # Every candidate scored through the memo: each distinct reading once (836 for 8,976 candidates here);
    # without it at least once per candidate. (How many the step-time-ordered search scores before it may stop
    # depends on the cost model, not on the memo.)
    total = len(evaluate(req))
    assert len(calls) < total / 4
    calls.clear()
    plan = make_plan(req)
    assert 0 < len(calls) <= len(search(req, top_rejected).scored)
    assert plan.to_json() == exhaustive_plan(req).to_json()


def test_the_reason_counts_what_was_compared(request_for):
    plan = make_plan(request_for(budget_bytes=30 * 10**9))
    total = len(candidates(request_for()))
    assert plan.reasons[0].startswith(f"fastest fitting candidate of {total} (")
    faster = sum(1 for c in evaluate(request_for(budget_bytes=30 * 10**9))
                 if c.problem and c.estimate.step_time_s < plan.estimate.step_time_s)
    assert f"({faster} predicted faster do not fit)" in plan.reasons[0]


def test_memo_keys_on_the_fields_a_term_reads():
    calls = []

    def term(s, scale):
        calls.append(s.micro_batch_size if s.layout.zero_stage == 3 else None)
        return s.micro_batch_size * scale if s.layout.zero_stage == 3 else scale

    memo = TracedMemo()
    base = candidates_strategy(zero_stage=3, micro_batch_size=2)
    assert memo.call(("t", 10), term, base, 10) == 20
    assert memo.call(("t", 10), term, dataclasses.replace(base, loss_chunks=8), 10) == 20  # not read: a hit
    assert memo.call(("t", 10), term, dataclasses.replace(base, micro_batch_size=4), 10) == 40  # read: a miss
    other = Strategy.from_json(base.to_json() | dict(zero_stage=2))
    assert memo.call(("t", 10), term, other, 10) == 10
    assert memo.call(("t", 10), term, dataclasses.replace(other, micro_batch_size=8), 10) == 10  # not read at 2
    assert (memo.hits, memo.misses) == (2, 3) and len(calls) == 3


def test_memoized_states_are_copies(request_for):
    """A caller adjusting the States it got cannot change what the next strategy gets."""
    from launcher.planner.memo import spec_for
    from launcher.planner.plan import Strategy  # noqa: F401

    req = request_for()
    inp = scoring.memory_inputs(req)
    inp.memo = {}
    s = candidates(req)[0]
    buckets = scoring.size_buckets(req)
    first = spec_for(inp, s).states(inp, s, buckets)
    first.params += 1e12
    assert spec_for(inp, s).states(inp, s, buckets).params == ENGINES[s.engine].states(inp, s, buckets).params


def test_memo_copies_every_mutable_record_and_keeps_immutable_answers():
    """States goes through its __init__; a record that cannot (keyword-only fields) is copied field by field."""
    from launcher.planner.memo import _fresh
    from launcher.planner.plan import Buckets
    from launcher.planner.terms import States, Traffic

    for record in (States(params=1.0, side_stream_cached={"step": 2.0}),
                   Buckets(reduce_bucket_size=1, allgather_bucket_size=2, stage3_prefetch_bucket_size=3,
                           stage3_max_live_parameters=4, stage3_param_persistence_threshold=5)):
        copy = _fresh(record)
        assert copy == record and copy is not record and type(copy) is type(record)
    traffic = Traffic(intra_node_bytes=1.0, inter_node_bytes=0.0, calls=1)
    assert _fresh(traffic) is traffic and _fresh(2.0) == 2.0


def candidates_strategy(**kw):
    from launcher.planner.plan import Strategy

    base = dict(engine="deepspeed", zero_stage=2, fsdp_reshard_after_forward=None, offload_optimizer="none",
                offload_params="none", micro_batch_size=1, grad_accum_steps=1, activation_checkpointing=False)
    return Strategy.from_json({**base, **kw})


def test_the_list_is_final_only_once_the_bound_passes_its_slowest_runner_up(request_for):
    """A runner-up listed from the scored ones but slower than the bound may still be overtaken by one not yet
    scored: the search goes on until the bound passes it."""
    req = request_for(budget_bytes=30 * 10**9)
    scored = evaluate(req)
    fits = sorted((i for i, c in enumerate(scored) if c.problem is None), key=lambda i: scored[i].estimate.step_time_s)
    best = scored[fits[0]]
    done = dict(enumerate(scored))
    listed = top_rejected(best, scored)
    slowest = max(r.step_time_s for r in listed if r.why == "slower")
    key = (*scoring._rank(best), fits[0])
    assert scoring._blocking(done, key, slowest, top_rejected) == slowest
    assert scoring._blocking(done, key, slowest * 1.001, top_rejected) is None


LORA_LINEARS = dataclasses.replace(llama_stats(trainable=8 * 32 * 4 * 4096),
                                   block_linear_shapes=[[4096, 4096]] * 4 + [[11008, 4096]] * 2 + [[4096, 11008]])


@pytest.mark.parametrize("kw", [
    dict(global_batch_size=8 * 4),
    dict(global_batch_size=8 * 4, precision="fp16", nodes=2),
    dict(model=LORA_LINEARS, gpus_per_node=2, global_batch_size=16),  # QLoRA
    dict(model=SMALL, hardware=PROFILES["cpu"], gpus_per_node=2, global_batch_size=4, seq_len=512),
    dict(nvme_free_bytes=10**13, global_batch_size=16, script=True),
])
def test_the_device_floor_is_never_above_the_peak(request_for, every_lever, kw):
    """The search defers a candidate whose device floor is over the budget: the floor must be a lower bound of the
    peak for every candidate and both bucket sizes, or a plan that fits would be passed over."""
    from launcher.planner.memory import device_floor, estimate_memory, held_bytes

    req = request_for(allow_levers=ALLOW_ALL, **kw)
    inp = scoring.memory_inputs(req)
    buckets = [scoring.size_buckets(req), scoring.size_buckets(req, smallest=True)]
    cands = candidates(req)
    assert {bool(getattr(s, name)) for s in cands for name in LEVER_FIELDS if name != "qlora"} == {False, True}
    for s in cands:
        for b in buckets:
            held = held_bytes(inp, s, b)
            assert device_floor(held) <= estimate_memory(inp, s, b, held).peak_bytes, s.label()
            assert estimate_memory(inp, s, b, held) == estimate_memory(inp, s, b)
        assert held_bytes(inp, s, buckets[1], held_bytes(inp, s, buckets[0])) == held_bytes(inp, s, buckets[1])


def test_a_deferred_candidate_reads_as_scoring_it_at_once(request_for, every_lever):
    """What the search defers (Scored.defer), once read, is what scoring every candidate gives, number for number;
    the deferred ones are not estimated until read."""
    req = request_for(global_batch_size=8 * 64, budget_bytes=40 * 10**9, allow_levers=ALLOW_ALL)
    found = search(req, top_rejected)
    deferred = [c for c in found.scored if c.deferred]
    assert len(deferred) > len(found.scored) / 2
    assert all(not c.fits and c.overrun_at_least > 1 for c in deferred)
    reference = {c.strategy.label(): c for c in evaluate(req, memo=False)}
    for c in found.scored:
        ref = reference[c.strategy.label()]
        assert c.step_time_s == ref.estimate.step_time_s
        assert (c.estimate, c.problem, c.buckets) == (ref.estimate, ref.problem, ref.buckets)
        assert c.overrun_at_least == ref.overrun_at_least and c.fits == (ref.problem is None) and not c.deferred


@pytest.mark.parametrize("kw", [dict(global_batch_size=8 * 8),
                                dict(model=SMALL, hardware=PROFILES["cpu"], gpus_per_node=2, global_batch_size=4,
                                     seq_len=512)])
def test_the_compute_parts_key_holds_every_field_they_read(request_for, every_lever, kw):
    """cost.compute_parts keeps compute_s's answers by COMPUTE_FIELDS' values: a field compute_s reads outside them
    would hand one strategy another's seconds. Traced on every candidate (the memo's recorder notes each read)."""
    from launcher.planner.cost import COMPUTE_FIELDS, compute_parts, compute_s
    from launcher.planner.memo import _Recorder

    req = request_for(allow_levers=ALLOW_ALL, **kw)
    inp = scoring.memory_inputs(req)
    read = set()
    for s in candidates(req):
        rec = _Recorder(s)
        assert compute_s(inp, rec) == compute_s(inp, s)
        read |= {name for name, _ in rec._reads}
    assert read == set(COMPUTE_FIELDS)
    inp.memo = {}
    assert all(compute_parts(inp, s) == compute_s(inp, s) for s in candidates(req))
