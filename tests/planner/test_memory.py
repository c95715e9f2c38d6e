"""The model-state terms against DeepSpeed's own estimators, and the activation terms against the paper."""

import pytest
from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

from launcher.planner.hardware import PROFILES
from launcher.planner.memory import ActivationConstants, MemoryInputs, activation_bytes, estimate_memory
from launcher.planner.plan import Buckets, Strategy
from tests.planner.conftest import llama_stats

P = 6_738_415_616


def states(stage, opt="none", par="none", gpus=8, nodes=1, model=None):
    m = model or llama_stats()
    inp = MemoryInputs(model=m, world_size=gpus * nodes, gpus_per_node=gpus, nodes=nodes, seq_len=1, precision="bf16",
                       optimizer="adamw", hardware=PROFILES["cpu"])
    s = Strategy(engine="deepspeed", zero_stage=stage, fsdp_reshard_after_forward=None, offload_optimizer=opt,
                 offload_params=par, micro_batch_size=1, grad_accum_steps=1, activation_checkpointing=False)
    # Buckets at their floor and a prefetch below L, so the live-parameter term is DeepSpeed's 4L.
    b = Buckets(reduce_bucket_size=0, allgather_bucket_size=0, stage3_prefetch_bucket_size=1,
                stage3_max_live_parameters=1, stage3_param_persistence_threshold=0)
    est = estimate_memory(inp, s, b)
    return sum(est.breakdown[k] for k in ("params", "grads", "optimizer", "buffers")), m


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


def test_zero3_offloads_equal_deepspeed():
    ours, m = states(3, opt="cpu")
    _, ds, _ = estimate_zero3_model_states_mem_needs(P, m.largest_layer_params, 8, 1, cpu_offload=True,
                                                     cpu_offload_params=False)
    assert abs(ours - ds) <= 1
    ours, m = states(3, opt="cpu", par="cpu")
    _, ds, _ = estimate_zero3_model_states_mem_needs(P, m.largest_layer_params, 8, 1, cpu_offload=True,
                                                     cpu_offload_params=True)
    assert ours == ds


def test_zero_paper_table_1_for_7_5b_at_64_gpus():
    # ZeRO paper, Table 1: Ψ = 7.5B, N_d = 64, K = 12 -> 120, 31.4, 16.6 GB (model states only). DeepSpeed's
    # bf16/fp16 optimizers also keep an fp32 gradient accumulation buffer (the "4_grads_32bit" of its
    # estimator), sharded like the optimizer: 4Ψ at stage 0, 4Ψ/N from stage 1.
    psi, n = 7_500_000_000, 64
    m = llama_stats(num_params=psi)
    got = [states(stage, gpus=n, model=m)[0] for stage in (0, 1, 2)]
    paper = [120.0e9, 31.4e9, 16.6e9]
    fp32_grads = [4 * psi, 4 * psi / n, 4 * psi / n]
    for g, p, extra in zip(got, paper, fp32_grads):
        assert abs(g - (p + extra)) < 0.05e9


def test_korthikanti_34sbh_without_recompute_and_2sbh_with_it():
    # GPT-style block (I = 4h, no gating): 34 bytes per token per h with fp16 activations, sdpa attention.
    m = llama_stats(h=1024, inter=4096, blocks=24, num_params=350_000_000)
    m = type(m)(**{**m.to_json(), "gated_mlp": False})
    c = ActivationConstants(hidden_terms=7, inner_terms=2, mask_bytes_per_h=2, embedding_terms=0)
    s, b = 512, 4
    full = activation_bytes(m, b, s, 2, False, c)
    assert full == 24 * s * b * m.hidden_size * (2 * 7 + 2 * 2 * 4 + 2)  # = 34·sbh per layer
    ckpt = activation_bytes(m, b, s, 2, True, c)
    assert ckpt == 24 * 2 * s * b * m.hidden_size + full // 24


def test_attention_scores_add_5as_over_h_without_flash():
    m = llama_stats(h=1024, inter=4096, blocks=1, num_params=10**8)
    m = type(m)(**{**m.to_json(), "gated_mlp": False})
    base = ActivationConstants(embedding_terms=0)
    eager = ActivationConstants(embedding_terms=0, score_bytes=5)
    s, b = 2048, 1
    extra = activation_bytes(m, b, s, 2, False, eager) - activation_bytes(m, b, s, 2, False, base)
    assert extra == 5 * m.num_heads * s * s * b  # sbh · 5as/h
