"""Issue 37: levers that compose (§3), a math lever only where it buys something (§6), and its done-when checks on
the Llama-3.2-3B-shaped job of examples/llama-3b-24gb.yaml on one 24 GiB card."""

from pathlib import Path

import pytest
import yaml

from launcher.config.jobfile import job_from_data
from launcher.errors import NoPlanError
from launcher.inputs.plan_inputs import plan_job
from launcher.planner.hardware import PROFILES
from launcher.planner.levers import MATH_LEVER_MARGIN, math_departure
from launcher.planner.scoring import evaluate
from launcher.planner.search import make_plan
from tests.conftest import REPO

EXAMPLE = REPO / "examples" / "llama-3b-24gb.yaml"

STACK = {"engine": "fsdp", "pure_bf16": True, "activation_checkpointing": True, "checkpoint_every": 1,
         "checkpoint_policy": "full", "loss_chunks": 8, "optimizer_in_backward": True, "activation_offload": True,
         "low_memory_optimizer": "adamw8bit"}
"""torchtune's low-memory single-device recipe (pure bf16, full checkpointing, chunked loss, the optimizer step in
backward, activation offload, 8-bit AdamW), pinned."""


def plan_3b(allow, host_ram="128GB", strategy=None):
    """The example's 3B job at batch 2 x 4096 tokens on one 24 GiB L4, ``allow`` its train.allow_levers."""
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc.update(budget="24GiB", gpus=1, cluster={"hardware": "l4", "host_ram_per_node": host_ram},
               train={**doc["train"], "global_batch_size": 2, "allow_levers": list(allow)})
    if strategy:
        doc["strategy"] = strategy
    return plan_job(job_from_data(doc, EXAMPLE.parent))


def test_the_torchtune_single_device_stack_is_accepted_and_predicted():
    plan = plan_3b(["pure_bf16", "adamw8bit"], strategy=STACK)
    s = plan.strategy
    assert {k: getattr(s, k) for k in STACK if k != "engine"} == {k: v for k, v in STACK.items() if k != "engine"}
    assert s.engine == "fsdp" and s.grad_accum_steps == 1
    assert plan.estimate.peak_bytes <= plan.usable_bytes
    # Everything on the GPU: no gradient at the step, 8-bit moments (~2 bytes a parameter), bf16 shards.
    bd = plan.estimate.breakdown
    assert bd["grads"] == 0 and bd["optimizer"] < 2.1 * plan.trainable_params and bd["params"] < 2.4 * plan.num_params


def test_the_3b_job_keeps_its_optimizer_on_the_gpu_with_pure_bf16_and_8bit_adamw():
    """Done-when of issue 37: with [pure_bf16, adamw8bit] allowed, the step in backward beside 8-bit AdamW fits the
    whole optimizer on the card, where the job's own math needs ZeRO-3 with CPU Adam."""
    exact = plan_3b([])
    assert exact.strategy.layout.offload_optimizer == "cpu"
    plan = plan_3b(["pure_bf16", "adamw8bit"])
    s = plan.strategy
    assert (s.layout.offload_optimizer, s.layout.offload_params) == ("none", "none")
    # On the plain engine (no FSDP2 root or block beside the weights, issue 37 §5) the state fits with the step
    # after backward; on FSDP2 it takes the step in backward beside it (test_the_stack_composes_on_fsdp2_too).
    assert (s.pure_bf16, s.low_memory_optimizer) == (True, "adamw8bit")
    assert plan.estimate.step_time_s < (1 - MATH_LEVER_MARGIN) ** 2 * exact.estimate.step_time_s
    # Exact plans fit (with the Adam state on the host): the math levers are used for speed, not "needed to fit".
    why = {d.lever: d.why for d in plan.levers}
    assert why["pure_bf16"] == why["low_memory_optimizer"] == "faster_than_without"
    if s.optimizer_in_backward:
        assert why["optimizer_in_backward"] == "needed_to_fit"  # an exact lever: the plan does not fit without it


def test_the_stack_composes_on_fsdp2_too():
    """Issue 37 §3 on FSDP2 (its root and one block beside the shards): the step in backward beside 8-bit AdamW and
    pure bf16 keeps the optimizer on the card."""
    plan = plan_3b(["pure_bf16", "adamw8bit"], strategy={"engine": "fsdp"})
    s = plan.strategy
    assert (s.layout.offload_optimizer, s.layout.offload_params) == ("none", "none")
    assert (s.pure_bf16, s.low_memory_optimizer, s.optimizer_in_backward) == (True, "adamw8bit", True)
    assert {d.lever: d.why for d in plan.levers}["optimizer_in_backward"] == "needed_to_fit"


def test_needed_to_fit_only_where_no_plan_without_it_fits():
    # 24 GB of host RAM holds no CPU Adam state (3.2B x 12 bytes): no plan with the job's optimizer fits.
    plan = plan_3b(["pure_bf16", "adamw8bit"], host_ram="24GB")
    assert plan.strategy.layout.offload_optimizer == "none"
    assert {d.lever: d.why for d in plan.levers}["low_memory_optimizer"] == "needed_to_fit"
    with pytest.raises(NoPlanError):
        plan_3b([], host_ram="24GB")


def test_with_every_math_lever_allowed_the_mildest_that_buys_the_margin_wins():
    """Issue 37: 4-bit AdamW was taken for a 0.4 % gain over 8-bit; a further change of the math must buy the
    margin too."""
    allow = ["pure_bf16", "adamw8bit", "adamw4bit", "adafactor"]
    plan = plan_3b(allow)
    assert plan.strategy.low_memory_optimizer == "adamw8bit" and plan.strategy.layout.offload_optimizer == "none"
    four = plan_3b(allow, strategy={"low_memory_optimizer": "adamw4bit"})
    assert four.estimate.step_time_s <= plan.estimate.step_time_s  # no slower, but faster by less than the margin
    assert four.estimate.step_time_s > (1 - MATH_LEVER_MARGIN) * plan.estimate.step_time_s


def _a100(request_for, budget_gb):
    return request_for(gpus_per_node=8, budget_bytes=budget_gb * 10**9, hardware=PROFILES["a100-80gb"],
                       allow_levers=("pure_bf16",))


def _fastest(req):
    """(fastest fitting exact plan's step time, fastest fitting pure bf16 plan's), every candidate scored."""
    fits = [c for c in evaluate(req) if c.problem is None]
    exact = min(c.estimate.step_time_s for c in fits if not math_departure(c.strategy))
    math = min(c.estimate.step_time_s for c in fits if math_departure(c.strategy))
    return exact, math


def test_a_math_lever_faster_by_less_than_the_margin_is_not_used(request_for):
    """Issue 37 §6: 8 A100s at 40 GB, where pure bf16 steps 0.5 % faster than the fastest exact plan (ZeRO-3)."""
    req = _a100(request_for, 40)
    exact, math = _fastest(req)
    assert math < exact < math / (1 - MATH_LEVER_MARGIN)  # a real, small gain: the case the margin is for
    plan = make_plan(req)
    assert not plan.strategy.pure_bf16 and plan.estimate.step_time_s == exact
    assert {d.lever: d.why for d in plan.levers}["pure_bf16"] == "fits_without"


def test_a_math_lever_faster_by_more_than_the_margin_is_used(request_for):
    req = _a100(request_for, 24)
    exact, math = _fastest(req)
    assert math < (1 - MATH_LEVER_MARGIN) * exact
    plan = make_plan(req)
    assert plan.strategy.pure_bf16 and plan.estimate.step_time_s == math
    assert {d.lever: d.why for d in plan.levers}["pure_bf16"] == "faster_than_without"


def test_docs_state_the_margin():
    text = (REPO / "docs" / "levers.md").read_text()
    assert f"more than {MATH_LEVER_MARGIN * 100:g} % faster" in text and "MATH_LEVER_MARGIN" in text
    assert Path(EXAMPLE).exists()


def test_a_fitting_alternative_faster_within_the_margin_is_worded_so(request_for):
    import dataclasses

    from launcher.cli.render import rejected_reason
    from launcher.planner.plan import Rejected

    plan = make_plan(_a100(request_for, 40))
    t0 = plan.estimate.step_time_s
    faster = Rejected(label="x", why="slower", peak_bytes=1, step_time_s=0.99 * t0)
    assert rejected_reason(faster, plan).startswith("fits, ") and "5%" in rejected_reason(faster, plan)
    slower = dataclasses.replace(faster, step_time_s=1.01 * t0)
    assert rejected_reason(slower, plan).startswith("fits but slower")
