"""Low-memory optimizers on DeepSpeed (issue 21): DeepSpeed's client optimizer, per ZeRO stage.

ZeRO-0 keeps the parameters' shapes (all three optimizers, the per-tensor terms); ZeRO-1/2 step one flat fp32
partition (the low-bit AdamWs only, quantized or not as a whole); ZeRO-3 and optimizer offload offer none.
"""

import dataclasses
from pathlib import Path

import pytest

from launcher.config.job import StrategyConfig
from launcher.engines import ENGINES
from launcher.engines.deepspeed.memory import deepspeed_states, flat_partition_elems
from launcher.errors import ConfigError
from launcher.planner.candidates import candidates
from launcher.planner.hardware import PROFILES
from launcher.planner.memory import MemoryInputs, analytic_constants
from launcher.planner.plan import Buckets, Strategy
from launcher.planner.terms import (
    LOW_BIT_STEP_COPIES,
    low_bit_tensor_bytes,
    optimizer_state_bytes,
    optimizer_step_temp_bytes,
)
from tests.planner.conftest import llama_stats

ALL = ("adamw8bit", "adamw4bit", "adafactor")
GPT2_SMALL_PARAMS = 1_448_704
"""The accuracy matrix's GPT-2-small (h 128, 4 blocks, 4096 tokens): 724,352 elements per rank's partition on 2."""


def _gpt2s(trainable=GPT2_SMALL_PARAMS):
    m = llama_stats(num_params=trainable, blocks=4, h=128, inter=512, vocab=4096)
    return dataclasses.replace(m, model_type="gpt2", tied_embeddings=True)


def _inp(m, n=2, hw="cpu", precision="fp32"):
    return MemoryInputs(model=m, world_size=n, gpus_per_node=n, nodes=1, seq_len=256, precision=precision,
                        optimizer="adamw", hardware=PROFILES[hw], activations=analytic_constants(m, precision))


def _s(stage, opt="none", **kw):
    base = dict(engine="deepspeed", zero_stage=stage, fsdp_reshard_after_forward=None, offload_optimizer="none",
                offload_params="none", micro_batch_size=2, grad_accum_steps=1, activation_checkpointing=False,
                low_memory_optimizer=opt)
    base.update(kw)
    return Strategy.from_json(base)


def _buckets():
    return Buckets(reduce_bucket_size=10**6, allgather_bucket_size=10**6, stage3_prefetch_bucket_size=10**6,
                   stage3_max_live_parameters=10**6, stage3_param_persistence_threshold=10**4)


def test_zero12_partition_is_padded_to_2n_elements():
    # stage_1_and_2.py: the flat group is padded to a multiple of 2N, each rank gets 1/N of it.
    assert flat_partition_elems(_inp(_gpt2s())) == 724_352
    assert flat_partition_elems(_inp(_gpt2s(1001), n=4)) == 2 * 126  # 1001 -> 1008 over 4 ranks


def test_zero12_low_bit_state_is_the_flat_partition_quantized_or_not():
    # 724,352 = 5659 x 128 but 2829.5 x 256: the 4-bit moments quantize, the 8-bit ones stay fp32 (torchao
    # _new_buffer quantizes a tensor whole or not at all), whatever the per-tensor shapes would allow.
    p, master = 724_352, 4 * 724_352
    for stage in (1, 2):
        st4 = deepspeed_states(_inp(_gpt2s()), _s(stage, "adamw4bit"), _buckets())
        st8 = deepspeed_states(_inp(_gpt2s()), _s(stage, "adamw8bit"), _buckets())
        assert st4.optimizer == pytest.approx(master + 2 * (0.5 + 4 / 128) * p)
        assert st8.optimizer == pytest.approx(master + 8 * p)
    assert low_bit_tensor_bytes("adamw8bit", 256 * 4096) == pytest.approx(2 * (1 + 4 / 256) * 256 * 4096)
    assert low_bit_tensor_bytes("adamw8bit", 2048) == 8 * 2048  # under 4096 elements: fp32 moments


def test_zero12_eager_step_copies_the_whole_partition_on_cpu_only():
    # AdamW's fp32 step holds three partition-sized fp32 tensors (the gradient, its denominator's two); torchao's
    # eager step holds six copies of the one tensor it steps, here the partition; compiled on CUDA none.
    m, p = _gpt2s(), 724_352
    plain = deepspeed_states(_inp(m), _s(2), _buckets())
    low = deepspeed_states(_inp(m), _s(2, "adamw8bit"), _buckets())
    assert plain.step_extra == pytest.approx(3 * 4 * m.trainable_params / 2)
    assert low.step_extra == pytest.approx(4 * m.trainable_params / 2 + LOW_BIT_STEP_COPIES * 4 * p)
    gpu = deepspeed_states(_inp(m, hw="a100-80gb"), _s(2, "adamw8bit"), _buckets())
    assert gpu.step_extra == pytest.approx(4 * m.trainable_params / 2)


def test_zero0_uses_the_per_tensor_terms_of_one_unsharded_rank():
    m = _gpt2s()
    for opt in (*ALL, "none"):
        s = _s(0, opt)
        # fp32: the optimizer steps the fp32 parameters themselves (no master copy), their whole gradients and
        # its temporaries of the largest tensor (measured on the ZeRO-0 dev cells: exact).
        st = deepspeed_states(_inp(m), s, _buckets())
        assert st.optimizer == pytest.approx(optimizer_state_bytes(_inp(m), s, 1))
        assert st.step_extra == pytest.approx(4 * m.trainable_params
                                              + optimizer_step_temp_bytes(_inp(m), s, 1, on_host=True))
        # bf16: FP16_UnfusedOptimizer's fp32 clone of every parameter is the master.
        bf16 = deepspeed_states(_inp(m, precision="bf16"), s, _buckets())
        assert bf16.optimizer == pytest.approx(4 * m.trainable_params + optimizer_state_bytes(_inp(m), s, 1))
    # Adafactor factors the parameters ZeRO-0 keeps 2-D: a row and a column per matrix, far below Adam's 8 bytes.
    assert optimizer_state_bytes(_inp(m), _s(0, "adafactor"), 1) < 0.05 * 8 * m.trainable_params


def _offered(request_for, field="low_memory_optimizer", precision="fp32", allow_levers=ALL, **kw):
    """The values of the lever ``field`` DeepSpeed's candidates take, per (ZeRO stage, optimizer offload)."""
    req = request_for(model=_gpt2s(), gpus_per_node=2, seq_len=256, global_batch_size=4, precision=precision,
                      hardware=PROFILES["cpu"], allow_levers=allow_levers, **kw)
    out: dict[tuple, set] = {}
    for s in candidates(req):
        if s.engine == "deepspeed":
            out.setdefault((s.layout.zero_stage, s.layout.offload_optimizer), set()).add(getattr(s, field))
    return out


def test_the_planner_offers_each_stage_only_what_runs_there(request_for):
    offered = _offered(request_for)
    assert offered[0, "none"] == {"none", *ALL}
    assert offered[1, "none"] == offered[2, "none"] == {"none", "adamw8bit", "adamw4bit"}
    assert offered[3, "none"] == {"none"}
    for (stage, offload), opts in offered.items():
        if offload != "none":
            assert opts == {"none"}, (stage, offload)


def test_a_pinned_low_bit_optimizer_with_optimizer_offload_is_refused_in_one_line(request_for):
    pins = StrategyConfig(engine="deepspeed", zero_stage=2, offload_optimizer="cpu", low_memory_optimizer="adamw8bit")
    req = request_for(model=_gpt2s(), gpus_per_node=2, seq_len=256, global_batch_size=4, precision="fp32",
                      hardware=PROFILES["cpu"], allow_levers=("adamw8bit",), pins=pins)
    with pytest.raises(ConfigError) as err:
        candidates(req)
    text = str(err.value)
    assert "\n" not in text.strip()
    assert "strategy.low_memory_optimizer: 'adamw8bit' is not offered with DeepSpeed ZeRO-2 (optimizer offload: " \
           "cpu)" in text and "DeepSpeedCPUAdam" in text


def test_adafactor_pinned_on_zero2_names_the_flat_partition(request_for):
    pins = StrategyConfig(engine="deepspeed", zero_stage=2, offload_optimizer="none", low_memory_optimizer="adafactor")
    req = request_for(model=_gpt2s(), gpus_per_node=2, seq_len=256, global_batch_size=4, precision="fp32",
                      hardware=PROFILES["cpu"], allow_levers=("adafactor",), pins=pins)
    with pytest.raises(ConfigError, match="one flat 1-D partition"):
        candidates(req)


def test_the_lever_decision_says_the_layout_lacks_it(request_for):
    from launcher.planner.search import make_plan

    pins = StrategyConfig(engine="deepspeed", zero_stage=3, offload_optimizer="none", offload_params="none")
    req = request_for(model=_gpt2s(), gpus_per_node=2, seq_len=256, global_batch_size=4, precision="fp32",
                      hardware=PROFILES["cpu"], allow_levers=("adamw8bit",), pins=pins, budget_bytes=10**10)
    decision = next(d for d in make_plan(req).levers if d.lever == "low_memory_optimizer")
    assert (decision.used, decision.why) == (False, "engine_lacks")
    # The layout's own reason, in the plan and its lever line; an engine that lacks the lever has none.
    from launcher.cli.render import lever_line
    from launcher.planner.plan import LeverDecision

    assert decision.layout_reason.startswith("ZeRO-3 steps flat sub-groups")
    assert "not offered with this plan's layout: ZeRO-3 steps flat sub-groups" in lever_line(decision)
    assert LeverDecision.from_json(decision.to_json()) == decision
    oib = next(d for d in make_plan(req).levers if d.lever == "optimizer_in_backward")
    assert oib.layout_reason == "" and "layout_reason" not in oib.to_json()


def test_exports_say_where_the_optimizer_is_built(request_for):
    from launcher.planner.search import make_plan

    pins = StrategyConfig(engine="deepspeed", zero_stage=2, offload_optimizer="none", low_memory_optimizer="adamw4bit")
    req = request_for(model=_gpt2s(), gpus_per_node=2, seq_len=256, global_batch_size=4, precision="fp32",
                      hardware=PROFILES["cpu"], allow_levers=("adamw4bit",), pins=pins, budget_bytes=10**10)
    plan = make_plan(req)
    notes = " ".join(ENGINES["deepspeed"].accelerate_notes(plan, Path("."), optimizer=req.optimizer))
    assert "torchao.optim.AdamW4bit" in notes and "not DummyOptim" in notes and "--optim adamw_torch_4bit" in notes
    plain = make_plan(dataclasses.replace(req, pins=dataclasses.replace(pins, low_memory_optimizer=None),
                                          allow_levers=()))
    assert "DummyOptim" in " ".join(ENGINES["deepspeed"].accelerate_notes(plain, Path("."),
                                                                          optimizer=req.optimizer))
