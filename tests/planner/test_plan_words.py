"""launcher.planner.plan_words: the planner's typed overrun in words, the exact sentences plan.json and launch plan
carry."""

import dataclasses

from launcher.planner.hardware import PROFILES
from launcher.planner.plan import Problem
from launcher.planner.plan_words import forced_reason, problem_words, with_forced_reason
from launcher.planner.request import PlanRequest
from tests.planner.conftest import llama_stats

GB = 10**9


def request_for(**kw) -> PlanRequest:
    base = dict(model=llama_stats(), gpus_per_node=8, nodes=1, budget_bytes=80 * GB, seq_len=2048,
                global_batch_size=64, precision="bf16", optimizer="adamw", hardware=PROFILES["a100-80gb"],
                host_ram_per_node_bytes=10**12)
    return PlanRequest(**(base | kw))


def test_each_resource_is_worded_from_its_numbers():
    assert problem_words(Problem(resource="device", need_bytes=3 * GB, have_bytes=2 * GB, largest="optimizer")) == (
        "over budget by 1.00 GB (peak 3.00 GB, largest: optimizer)")
    assert problem_words(Problem(resource="host_ram", need_bytes=79_260_000_000, have_bytes=4 * GB)) == (
        "host RAM: needs 79.26 GB per node, has 4.00 GB")
    assert problem_words(Problem(resource="nvme", need_bytes=57_830_000_000, have_bytes=GB)) == (
        "NVMe: needs 57.83 GB, has 1.00 GB free")


def test_a_forced_plan_gets_its_reason_first_and_a_fitting_one_is_left_as_it_is():
    from launcher.config.job import StrategyConfig
    from launcher.planner.search import make_plan

    fits = make_plan(request_for(budget_bytes=80 * GB))
    assert with_forced_reason(fits) is fits
    pins = StrategyConfig(engine="deepspeed", zero_stage=0, offload_optimizer="none", offload_params="none",
                          micro_batch_size=8, activation_checkpointing=False)
    forced = make_plan(request_for(pins=pins, force=True))
    worded = with_forced_reason(forced)
    assert worded.reasons == [forced_reason(forced.problem), *forced.reasons]
    assert worded.reasons[0].startswith("forced: every strategy field is pinned and the prediction is over budget by ")
    assert dataclasses.replace(worded, reasons=forced.reasons) == forced  # nothing else changes
