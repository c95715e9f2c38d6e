"""Pure bf16 (Strategy.pure_bf16): bf16 parameters, gradients and optimizer states, no fp32 master."""

import dataclasses

import pytest

from launcher.engines import engine_spec
from launcher.engines.fsdp.memory import fsdp_states
from launcher.planner.hardware import PROFILES
from launcher.planner.levers import options
from launcher.planner.memory import MemoryInputs, analytic_constants, estimate_memory
from launcher.planner.plan import Strategy
from launcher.planner.search import size_buckets
from launcher.planner.terms import (
    SR_CPU_STEP_RATIO,
    SR_STEP_COPIES,
    TORCH_HOST_ADAM_RATIO,
    optimizer_step_s,
    optimizer_step_temp_bytes,
)


def fsdp(pure: bool, accum: int = 1, offload: str = "none") -> Strategy:
    return Strategy.from_json(dict(engine="fsdp", zero_stage=None, fsdp_reshard_after_forward=True,
                                   fsdp_sharding="full", offload_optimizer=offload, offload_params=offload,
                                   micro_batch_size=1, grad_accum_steps=accum, activation_checkpointing=True,
                                   pure_bf16=pure))


def inputs(model, n: int = 8, hw: str = "a100-80gb", optimizer: str = "adamw") -> MemoryInputs:
    return MemoryInputs(model=model, world_size=n, gpus_per_node=n, nodes=1, seq_len=2048, precision="bf16",
                        optimizer=optimizer, hardware=PROFILES[hw], activations=analytic_constants(model, "bf16"))


@pytest.mark.parametrize("accum", [1, 2])
def test_fsdp_states_halve_params_grads_and_adam_states(llama7b, accum):
    inp, psi, n = inputs(llama7b), llama7b.num_params, 8
    mixed, pure = fsdp_states(inp, fsdp(False, accum)), fsdp_states(inp, fsdp(True, accum))
    # fp32 shards 4Ψ/N -> bf16 shards 2Ψ/N; AdamW's two states take the parameter's dtype: 8Ψ/N -> 4Ψ/N.
    assert mixed.params == pytest.approx(4 * psi / n) and pure.params == pytest.approx(2 * psi / n)
    assert mixed.optimizer == pytest.approx(8 * psi / n) and pure.optimizer == pytest.approx(4 * psi / n)
    # Without accumulation the step's extra is the gradients and, mixed, AdamW's two fp32 denominator copies of the
    # largest local tensor (terms.ADAM_STEP_COPIES); pure bf16's stochastically rounded step is compiled and fused
    # on CUDA and holds none (its host copies: test_the_stochastically_rounded_step_...).
    copies = 2 * llama7b.largest_layer_params / n
    grads = (lambda st: st.grads) if accum > 1 else (lambda st: st.step_extra)
    extra = 0 if accum > 1 else 1
    assert grads(mixed) == pytest.approx(4 * psi / n + extra * 4 * copies)
    assert grads(pure) == pytest.approx(2 * psi / n)
    # The gathered working copies are bf16 either way.
    assert pure.buffers == mixed.buffers


def test_pure_bf16_lowers_the_peak_by_the_master_and_state_bytes(llama7b, request_for):
    buckets = size_buckets(request_for())
    # 4096 tokens: the backward start is the peak of both (at 2048 FSDP2's side-stream pools, larger by the fp32
    # gradients, put the mixed plan's at the end of backward, whose breakdown counts other things).
    inp = dataclasses.replace(inputs(llama7b), seq_len=4096)
    mixed, pure = estimate_memory(inp, fsdp(False), buckets), estimate_memory(inp, fsdp(True), buckets)
    assert mixed.peak_moment == pure.peak_moment == "backward"
    assert mixed.breakdown["params"] - pure.breakdown["params"] == pytest.approx(2 * llama7b.num_params / 8, rel=1e-6)
    assert mixed.breakdown["optimizer"] - pure.breakdown["optimizer"] == pytest.approx(
        4 * llama7b.num_params / 8, rel=1e-6)
    assert pure.peak_bytes < mixed.peak_bytes


def test_offered_only_where_allowed_on_bf16_and_implemented(request_for):
    supported = engine_spec("fsdp").levers
    assert "pure_bf16" in supported
    assert "pure_bf16" in engine_spec("deepspeed").levers  # at ZeRO-1/2/3 (test_deepspeed_pure_bf16.py)
    allowed = request_for(allow_levers=("pure_bf16",))
    assert {o.pure_bf16 for o in options(allowed, supported, 1)} == {False, True}
    assert {o.pure_bf16 for o in options(request_for(), supported, 1)} == {False}
    fp32 = dataclasses.replace(allowed, precision="fp32")
    assert {o.pure_bf16 for o in options(fp32, supported, 1)} == {False}


def test_lora_base_is_held_in_the_working_dtype_not_fp32(llama7b):
    """The worker casts frozen parameters to the working dtype before sharding (mixed precision casts them there at
    every all-gather anyway): 2 bytes for the base, 4 for the adapters."""
    lora = dataclasses.replace(llama7b, trainable_params=4_000_000, lora_params=4_000_000)
    st = fsdp_states(inputs(lora), fsdp(False))
    assert st.params == pytest.approx((4 * 4_000_000 + 2 * (lora.num_params - 4_000_000)) / 8)
    fp32 = dataclasses.replace(inputs(lora), precision="fp32")
    assert fsdp_states(fp32, fsdp(False)).params == pytest.approx(4 * lora.num_params / 8)


def test_the_stochastically_rounded_step_holds_fp32_copies_on_the_host_only(llama7b):
    """Pure bf16 steps Adam/AdamW through torchao's single_param_adam with stochastic rounding: run eagerly (CPU
    ranks, or a host-resident shard) it holds SR_STEP_COPIES fp32 copies of the local tensor; compiled on CUDA
    none. SGD keeps torch's step (no copies)."""
    n, local = 8, 4 * -(-llama7b.largest_layer_params // 8)
    pure = fsdp(True)
    assert SR_STEP_COPIES == 10.25  # counted down single_param_adam and _fp32_to_bf16_sr (terms.py)
    assert optimizer_step_temp_bytes(inputs(llama7b, hw="cpu"), pure, n, on_host=True) == SR_STEP_COPIES * local
    assert optimizer_step_temp_bytes(inputs(llama7b), pure, n, on_host=False) == 0
    assert optimizer_step_temp_bytes(inputs(llama7b, hw="cpu", optimizer="sgd"), pure, n, on_host=True) == 0
    # CPU ranks: the step moment gains them beside the bf16 gradients.
    st = fsdp_states(inputs(llama7b, hw="cpu"), pure)
    assert st.step_extra == pytest.approx(2 * llama7b.num_params / n + SR_STEP_COPIES * local)
    # Under LoRA the stepped tensors are adapters: no more than the trainable parameters, not the frozen table.
    lora = dataclasses.replace(llama7b, trainable_params=4_000_000, lora_params=4_000_000)
    assert optimizer_step_temp_bytes(inputs(lora, hw="cpu"), pure, n, on_host=True) == SR_STEP_COPIES * 4 * 500_000


def test_the_stochastically_rounded_step_costs_time_on_the_host_only(llama7b):
    shard = llama7b.num_params / 8
    cpu = inputs(llama7b, hw="cpu")
    assert SR_CPU_STEP_RATIO > 1
    assert optimizer_step_s(cpu, fsdp(True), shard, on_host=True) == pytest.approx(
        (SR_CPU_STEP_RATIO - 1) * TORCH_HOST_ADAM_RATIO * shard * 8 / cpu.hardware.cpu_adam_params_per_s)
    assert optimizer_step_s(inputs(llama7b), fsdp(True), shard, on_host=False) == 0
    assert optimizer_step_s(cpu, fsdp(False), shard, on_host=True) == 0
    from launcher.planner.cost import step_time_terms

    assert step_time_terms(cpu, fsdp(True), 10**6)["optimizer"] > 0
    assert "optimizer" not in step_time_terms(cpu, fsdp(False), 10**6)


def test_with_the_step_in_backward_the_root_hook_holds_the_rounding_copies(llama7b):
    """Optimizer step in backward + pure bf16: the root's hook steps the vocabulary table right after its reduce,
    so on CPU ranks the end of backward holds its reduce input and output beside the step's fp32 copies."""
    n = 8
    oib = dataclasses.replace(fsdp(True), optimizer_in_backward=True, activation_checkpointing=False)
    cpu, gpu = fsdp_states(inputs(llama7b, hw="cpu"), oib), fsdp_states(inputs(llama7b), oib)
    local = 4 * -(-llama7b.largest_layer_params // n)
    assert cpu.step_extra == gpu.step_extra == 0  # no step-time gradient or step
    # The root's reduce copy-in (2 + 2 bytes per element of the unit, bf16 in and out) against, in its hook, the
    # reduce input and output (2 + 2/n) and the copies: on CUDA the copy-in alone.
    unit = max(llama7b.non_block_params, llama7b.block_params)
    in_hook = (2 + 2 / n) * unit + SR_STEP_COPIES * local
    assert in_hook > 4 * unit
    assert cpu.backward_end_extra - gpu.backward_end_extra == pytest.approx(in_hook - 4 * unit)


@pytest.mark.parametrize(("optimizer", "said"), [("adamw", "rounds each new bf16 weight stochastically"),
                                                 ("sgd", "rounds to nearest")])
def test_the_plan_says_how_the_pure_bf16_step_rounds(request_for, optimizer, said):
    from launcher.config.job import StrategyConfig
    from launcher.planner.search import make_plan

    kw = dict(allow_levers=("pure_bf16",), optimizer=optimizer)
    pure = make_plan(request_for(**kw, pins=StrategyConfig(engine="fsdp", pure_bf16=True)))
    assert pure.strategy.pure_bf16
    notes = [n for n in pure.math_notes if n.startswith("pure bf16")]
    assert len(notes) == 1 and said in notes[0] and notes[0] in pure.reasons
    mixed = make_plan(request_for(**kw, pins=StrategyConfig(engine="fsdp", pure_bf16=False)))
    assert not any(n.startswith("pure bf16") for n in mixed.math_notes)


def test_the_export_moment_starts_from_the_state_the_step_leaves_not_its_working_copies(llama7b, request_for):
    """Rank 0's end-of-run export (CPU ranks) comes after the last step returned: the step's fp32 working copies are
    gone (measured on the pure-bf16 dev cell: export phase 40.9 MB = shards + states + the gathered copy, while the
    step phase held 43 MB of rounding copies more)."""
    from launcher.planner.memory import export_host_bytes

    inp, n = inputs(llama7b, hw="cpu"), 8
    est = estimate_memory(inp, fsdp(True), size_buckets(request_for()))
    copies = SR_STEP_COPIES * 4 * -(-llama7b.largest_layer_params // n)
    step, export = est.moment_bytes["step"], est.moment_bytes["export"]
    from launcher.engines import engine_spec

    st = engine_spec("fsdp").states(inp, fsdp(True), size_buckets(request_for()))
    kept = st.params + st.grads + st.optimizer + (0.0 if st.step_frees_buffers else st.buffers)
    assert export == pytest.approx(kept + export_host_bytes(llama7b, "bf16"), abs=2)
    assert step - export >= copies - export_host_bytes(llama7b, "bf16")  # the copies are not in the export


def test_pure_bf16_pairs_with_a_low_bit_adamw_where_the_engine_steps_them_together(request_for):
    """FSDP2 steps bf16 shards with torchao's low-bit AdamW (bf16_stochastic_round): 2 + 2 bytes per parameter
    and the quantized moments; DeepSpeed at ZeRO-1/2 over its flat bf16 master (not ZeRO-3: no low-memory client
    optimizer there). No engine pairs Adafactor (no stochastically rounding step); the step in backward takes the
    low-bit ones."""
    from launcher.config.job import StrategyConfig
    from launcher.planner.candidates import candidates

    fsdp_spec, ds_spec = engine_spec("fsdp"), engine_spec("deepspeed")
    # FSDP2 also steps bf16 weights with bitsandbytes' paged AdamW8bit (rounding to nearest, its own kernel).
    assert fsdp_spec.pure_bf16_optimizers - {"paged_adamw8bit"} == ds_spec.pure_bf16_optimizers == {"adamw8bit",
                                                                                                   "adamw4bit"}
    req = request_for(allow_levers=("adamw8bit", "adamw4bit", "adafactor", "pure_bf16"))
    pairs = {(o.low_memory_optimizer, o.pure_bf16, o.optimizer_in_backward)
             for o in options(req, fsdp_spec.levers, 1, pure_bf16_optimizers=fsdp_spec.pure_bf16_optimizers)}
    assert {("adamw8bit", True, False), ("adamw4bit", True, False), ("adafactor", False, False)} <= pairs
    # The step in backward takes them too, with pure bf16 (issue 37 §3, torchtune's low-memory recipe); not Adafactor.
    assert {("adamw8bit", True, True), ("adamw4bit", True, True)} <= pairs
    assert not {p for p in pairs if p[0] == "adafactor" and (p[1] or p[2])}
    assert not {p for p in (o.low_memory_optimizer for o in options(req, ds_spec.levers, 1) if o.pure_bf16)
                if p != "none"}  # without the engine's pairs
    by_engine = {(s.engine, getattr(s.layout, "zero_stage", None), s.low_memory_optimizer) for s in candidates(req)
                 if s.pure_bf16}
    assert {("fsdp", None, "adamw8bit"), ("deepspeed", 1, "adamw8bit"), ("deepspeed", 2, "adamw4bit")} <= by_engine
    assert not {e for e in by_engine if e[0] == "deepspeed" and e[1] == 3 and e[2] != "none"}
    # Pinned with Adafactor, which no engine pairs: refused in one line that says which engine pairs what.
    from launcher.errors import ConfigError

    with pytest.raises(ConfigError, match="pure bf16 pairs only with .*fsdp: adamw4bit, adamw8bit"):
        candidates(dataclasses.replace(req, pins=StrategyConfig(engine="fsdp", pure_bf16=True,
                                                                low_memory_optimizer="adafactor")))


def test_pure_bf16_low_bit_memory_and_step_terms(llama7b):
    from launcher.planner.terms import low_bit_tensor_bytes, optimizer_state_bytes

    inp, n = inputs(llama7b), 8
    mixed8 = dataclasses.replace(fsdp(False), low_memory_optimizer="adamw8bit")
    pure8 = dataclasses.replace(fsdp(True), low_memory_optimizer="adamw8bit")
    # The quantized moments do not depend on the weights' dtype; a tensor torchao leaves unquantized keeps its
    # moments in the weights' dtype (zeros_like): 8 bytes per element over fp32 weights, 4 over bf16.
    assert optimizer_state_bytes(inp, pure8, n) == optimizer_state_bytes(inp, mixed8, n)
    assert low_bit_tensor_bytes("adamw8bit", 100) == 800
    assert low_bit_tensor_bytes("adamw8bit", 100, param_bytes=2) == 400
    mixed, pure = fsdp_states(inp, mixed8), fsdp_states(inp, pure8)
    assert mixed.params - pure.params == pytest.approx(2 * llama7b.num_params / n)
    assert mixed.optimizer == pure.optimizer
    # Its step: the stochastically rounded single_param_adam's SR_STEP_COPIES fp32 copies on the host (measured
    # the same for 8- and 4-bit moments), none on CUDA (compiled); timed as the low-bit step.
    local = 4 * -(-llama7b.largest_layer_params // n)
    cpu = inputs(llama7b, hw="cpu")
    assert optimizer_step_temp_bytes(cpu, pure8, n, on_host=True) == SR_STEP_COPIES * local
    assert optimizer_step_temp_bytes(inp, pure8, n, on_host=False) == 0.0
    assert optimizer_step_s(cpu, pure8, 1e6, on_host=True) == optimizer_step_s(cpu, mixed8, 1e6, on_host=True) > 0


@pytest.mark.parametrize("engine", ["deepspeed", "fsdp"])
def test_a_pure_bf16_plan_says_whether_its_engine_pairs_a_low_bit_adamw(request_for, engine):
    from launcher.config.job import StrategyConfig
    from launcher.planner.search import make_plan

    pins = StrategyConfig(engine=engine, pure_bf16=True, offload_optimizer="none",
                          **({"zero_stage": 3} if engine == "deepspeed" else {}))
    plan = make_plan(request_for(allow_levers=("adamw8bit", "pure_bf16"), pins=pins))
    d = next(d for d in plan.levers if d.lever == "low_memory_optimizer")
    if engine == "deepspeed":  # ZeRO-3 runs no low-memory client optimizer (its ZeRO-1/2 pair them)
        assert (d.used, d.why) == (False, "engine_lacks")
    else:  # scored the other way: 8-bit moments in place of bf16 Adam's 4 bytes per parameter
        assert d.used or (d.other_value == "adamw8bit" and d.peak_delta_bytes < 0)


def test_adafactor_beside_pure_bf16_is_said_to_be_unpaired(request_for):
    from launcher.cli.render import lever_line
    from launcher.config.job import StrategyConfig
    from launcher.planner.search import make_plan

    plan = make_plan(request_for(allow_levers=("adafactor", "pure_bf16"),
                                 pins=StrategyConfig(engine="fsdp", pure_bf16=True)))
    d = next(d for d in plan.levers if d.lever == "low_memory_optimizer")
    assert (d.used, d.why, d.other_value) == (False, "not_paired", "adafactor")
    assert "pure bf16 pairs only with 8-bit or 4-bit AdamW" in lever_line(d)
    plan = make_plan(request_for(allow_levers=("adafactor", "pure_bf16"),
                                 pins=StrategyConfig(engine="fsdp", low_memory_optimizer="adafactor")))
    assert next(d.why for d in plan.levers if d.lever == "pure_bf16") == "not_paired"
