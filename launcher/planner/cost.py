"""Seconds per optimizer step for one strategy: the cost model that ranks fitting plans.

compute   = 6·Ψ·tokens FLOPs, plus 2·Ψ_block·tokens per recomputed block [Kaplan et al. 2020; Korthikanti et al.
            2022 §5] (every block with full recompute, every k-th with checkpoint_every = k); under the op
            policy only the matmuls it does not save (recomputed_share)
            LoRA skips frozen weight gradients: 4·Ψ·tokens. Ψ is the active parameters:
            a mixture of experts runs each token through top-k of its E experts [Mixtral, arXiv:2401.04088 §2].
            Chunked cross-entropy recomputes the head's forward in backward: +2·h·V per token.
            Attention's own matmuls, which Ψ leaves out: 12·s·d per token and block (attention_flops_per_token).
            The matmuls run at mfu of the peak; the memory-bound kernels between them (norms, activations, casts,
            residual adds, eager softmax) move ELEMENTWISE_BYTES_PER_SAVED_BYTE bytes per byte a block saves,
            over the device's memory bandwidth (elementwise_s).
comm      = ring collectives move (N-1)/N of the payload per rank [ZeRO §7: DP 2Ψ, ZeRO-3 3Ψ per step];
            FSDP2 hybrid sharding gathers and reduce-scatters within a node and all-reduces its 1/n shard of
            the gradients across nodes [PyTorch FSDP, arXiv:2304.11277 §3.2.2]. comm_overlap of it hides behind
            compute, never more than the compute's own length.
offload   = PCIe traffic of grads and params, plus CPU Adam over the partition [ZeRO-Offload, arXiv:2101.06840];
            parameter offload moves every weight (frozen ones too) host to device in each forward and backward;
            activation offload moves the saved activations out in forward and back in backward, not overlapped;
            paged_adamw8bit pages its state in for each tensor's step and out again, over the host link.
dequant   = QLoRA: each NF4 weight dequantized in forward, backward (and recompute), memory-bound: the
            bytes NF4Tensor.get_original_weight writes and reads over the device's memory bandwidth.
optimizer = what a low-memory optimizer's step, or pure bf16's stochastically rounded one, adds over AdamW's
            (launcher.planner.terms.optimizer_step_s); present only in plans that use one.
engine    = a fixed per-step cost of the engine itself (HardwareProfile.step_overhead_s, keyed by engine), fitted from
            measured runs (`launch calibrate --from`).
in bwd    = the optimizer step in backward does the step's work inside backward, the same arithmetic on the same
            shards, plus one optimizer call per trainable tensor (IN_BACKWARD_CALL_S each).
Each engine's spec (launcher.engines) gives its communication and offload terms; compute is common.
"""

from __future__ import annotations

import operator
from typing import NamedTuple

from launcher.levers import (
    ACTIVATION_OFFLOAD,
    CHECKPOINT_EVERY,
    CHECKPOINT_POLICY,
    CHUNKED_LOSS,
    LOW_MEMORY_OPTIMIZER,
    OPTIMIZER_IN_BACKWARD,
)
from launcher.levers.checkpoint_every import checkpoint_count
from launcher.levers.checkpoint_policy import recomputed_share
from launcher.levers.chunked_loss import recompute_flops_per_token
from launcher.levers.optimizer_in_backward import CALL_S, step_calls_s
from launcher.planner.memo import spec_for
from launcher.planner.memory import offloaded_activation_bytes, rank_activations
from launcher.planner.plan import Strategy
from launcher.planner.terms import MemoryInputs, Traffic, optimizer_step_s, paged_state_s, stochastic_rounds

ELEMENTWISE_BYTES_PER_SAVED_BYTE = 26.0
"""Device memory traffic of a block's memory-bound kernels per byte the block saves for backward (the probe's
block_bytes_per_token, with eager attention's a·s² scores), forward and backward, bytes: eager PyTorch reads and
writes each activation several times around the matmuls (a norm's fp32 upcast, the gate's activation, the residual
adds, peft's dropout, an eager softmax). Fitted on the published step-time fit split
(benchmarks/published/steptime, split.yaml: 12 runs of torchtitan, Qwen and the Hugging Face guide on A100, H100
and V100; least squares on log(predicted / published) with mfu 0.8 and comm_overlap 1.0): 26; judged on its
validation split (benchmarks/results/published-steptime.md). What makes fast-FLOP cards slower than their peak
says: the H100 and the V100's fp16 tensor cores gain less than their FLOP/s over an A100 or fp32."""
IN_BACKWARD_CALL_S = CALL_S
"""Seconds one more optimizer call costs with the optimizer step in backward (launcher.levers
.optimizer_in_backward.CALL_S says why)."""


def communication(inp: MemoryInputs, s: Strategy, bucket_elems: int) -> Traffic:
    """Per-rank collective traffic of one optimizer step (the engine's spec says which collectives it runs)."""
    if inp.world_size <= 1:
        return Traffic(intra_node_bytes=0.0, inter_node_bytes=0.0, calls=0)
    return spec_for(inp, s).communication(inp, s, bucket_elems)


class RankTerms(NamedTuple):
    """The step-time terms that do not depend on the reduce bucket size (all but communication), seconds per step:
    the search prices each candidate with two bucket sizes. A tuple: one is made per candidate."""

    compute: float
    """Compute, its fixed per-block cost and the step in backward's calls: step_time_terms' "compute"."""
    hides: float
    """The compute collectives may overlap (compute and the per-block cost)."""
    offload: float
    """Host traffic and the host optimizer step: step_time_terms' "offload"."""
    engine: float
    """The engine's fixed seconds (HardwareProfile.step_overhead_s)."""
    optimizer: float | None
    """A low-memory optimizer's or pure bf16's step over AdamW's; None in plans that use neither."""


def step_time_terms(inp: MemoryInputs, s: Strategy, bucket_elems: int,
                    rank: RankTerms | None = None) -> dict[str, float]:
    """Seconds per optimizer step by term: compute, communication (the part not hidden), offload, engine, and the
    optimizer's where a plan changes it. ``rank``: rank_terms(inp, s), where the caller has it."""
    r = rank or rank_terms(inp, s)
    return terms_of(r, exposed_communication(inp, s, bucket_elems, r))


def exposed_communication(inp: MemoryInputs, s: Strategy, bucket_elems: int, rank: RankTerms) -> float:
    """Seconds per step of the collectives that compute does not hide (step_time_terms' "communication")."""
    hw = inp.hardware
    traffic = communication(inp, s, bucket_elems)
    comm = (traffic.intra_node_bytes / hw.intra_node_bw + traffic.inter_node_bytes / hw.inter_node_bw
            + traffic.calls * hw.collective_latency_s)
    # Prefetched gathers and bucketed reduces run beside compute: at most the compute's length hides.
    return max(comm * (1.0 - hw.comm_overlap), comm - rank.hides)


def terms_of(r: RankTerms, exposed_comm: float) -> dict[str, float]:
    """The step-time terms by name, in the order plan.json lists them."""
    terms = {"compute": r.compute, "communication": exposed_comm, "offload": r.offload, "engine": r.engine}
    if r.optimizer is not None:
        terms["optimizer"] = r.optimizer
    return terms


def step_seconds(r: RankTerms, exposed_comm: float) -> float:
    """sum(terms_of(r, exposed_comm).values()), the same float, without the dict: the search's bound for every
    candidate."""
    t = r.compute + exposed_comm + r.offload + r.engine
    return t if r.optimizer is None else t + r.optimizer


def rank_terms(inp: MemoryInputs, s: Strategy) -> RankTerms:
    """Every step-time term but communication (RankTerms)."""
    m, hw = inp.model, inp.hardware
    spec = spec_for(inp, s)
    matmuls, overhead, calls = compute_parts(inp, s)
    # QLoRA: every NF4 weight is dequantized in forward and backward, memory-bound (the engine's spec).
    compute = matmuls + spec.dequant_s(inp, s)
    # CPU ranks: "offloaded" state stays in the same memory and the optimizer runs on the same cores either
    # way, so offload moves nothing (measured: offloaded runs as fast or faster, plan_quality.md).
    # paged_adamw8bit's state in and out over the host link, whatever the engine (terms.paged_state_s).
    offload = 0.0 if hw.device_is_host else (spec.offload_s(inp, s) + activation_offload_s(inp, s)
                                             + paged_state_s(inp, s))
    optimizer = None
    if LOW_MEMORY_OPTIMIZER.of(s) != LOW_MEMORY_OPTIMIZER.off or stochastic_rounds(inp, s):
        optimizer = optimizer_step_s(inp, s, m.trainable_params / spec.optimizer_shard_ranks(inp, s),
                                     on_host=hw.device_is_host or spec.optimizer_on_host(s))
    # The engine's fixed seconds (launch calibrate --from fits them).
    return RankTerms(compute + overhead + calls, compute + overhead, offload, hw.step_overhead(spec.name), optimizer)


COMPUTE_FIELDS = ("micro_batch_size", "grad_accum_steps", "activation_checkpointing", CHECKPOINT_EVERY.field,
                  CHECKPOINT_POLICY.field, CHUNKED_LOSS.field, OPTIMIZER_IN_BACKWARD.field)
"""The Strategy fields compute_s reads: compute_parts keeps its answers by their values, so every layout with the
same micro-batch and levers shares one (tests/planner/test_search_speed.py traces compute_s to hold the list
whole)."""
_compute_key = operator.attrgetter(*COMPUTE_FIELDS)


def compute_parts(inp: MemoryInputs, s: Strategy) -> tuple[float, float, float]:
    """compute_s, from the request's memo where the search set one (MemoryInputs.memo), by COMPUTE_FIELDS."""
    memo = getattr(inp, "memo", None)
    if memo is None:
        return compute_s(inp, s)
    kept = memo.get("compute")
    if kept is None:
        kept = memo["compute"] = {}
    key = _compute_key(s)
    parts = kept.get(key)
    if parts is None:
        parts = kept[key] = compute_s(inp, s)
    return parts


def compute_s(inp: MemoryInputs, s: Strategy) -> tuple[float, float, float]:
    """(the matmuls and the memory-bound kernels between them, the fixed per-block cost, the step in backward's
    optimizer calls), seconds per step: "compute" less the engine's own dequantization (rank_terms)."""
    m, hw, k = inp.model, inp.hardware, cost_constants(inp)
    tokens_per_rank = s.micro_batch_size * s.grad_accum_steps * inp.seq_len
    # A token runs through the active parameters only: all of a dense model, top-k of E experts of an MoE.
    # Recompute: a checkpointed block runs its forward again in backward, 2 FLOPs per active block parameter
    # per token; the other blocks and everything outside them (embeddings, head) are not recomputed.
    checkpointed = checkpointed_blocks(m.num_blocks, s)
    recompute = 2.0 * checkpointed * k.block_params * recomputed_share(m, s) if checkpointed else 0.0
    flops_per_token = k.dense_flops + recompute + attention_flops_per_token(inp, s, checkpointed)
    if CHUNKED_LOSS.on(s):
        # Chunked cross-entropy runs the head's matmul again in backward (launcher.model.chunked_loss).
        flops_per_token += k.head_recompute_flops
    matmuls = flops_per_token * tokens_per_rank / k.flop_rate + elementwise_s(inp, s, tokens_per_rank, checkpointed)
    # Small micro-batches pay the fixed per-block cost more often for the same tokens; a recomputed block pays
    # its forward's half of it again.
    overhead = s.grad_accum_steps * hw.block_overhead_s * (m.num_blocks + 0.5 * checkpointed)
    # The step in backward: the same step arithmetic, moved into backward; only the per-tensor calls are new (at
    # least one tensor). They run in the gradient hooks ahead of the reduce-scatters those gradients feed, so no
    # collective hides behind them (nor do they make the lever free where the collectives are the longer part).
    calls = k.step_calls if OPTIMIZER_IN_BACKWARD.on(s) else 0.0
    return matmuls, overhead, calls


class CostConstants(NamedTuple):
    """A request's step-time factors that read no strategy field, made once per request where the search keeps a
    memo (MemoryInputs.memo): rank_terms runs for every candidate."""

    dense_flops: float
    """FLOPs per token of forward and backward over the active parameters (6Ψ, 4Ψ with frozen weights)."""
    block_params: float
    """active_block_params of the model."""
    flop_rate: float
    """FLOP/s the matmuls run at: the precision's peak times mfu."""
    head_recompute_flops: float
    """FLOPs per token chunked cross-entropy adds (recompute_flops_per_token)."""
    step_calls: float
    """Seconds the optimizer step in backward adds (step_calls_s)."""
    attention_pass_flops: float
    """Attention's FLOPs per token and block pass (attention_flops_per_token)."""
    elementwise_bytes: float
    """ELEMENTWISE_BYTES_PER_SAVED_BYTE times the bytes a block saves per token (elementwise_s)."""


def cost_constants(inp: MemoryInputs) -> CostConstants:
    """The request's CostConstants, from its memo where the search set one."""
    memo = getattr(inp, "memo", None)
    if memo is not None and "cost" in memo:
        return memo["cost"]
    m, hw, a = inp.model, inp.hardware, inp.activations
    fused = a.attention != "eager"
    k = CostConstants(
        dense_flops=(6.0 if m.trainable_params == m.num_params else 4.0) * m.active_params,
        block_params=active_block_params(m),
        flop_rate=(hw.flops_fp32 if inp.precision == "fp32" else hw.flops_bf16) * hw.mfu,
        head_recompute_flops=recompute_flops_per_token(m), step_calls=step_calls_s(m),
        # Forward 2·2·s·d per block and pass (d = heads x head_dim): attention_flops_per_token.
        attention_pass_flops=4.0 * inp.seq_len * m.num_heads * m.head_dim * (0.5 if fused and m.task == "causal_lm"
                                                                               else 1.0),
        elementwise_bytes=ELEMENTWISE_BYTES_PER_SAVED_BYTE * (a.block_bytes_per_token
                                                              + a.block_bytes_per_token_per_seq * inp.seq_len))
    if memo is not None:
        memo["cost"] = k
    return k


def checkpointed_blocks(num_blocks: int, s: Strategy) -> int:
    """How many blocks recompute in backward: ceil(n / k) with every k-th checkpointed (memory.checkpointed)."""
    if not s.activation_checkpointing:
        return 0
    return checkpoint_count(num_blocks, CHECKPOINT_EVERY.of(s))


def attention_flops_per_token(inp: MemoryInputs, s: Strategy, checkpointed: int | None = None) -> float:
    """FLOPs per token of attention's two matmuls (Q·Kᵀ, then the scores times V), which 6·Ψ leaves out: 12·s·d per
    block, half under a fused causal kernel (docs/step-time.md#attentions-matmuls). ``checkpointed``:
    checkpointed_blocks, where the caller has it."""
    m = inp.model
    if checkpointed is None:
        checkpointed = checkpointed_blocks(m.num_blocks, s)
    recomputed = 0 if inp.activations.attention != "eager" and CHECKPOINT_POLICY.of(s) == "ops" else checkpointed
    return cost_constants(inp).attention_pass_flops * (3 * m.num_blocks + recomputed)


def elementwise_s(inp: MemoryInputs, s: Strategy, tokens_per_rank: int, checkpointed: int | None = None) -> float:
    """Seconds per step of the memory-bound kernels between the matmuls, on a device with a known bandwidth.

    ELEMENTWISE_BYTES_PER_SAVED_BYTE times what a block saves per token (without checkpointing), for every block
    and a third more for each recomputed one (its forward again), over hw.memory_bw. CPU ranks (memory_bw 0) have
    their calibrated block_overhead_s instead. ``checkpointed``: checkpointed_blocks, where the caller has it."""
    hw, m = inp.hardware, inp.model
    if not hw.memory_bw:
        return 0.0
    if checkpointed is None:
        checkpointed = checkpointed_blocks(m.num_blocks, s)
    blocks = m.num_blocks + checkpointed / 3.0
    return cost_constants(inp).elementwise_bytes * blocks * tokens_per_rank / hw.memory_bw


def active_block_params(m) -> float:
    """Parameters one token runs through in one block: the active ones outside embeddings and head, per block."""
    return max(m.active_params - m.non_block_params, 0) / max(m.num_blocks, 1)


def activation_offload_s(inp: MemoryInputs, s: Strategy) -> float:
    """Seconds per step copying saved activations to the host in forward and back in backward, on the compute stream:
    no overlap (CUDA ranks; docs/step-time.md#activation-offloads-copies)."""
    if not ACTIVATION_OFFLOAD.on(s) or inp.hardware.device_is_host:
        return 0.0
    *_, saved = offloaded_activation_bytes(rank_activations(inp, s), inp.model.num_blocks,
                                          s.micro_batch_size, inp.seq_len,
                                          s.activation_checkpointing, CHECKPOINT_EVERY.of(s))
    return 2.0 * saved * s.grad_accum_steps / inp.hardware.host_link_bw


__all__ = ["COMPUTE_FIELDS", "ELEMENTWISE_BYTES_PER_SAVED_BYTE", "IN_BACKWARD_CALL_S", "CostConstants", "RankTerms",
           "Traffic", "compute_parts", "compute_s",
           "active_block_params", "cost_constants", "exposed_communication", "rank_terms", "step_seconds", "terms_of",
           "activation_offload_s", "attention_flops_per_token", "checkpointed_blocks", "communication",
           "elementwise_s", "recomputed_share", "step_time_terms"]
