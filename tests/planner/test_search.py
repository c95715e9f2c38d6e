import dataclasses

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from launcher.config.job import StrategyConfig
from launcher.errors import ConfigError, NoPlanError
from launcher.planner.hardware import PROFILES
from launcher.planner.search import candidates, make_plan
from tests.planner.conftest import llama_stats


def test_plan_fits_and_keeps_the_global_batch(request_for):
    plan = make_plan(request_for(budget_bytes=40 * 10**9))
    s = plan.strategy
    assert plan.estimate.peak_bytes <= plan.usable_bytes < plan.budget_bytes
    assert s.micro_batch_size * s.grad_accum_steps * plan.world_size == 64
    assert plan.reasons and plan.rejected


def test_tighter_budget_moves_to_more_sharding(request_for):
    loose = make_plan(request_for(budget_bytes=80 * 10**9))
    tight = make_plan(request_for(budget_bytes=24 * 10**9))
    assert tight.estimate.peak_bytes <= 24 * 10**9 * 0.95
    # 7B on 8 GPUs cannot hold replicated optimizer state in 24 GB: stage 3 / full shard / offload is needed.
    s = tight.strategy
    assert s.layout.zero_stage == 3 or s.layout.fsdp_reshard_after_forward or s.layout.offload_optimizer != "none"
    assert loose.estimate.step_time_s <= tight.estimate.step_time_s


def test_pinned_fields_are_kept(request_for):
    pins = StrategyConfig(engine="deepspeed", zero_stage=2, micro_batch_size=2)
    plan = make_plan(request_for(pins=pins))
    s = plan.strategy
    assert (s.engine, s.layout.zero_stage, s.micro_batch_size) == ("deepspeed", 2, 2)
    assert set(plan.pinned) == {"engine", "zero_stage", "micro_batch_size"}


def test_nothing_fits_says_what_would_with_numbers(request_for):
    with pytest.raises(NoPlanError) as e:
        make_plan(request_for(budget_bytes=5 * 10**9, seq_len=16384, gpus_per_node=2))
    no_fit = e.value.no_fit
    assert (no_fit.budget_bytes, no_fit.world_size) == (5 * 10**9, 2) and no_fit.tried > 0
    assert no_fit.smallest.resource == "device" and no_fit.smallest_peak_bytes > 5 * 10**9 * 0.95
    assert any(s.change == "budget" for s in no_fit.suggestions)
    # The suggestion is real: the same request at the suggested length plans.
    seq = next(s.value for s in no_fit.suggestions if s.change == "seq_len")
    assert seq < 16384
    assert make_plan(request_for(budget_bytes=5 * 10**9, seq_len=seq, gpus_per_node=2)).usable_bytes


def test_nvme_only_offered_with_a_path(request_for):
    assert not any("nvme" in (c.layout.offload_optimizer, c.layout.offload_params) for c in candidates(request_for()))
    assert any(c.layout.offload_params == "nvme" for c in candidates(request_for(nvme_free_bytes=10**12)))


def test_host_ram_limits_offload(request_for):
    req = request_for(budget_bytes=12 * 10**9, host_ram_per_node_bytes=64 * 10**9,
                      pins=StrategyConfig(offload_optimizer="cpu"))
    with pytest.raises(NoPlanError) as e:
        make_plan(req)
    # The answer is typed: the resource the smallest candidate overruns, with its numbers (cli/render words it).
    assert e.value.short_of == "host_ram" == e.value.no_fit.smallest.resource
    assert e.value.no_fit.smallest.need_bytes > e.value.no_fit.smallest.have_bytes == 64 * 10**9


def test_rejected_reasons_are_the_typed_problem_described(request_for):
    """A candidate's Problem keeps the numbers (resource, need, have); launcher.planner.plan_words makes its
    sentence."""
    from launcher.planner.plan_words import problem_words
    from launcher.planner.scoring import evaluate

    req = request_for(budget_bytes=12 * 10**9, host_ram_per_node_bytes=64 * 10**9)
    scored = evaluate(req)
    over = [c for c in scored if c.problem is not None and c.problem.resource == "device"]
    assert over and all(c.problem.need_bytes == c.estimate.peak_bytes and c.problem.have_bytes == req.usable_bytes
                        for c in over)
    assert problem_words(over[0].problem).startswith("over budget by ")


def test_batch_not_divisible_by_gpus_is_bad_input(request_for):
    with pytest.raises(ConfigError, match="global_batch_size: 64 is not divisible by 6 GPUs"):
        make_plan(request_for(gpus_per_node=6))


def test_impossible_pins_are_bad_input(request_for):
    with pytest.raises(ConfigError, match="admit no strategy"):
        make_plan(request_for(pins=StrategyConfig(engine="fsdp", offload_optimizer="cpu", offload_params="none")))


def test_forced_plan_over_budget(request_for):
    pins = StrategyConfig(engine="deepspeed", zero_stage=0, offload_optimizer="none", offload_params="none",
                          micro_batch_size=8, activation_checkpointing=False)
    with pytest.raises(NoPlanError):
        make_plan(request_for(pins=pins))
    plan = make_plan(request_for(pins=pins, force=True))
    assert plan.status == "forced" and plan.estimate.peak_bytes > plan.budget_bytes


def test_a_forced_plan_carries_its_problem_typed_and_unworded(request_for):
    """The planner returns what the forced plan overruns as numbers (Plan.problem, kept in plan.json); the
    sentence is launcher.planner.plan_words', put first by launcher.inputs.plan_inputs.plan_job, not the planner's."""
    from launcher.planner.plan import Plan, Problem

    pins = StrategyConfig(engine="deepspeed", zero_stage=0, offload_optimizer="none", offload_params="none",
                          micro_batch_size=8, activation_checkpointing=False)
    plan = make_plan(request_for(pins=pins, force=True))
    e = plan.estimate
    assert plan.problem == Problem(resource="device", need_bytes=e.peak_bytes, have_bytes=plan.usable_bytes,
                                   largest=max(e.breakdown, key=e.breakdown.get))
    assert not any(r.startswith("forced") for r in plan.reasons)
    assert Plan.from_json(plan.to_json()).problem == plan.problem
    fits = make_plan(request_for(budget_bytes=80 * 10**9))
    assert fits.problem is None and "problem" not in fits.to_json()  # a fitting plan.json is as before


def test_405b_over_1024_gpus_plans(request_for):
    m = llama_stats(num_params=405_853_388_800, blocks=126, h=16384, inter=53248, vocab=128256)
    plan = make_plan(request_for(model=m, gpus_per_node=8, nodes=128, global_batch_size=1024,
                                 hardware=PROFILES["h100-80gb"], seq_len=4096))
    assert plan.estimate.peak_bytes <= plan.usable_bytes


models = st.builds(
    lambda h, blocks, vocab: llama_stats(num_params=blocks * 12 * h * h + 2 * vocab * h, blocks=blocks, h=h,
                                         inter=4 * h, vocab=vocab),
    h=st.sampled_from([256, 512, 1024, 2048, 4096]), blocks=st.integers(2, 48),
    vocab=st.sampled_from([1024, 32000, 128256]),
)


# 25 examples (was 40, 21.8 s in a full suite run): the suite's 20-minute bound; each example plans twice.
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(model=models, gpus=st.sampled_from([1, 2, 4, 8]), nodes=st.sampled_from([1, 2, 4]), budget_gb=st.floats(0.5, 80),
       seq=st.sampled_from([128, 512, 2048]), hw=st.sampled_from(["a100-80gb", "cpu"]), grow=st.floats(1.0, 4.0),
       lora_fraction=st.sampled_from([None, 0.001, 0.01]), nvme_free=st.sampled_from([None, 2 * 10**12]))
def test_plans_fit_and_more_budget_never_hurts(request_for, model, gpus, nodes, budget_gb, seq, hw, grow,
                                               lora_fraction, nvme_free):
    if lora_fraction is not None:  # adapters train, the base is frozen: the planner sees only trainable_params
        lora = max(1, int(model.num_params * lora_fraction))
        model = dataclasses.replace(model, trainable_params=lora, lora_params=lora)
    req = request_for(model=model, gpus_per_node=gpus, nodes=nodes, budget_bytes=int(budget_gb * 1e9), seq_len=seq,
                      hardware=PROFILES[hw], global_batch_size=8 * gpus * nodes, host_ram_per_node_bytes=256 * 10**9,
                      nvme_free_bytes=nvme_free)
    try:
        plan = make_plan(req)
    except NoPlanError:
        event("no plan fits")
        return
    event("planned")
    assert plan.estimate.peak_bytes <= plan.usable_bytes <= plan.budget_bytes
    assert plan.estimate.host_bytes_per_node <= req.host_ram_per_node_bytes
    assert plan.estimate.nvme_bytes_per_node <= (nvme_free or 0)
    s = plan.strategy
    assert s.micro_batch_size * s.grad_accum_steps * gpus * nodes == req.global_batch_size  # the global batch is kept
    assert getattr(s.layout, "fsdp_sharding", None) != "hybrid" or nodes > 1
    bigger = make_plan(dataclasses.replace(req, budget_bytes=int(req.budget_bytes * grow)))
    assert bigger.estimate.peak_bytes <= bigger.usable_bytes
    # ... and it never plans a slower step: every plan that fitted still fits, and the planner takes the fastest.
    assert bigger.estimate.step_time_s <= plan.estimate.step_time_s * (1 + 1e-9), (
        f"{req.budget_bytes} B: {plan.strategy.label()} {plan.estimate.step_time_s:.6g} s/step; x{grow:.3g}: "
        f"{bigger.strategy.label()} {bigger.estimate.step_time_s:.6g} s/step")
