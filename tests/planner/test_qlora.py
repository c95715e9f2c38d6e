"""QLoRA (Strategy.qlora): the frozen block linears in NF4, the terms from torchao's NF4Tensor layout."""

import dataclasses

import pytest

from launcher.engines import engine_spec
from launcher.engines.fsdp.memory import fsdp_states
from launcher.model.qlora import block_nf4, dequant_transient_bytes, nf4_bytes, nf4_eligible
from launcher.planner.hardware import PROFILES
from launcher.planner.levers import options
from launcher.planner.memory import MemoryInputs, analytic_constants, estimate_memory
from launcher.planner.plan import Strategy
from launcher.planner.search import size_buckets
from tests.planner.conftest import llama_stats

H, KV, INTER = 4096, 1024, 11008
SHAPES = [[H, H], [KV, H], [KV, H], [H, H], [INTER, H], [INTER, H], [H, INTER]]
"""A Llama block's frozen linears (q, k, v, o, gate, up, down) under LoRA on q and v: their base layers too."""


def lora_llama():
    m = llama_stats(trainable=8 * 32 * (2 * H + H + KV))
    return dataclasses.replace(m, block_linear_shapes=SHAPES)


def fsdp(qlora: bool, precision_pure: bool = False) -> Strategy:
    return Strategy.from_json(dict(engine="fsdp", zero_stage=None, fsdp_reshard_after_forward=True,
                                   fsdp_sharding="full", offload_optimizer="none", offload_params="none",
                                   micro_batch_size=1, grad_accum_steps=1, activation_checkpointing=True, qlora=qlora,
                                   pure_bf16=precision_pure))


def inputs(model, n: int = 8, precision: str = "bf16") -> MemoryInputs:
    return MemoryInputs(model=model, world_size=n, gpus_per_node=n, nodes=1, seq_len=2048, precision=precision,
                        optimizer="adamw", hardware=PROFILES["a100-80gb"],
                        activations=analytic_constants(model, precision))


def test_nf4_bytes_follow_torchaos_layout():
    # 65536 fp32 elements: 32768 code bytes, 1024 int8 scalers, 4 fp32 factors, the mean and the 16-entry table.
    assert nf4_bytes(65536, 4) == 32768 + 1024 + 4 * 4 + 4 * 17
    # Sharded over 2: the split tensors halve, the mean and table stay whole on each shard.
    assert nf4_bytes(65536, 4, 2) == (32768 + 1024 + 16) / 2 + 4 * 17
    assert dequant_transient_bytes(1000, 2) == 8 * 1000 + 3 * 2 * 1000


def test_eligibility_is_what_to_nf4_and_fsdp2_sharding_take():
    assert nf4_eligible(256, 128, 2)  # 32768 = 64 x 256 x 2
    assert not nf4_eligible(128, 128, 2)  # 16384 elements: one scaler block, cannot split over 2
    assert nf4_eligible(128, 128, 1)
    assert not nf4_eligible(3, 65536, 2)  # rows do not split evenly
    assert block_nf4([[256, 128], [128, 128]], 2) == [32768]


def test_fsdp_params_are_the_nf4_shards_the_adapters_in_fp32_and_the_rest_of_the_base_in_bf16():
    m, n = lora_llama(), 8
    base, q = fsdp_states(inputs(m), fsdp(False)), fsdp_states(inputs(m), fsdp(True))
    elems = [o * i for o, i in SHAPES]
    nf4 = sum(nf4_bytes(e, 2, n) for e in elems) * m.num_blocks
    rest = m.num_params - m.trainable_params - m.num_blocks * sum(elems)  # embeddings, head, norms
    assert q.params == pytest.approx((4 * m.trainable_params + 2 * rest) / n + nf4)
    assert q.params < 0.5 * base.params
    # One block's gathered copy: bf16 for what is not NF4 (norms, adapters), the NF4 codes and scalers for the rest.
    gathered = sum(e / 2 + e / 64 + 2 * e / 16384 for e in elems)
    assert q.buffers == pytest.approx(2 * (m.non_block_params + m.block_params - sum(elems)) + gathered)
    assert q.dequant_transient == dequant_transient_bytes(INTER * H, 2)
    assert base.dequant_transient == 0
    # The trainable side (adapters) is unchanged.
    assert q.optimizer == base.optimizer


def test_on_one_rank_the_nf4_base_is_never_gathered_and_stays_on_the_device_under_offload():
    """FSDP2's one-rank shortcut cannot gather NF4Tensor, so the worker leaves the NF4 weights out of FSDP2
    (launcher.engines.fsdp.nf4_outside_fsdp): no gathered NF4 copy, and CPUOffloadPolicy does not move them."""
    m = lora_llama()
    elems = [o * i for o, i in SHAPES]
    one, two = fsdp_states(inputs(m, n=1), fsdp(True)), fsdp_states(inputs(m, n=2), fsdp(True))
    assert one.buffers == pytest.approx(2 * (m.non_block_params + m.block_params - sum(elems)))
    assert two.buffers == pytest.approx(one.buffers + sum(e / 2 + e / 64 + 2 * e / 16384 for e in elems))
    off = Strategy.from_json(fsdp(True).to_json() | dict(offload_params="cpu", offload_optimizer="cpu"))
    on_host = fsdp_states(inputs(m, n=1), off)
    resident = m.num_blocks * sum(nf4_bytes(e, 2) for e in elems)
    assert on_host.params == pytest.approx(resident)
    assert on_host.host == pytest.approx(one.params - resident + one.optimizer)
    assert fsdp_states(inputs(m, n=2), off).params == 0
    # At init the NF4 weights are on the device and nothing else FSDP2 holds is (one rank: no broadcast either).
    from launcher.model.qlora import quantize_transient_bytes

    spec = engine_spec("fsdp")
    quantizing = quantize_transient_bytes(INTER * H, 2)
    assert spec.init_bytes(inputs(m, n=1), off) == pytest.approx(resident + quantizing)
    assert spec.init_bytes(inputs(m, n=2), off) == pytest.approx(max(quantizing, 4 * m.largest_layer_params))


def test_dequant_transient_counts_only_where_it_exceeds_the_loss_temporaries(request_for):
    m = lora_llama()
    buckets = size_buckets(request_for())
    est = estimate_memory(inputs(m), fsdp(True), buckets)
    base = estimate_memory(inputs(m), fsdp(False), buckets)
    assert est.peak_bytes < base.peak_bytes
    assert est.breakdown["logits"] == base.breakdown["logits"]  # 32000-token logits dwarf one weight


def test_offered_only_with_lora_and_quantizable_linears(request_for):
    supported = engine_spec("fsdp").levers
    assert "qlora" in supported and "qlora" not in engine_spec("deepspeed").levers
    m = lora_llama()
    allowed = request_for(model=m, allow_levers=("qlora",))
    assert {o.qlora for o in options(allowed, supported, 1)} == {False, True}
    assert {o.qlora for o in options(request_for(model=m), supported, 1)} == {False}
    no_linears = request_for(model=dataclasses.replace(m, block_linear_shapes=[]), allow_levers=("qlora",))
    assert {o.qlora for o in options(no_linears, supported, 1)} == {False}


def test_init_counts_the_largest_weights_quantization():
    from launcher.engines.fsdp.spec import FsdpSpec
    from launcher.model.qlora import quantize_transient_bytes

    m = lora_llama()
    cpu = dataclasses.replace(inputs(m), hardware=PROFILES["cpu"])
    spec = FsdpSpec()
    # to_nf4's nearest-code search: (value - nf4) and its abs(), 16 codes x 2 bytes per element of a 1M chunk.
    assert quantize_transient_bytes(INTER * H, 2) == 2 * 2 * INTER * H + INTER * H + 2 * 16 * 2 * 1024**2
    # On a GPU the larger of the quantizing and the one whole fp32 tensor broadcast into the shards (8 ranks).
    extra = spec.init_bytes(inputs(m), fsdp(True)) - fsdp_states(inputs(m), fsdp(True)).params
    assert extra == max(quantize_transient_bytes(INTER * H, 2), 4 * m.largest_layer_params)
    # On CPU ranks rank 0 still holds its fp32 state dict, less the first block's weights up to the largest.
    consumed = 4 * (2 * H * H + 2 * KV * H + INTER * H)
    shards = fsdp_states(cpu, fsdp(True)).params
    assert spec.init_bytes(cpu, fsdp(True)) == 4 * m.num_params + max(
        shards, quantize_transient_bytes(INTER * H, 2) - consumed)



def test_step_time_pays_dequantization_and_gathers_fewer_bytes(request_for):
    from launcher.planner.cost import communication, step_time_terms

    m = lora_llama()
    inp = inputs(m)
    on, off = step_time_terms(inp, fsdp(True), 0), step_time_terms(inp, fsdp(False), 0)
    elems = [o * i for o, i in SHAPES]
    # forward, recompute (checkpointing is on) and backward; each temporary written and read once
    dequant = 3 * 2 * sum(dequant_transient_bytes(e, 2) for e in elems) * m.num_blocks / PROFILES["a100-80gb"].memory_bw
    assert on["compute"] - off["compute"] == pytest.approx(dequant)
    comm_on, comm_off = communication(inp, fsdp(True), 0), communication(inp, fsdp(False), 0)
    assert comm_on.intra_node_bytes < 0.5 * comm_off.intra_node_bytes


def test_dequantization_is_repeated_only_in_the_recomputed_blocks():
    from launcher.engines.fsdp.spec import FsdpSpec

    inp = inputs(lora_llama())
    full, every2 = fsdp(True), dataclasses.replace(fsdp(True), checkpoint_every=2)
    no_ac = dataclasses.replace(fsdp(True), activation_checkpointing=False)
    d1, d2, d0 = (FsdpSpec().dequant_s(inp, s) for s in (full, every2, no_ac))
    # 32 blocks: forward and backward in all, the recompute in 16 of them with every 2nd checkpointed.
    assert d1 == pytest.approx(3 / 2 * d0) and d2 == pytest.approx(2.5 / 2 * d0)
