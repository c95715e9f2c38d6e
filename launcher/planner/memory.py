"""Bytes per rank for one strategy: the memory model.

Sources, cited where each term is computed:
  [ZeRO]  Rajbhandari et al., arXiv:1910.02054, Table 1: (2 + 2 + K)Ψ with K = 12 for mixed-precision Adam.
  [DS]    DeepSpeed estimate_zero2/3_model_states_mem_needs (stage_1_and_2.py, stage3.py).
  [Kort]  Korthikanti et al., arXiv:2205.05198, eq. (1): sbh(34 + 5as/h) bytes per layer, 2sbh with full recompute.
  [ZInf]  ZeRO-Infinity, arXiv:2104.07857 §3: activation checkpoints 2·b·s·h·layers/ci bytes.
All inputs are plain numbers; nothing here touches a device.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from launcher.model.introspect import ModelStats
from launcher.planner.hardware import HardwareProfile
from launcher.planner.plan import Buckets, Strategy

BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
# Optimizer state bytes per trainable parameter: Adam keeps fp32 momentum and variance, SGD one momentum.
OPTIMIZER_STATE_BYTES = {"adamw": 8, "adam": 8, "sgd": 4}
MASTER_BYTES = 4  # fp32 master copy kept by mixed precision [ZeRO §3: "fp32 copy of parameters"]


@dataclass(kw_only=True, slots=True)
class ActivationConstants:
    """Per-token, per-block activation terms, in elements unless named bytes; fit with `launch calibrate`.

    A block saves for backward ``hidden_terms * h + inner_terms * I`` elements of the activation dtype and
    ``mask_bytes_per_h * h`` bytes of dropout masks per token [Kort: 34sbh for I = 4h, fp16 = 11 + 19 + 4].
    Attention scores add ``score_bytes`` * heads * s per token without fused attention [Kort: 5as/h term].
    """

    hidden_terms: float = 7.0
    """h-sized tensors saved per token per block (norm inputs, q/k/v, attention out, residuals)."""
    inner_terms: float = 2.0
    """I-sized tensors saved per token per block (MLP up-projection and activation; 3 for gated MLPs)."""
    mask_bytes_per_h: float = 2.0
    """Dropout mask bytes per token per block, in units of h (1-byte masks after attention and MLP)."""
    score_bytes: float = 0.0
    """Bytes per attention-score element saved (softmax + dropout); 0 with sdpa / flash attention."""
    logits_bytes: float = 10.0
    """Bytes per logit element alive at the loss: bf16 logits + fp32 upcast + fp32 log-softmax [Kort §4.1]."""
    embedding_terms: float = 2.0
    """h-sized tensors per token outside the blocks (embedding output, final norm)."""
    source: str = "default (Korthikanti et al. 2022)"
    """Where these numbers came from: the paper's defaults or a calibration file."""


@dataclass(kw_only=True, slots=True)
class MemoryInputs:
    """Everything the memory model reads, as plain numbers."""

    model: ModelStats
    world_size: int
    gpus_per_node: int
    nodes: int
    seq_len: int
    """Tokens per sequence."""
    precision: str
    optimizer: str
    hardware: HardwareProfile
    activations: ActivationConstants = field(default_factory=ActivationConstants)
    overlap_comm: bool = False
    """DeepSpeed overlap_comm doubles the reduce bucket."""


@dataclass(kw_only=True, slots=True)
class MemoryEstimate:
    breakdown: dict[str, int]
    """Device bytes per rank by category."""
    peak_bytes: int
    host_bytes_per_node: int
    nvme_bytes_per_node: int


def activation_bytes_per_block(m: ModelStats, micro_batch: int, seq_len: int, act_bytes: int,
                               c: ActivationConstants) -> float:
    """Bytes one block saves for backward [Kort eq. 1, constants per architecture]."""
    tokens = micro_batch * seq_len
    inner = m.intermediate_size * (1.5 if m.gated_mlp else 1.0)  # SwiGLU keeps gate and up projections
    per_token = (c.hidden_terms * m.hidden_size + c.inner_terms * inner) * act_bytes
    per_token += c.mask_bytes_per_h * m.hidden_size
    per_token += c.score_bytes * m.num_heads * seq_len
    return tokens * per_token


def activation_bytes(m: ModelStats, micro_batch: int, seq_len: int, act_bytes: int, checkpointing: bool,
                     c: ActivationConstants) -> int:
    block = activation_bytes_per_block(m, micro_batch, seq_len, act_bytes, c)
    outside = c.embedding_terms * micro_batch * seq_len * m.hidden_size * act_bytes
    if not checkpointing:
        return int(m.num_blocks * block + outside)
    # Full recompute keeps each block's input [Kort: 2sbh per layer; ZInf: 2·bsz·seq·hd·nl/ci] and,
    # during backward, one block's full activations while it is recomputed.
    checkpoints = m.num_blocks * micro_batch * seq_len * m.hidden_size * act_bytes
    return int(checkpoints + block + outside)


def logits_bytes(m: ModelStats, micro_batch: int, seq_len: int, c: ActivationConstants) -> int:
    if m.task == "causal_lm":
        return int(micro_batch * seq_len * m.vocab_size * c.logits_bytes)
    if m.task == "seq_cls":
        return int(micro_batch * max(m.num_labels, 2) * c.logits_bytes)
    return int(micro_batch * micro_batch * c.logits_bytes)  # in-batch similarity matrix


def deepspeed_states(inp: MemoryInputs, s: Strategy, buckets: Buckets) -> tuple[dict[str, float], float, float]:
    """Model states per rank on device, and host / NVMe bytes per rank [ZeRO Table 1, DS estimators]."""
    m, n = inp.model, inp.world_size
    w = BYTES[inp.precision]
    psi, psi_t = m.num_params, m.trainable_params
    mixed = inp.precision != "fp32"
    master = MASTER_BYTES * psi_t if mixed else 0
    k = OPTIMIZER_STATE_BYTES[inp.optimizer]
    # fp32 gradient accumulation partition next to the working-dtype gradients (DS bf16/fp16 optimizers).
    grad_fp32 = 4 * psi_t if mixed else 0
    stage = s.zero_stage or 0
    shard_opt = n if stage >= 1 else 1
    shard_grad = n if stage >= 2 else 1
    shard_param = n if stage >= 3 else 1

    params = w * psi / shard_param
    grads = w * psi_t / shard_grad + grad_fp32 / shard_opt
    optimizer = (master + k * psi_t) / shard_opt
    elem = w if mixed else 4
    reduce_buf = buckets.reduce_bucket_size * elem * (2 if inp.overlap_comm else 1) if stage >= 2 else 0
    buffers = min(reduce_buf, w * psi_t)
    if stage == 3:
        # Gathered parameters alive at once: the largest layer (4L in [DS]: its fp16 params and grads),
        # or the prefetch window if larger, capped by stage3_max_live_parameters.
        live = max(m.largest_layer_params, min(buckets.stage3_prefetch_bucket_size, buckets.stage3_max_live_parameters))
        buffers += 2 * w * min(live, psi)
    host = nvme = 0.0
    if s.offload_optimizer != "none":
        # ZeRO-Offload copies reduced buckets straight to host fp32 gradients; with ZeRO-2/3 no gradient
        # partition stays on the device [DS: "gpu_mem = 2 * total_params" for ZeRO-2 offload].
        moved = optimizer + grad_fp32 / shard_opt
        optimizer = 0.0
        grads = w * psi_t if stage == 1 else 0.0
        if s.offload_optimizer == "cpu":
            host += moved
        else:
            nvme += moved
            host += min(moved, 4 * buckets.reduce_bucket_size * 4)  # pinned swap buffers (buffer_count 4)
    if s.offload_params != "none":
        moved = params
        params = 0.0
        if s.offload_params == "cpu":
            host += moved
        else:
            nvme += moved
            host += min(moved, 5 * buckets.stage3_prefetch_bucket_size * w)  # param swap buffers (buffer_count 5)
    return {"params": params, "grads": grads, "optimizer": optimizer, "buffers": buffers}, host, nvme


def fsdp_states(inp: MemoryInputs, s: Strategy) -> tuple[dict[str, float], float, float]:
    """FSDP2 keeps sharded fp32 params, grads and optimizer state; unsharded bf16 copies while in use."""
    m, n = inp.model, inp.world_size
    w = BYTES[inp.precision]
    k = OPTIMIZER_STATE_BYTES[inp.optimizer]
    # HYBRID_SHARD (nodes > 1, SHARD_GRAD_OP) shards inside a node only.
    shard = n
    params = 4 * m.num_params / shard
    grads = 4 * m.trainable_params / shard
    optimizer = k * m.trainable_params / shard
    # Unsharded working copies: the root's params (embeddings, head) stay gathered for the whole step,
    # the current block plus the prefetched one, and its unsharded gradient in backward.
    gathered_blocks = 2 if s.fsdp_reshard_after_forward else m.num_blocks + 1
    buffers = w * (m.non_block_params + gathered_blocks * m.block_params) + w * m.block_params
    host = nvme = 0.0
    if s.offload_params == "cpu":  # CPUOffloadPolicy moves params, grads and optimizer state together
        host = params + grads + optimizer
        params = grads = optimizer = 0.0
    return {"params": params, "grads": grads, "optimizer": optimizer, "buffers": buffers}, host, nvme


def estimate_memory(inp: MemoryInputs, s: Strategy, buckets: Buckets) -> MemoryEstimate:
    m = inp.model
    if s.engine == "deepspeed":
        states, host_rank, nvme_rank = deepspeed_states(inp, s, buckets)
    else:
        states, host_rank, nvme_rank = fsdp_states(inp, s)
    act_bytes = BYTES[inp.precision]
    acts = activation_bytes(m, s.micro_batch_size, inp.seq_len, act_bytes, s.activation_checkpointing,
                            inp.activations)
    logits = logits_bytes(m, s.micro_batch_size, inp.seq_len, inp.activations)
    tensors = sum(states.values()) + acts + logits
    hw = inp.hardware
    reserve = hw.fragmentation * tensors + hw.context_bytes
    breakdown = {k: int(v) for k, v in states.items()}
    breakdown.update(activations=int(acts), logits=int(logits), reserve=int(reserve))
    peak = sum(breakdown.values())
    ranks = inp.gpus_per_node
    # Loading weights before sharding costs one fp32 copy per rank on the host, except where the model is
    # built sharded (ZeRO-3 zero.Init, FSDP2 meta-device init) [DS: "4nP·f without zero.Init"].
    builds_sharded = s.engine == "fsdp" or (s.zero_stage or 0) >= 3
    load = 0 if builds_sharded else 4 * m.num_params * ranks
    host = ranks * host_rank
    if hw.device_is_host:
        host += ranks * peak
    host = max(host, load)
    return MemoryEstimate(breakdown=breakdown, peak_bytes=int(peak), host_bytes_per_node=int(host),
                          nvme_bytes_per_node=int(ranks * nvme_rank))
