"""LoRA's adapters under bf16: peft makes them fp32 by default (and casts each adapted linear's input to fp32 for
them); the launcher's ranks make them in the base's dtype, and every engine but ZeRO-3 casts a script's back. The
probe measures the working dtype and the fp32 difference; an engine's spec says which it runs
(EngineSpec.fp32_adapters), and the planner adds the difference there (launcher.planner.memory.strategy_activations)."""

import dataclasses

import pytest

from launcher.config.job import StrategyConfig
from launcher.engines import ENGINES
from launcher.planner.memory import analytic_constants, strategy_activations
from launcher.planner.plan import Strategy
from launcher.planner.scoring import score
from launcher.planner.search import make_plan
from tests.planner.conftest import llama_stats

H = 4096
FP32_BLOCK = 6 * H  # q's and v's adapters: two fp32 copies of their shared bf16 input, which bf16 adapters save
FP32_HEAD = 64
FP32_SAC = 4 * H


def constants(m):
    c = analytic_constants(m, "bf16")
    return dataclasses.replace(c, sac_bytes_per_token=2 * 4 * H, fp32_adapter_bytes_per_token=FP32_BLOCK,
                               fp32_adapter_head_bytes_per_token=FP32_HEAD, fp32_adapter_sac_bytes_per_token=FP32_SAC)


def test_a_script_at_zero3_alone_computes_fp32_adapters():
    ds, fsdp = ENGINES["deepspeed"], ENGINES["fsdp"]

    def on(layout):
        return Strategy(layout=layout, micro_batch_size=1, grad_accum_steps=1, activation_checkpointing=False)

    by_stage = {c.zero_stage: ds.fp32_adapters(on(c), script=True)
                for c in ds.candidates(nodes=1, nvme=True, world_size=1)}
    assert by_stage == {0: False, 1: False, 2: False, 3: True}
    assert not any(ds.fp32_adapters(on(c), script=False) for c in ds.candidates(nodes=1, nvme=True, world_size=1))
    assert not any(fsdp.fp32_adapters(on(c), script=script) for c in fsdp.candidates(nodes=2, nvme=True, world_size=2)
                   for script in (True, False))


def test_the_fp32_terms_are_added_where_asked(request_for):
    c = constants(llama_stats())
    s = make_plan(request_for(activations=c)).strategy
    assert strategy_activations(c, s) is c
    r = strategy_activations(c, s, fp32_adapters=True)
    assert r.block_bytes_per_token == c.block_bytes_per_token + FP32_BLOCK
    assert r.sac_bytes_per_token == c.sac_bytes_per_token + FP32_SAC
    assert (r.head_bytes_per_token, r.head_ckpt_bytes_per_token) == (c.head_bytes_per_token + FP32_HEAD,
                                                                     c.head_ckpt_bytes_per_token + FP32_HEAD)
    assert r.ckpt_bytes_per_token == c.ckpt_bytes_per_token  # a checkpointed block keeps its bf16 input either way
    # DeepSpeed's linear: the frozen inputs beside working-dtype adapters, and what fp32 ones add to them.
    frozen = dataclasses.replace(c, frozen_input_bytes_per_token=2 * 3 * H, frozen_head_input_bytes_per_token=2 * H,
                                 fp32_adapter_frozen_input_bytes_per_token=2 * H,
                                 fp32_adapter_frozen_head_input_bytes_per_token=-2 * H)
    released = dataclasses.replace(s, release_frozen_weights=True)
    r = strategy_activations(frozen, released)
    assert (r.block_bytes_per_token, r.head_bytes_per_token) == (c.block_bytes_per_token + 6 * H,
                                                                 c.head_bytes_per_token + 2 * H)
    r = strategy_activations(frozen, released, fp32_adapters=True)
    assert (r.block_bytes_per_token, r.head_bytes_per_token) == (c.block_bytes_per_token + FP32_BLOCK + 8 * H,
                                                                 c.head_bytes_per_token + FP32_HEAD)
    # Constants without the op policy measured keep it unmeasured (0: the planner does not offer the policy).
    assert strategy_activations(dataclasses.replace(c, sac_bytes_per_token=0.0), s,
                                fp32_adapters=True).sac_bytes_per_token == 0.0


def pinned(stage: int) -> StrategyConfig:
    return StrategyConfig(engine="deepspeed", zero_stage=stage, offload_optimizer="none", offload_params="none",
                          micro_batch_size=1, activation_checkpointing=False, loss_chunks=0)


@pytest.mark.parametrize("stage,script", [(2, True), (3, True), (3, False)])
def test_a_scripts_zero3_plan_counts_the_fp32_copies_and_no_other_does(request_for, stage, script):
    m = llama_stats(trainable=4_194_304)
    with_fp32 = request_for(model=m, activations=constants(m), pins=pinned(stage), script=script)
    without = request_for(model=m, activations=dataclasses.replace(
        constants(m), fp32_adapter_bytes_per_token=0.0, fp32_adapter_head_bytes_per_token=0.0),
        pins=pinned(stage), script=script)
    s = make_plan(with_fp32).strategy
    a, b = score(without, s).estimate, score(with_fp32, s).estimate
    grown = sum(b.breakdown[k] - a.breakdown[k] for k in ("activations", "logits"))
    expected = 2048 * (m.num_blocks * FP32_BLOCK + FP32_HEAD) if stage == 3 and script else 0
    assert grown == pytest.approx(expected, rel=1e-6, abs=1)
