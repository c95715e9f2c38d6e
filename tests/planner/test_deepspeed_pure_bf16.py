"""Pure bf16 on DeepSpeed (issue 21): bf16_master_weights_and_grads + bf16_optimizer_states at ZeRO-1/2/3, the
stochastically rounding AdamW as DeepSpeed's client optimizer; not at ZeRO-0 or with optimizer offload."""

import dataclasses
from pathlib import Path

import pytest

from launcher.config.job import StrategyConfig
from launcher.engines import ENGINES
from launcher.engines.deepspeed.memory import deepspeed_states, flat_partition_elems, sub_group_elems
from launcher.errors import ConfigError
from launcher.planner.candidates import candidates
from launcher.planner.cost import step_time_terms
from launcher.planner.hardware import PROFILES
from launcher.planner.terms import SR_STEP_COPIES
from tests.planner.test_deepspeed_low_memory import _buckets, _gpt2s, _inp, _s
from tests.planner.test_deepspeed_low_memory import _offered as offered

PARTITION = 724_352
"""GPT-2-small's flat partition on 2 ranks (flat_partition_elems)."""


def _bf16(stage, hw="cpu", **kw):
    m = _gpt2s()
    return m, _inp(m, hw=hw, precision="bf16"), _s(stage, pure_bf16=True, **kw)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_masters_and_states_take_bf16_at_every_stage(stage):
    # A bf16 master partition (2Ψ/N: ZeRO-1/2 clone it, ZeRO-3 clones too: it compares a torch.device with a
    # string and never aliases) and bf16 AdamW states (4Ψ/N), against 4 + 8 in mixed bf16.
    m, inp, s = _bf16(stage)
    pure = deepspeed_states(inp, s, _buckets())
    mixed = deepspeed_states(inp, dataclasses.replace(s, pure_bf16=False), _buckets())
    psi_n = m.trainable_params / 2
    assert pure.optimizer == pytest.approx(6 * psi_n)
    assert mixed.optimizer == pytest.approx(12 * psi_n)
    assert pure.params == mixed.params  # the working bf16 parameters are the same


def test_zero12_step_rounds_the_whole_flat_partition_on_cpu_only():
    # Measured on the dev cells (z1/z2 gpt2s, 32 tokens): the step holds the flat bf16 gradient (the master gradient,
    # no fp32 conversion) and 10.25 fp32 copies of the partition the rounding AdamW steps as one tensor.
    for stage in (1, 2):
        m, inp, s = _bf16(stage)
        assert flat_partition_elems(inp) == PARTITION
        st = deepspeed_states(inp, s, _buckets())
        assert st.step_extra == pytest.approx(2 * m.trainable_params / 2 + SR_STEP_COPIES * 4 * PARTITION)
    # On CUDA the step is compiled and holds no copies: the flatten instant is the larger, 16-bit gradients (whole at
    # ZeRO-1, a partition at ZeRO-2 with averaged_gradients' copy) and the flat bf16 partition.
    m, inp, s = _bf16(2, hw="a100-80gb")
    assert deepspeed_states(inp, s, _buckets()).step_extra == pytest.approx(3 * 2 * m.trainable_params / 2)
    m, inp, s = _bf16(1, hw="a100-80gb")
    assert deepspeed_states(inp, s, _buckets()).step_extra == pytest.approx(2 * m.trainable_params
                                                                            + 2 * m.trainable_params / 2)


def test_zero3_step_rounds_one_sub_group():
    m, inp, s = _bf16(3)
    sub = sub_group_elems(inp, _buckets().sub_group_size)
    st = deepspeed_states(inp, s, _buckets())
    assert st.step_extra == pytest.approx((2 + SR_STEP_COPIES * 4) * sub)
    small = dataclasses.replace(_buckets(), sub_group_size=1000)
    assert deepspeed_states(inp, s, small).step_extra < st.step_extra / 2


def test_sgd_keeps_torchs_step_without_rounding_copies():
    m, inp, s = _bf16(2)
    sgd = deepspeed_states(dataclasses.replace(inp, optimizer="sgd"), s, _buckets())
    assert sgd.step_extra == pytest.approx(3 * 2 * m.trainable_params / 2)


def test_step_time_adds_the_eager_rounding_step_on_cpu_and_the_same_traffic():
    m, inp, s = _bf16(2)
    pure = step_time_terms(inp, s, 10**6)
    mixed = step_time_terms(inp, dataclasses.replace(s, pure_bf16=False), 10**6)
    assert pure["optimizer"] > 0 and "optimizer" not in mixed
    # DeepSpeed reduces and gathers bf16 either way: the collectives move the same bytes.
    assert pure["communication"] == mixed["communication"]
    _, gpu, gs = _bf16(2, hw="a100-80gb")
    assert step_time_terms(gpu, gs, 10**6)["optimizer"] == 0.0


def _offered(request_for, **kw):
    return offered(request_for, "pure_bf16", "bf16", ("pure_bf16",), **kw)


def test_offered_at_zero123_without_optimizer_offload_only(request_for):
    offered = _offered(request_for)
    assert offered[0, "none"] == {False}
    assert offered[1, "none"] == offered[2, "none"] == offered[3, "none"] == {False, True}
    assert all(v == {False} for (stage, off), v in offered.items() if off != "none")
    assert "pure_bf16" in ENGINES["deepspeed"].levers


@pytest.mark.parametrize("pins, words", [
    (dict(zero_stage=0), "is not offered with DeepSpeed ZeRO-0: DeepSpeed keeps bf16 master weights"),
    (dict(zero_stage=2, offload_optimizer="cpu"), "is not offered with DeepSpeed ZeRO-2 (optimizer offload: cpu)"),
])
def test_a_pinned_pure_bf16_where_deepspeed_cannot_is_refused_in_one_line(request_for, pins, words):
    req = request_for(model=_gpt2s(), gpus_per_node=2, seq_len=256, global_batch_size=4, precision="bf16",
                      hardware=PROFILES["cpu"], allow_levers=("pure_bf16",),
                      pins=StrategyConfig(engine="deepspeed", pure_bf16=True, **pins))
    with pytest.raises(ConfigError) as err:
        candidates(req)
    text = str(err.value).strip()
    assert "\n" not in text and f"strategy.pure_bf16: True {words}" in text
    assert "leave strategy.pure_bf16 out or pin another layout" in text


def test_accelerate_notes_name_the_rounding_client_optimizer(request_for):
    from launcher.planner.search import make_plan

    pins = StrategyConfig(engine="deepspeed", zero_stage=2, offload_optimizer="none", pure_bf16=True)
    req = request_for(model=_gpt2s(), gpus_per_node=2, seq_len=256, global_batch_size=4, precision="bf16",
                      hardware=PROFILES["cpu"], allow_levers=("pure_bf16",), pins=pins, budget_bytes=10**10)
    plan = make_plan(req)
    assert plan.strategy.pure_bf16
    notes = " ".join(ENGINES["deepspeed"].accelerate_notes(plan, Path("."), optimizer=req.optimizer))
    assert "bf16_stochastic_round=True" in notes and "not DummyOptim" in notes and "optimizers=(opt, None)" in notes
    assert "torchao.optim._AdamW(" in notes and "DeepSpeed's own AdamW" in notes


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_accelerate_notes_follow_the_jobs_optimizer_under_pure_bf16(request_for, optimizer):
    # ds_config.json keeps SGD's block (torch's SGD, to nearest: DummyOptim) and leaves Adam to the client optimizer,
    # the rounding _AdamBase with is_adamw=False (engines.deepspeed.emit._fill_optimizer, worker build_optimizer;
    # tests/emit/test_emit_deepspeed.py checks the blocks).
    from launcher.planner.search import make_plan

    pins = StrategyConfig(engine="deepspeed", zero_stage=2, offload_optimizer="none", pure_bf16=True)
    req = request_for(model=_gpt2s(), gpus_per_node=2, seq_len=256, global_batch_size=4, precision="bf16",
                      hardware=PROFILES["cpu"], allow_levers=("pure_bf16",), pins=pins, budget_bytes=10**10,
                      optimizer=optimizer)
    plan = make_plan(req)
    assert plan.strategy.pure_bf16
    notes = " ".join(ENGINES["deepspeed"].accelerate_notes(plan, Path("."), optimizer=optimizer))
    if optimizer == "sgd":
        assert "pass accelerate.utils.DummyOptim" in notes and "names the job's SGD" in notes
        assert "torchao.optim" not in notes and "not DummyOptim" not in notes and "optimizers=(opt, None)" not in notes
    else:
        assert "not DummyOptim" in notes and "DeepSpeed's own Adam " in notes
        assert "is_adamw=False" in notes and "bf16_stochastic_round=True" in notes and "_AdamW" not in notes


@pytest.mark.parametrize("stage", [1, 2])
@pytest.mark.parametrize("opt", ["adamw8bit", "adamw4bit"])
def test_zero12_pairs_pure_bf16_with_a_low_bit_client_optimizer(stage, opt):
    # The client optimizer steps the flat bf16 master with torchao's low-bit AdamW and bf16_stochastic_round: the
    # master at 2 bytes, the quantized moments of the one flat tensor (or, where torchao leaves it unquantized,
    # moments in the master's bf16), and the step's rounding copies of the partition on CPU ranks.
    from launcher.planner.terms import low_bit_tensor_bytes

    m, inp, s = _bf16(stage, low_memory_optimizer=opt)
    st = deepspeed_states(inp, s, _buckets())
    moments = low_bit_tensor_bytes(opt, PARTITION, param_bytes=2)
    assert st.optimizer == pytest.approx(2 * m.trainable_params / 2 + moments)
    assert st.step_extra == pytest.approx(2 * m.trainable_params / 2 + SR_STEP_COPIES * 4 * PARTITION)
    assert low_bit_tensor_bytes(opt, 1001, param_bytes=2) == 1001 * 4  # unquantized: two bf16 moments
    offered_values = ENGINES["deepspeed"].lever_values(s.layout)
    assert opt in offered_values["low_memory_optimizer"][0] and "pure_bf16" not in offered_values
    assert opt in ENGINES["deepspeed"].pure_bf16_optimizers
