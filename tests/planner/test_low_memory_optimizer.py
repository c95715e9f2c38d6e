"""Low-memory optimizers (Strategy.low_memory_optimizer): the state and step terms, and when the planner uses one."""

import dataclasses

import pytest

from launcher.config.job import StrategyConfig
from launcher.engines import ENGINES
from launcher.engines.fsdp.memory import fsdp_states
from launcher.planner.cost import step_time_terms
from launcher.planner.hardware import PROFILES
from launcher.planner.memory import MemoryInputs, analytic_constants
from launcher.planner.plan import Strategy
from launcher.planner.search import make_plan
from launcher.planner.terms import (
    LOW_BIT_STEP_COPIES,
    TORCH_HOST_ADAM_RATIO,
    optimizer_state_bytes,
    optimizer_step_s,
    optimizer_step_temp_bytes,
)
from tests.planner.conftest import llama_stats


def _inp(m, n=2, hw="cpu"):
    return MemoryInputs(model=m, world_size=n, gpus_per_node=n, nodes=1, seq_len=128, precision="fp32",
                        optimizer="adamw", hardware=PROFILES[hw], activations=analytic_constants(m, "fp32"))


def _s(opt="none", **kw):
    base = dict(engine="fsdp", zero_stage=None, fsdp_reshard_after_forward=True, offload_optimizer="none",
                offload_params="none", micro_batch_size=1, grad_accum_steps=1, activation_checkpointing=False,
                low_memory_optimizer=opt)
    base.update(kw)
    return Strategy.from_json(base)


def _bert(vocab):
    """MiniLM's shape: a 384-wide encoder whose word-embedding table has ``vocab`` rows."""
    m = llama_stats(num_params=22_000_000, blocks=6, h=384, inter=1536, vocab=vocab)
    return dataclasses.replace(m, task="seq_cls", tied_embeddings=True)


def test_adamw_keeps_eight_bytes_per_trainable_parameter_per_shard():
    m = llama_stats()
    assert optimizer_state_bytes(_inp(m, 8), _s(), 8) == 8 * m.trainable_params / 8


@pytest.mark.parametrize(("opt", "per_param"), [("adamw8bit", 2 * (1 + 4 / 256)), ("adamw4bit", 2 * (0.5 + 4 / 128))])
def test_low_bit_state_is_codes_plus_one_fp32_scale_per_block(opt, per_param):
    # torchao OptimState8bit / 4bit: uint8 codes (4-bit packed two per byte) and numel/block fp32 scales, per moment.
    m = llama_stats()  # 32000 x 4096 tables: every shard's size is a multiple of both blocks
    assert optimizer_state_bytes(_inp(m, 8), _s(opt), 8) == pytest.approx(per_param * m.trainable_params / 8)


def test_a_table_shard_the_block_does_not_divide_keeps_fp32_moments():
    # 30522 rows over 2 ranks: 15261 x 384 elements, a multiple of 128 (4-bit) but not of 256 (8-bit), so torchao
    # (adam.py _new_buffer) keeps that table's 8-bit moments in fp32 and quantizes its 4-bit ones.
    m, table = _bert(30522), 15261 * 384
    rest = (m.trainable_params - 30522 * 384) / 2
    assert optimizer_state_bytes(_inp(m), _s("adamw8bit"), 2) == pytest.approx(8 * table + 2 * (1 + 4 / 256) * rest)
    assert optimizer_state_bytes(_inp(m), _s("adamw4bit"), 2) == pytest.approx(2 * (0.5 + 4 / 128) * (table + rest))
    # An even vocabulary quantizes under both.
    even = _bert(30520)
    assert optimizer_state_bytes(_inp(even), _s("adamw8bit"), 2) < 2.1 * even.trainable_params / 2


def test_adafactor_keeps_a_row_and_a_column_per_matrix():
    m = _bert(30522)
    state = optimizer_state_bytes(_inp(m), _s("adafactor"), 2)
    # The table: its rank's rows plus the replicated column vector, 4 bytes each; the blocks a few KB more.
    assert 4 * (15261 + 384) <= state < 4 * (15261 + 384) + 4 * 2 * m.trainable_params / 384
    assert state < 0.01 * optimizer_state_bytes(_inp(m), _s(), 2)


def test_step_temporaries_are_copies_of_the_largest_local_tensor():
    m = llama_stats()
    local = 4 * m.largest_layer_params / 2
    # Eager torchao on the host holds six fp32 copies; compiled on CUDA none; Adafactor one variance estimate.
    assert optimizer_step_temp_bytes(_inp(m), _s("adamw8bit"), 2, on_host=True) == LOW_BIT_STEP_COPIES * local
    assert optimizer_step_temp_bytes(_inp(m, hw="a100-80gb"), _s("adamw4bit"), 2, on_host=False) == 0
    assert optimizer_step_temp_bytes(_inp(m), _s("adafactor"), 2, on_host=True) == local
    # torch's AdamW: its denominator's two (measured on the FSDP2 twins of the dev cells); SGD none.
    assert optimizer_step_temp_bytes(_inp(m), _s(), 2, on_host=True) == 2 * local
    sgd = dataclasses.replace(_inp(m), optimizer="sgd")
    assert optimizer_step_temp_bytes(sgd, _s(), 2, on_host=False) == 0


def test_fsdp_states_count_the_smaller_state_and_the_step_copies():
    m = _bert(30520)
    plain, low = fsdp_states(_inp(m), _s()), fsdp_states(_inp(m), _s("adamw8bit"))
    assert low.optimizer == optimizer_state_bytes(_inp(m), _s("adamw8bit"), 2) < plain.optimizer / 3
    assert low.step_extra - plain.step_extra == (LOW_BIT_STEP_COPIES - 2) * 4 * m.largest_layer_params / 2
    # Under CPUOffloadPolicy the state and the step's copies are on the host.
    off = fsdp_states(_inp(m, hw="a100-80gb"), _s("adamw8bit", offload_optimizer="cpu", offload_params="cpu"))
    assert off.optimizer == 0 and off.host_step_extra - 4 * m.trainable_params / 2 == pytest.approx(
        LOW_BIT_STEP_COPIES * 4 * m.largest_layer_params / 2)


def test_the_eager_low_bit_step_on_the_host_is_priced_at_its_measured_ratio_to_adamw():
    """benchmarks/results/lowbit-step.md: the eager step runs 141 (8-bit) and 80 (4-bit) times torch's AdamW over
    weight-sized tensors, one thread: the extra time is (ratio - 1) AdamW steps over the rank's shard, at the node's
    rate shared by its ranks (2 here). Was 7 for both, 11-20 times too cheap. torch's AdamW runs TORCH_HOST_ADAM_RATIO
    times slower than the DeepSpeed CPU Adam the profile's rate is of (issue 37 §4; was priced at that rate);
    bitsandbytes' CPU step (paged_adamw8bit on CPU ranks) at 21."""
    m = _bert(30520)
    shard, hw = m.trainable_params / 2, PROFILES["cpu"]
    for opt, ratio in (("adamw8bit", 141), ("adamw4bit", 80), ("paged_adamw8bit", 21)):
        got = optimizer_step_s(_inp(m), _s(opt), shard, on_host=True)
        assert got == pytest.approx((ratio - 1) * TORCH_HOST_ADAM_RATIO * shard * 2 / hw.cpu_adam_params_per_s)


def test_eager_low_bit_step_costs_time_on_cpu_ranks_only():
    m = _bert(30520)
    assert optimizer_step_s(_inp(m), _s("adamw8bit"), m.trainable_params / 2, on_host=True) > 0
    assert optimizer_step_s(_inp(m), _s("adafactor"), m.trainable_params / 2, on_host=True) == 0
    assert optimizer_step_s(_inp(m, hw="a100-80gb"), _s("adamw8bit"), m.trainable_params / 2, on_host=False) == 0
    terms = step_time_terms(_inp(m), _s("adamw8bit"), 10**6)
    assert terms["optimizer"] > 0 and "optimizer" not in step_time_terms(_inp(m), _s(), 10**6)


def test_every_engine_implements_it():
    # DeepSpeed on some layouts only (EngineSpec.lever_values; tests/planner/test_deepspeed_low_memory.py).
    assert {name for name, spec in ENGINES.items() if "low_memory_optimizer" in spec.levers} == {
        "fsdp", "deepspeed", "plain"}


def _cpu_request(request_for, **kw):
    m = _bert(30520)
    return request_for(model=m, gpus_per_node=2, seq_len=128, global_batch_size=2, precision="fp32",
                       hardware=PROFILES["cpu"], **kw)


def test_the_planner_keeps_adamw_when_it_fits(request_for):
    # On FSDP2, where the 8-bit states save more than the eager step's copies of the (sharded) largest tensor add;
    # the plain engine steps the whole vocabulary table on a CPU rank, whose six fp32 copies outweigh the saving.
    plan = make_plan(_cpu_request(request_for, budget_bytes=10**10, allow_levers=("adamw8bit", "adafactor"),
                                  pins=StrategyConfig(engine="fsdp")))
    assert plan.strategy.low_memory_optimizer == "none"
    decision = next(d for d in plan.levers if d.lever == "low_memory_optimizer")
    assert (decision.used, decision.why) == (False, "fits_without") and decision.peak_delta_bytes < 0


def test_the_planner_uses_an_allowed_low_memory_optimizer_only_to_fit(request_for):
    from launcher.planner.search import evaluate

    base = _cpu_request(request_for, budget_bytes=10**10)
    # Every candidate the search scores without permission is AdamW (a budget nothing meets: offload included).
    adamw_peaks = [sc.estimate.peak_bytes for sc in evaluate(_cpu_request(request_for, budget_bytes=10**6))]
    # A budget just below the smallest AdamW plan: only a low-memory optimizer fits.
    budget = int(min(adamw_peaks) / (1 - base.pins.safety_margin)) - 1
    tight = _cpu_request(request_for, budget_bytes=budget, allow_levers=("adamw8bit", "adamw4bit", "adafactor"))
    plan = make_plan(tight)
    assert plan.strategy.low_memory_optimizer != "none"
    decision = next(d for d in plan.levers if d.lever == "low_memory_optimizer")
    assert (decision.used, decision.why) == (True, "needed_to_fit")
    # Without permission the same budget has no plan with a low-memory optimizer.
    from launcher.errors import NoPlanError

    with pytest.raises(NoPlanError):
        make_plan(_cpu_request(request_for, budget_bytes=budget))


def _fsdp_strategies(req):
    from launcher.planner.candidates import candidates

    return candidates(req)


def test_pinned_on_deepspeed_zero3_it_admits_nothing(request_for):
    from launcher.config.job import StrategyConfig
    from launcher.errors import ConfigError
    from launcher.planner.candidates import candidates

    # ZeRO-3 steps sub-groups of padded per-parameter partitions: not offered (the one refusal line names why).
    req = request_for(pins=StrategyConfig(engine="deepspeed", zero_stage=3, low_memory_optimizer="adamw8bit"),
                      allow_levers=("adamw8bit",))
    with pytest.raises(ConfigError, match=r"'adamw8bit' is not offered with DeepSpeed ZeRO-3.*sub-groups"):
        candidates(req)


def test_not_tried_under_lora_or_in_place_of_sgd(request_for):
    from launcher.planner.levers import options

    allow = ("adamw8bit", "adamw4bit", "adafactor")
    assert {o.low_memory_optimizer for o in options(request_for(allow_levers=allow), frozenset(
        {"low_memory_optimizer"}), 1)} == {"none", *allow}
    lora = llama_stats(trainable=4_000_000)
    for req in (request_for(model=lora, allow_levers=allow), request_for(optimizer="sgd", allow_levers=allow)):
        assert {o.low_memory_optimizer for o in options(req, frozenset({"low_memory_optimizer"}), 1)} == {"none"}


def test_the_accelerate_export_tells_the_script_which_optimizer_the_plan_assumes(request_for):
    from pathlib import Path

    req = _cpu_request(request_for, budget_bytes=10**10, allow_levers=("adamw4bit",))
    plan = make_plan(dataclasses.replace(req, pins=dataclasses.replace(req.pins, engine="fsdp",
                                                                       low_memory_optimizer="adamw4bit")))
    notes = ENGINES["fsdp"].accelerate_notes(plan, Path("."), optimizer=req.optimizer)
    assert any("torchao.optim.AdamW4bit" in n for n in notes)
    plain = make_plan(dataclasses.replace(req, pins=dataclasses.replace(req.pins, engine="fsdp")))
    plain_notes = ENGINES["fsdp"].accelerate_notes(plain, Path("."), optimizer=req.optimizer)
    assert not any("optimizer" in n for n in plain_notes)


def test_low_bit_adamw_steps_in_backward_adafactor_does_not_and_pure_bf16_only_where_paired(request_for):
    """Issue 37 §3: 8-/4-bit AdamW with the step in backward (torchtune's low-memory recipe); Adafactor's sharded step
    all-reduces, so not in backward's hooks; pure bf16 only beside the optimizers the engine pairs with it."""
    from launcher.planner.levers import options

    allow = ("adamw8bit", "adamw4bit", "adafactor", "pure_bf16")
    levers = frozenset({"low_memory_optimizer", "optimizer_in_backward", "pure_bf16"})
    unpaired = {(o.low_memory_optimizer, o.optimizer_in_backward, o.pure_bf16)
                for o in options(request_for(allow_levers=allow), levers, 1)}
    assert ("adamw8bit", True, False) in unpaired and ("adamw4bit", True, False) in unpaired
    assert ("adafactor", True, False) not in unpaired and ("adafactor", False, False) in unpaired
    assert not any(opt != "none" and bf16 for opt, _, bf16 in unpaired)  # the engine pairs none here
    paired = {(o.low_memory_optimizer, o.optimizer_in_backward, o.pure_bf16)
              for o in options(request_for(allow_levers=allow), levers, 1, pure_bf16_optimizers=frozenset(
                  {"adamw8bit", "adamw4bit"}))}
    assert {("adamw8bit", True, True), ("adamw4bit", True, True)} <= paired
    assert not any(opt == "adafactor" and (in_bwd or bf16) for opt, in_bwd, bf16 in paired)


def test_among_equally_fast_plans_the_mildest_math_lever_wins(request_for):
    """On CUDA the low-bit step costs no time, so AdamW, 8-bit and 4-bit plans of one layout tie: the job's own
    math wins where it fits, then 8-bit (levers.math_departure), and 4-bit only where it alone fits."""
    import dataclasses

    from launcher.config.job import StrategyConfig
    from launcher.planner.scoring import score
    from launcher.planner.search import make_plan

    pins = StrategyConfig(engine="fsdp", fsdp_reshard_after_forward=True, offload_optimizer="none",
                          offload_params="none", micro_batch_size=1, activation_checkpointing=True,
                          checkpoint_every=1, checkpoint_policy="full", loss_chunks=0, activation_offload=False,
                          optimizer_in_backward=False, pure_bf16=False, qlora=False)
    req = request_for(pins=pins, allow_levers=("adamw8bit", "adamw4bit"))
    chosen = make_plan(req).strategy
    peak = {opt: score(req, dataclasses.replace(chosen, low_memory_optimizer=opt)).estimate.peak_bytes
            for opt in ("none", "adamw8bit", "adamw4bit")}
    assert chosen.low_memory_optimizer == "none" and peak["none"] > peak["adamw8bit"] > peak["adamw4bit"]

    def planned_under(usable: float) -> str:
        budget = int(usable / (1 - req.pins.safety_margin))
        return make_plan(dataclasses.replace(req, budget_bytes=budget)).strategy.low_memory_optimizer

    assert planned_under((peak["none"] + peak["adamw8bit"]) / 2) == "adamw8bit"  # 4-bit's smaller peak loses
    assert planned_under((peak["adamw8bit"] + peak["adamw4bit"]) / 2) == "adamw4bit"


def test_the_step_in_backward_with_a_low_bit_adamw_holds_its_eager_copies_in_the_hooks_on_cpu_ranks_only():
    """CPU ranks step torchao's AdamW8bit eagerly (LOW_BIT_STEP_COPIES fp32 copies of the tensor): in the root's
    hook beside its reduce buffers, and a block tensor's in the blocks' backward. On CUDA the compiled step holds
    none (terms.optimizer_step_temp_bytes), so the combination costs what the step in backward alone does."""
    import dataclasses

    from launcher.engines.fsdp.memory import fsdp_states
    from launcher.planner.terms import LOW_BIT_STEP_COPIES
    from tests.planner.test_backward_end import FSDP, gpt2_stats, inputs

    m = dataclasses.replace(gpt2_stats(), grad_layout=[[128 * 512, 0], [4096 * 128, -1]])
    in_bwd = dataclasses.replace(FSDP, optimizer_in_backward=True)
    low_bit = dataclasses.replace(in_bwd, low_memory_optimizer="adamw8bit")
    cpu, cuda = inputs(m), inputs(m, hardware="a100-80gb")
    plain, with_low_bit = fsdp_states(cpu, in_bwd), fsdp_states(cpu, low_bit)
    copies = LOW_BIT_STEP_COPIES * 4 * 4096 * 128 / 2  # of the root's vocabulary table's shard
    # The root's hook: the copies beside its reduce input and output, the larger of it and the plain reduce.
    assert with_low_bit.backward_end_extra > plain.backward_end_extra and with_low_bit.backward_end_extra > copies
    assert with_low_bit.dequant_transient == LOW_BIT_STEP_COPIES * 4 * 128 * 512 / 2  # the largest block tensor
    assert (with_low_bit.step_extra, plain.dequant_transient) == (0, 0)  # no step-time gradient, nothing else
    on_cuda = fsdp_states(cuda, low_bit)
    assert (on_cuda.backward_end_extra, on_cuda.dequant_transient) == (fsdp_states(cuda, in_bwd).backward_end_extra, 0)
