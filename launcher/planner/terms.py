"""The vocabulary the memory and cost models share with the engine specs (launcher.engines).

Plain numbers and small records only: the generic models (launcher.planner.memory, launcher.planner.cost)
assemble these, the engine specs compute them, and neither imports the other through this module.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from launcher.model.introspect import ModelStats
from launcher.planner.hardware import HardwareProfile

BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
# Optimizer state bytes per trainable parameter: Adam keeps fp32 momentum and variance, SGD one momentum.
OPTIMIZER_STATE_BYTES = {"adamw": 8, "adam": 8, "sgd": 4}
MASTER_BYTES = 4  # fp32 master copy kept by mixed precision [ZeRO §3: "fp32 copy of parameters"]
PURE_BF16_BYTES = 2
"""Pure bf16 (Strategy.pure_bf16, LitGPT's "bf16-true"): the bytes per element of the kept parameters, their
gradients and each optimizer state. torch's AdamW allocates exp_avg / exp_avg_sq with zeros_like(param)
(torch/optim/adamw.py _init_group), so bf16 parameters get bf16 states: Adam's 8 state bytes become 4."""
# DeepSpeed's offload_param buffer_count default; the emitter writes it explicitly.
NVME_PARAM_BUFFER_COUNT = 5


def nvme_param_buffer_elems(prefetch_bucket_elems: int, largest_layer_params: int, world_size: int) -> int:
    """Elements in one NVMe parameter swap buffer (DeepSpeed's offload_param.buffer_size).

    Each buffer must hold the largest parameter's shard, ceil(L / N) (partitioned_param_swapper.py asserts it),
    and is at least the prefetch bucket. The emitter writes this and the memory model counts
    NVME_PARAM_BUFFER_COUNT of them, so the two cannot disagree.
    """
    return max(prefetch_bucket_elems, math.ceil(largest_layer_params / world_size))


@dataclass(kw_only=True, slots=True)
class ActivationConstants:
    """Activation bytes per example-token (a sentence_embedding example is two sequences).

    Without checkpointing a block saves ``block_bytes_per_token + block_bytes_per_token_per_seq · s`` per token
    [Kort: sbh(34 + 5as/h) / (sb)]; with full recompute it keeps ``ckpt_bytes_per_token`` [Kort: 2sbh] and one
    block is live again during its backward. ``head_*`` is what lies outside the blocks at the peak:
    embeddings, the logits and the loss's temporaries (b·s·V·bytes, often the largest term).
    """

    block_bytes_per_token: float
    """Saved bytes per token per block that do not grow with the sequence."""
    block_bytes_per_token_per_seq: float
    """Saved bytes per token per block per token of sequence: attention scores without fused attention."""
    ckpt_bytes_per_token: float
    """Bytes per token per block kept by full activation checkpointing (the block input)."""
    head_bytes_per_token: float
    """Bytes per token outside the blocks at the peak (embeddings, logits, loss)."""
    head_ckpt_bytes_per_token: float
    """The same with checkpointing on (the model may recompute or keep different tensors)."""
    head_logit_bytes_per_token: float = 0.0
    """The part of the head terms that is the loss's vocabulary-sized tensors, bytes per token: what chunked
    cross-entropy divides by its chunk count (launcher.planner.memory.chunked_head_bytes). 0: unknown, no saving."""
    head_weight_grad_bytes: float = 0.0
    """Bytes of one gradient of the output embedding (V·h in the working dtype; 0 when it is frozen, as under
    LoRA), per micro-batch: with chunked cross-entropy two of them exist while the blocks' activations do."""
    probe_seq_len: int = 0
    """Sequence length the numbers were measured at (0: derived from the paper)."""
    source: str = "Korthikanti et al. 2022"
    """Where the numbers came from."""
    attention: str = "sdpa"
    """The attention kernel assumed: eager saves the a·s² scores (block_bytes_per_token_per_seq), sdpa and
    flash_attention_2 do not."""
    probe_error: str = ""
    """Why the fake-tensor probe could not measure this model ('' when it did or was not asked to)."""


@dataclass(kw_only=True, slots=True)
class MemoryInputs:
    """Everything the memory model reads, as plain numbers."""

    model: ModelStats
    """Parameter counts and shapes of the model (counts in parameters, sizes in features)."""
    world_size: int
    """Data-parallel ranks in all, N."""
    gpus_per_node: int
    """Ranks per node (the hybrid FSDP2 shard group)."""
    nodes: int
    """Machines."""
    seq_len: int
    """Tokens per sequence."""
    precision: str
    """Working dtype: bf16, fp16 (2 bytes) or fp32 (4 bytes)."""
    optimizer: str
    """adamw, adam (8 state bytes per trainable parameter) or sgd (4)."""
    hardware: HardwareProfile
    """Device constants: context bytes, fragmentation share, whether device memory is host memory."""
    activations: ActivationConstants
    """Activation bytes per token (measured, calibrated or from the paper)."""
    overlap_comm: bool = False
    """DeepSpeed overlap_comm doubles the reduce bucket (the emitter turns it off at stages 1-2)."""
    memo: dict | None = field(default=None, init=False, compare=False, repr=False)
    """One request's memo of the engine terms (launcher.planner.memo); set by the search, None elsewhere. Not an
    init field, so dataclasses.replace never hands it to inputs with other values."""


@dataclass(slots=True)
class States:
    """Model states per rank, bytes: what persists through a micro-step, and what the optimizer step adds."""

    params: float = 0.0
    """Device bytes of the parameters (partition or full copy) between uses."""
    grads: float = 0.0
    """Device bytes of gradients that persist through a micro-step (accumulation, ZeRO-3's partition)."""
    optimizer: float = 0.0
    """Device bytes of optimizer state and fp32 master weights."""
    buffers: float = 0.0
    """Device bytes of engine buffers alive at the backward start (reduce bucket, FSDP2 unsharded copies)."""
    buffers_category: str = "buffers"
    """The breakdown category ``buffers`` is shown under (launcher.categories: gathered parameters are params)."""
    step_extra: float = 0.0
    """Bytes that exist only during the optimizer step (full-step gradients, fp32 working copies)."""
    backward_extra: float = 0.0
    """Bytes next to the saved activations at the backward start: ZeRO-3's gathered weights, or a ZeRO-1/2 reduce
    bucket kept from the previous micro-step."""
    backward_extra_category: str = "params"
    """The breakdown category backward_extra is shown under."""
    backward_end_extra: float = 0.0
    """Bytes at the gradient-reduce moment, when the reduce bucket or largest unit's gradient exists."""
    reduce_with_blocks: bool = False
    """The gradient-reduce moment comes while the blocks' activations are still saved (ZeRO-1/2)."""
    host: float = 0.0
    """Host bytes per rank: offloaded state and pinned staging or swap buffers."""
    host_step_extra: float = 0.0
    """Host bytes that exist only during the optimizer step (offloaded gradients)."""
    nvme: float = 0.0
    """NVMe bytes per rank: swapped-out optimizer state and parameters."""
    model_states: float = 0.0
    """Params, a full step's gradients and optimizer state all at once: what DeepSpeed's estimators count."""
    dequant_transient: float = 0.0
    """Bytes of the one frozen weight dequantized at a time in forward and backward (QLoRA's NF4 base): it meets the
    saved activations in the blocks' backward, after the loss's temporaries are freed, so the backward moment
    counts the larger of the two."""
    step_frees_buffers: bool = False
    """The engine frees its buffers before the optimizer step (FSDP2 reshards its unsharded working copies
    before stepping on the shards, measured)."""


@dataclass(kw_only=True, slots=True, frozen=True)
class Traffic:
    """What one rank sends per optimizer step, by link."""

    intra_node_bytes: float
    """Bytes over the node's own link (NVLink), ring factor included."""
    inter_node_bytes: float
    """Bytes over the network between nodes, ring factor included."""
    calls: int
    """Collective calls, each paying the link's fixed latency."""


def ring(ranks: int) -> float:
    """Share of the payload each rank sends in a ring all-gather or reduce-scatter [ZeRO §7]."""
    return (ranks - 1) / ranks if ranks > 1 else 0.0


def over_links(inp: MemoryInputs, volume: float, calls: int) -> Traffic:
    """A collective volume over all ranks: on the node's link on one node; a group that spans nodes runs at the
    network's speed, so it all counts as inter-node traffic once nodes > 1."""
    if inp.nodes == 1:
        return Traffic(intra_node_bytes=volume * ring(inp.world_size), inter_node_bytes=0.0, calls=calls)
    return Traffic(intra_node_bytes=0.0, inter_node_bytes=volume * ring(inp.world_size), calls=calls)


def optimizer_offload_s(inp: MemoryInputs, trainable_shard: float, nvme: bool) -> float:
    """Seconds per step of an optimizer on the host over this rank's shard: gradients down and updated
    parameters up over PCIe, CPU Adam on the node's cores, and with NVMe the state swapped out and back
    [ZeRO-Offload, arXiv:2101.06840]."""
    hw, w = inp.hardware, BYTES[inp.precision]
    pcie = 2 * w * trainable_shard / hw.host_link_bw  # grads down, updated params up
    adam = trainable_shard * inp.gpus_per_node / hw.cpu_adam_params_per_s
    seconds = pcie + adam
    if nvme:
        seconds += 2 * 16 * trainable_shard * inp.gpus_per_node / hw.nvme_bw
    return seconds


def kept_param_bytes(pure_bf16: bool) -> int:
    """Bytes per element of the parameters an engine keeps and steps (FSDP2's shards): fp32, or bf16 when pure."""
    return PURE_BF16_BYTES if pure_bf16 else MASTER_BYTES


def optimizer_state_bytes(optimizer: str, pure_bf16: bool) -> float:
    """Optimizer state bytes per trainable parameter: OPTIMIZER_STATE_BYTES in fp32, half of it in bf16 when
    pure (the states take the parameter's dtype)."""
    k = OPTIMIZER_STATE_BYTES[optimizer]
    return k * PURE_BF16_BYTES / 4 if pure_bf16 else k


def untied_head_bytes(m: ModelStats) -> float:
    """A random init of a causal LM with tied embeddings also allocates the output head before tying it to the
    input embedding (nn.Linear's own weight, replaced by post_init's tie_weights): 4Vh for a moment (measured,
    GPT-2)."""
    return 4 * m.vocab_size * m.hidden_size if (
        m.task == "causal_lm" and m.tied_embeddings and not m.checkpoint_bytes) else 0.0
