"""Pure bf16 (Strategy.pure_bf16): bf16 parameters, gradients and optimizer states, no fp32 master."""

import dataclasses

import pytest

from launcher.engines import engine_spec
from launcher.engines.fsdp import fsdp_states
from launcher.planner.hardware import PROFILES
from launcher.planner.levers import options
from launcher.planner.memory import MemoryInputs, analytic_constants, estimate_memory
from launcher.planner.plan import Strategy
from launcher.planner.search import size_buckets


def fsdp(pure: bool, accum: int = 1, offload: str = "none") -> Strategy:
    return Strategy(engine="fsdp", zero_stage=None, fsdp_reshard_after_forward=True, fsdp_sharding="full",
                    offload_optimizer=offload, offload_params=offload, micro_batch_size=1, grad_accum_steps=accum,
                    activation_checkpointing=True, pure_bf16=pure)


def inputs(model, n: int = 8) -> MemoryInputs:
    return MemoryInputs(model=model, world_size=n, gpus_per_node=n, nodes=1, seq_len=2048, precision="bf16",
                        optimizer="adamw", hardware=PROFILES["a100-80gb"], activations=analytic_constants(model, "bf16"))


@pytest.mark.parametrize("accum", [1, 2])
def test_fsdp_states_halve_params_grads_and_adam_states(llama7b, accum):
    inp, psi, n = inputs(llama7b), llama7b.num_params, 8
    mixed, pure = fsdp_states(inp, fsdp(False, accum)), fsdp_states(inp, fsdp(True, accum))
    # fp32 shards 4Ψ/N -> bf16 shards 2Ψ/N; AdamW's two states take the parameter's dtype: 8Ψ/N -> 4Ψ/N.
    assert mixed.params == pytest.approx(4 * psi / n) and pure.params == pytest.approx(2 * psi / n)
    assert mixed.optimizer == pytest.approx(8 * psi / n) and pure.optimizer == pytest.approx(4 * psi / n)
    # Without accumulation the step's extra is the gradients and AdamW's two denominator copies of the largest
    # local tensor (terms.ADAM_STEP_COPIES), both in the parameters' dtype.
    copies = 2 * llama7b.largest_layer_params / n
    grads = (lambda st: st.grads) if accum > 1 else (lambda st: st.step_extra)
    extra = 0 if accum > 1 else 1
    assert grads(mixed) == pytest.approx(4 * psi / n + extra * 4 * copies)
    assert grads(pure) == pytest.approx(2 * psi / n + extra * 2 * copies)
    # The gathered working copies are bf16 either way.
    assert pure.buffers == mixed.buffers


def test_pure_bf16_lowers_the_peak_by_the_master_and_state_bytes(llama7b, request_for):
    buckets = size_buckets(request_for())
    inp = inputs(llama7b)
    mixed, pure = estimate_memory(inp, fsdp(False), buckets), estimate_memory(inp, fsdp(True), buckets)
    assert mixed.breakdown["params"] - pure.breakdown["params"] == pytest.approx(2 * llama7b.num_params / 8, rel=1e-6)
    assert mixed.breakdown["optimizer"] - pure.breakdown["optimizer"] == pytest.approx(
        4 * llama7b.num_params / 8, rel=1e-6)
    assert pure.peak_bytes < mixed.peak_bytes


def test_offered_only_where_allowed_on_bf16_and_implemented(request_for):
    supported = engine_spec("fsdp").levers
    assert "pure_bf16" in supported
    assert "pure_bf16" not in engine_spec("deepspeed").levers
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
