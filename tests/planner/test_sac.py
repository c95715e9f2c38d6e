"""Op-level selective checkpointing (Strategy.checkpoint_policy "ops", issue 21 lever 2): where the search offers
it, what a block keeps under it (memory) and what its recompute re-runs (cost)."""

import dataclasses

import pytest

from launcher.config.job import StrategyConfig
from launcher.engines import ENGINES
from launcher.planner.cost import recomputed_share, step_time_terms
from launcher.planner.levers import options
from launcher.planner.memory import ActivationConstants, activation_bytes, block_activations
from launcher.planner.search import make_plan
from tests.planner.conftest import llama_stats
from tests.planner.test_cost import TOKENS_PER_STEP, P, attention, inputs, no_overhead, strategy

MEASURED = ActivationConstants(block_bytes_per_token=100.0, block_bytes_per_token_per_seq=0.0,
                               ckpt_bytes_per_token=8.0, head_bytes_per_token=50.0, head_ckpt_bytes_per_token=40.0,
                               sac_bytes_per_token=30.0)


def test_ops_is_offered_only_with_checkpointing_and_a_measured_term(request_for):
    for engine in ("fsdp", "deepspeed"):  # FSDP2's checkpoint_wrapper, DeepSpeed's through transformers' checkpointing
        got = options(request_for(activations=MEASURED), ENGINES[engine].levers, 1)
        assert {o.checkpoint_policy for o in got if o.activation_checkpointing} == {"full", "ops"}
        assert {o.checkpoint_policy for o in got if not o.activation_checkpointing} == {"full"}
        assert not any(o.checkpoint_policy == "ops" and o.activation_offload for o in got)
    # The paper's constants (no probe) do not say what it keeps.
    unmeasured = dataclasses.replace(MEASURED, sac_bytes_per_token=0.0)
    assert {o.checkpoint_policy for o in options(request_for(activations=unmeasured), ENGINES["fsdp"].levers, 1)} \
        == {"full"}
    # Pinned: kept (and checkpointing with it) where implemented; no candidate for a spec without it.
    pinned = request_for(activations=MEASURED, pins=StrategyConfig(checkpoint_policy="ops"))
    for engine in ("fsdp", "deepspeed"):
        got = options(pinned, ENGINES[engine].levers, 1)
        assert got and all(o.activation_checkpointing and o.checkpoint_policy == "ops" for o in got)
    assert options(pinned, ENGINES["fsdp"].levers - {"checkpoint_policy"}, 1) == []


def test_a_checkpointed_block_keeps_the_measured_op_outputs():
    tokens, n = 2 * 512, 4
    full, live = block_activations(MEASURED, n, 2, 512, True, 2)
    ops, live_ops = block_activations(MEASURED, n, 2, 512, True, 2, "ops")
    # Blocks 0 and 2 checkpointed: each keeps 30 bytes a token instead of 8; the others keep all 100; one block
    # is whole again in its recompute either way.
    assert ops == tokens * (2 * 30 + 2 * 100) and full == tokens * (2 * 8 + 2 * 100)
    assert live_ops == live == tokens * 100
    blocks, _ = activation_bytes(MEASURED, n, 2, 512, True, 1, policy="ops")
    assert blocks == tokens * (4 * 30 + 100)


@pytest.mark.parametrize("policy", ["full", "ops"])
def test_a_mixed_layout_holds_the_checkpointed_layers_kwargs_once_at_the_backward_start(policy):
    # torch.utils.checkpoint's recompute closure keeps the checkpointed layers' kwargs (the causal mask) until their
    # backward: at the backward start of a layout whose last block is not checkpointed, once, whatever the count.
    c = dataclasses.replace(MEASURED, ckpt_kwargs_bytes_per_token=5.0)
    tokens = 2 * 512
    for n, every in ((4, 2), (6, 4), (2, 2)):
        plain = activation_bytes(MEASURED, n, 2, 512, True, every, policy=policy)
        assert activation_bytes(c, n, 2, 512, True, every, policy=policy) == (plain[0] + tokens * 5, plain[1])
    # Every block checkpointed (the last one's recompute is the moment) or none: the probe's terms hold them already.
    for every, ac in ((1, True), (3, True), (1, False)):
        assert activation_bytes(c, 4, 2, 512, ac, every, policy=policy) == \
            activation_bytes(MEASURED, 4, 2, 512, ac, every, policy=policy)


def test_the_recompute_reruns_only_the_matmuls_the_policy_does_not_save():
    # Llama 7B: q, k, v, o are h x h, gate, up, down h x I; the policy re-runs k, o, up (every second aten.mm).
    m, h, inter = llama_stats(), 4096, 11008
    ops = dataclasses.replace(strategy(engine="fsdp", ac=True), checkpoint_policy="ops")
    share = (2 * h * h + h * inter) / (4 * h * h + 3 * h * inter)
    assert recomputed_share(m, ops) == pytest.approx(share)
    assert recomputed_share(m, dataclasses.replace(ops, checkpoint_policy="full")) == 1.0
    # Biased linears (GPT-2's Conv1D, BERT) run as aten.addmm, which the policy does not save: a whole recompute.
    assert recomputed_share(dataclasses.replace(m, gated_mlp=False), ops) == 1.0
    inp = no_overhead(inputs())
    got = step_time_terms(inp, ops, 10**6)["compute"]
    block = (P - m.non_block_params) / m.num_blocks
    hw = inp.hardware
    # Attention's own matmuls: 3 passes per block, none recomputed (the policy saves the fused kernel's output).
    flops = 6 * P + 2 * 32 * share * block + attention(3 * 32)
    assert got == pytest.approx(flops * TOKENS_PER_STEP / (hw.flops_bf16 * hw.mfu))


def test_a_pinned_op_policy_plans_and_labels_the_plan(request_for):
    plan = make_plan(request_for(activations=MEASURED, pins=StrategyConfig(engine="fsdp", checkpoint_policy="ops")))
    assert plan.strategy.activation_checkpointing and plan.strategy.checkpoint_policy == "ops"
    assert "(ops)" in plan.strategy.label()
    # `launch plan`'s strategy line says which checkpointing runs (launcher.cli.render).
    from launcher.cli.render import render_plan

    line = next(ln for ln in render_plan(plan, "job", "llama").splitlines() if ln.strip().startswith("strategy"))
    assert "activation checkpointing on" in line and "op-level" in line
