"""The model-state terms against DeepSpeed's own estimators, and the activation terms against the paper."""

import dataclasses

import pytest
from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

from launcher.planner.hardware import PROFILES
from launcher.planner.memory import (
    ActivationConstants,
    MemoryInputs,
    activation_bytes,
    analytic_constants,
    model_state_bytes,
)
from launcher.planner.plan import Buckets, Strategy
from tests.planner.conftest import llama_stats

P = 6_738_415_616


def states(stage, opt="none", par="none", gpus=8, nodes=1, model=None):
    m = model or llama_stats()
    inp = MemoryInputs(model=m, world_size=gpus * nodes, gpus_per_node=gpus, nodes=nodes, seq_len=1, precision="bf16",
                       optimizer="adamw", hardware=PROFILES["cpu"], activations=analytic_constants(m, "bf16"))
    s = Strategy.from_json(dict(engine="deepspeed", zero_stage=stage, fsdp_reshard_after_forward=None,
                                offload_optimizer=opt, offload_params=par, micro_batch_size=1, grad_accum_steps=1,
                                activation_checkpointing=False))
    # Buckets at their floor and a prefetch below L, so the live-parameter term is DeepSpeed's 4L.
    b = Buckets(reduce_bucket_size=0, allgather_bucket_size=0, stage3_prefetch_bucket_size=1,
                stage3_max_live_parameters=1, stage3_param_persistence_threshold=0)
    return model_state_bytes(inp, s, b), m


@pytest.mark.parametrize("gpus,nodes", [(1, 1), (8, 1), (8, 4)])
def test_zero2_equals_deepspeed(gpus, nodes):
    ours, _ = states(2, gpus=gpus, nodes=nodes)
    _, ds = estimate_zero2_model_states_mem_needs(P, gpus, nodes, cpu_offload=False)
    assert abs(ours - ds) <= 4  # integer rounding of the per-term divisions


def test_zero2_offload_equals_deepspeed():
    ours, _ = states(2, opt="cpu")
    _, ds = estimate_zero2_model_states_mem_needs(P, 8, 1, cpu_offload=True)
    assert ours == ds


@pytest.mark.parametrize("gpus,nodes", [(8, 1), (8, 16)])
def test_zero3_differs_from_deepspeed_only_by_the_16bit_param_partition(gpus, nodes):
    ours, m = states(3, gpus=gpus, nodes=nodes)
    _, ds, _ = estimate_zero3_model_states_mem_needs(P, m.largest_layer_params, gpus, nodes, cpu_offload=False,
                                                     cpu_offload_params=False)
    # DeepSpeed's 18Ψ/N counts 2 (grad16) + 4 (grad32) + 4 (param32) + 8 (Adam) and leaves out the
    # bf16 parameter partition every ZeRO-3 rank holds between gathers: 2Ψ/N.
    assert abs(ours - (ds + 2 * P / (gpus * nodes))) <= 8


def test_zero3_offloads_agree_with_deepspeed_on_the_device():
    # With the optimizer offloaded, ZeRO-3's 16-bit gradient partition (2Ψ/N, which [DS] leaves out) is allocated
    # on the host too (stage3.py: self.device is "cpu" then); CPU ranks measured it because their host is the
    # device, and the first GPU check's ZeRO-3 offload step did not hold it. So the device figures agree with [DS].
    ours, m = states(3, opt="cpu")
    _, ds, _ = estimate_zero3_model_states_mem_needs(P, m.largest_layer_params, 8, 1, cpu_offload=True,
                                                     cpu_offload_params=False)
    assert abs(ours - ds) <= 2
    ours, m = states(3, opt="cpu", par="cpu")
    _, ds, _ = estimate_zero3_model_states_mem_needs(P, m.largest_layer_params, 8, 1, cpu_offload=True,
                                                     cpu_offload_params=True)
    assert abs(ours - ds) <= 2


def test_zero_paper_table_1_for_7_5b_at_64_gpus():
    # ZeRO paper, Table 1: Ψ = 7.5B, N_d = 64, K = 12 -> 120, 31.4, 16.6 GB (model states only). DeepSpeed's
    # bf16/fp16 optimizers also keep an fp32 gradient accumulation buffer (the "4_grads_32bit" of its
    # estimator), sharded like the optimizer: 4Ψ at stage 0, 4Ψ/N from stage 1.
    # Stage 3: (4 + K)Ψ/N = 16 · 7.5e9 / 64 = 1.875 GB ("1.9 GB"), plus the fp32 gradient partition
    # 4 · 7.5e9 / 64 = 0.46875 GB and [DS]'s 4L for the live largest layer: L = 32000 · 4096 = 131_072_000
    # (llama_stats' embedding), 4L = 0.524288 GB.
    psi, n = 7_500_000_000, 64
    m = llama_stats(num_params=psi)
    got = [states(stage, gpus=n, model=m)[0] for stage in (0, 1, 2, 3)]
    paper = [120.0e9, 31.4e9, 16.6e9, 1.9e9]
    extra = [30.0e9, 0.46875e9, 0.46875e9, 0.46875e9 + 0.524288e9]  # 4Ψ, then 4Ψ/64 (+ 4L at stage 3)
    for stage, g, p, e in zip((0, 1, 2, 3), got, paper, extra, strict=True):
        assert abs(g - (p + e)) < 0.05e9, stage


def test_korthikanti_34sbh_without_recompute_and_2sbh_with_it():
    # GPT-style block (I = 4h, no gating) at fp16 with sdpa attention: 34 bytes per token per h [Kort eq. 1].
    m = llama_stats(h=1024, inter=4096, blocks=24, num_params=350_000_000)
    m = type(m)(**{**m.to_json(), "gated_mlp": False})
    c = analytic_constants(m, "fp16")
    assert c.block_bytes_per_token == 34 * m.hidden_size
    s, b = 512, 4
    blocks, _ = activation_bytes(c, m.num_blocks, b, s, False)
    assert blocks == 24 * 34 * s * b * m.hidden_size
    # Full recompute keeps each block's input, 2sbh, and one block is live again in backward.
    ckpt, _ = activation_bytes(c, m.num_blocks, b, s, True)
    assert ckpt == 24 * 2 * s * b * m.hidden_size + 34 * s * b * m.hidden_size


def test_logits_term_scales_with_vocabulary_and_tokens():
    m = llama_stats(vocab=128256)
    c = analytic_constants(m, "bf16")
    _, head = activation_bytes(c, m.num_blocks, 2, 4096, False)
    # bf16 logits, fp32 upcast, log-softmax and its gradient: 2 + 4 + 4 + 4 = 14 bytes per logit, plus the
    # embedding output and its input to the head at bf16 (2 · 4096 · 2 bytes per token). By hand:
    # 2 · 4096 = 8192 tokens; 128256 · 14 = 1_795_584; + 16_384 = 1_811_968 bytes per token; · 8192 = 14_843_641_856.
    assert head == 14_843_641_856
    _, twice = activation_bytes(c, m.num_blocks, 4, 4096, False)
    assert twice == 2 * head  # linear in the micro-batch


def test_attention_scores_grow_with_the_sequence():
    c = ActivationConstants(block_bytes_per_token=100, block_bytes_per_token_per_seq=5 * 4,
                            ckpt_bytes_per_token=10, head_bytes_per_token=0, head_ckpt_bytes_per_token=0)
    short, _ = activation_bytes(c, 1, 1, 1024, False)
    long, _ = activation_bytes(c, 1, 1, 2048, False)
    # The per-token cost grows by 5·a·s [Kort: 5as/h term]: doubling s more than doubles the bytes.
    assert long - 2 * short == 2048 * 20 * 2048 - 2 * 1024 * 20 * 1024


def test_eager_attention_keeps_korthikanti_5as_scores_and_sdpa_none():
    # [Kort eq. 1]: sbh(34 + 5as/h) at fp16 with eager attention; fused kernels (sdpa, flash) drop the 5as/h.
    m = llama_stats(h=1024, inter=4096, blocks=24, num_params=350_000_000)
    m = type(m)(**{**m.to_json(), "gated_mlp": False})
    eager, sdpa = analytic_constants(m, "fp16", "eager"), analytic_constants(m, "fp16", "sdpa")
    assert eager.block_bytes_per_token_per_seq == 5 * m.num_heads
    assert sdpa.block_bytes_per_token_per_seq == 0
    assert (eager.attention, sdpa.attention) == ("eager", "sdpa")
    s, b = 2048, 1
    e_blocks, _ = activation_bytes(eager, m.num_blocks, b, s, False)
    assert e_blocks == m.num_blocks * s * b * m.hidden_size * (34 + 5 * m.num_heads * s / m.hidden_size)


def _fp32_states(stage, accum=1, n=2):
    from launcher.engines.deepspeed.memory import deepspeed_states

    m = llama_stats(num_params=10_000_000, blocks=2, h=256, inter=1024, vocab=1000)
    inp = MemoryInputs(model=m, world_size=n, gpus_per_node=n, nodes=1, seq_len=1, precision="fp32",
                       optimizer="adamw", hardware=PROFILES["cpu"], activations=analytic_constants(m, "fp32"))
    s = Strategy.from_json(dict(engine="deepspeed", zero_stage=stage, fsdp_reshard_after_forward=None,
                                offload_optimizer="none", offload_params="none", micro_batch_size=1,
                                grad_accum_steps=accum, activation_checkpointing=False))
    b = Buckets(reduce_bucket_size=10**6, allgather_bucket_size=10**6, stage3_prefetch_bucket_size=1,
                stage3_max_live_parameters=1, stage3_param_persistence_threshold=0)
    return deepspeed_states(inp, s, b), m.num_params


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_fp32_deepspeed_keeps_the_fp32_master_partition_too(stage):
    # Measured (benchmarks/results/accuracy.md, fp32 cells): DeepSpeed clones the flat partition to fp32 whatever
    # the working dtype, so an fp32 run holds (4 + 8)Ψ/N of optimizer state, not 8Ψ/N.
    st, psi = _fp32_states(stage)
    assert psi == 10_000_000
    assert st.optimizer == 60_000_000  # (4 master + 8 Adam) bytes · 1e7 params / 2 ranks


@pytest.mark.parametrize("stage", [1, 2])
def test_fp32_zero12_step_holds_three_fp32_partitions(stage):
    st, _ = _fp32_states(stage)
    assert st.step_extra == 60_000_000  # 3 fp32 partitions · 4 bytes · 1e7 params / 2 ranks


def _zero3_moments(*, live, bucket, lora, opt="none"):
    from dataclasses import replace

    from launcher.engines.deepspeed.memory import deepspeed_states

    m = llama_stats()
    if lora:
        m = replace(m, trainable_params=m.num_params // 1000)
    inp = MemoryInputs(model=m, world_size=8, gpus_per_node=8, nodes=1, seq_len=1, precision="fp32",
                       optimizer="adamw", hardware=PROFILES["cpu"], activations=analytic_constants(m, "fp32"))
    s = Strategy.from_json(dict(engine="deepspeed", zero_stage=3, fsdp_reshard_after_forward=None,
                                offload_optimizer=opt, offload_params="none", micro_batch_size=1, grad_accum_steps=1,
                                activation_checkpointing=False))
    b = Buckets(reduce_bucket_size=bucket, allgather_bucket_size=bucket, stage3_prefetch_bucket_size=1,
                stage3_max_live_parameters=live, stage3_param_persistence_threshold=0)
    return deepspeed_states(inp, s, b), m


@pytest.mark.parametrize("lora,opt", [(False, "none"), (True, "cpu")])
def test_zero3_keeps_up_to_the_live_cap_gathered_frozen_weights_included(lora, opt):
    # partitioned_param_coordinator.py: prefetch stops at max_live, release keeps reuses within max_reuse_distance
    # (= max_live): a LoRA model's frozen weights stay gathered just as trainable ones do.
    live = 3 * llama_stats().largest_layer_params
    st, m = _zero3_moments(live=live, bucket=10**6, lora=lora, opt=opt)
    assert st.backward_extra == 4 * live
    st, m = _zero3_moments(live=10 * m.num_params, bucket=10**6, lora=lora, opt=opt)
    assert st.backward_extra == 4 * m.num_params  # capped at the whole model


def test_zero3_backward_end_holds_the_reduce_scatter_copies_of_the_last_flush():
    # reduce_scatter_coalesced torch.cat's the bucket's gradients into a new flat buffer (min(bucket, trainable)
    # elements) beside the bucket itself, and on a CPU rank gloo's reduce_scatter clones that buffer.
    small, m = _zero3_moments(live=1, bucket=10**6, lora=False)
    large, _ = _zero3_moments(live=1, bucket=10**9, lora=False)
    bucket_growth = 4 * (10**9 - 10**6)  # the bucket buffer itself grows by this much
    assert large.backward_end_late - small.backward_end_late == bucket_growth + 2 * 4 * (10**9 - 10**6)
    huge, _ = _zero3_moments(live=1, bucket=10 * m.num_params, lora=False)
    # The last hook flushes while the input embedding (untied Llama: the token table alone) is still gathered.
    assert huge.backward_end_late - huge.buffers == 4 * m.vocab_size * m.hidden_size + 2 * 4 * m.trainable_params


def test_fsdp2_fp32_reduce_holds_the_unsharded_gradients_and_the_reduce_scatter_input_at_once():
    # _fsdp_collectives.py foreach_reduce: copy-in to the fp32 reduce-scatter input happens before the unsharded
    # gradients are cleared, so at fp32 8 bytes per element of the root unit live together (not 4 + 4/n).
    from launcher.engines.fsdp.memory import fsdp_states

    m = llama_stats()
    inp = MemoryInputs(model=m, world_size=2, gpus_per_node=2, nodes=1, seq_len=1, precision="fp32",
                       optimizer="adamw", hardware=PROFILES["cpu"], activations=analytic_constants(m, "fp32"))
    s = Strategy.from_json(dict(engine="fsdp", zero_stage=None, fsdp_reshard_after_forward=True,
                                offload_optimizer="none", offload_params="none", micro_batch_size=1, grad_accum_steps=1,
                                activation_checkpointing=False))
    st = fsdp_states(inp, s)
    unit = max(m.non_block_params, m.block_params)
    # ...next to the root's own parameters, still unsharded until it reshards after that reduce (4 · root).
    assert st.backward_end_extra == pytest.approx(4 * m.non_block_params + 4 * (m.num_params - m.non_block_params) / 2
                                                  + 8 * unit)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_fsdp2_step_in_backward_holds_no_gradient_for_a_step(precision):
    # Each unit's sharded gradient is stepped and dropped in its hook inside foreach_reduce: the step moment has no
    # gradients and the end of backward no blocks' gradients waiting, the root's reduce buffers unchanged.
    from launcher.engines.fsdp.memory import fsdp_states
    from launcher.planner.memory import estimate_memory

    m = llama_stats()
    inp = MemoryInputs(model=m, world_size=2, gpus_per_node=2, nodes=1, seq_len=16, precision=precision,
                       optimizer="adamw", hardware=PROFILES["cpu"], activations=analytic_constants(m, precision))
    plain = Strategy.from_json(dict(engine="fsdp", zero_stage=None, fsdp_reshard_after_forward=True,
                                    offload_optimizer="none", offload_params="none", micro_batch_size=1,
                                    grad_accum_steps=1, activation_checkpointing=False))
    oib = dataclasses.replace(plain, optimizer_in_backward=True)
    a, b = fsdp_states(inp, plain), fsdp_states(inp, oib)
    # The plain step also holds AdamW's two denominator copies of the largest local tensor (terms.ADAM_STEP_COPIES).
    assert a.step_extra == 4 * m.trainable_params / 2 + 2 * 4 * m.largest_layer_params / 2 and b.step_extra == 0
    assert a.backward_end_extra - b.backward_end_extra == pytest.approx(4 * (m.num_params - m.non_block_params) / 2)
    assert (b.params, b.optimizer, b.buffers) == (a.params, a.optimizer, a.buffers)
    buckets = Buckets(reduce_bucket_size=0, allgather_bucket_size=0, stage3_prefetch_bucket_size=0,
                      stage3_max_live_parameters=0, stage3_param_persistence_threshold=0)
    ea, eb = estimate_memory(inp, plain, buckets), estimate_memory(inp, oib, buckets)
    # The optimizer state, made lazily at the first step inside the first backward, is in every moment already.
    assert eb.moment_bytes["step"] == b.params + b.optimizer
    assert ea.moment_bytes["backward"] == eb.moment_bytes["backward"]
    # A 16-token run's training peaks at the end of backward or the step (on CPU ranks its export can top both).
    from launcher.planner.memory import TRAINING_MOMENTS

    assert max(eb.moment_bytes[k] for k in TRAINING_MOMENTS) < max(ea.moment_bytes[k] for k in TRAINING_MOMENTS)


def _estimate(stage, gpus, micro_batch=1, opt="none"):
    from launcher.planner.memory import estimate_memory

    m = llama_stats()
    inp = MemoryInputs(model=m, world_size=gpus, gpus_per_node=gpus, nodes=1, seq_len=2048, precision="bf16",
                       optimizer="adamw", hardware=PROFILES["a100-80gb"], activations=analytic_constants(m, "bf16"))
    s = Strategy.from_json(dict(engine="deepspeed", zero_stage=stage, fsdp_reshard_after_forward=None,
                                offload_optimizer=opt, offload_params="none", micro_batch_size=micro_batch,
                                grad_accum_steps=1, activation_checkpointing=True))
    b = Buckets(reduce_bucket_size=10**7, allgather_bucket_size=10**7, stage3_prefetch_bucket_size=10**6,
                stage3_max_live_parameters=10**7, stage3_param_persistence_threshold=0)
    return estimate_memory(inp, s, b)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_breakdown_terms_sum_to_the_peak(stage):
    est = _estimate(stage, 8)
    assert sum(est.breakdown.values()) == est.peak_bytes
    assert est.moment_bytes[est.peak_moment] >= max(est.moment_bytes.values()) - 1


def test_zero3_sharded_terms_by_hand_and_halved_by_twice_the_gpus():
    # ZeRO-3 shards the bf16 params and the fp32 master + Adam state: Ψ = 6_738_415_616.
    # 8 ranks: params 2Ψ/8 = 1_684_603_904; optimizer (4 + 8)Ψ/8 = 10_107_623_424.
    eight, sixteen = _estimate(3, 8), _estimate(3, 16)
    assert eight.breakdown["optimizer"] == 10_107_623_424
    assert eight.breakdown["params"] - sixteen.breakdown["params"] == 1_684_603_904 - 842_301_952
    assert sixteen.breakdown["optimizer"] * 2 == eight.breakdown["optimizer"]
    assert eight.peak_bytes > sixteen.peak_bytes


def test_model_states_shrink_stage_by_stage():
    # [ZeRO Table 1]: each stage shards one more state, so per-rank model states fall strictly from 0 to 3 at N = 8
    # (20Ψ, 4Ψ + 16Ψ/8, 2Ψ + 18Ψ/8, 20Ψ/8 + 4L with Ψ = 6.7e9, L = 1.3e8).
    got = [states(stage)[0] for stage in (0, 1, 2, 3)]
    assert got == sorted(got, reverse=True) and len(set(got)) == 4


def test_a_larger_micro_batch_never_needs_less_memory():
    peaks = [_estimate(2, 8, micro_batch=mb).peak_bytes for mb in (1, 2, 4, 8)]
    assert peaks == sorted(peaks) and peaks[0] < peaks[-1]


# -- selective activation checkpointing and activation offload (issue 21, levers 2 and 3) ------------------------

def _lever_estimate(*, ac=True, every=1, offload=False, hw="a100-80gb", mb=1):
    import dataclasses

    from launcher.planner.memory import estimate_memory

    m = llama_stats()
    inp = MemoryInputs(model=m, world_size=8, gpus_per_node=8, nodes=1, seq_len=2048, precision="bf16",
                       optimizer="adamw", hardware=PROFILES[hw], activations=analytic_constants(m, "bf16"))
    s = Strategy.from_json(dict(engine="deepspeed", zero_stage=3, fsdp_reshard_after_forward=None,
                                offload_optimizer="none", offload_params="none", micro_batch_size=mb,
                                grad_accum_steps=1, activation_checkpointing=ac))
    s = dataclasses.replace(s, checkpoint_every=every, activation_offload=offload)
    b = Buckets(reduce_bucket_size=10**7, allgather_bucket_size=10**7, stage3_prefetch_bucket_size=10**6,
                stage3_max_live_parameters=10**7, stage3_param_persistence_threshold=0)
    return inp, estimate_memory(inp, s, b)


def test_every_kth_block_from_the_first_is_checkpointed_as_transformers_every_n_layers_does():
    from launcher.levers.checkpoint_every import checkpointed

    assert [i for i in range(12) if checkpointed(i, 1)] == list(range(12))
    assert [i for i in range(12) if checkpointed(i, 2)] == [0, 2, 4, 6, 8, 10]
    assert [i for i in range(12) if checkpointed(i, 4)] == [0, 4, 8]


def test_selective_checkpointing_keeps_inputs_of_checkpointed_blocks_and_everything_of_the_rest():
    # Unit constants: a block saves 10 bytes per token, a checkpoint 1; 4 tokens.
    c = ActivationConstants(block_bytes_per_token=10, block_bytes_per_token_per_seq=0, ckpt_bytes_per_token=1,
                            head_bytes_per_token=0, head_ckpt_bytes_per_token=0)
    # k = 2 over 4 blocks: blocks 0 and 2 keep 1 each, 1 and 3 keep 10; block 3 (the first to run backward) is
    # not checkpointed, so the backward start is the peak: 22 per token.
    assert activation_bytes(c, 4, 1, 4, True, 2)[0] == 4 * (1 + 10 + 1 + 10)
    # k = 2 over 5 blocks: block 4 is checkpointed, recomputed on top of all saved: 1+10+1+10+1 + 10.
    assert activation_bytes(c, 5, 1, 4, True, 2)[0] == 4 * (23 + 10)
    # k = 1 is full recompute as before: n checkpoints plus one live block; no AC: every block's tensors.
    assert activation_bytes(c, 4, 1, 4, True, 1)[0] == 4 * (4 * 1 + 10)
    assert activation_bytes(c, 4, 1, 4, False, 2)[0] == 4 * 4 * 10
    # Fewer checkpoints never need less memory than more.
    k1, k2, k4 = (activation_bytes(c, 12, 1, 4, True, k)[0] for k in (1, 2, 4))
    assert k1 < k2 < k4 < activation_bytes(c, 12, 1, 4, False)[0]


def test_activation_offload_on_cuda_moves_the_saved_tensors_to_pinned_host_ram():
    from launcher.planner.memory import PINNED_ROUNDING, block_activations

    for ac in (False, True):
        inp, on = _lever_estimate(ac=ac, offload=True, mb=16)
        _, off = _lever_estimate(ac=ac, offload=False, mb=16)
        c, m, tokens = inp.activations, inp.model, 16 * 2048
        saved, _ = block_activations(c, m.num_blocks, 16, 2048, ac)
        # The device keeps one block's backward: its tensors, or its input and the recomputed block, beside what
        # the head still holds then.
        block = tokens * c.block_bytes_per_token + (tokens * c.ckpt_bytes_per_token if ac else 0)
        device = block + tokens * c.head_ckpt_bytes_per_token
        assert on.peak_moment == off.peak_moment == "backward"
        assert on.breakdown["activations"] + on.breakdown["logits"] == pytest.approx(device, abs=2)
        assert device < off.breakdown["activations"] + off.breakdown["logits"]
        # The host: what the blocks and the loss saved, in pinned blocks rounded up to a power of two.
        host = saved + tokens * c.head_bytes_per_token
        assert on.host_bytes_per_node - off.host_bytes_per_node == pytest.approx(8 * PINNED_ROUNDING * host, abs=16)


def test_selective_peak_is_the_last_recompute_or_the_backward_start_by_the_layout():
    # gpt2s of the accuracy cells (h 128, 4 blocks, vocab 4096), fp32, seq 512, as the fake-tensor probe measured.
    c = ActivationConstants(block_bytes_per_token=15376.0, block_bytes_per_token_per_seq=48.0,
                            ckpt_bytes_per_token=512.0, head_bytes_per_token=50708.0,
                            head_ckpt_bytes_per_token=11268.0)
    block, tokens = 15376 + 48 * 512, 2 * 512
    # Every block checkpointed: the last block's recompute is the peak (today's n·ckpt + block + head_ckpt).
    assert activation_bytes(c, 4, 2, 512, True, 1) == (tokens * (4 * 512 + block), tokens * 11268)
    # Every 2nd: blocks 1 and 3 keep all they saved, and the loss's backward at the start is the peak.
    assert activation_bytes(c, 4, 2, 512, True, 2) == (tokens * (2 * 512 + 2 * block), tokens * 50708)


def test_activation_offload_on_cpu_ranks_moves_nothing():
    # Host memory is the device there: the hooks keep each tensor where it is (save_on_cpu's tensor.cpu()).
    _, on = _lever_estimate(offload=True, hw="cpu")
    _, off = _lever_estimate(offload=False, hw="cpu")
    assert on.peak_bytes == off.peak_bytes and on.breakdown == off.breakdown
    assert on.host_bytes_per_node == off.host_bytes_per_node


def test_chunked_loss_keeps_one_piece_of_the_logits_and_the_head_weight_gradient():
    from launcher.planner.memory import chunked_head_bytes

    m = llama_stats(vocab=128256)
    c = analytic_constants(m, "bf16")
    tokens, k = 2 * 4096, 8
    _, whole = activation_bytes(c, m.num_blocks, 2, 4096, False)
    _, chunked = activation_bytes(c, m.num_blocks, 2, 4096, False, loss_chunks=k)
    logits = m.vocab_size * (2 + 12)  # bf16 logits, fp32 upcast, log-softmax and its gradient, per token
    g = m.vocab_size * m.hidden_size * 2  # one bf16 gradient of the (trainable) head weight
    rest = whole - tokens * logits
    # The logits of one piece beside the one weight gradient every piece adds into in place (issue 37 §7: the
    # out-of-place sum held three).
    assert chunked == int(rest + tokens * logits / k + g)
    assert chunked < whole / 4
    # A frozen head (LoRA) has no weight gradient: only one piece of the logits is left.
    lora = analytic_constants(llama_stats(vocab=128256, trainable=4_000_000), "bf16")
    assert lora.head_weight_grad_bytes == 0
    assert chunked_head_bytes(lora, lora.head_bytes_per_token, tokens, k) == rest + tokens * logits / k
    # One piece is the whole logits and no buffered gradient; linear in the constants (launcher.calibrate).
    assert chunked_head_bytes(c, c.head_bytes_per_token, tokens, 1) == whole
    doubled = dataclasses.replace(c, head_bytes_per_token=2 * c.head_bytes_per_token,
                                  head_logit_bytes_per_token=2 * c.head_logit_bytes_per_token,
                                  head_weight_grad_bytes=2 * c.head_weight_grad_bytes)
    assert chunked_head_bytes(doubled, doubled.head_bytes_per_token, tokens, k) == pytest.approx(
        2 * chunked_head_bytes(c, c.head_bytes_per_token, tokens, k))


def test_the_scored_estimate_is_the_memory_models_answer_whole(request_for):
    """Estimate extends MemoryEstimate: every field of the memory model's answer reaches the scored estimate
    (peak_moment too, which a field-by-field copy left out), with the cost model's terms beside it."""
    from launcher.planner.cost import step_time_terms
    from launcher.planner.memory import estimate_memory
    from launcher.planner.plan import MemoryEstimate
    from launcher.planner.scoring import memory_inputs, score

    req = request_for(budget_bytes=24 * 10**9)
    plan_strategy = Strategy.from_json(dict(engine="deepspeed", zero_stage=3, fsdp_reshard_after_forward=None,
                             offload_optimizer="cpu", offload_params="none", micro_batch_size=1,
                             grad_accum_steps=8, activation_checkpointing=True))
    c = score(req, plan_strategy)
    mem = estimate_memory(memory_inputs(req), plan_strategy, c.buckets)
    for f in dataclasses.fields(MemoryEstimate):
        assert getattr(c.estimate, f.name) == getattr(mem, f.name), f.name
    terms = step_time_terms(memory_inputs(req), plan_strategy, c.buckets.reduce_bucket_size)
    assert c.estimate.step_time_terms == terms and c.estimate.step_time_s == sum(terms.values())
