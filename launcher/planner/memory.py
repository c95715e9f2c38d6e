"""Bytes per rank for one strategy: the memory model.

Sources, cited where each term is computed:
  [ZeRO]  Rajbhandari et al., arXiv:1910.02054, Table 1: (2 + 2 + K)Ψ with K = 12 for mixed-precision Adam.
  [DS]    DeepSpeed estimate_zero2/3_model_states_mem_needs (stage_1_and_2.py, stage3.py).
  [Kort]  Korthikanti et al., arXiv:2205.05198, eq. (1): sbh(34 + 5as/h) bytes per layer, 2sbh with full recompute.
  [ZInf]  ZeRO-Infinity, arXiv:2104.07857 §3: activation checkpoints 2·b·s·h·layers/ci bytes.

The peak is the largest of three moments, as measured on real ranks (benchmarks/accuracy):
  backward start  the states that persist through a micro-step plus every saved activation and the loss's
                  temporaries (gradients of this micro-step do not exist yet);
  gradient reduce ZeRO-1/2: the reduce bucket, allocated at the first gradient hook while the blocks'
                  activations are still saved; ZeRO-3 and FSDP2: the end of backward, the largest unit
                  gathered with its gradient;
  optimizer step  the states plus the full step's gradients and the optimizer's fp32 working copies;
  init            rank 0 loading the weights (launcher.worker.loading): on CPU ranks, where host memory is the
                  device, the whole checkpoint it reads counts, and a LoRA or short-sequence run can peak there.
All inputs are plain numbers; nothing here touches a device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from launcher.model.introspect import ModelStats
from launcher.planner.cuda_overhead import cuda_overhead, verdict_basis
from launcher.planner.hardware import HardwareProfile
from launcher.planner.plan import Buckets, Strategy

BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
# Optimizer state bytes per trainable parameter: Adam keeps fp32 momentum and variance, SGD one momentum.
OPTIMIZER_STATE_BYTES = {"adamw": 8, "adam": 8, "sgd": 4}
MASTER_BYTES = 4  # fp32 master copy kept by mixed precision [ZeRO §3: "fp32 copy of parameters"]
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
    probe_seq_len: int = 0
    """Sequence length the numbers were measured at (0: derived from the paper)."""
    source: str = "Korthikanti et al. 2022"
    """Where the numbers came from."""
    attention: str = "sdpa"
    """The attention kernel assumed: eager saves the a·s² scores (block_bytes_per_token_per_seq), sdpa and
    flash_attention_2 do not."""
    probe_error: str = ""
    """Why the fake-tensor probe could not measure this model ('' when it did or was not asked to)."""


def analytic_constants(m: ModelStats, precision: str, attention: str = "sdpa") -> ActivationConstants:
    """[Kort] eq. (1) scaled to this architecture and dtype; the score term only with eager attention.

    Per block per token: 8h activation-dtype tensors (QKV input, Q, K, V, projection input: 5h; two norm
    inputs: 2h; MLP input: h), 2 I-sized MLP tensors (3 for gated MLPs) and 2h bytes of dropout masks:
    11h + 19h + 4h = 34h at fp16 with I = 4h. Outside the blocks: the
    embedding output, and for causal LMs the logits in the working dtype plus fp32 upcast, log-softmax and
    its gradient (2 + 4 + 4 + 4 bytes per logit).
    """
    w = BYTES[precision]
    inner = m.intermediate_size * (1.5 if m.gated_mlp else 1.0)
    block = (8 * m.hidden_size + 2 * inner) * w + 2 * m.hidden_size
    if m.task == "causal_lm":
        head = 2 * m.hidden_size * w + m.vocab_size * (w + 12)
    else:
        head = 2 * m.hidden_size * w
    # [Kort] 5as²b at fp16: the scores' softmax output and its dropout output (w bytes each) and the dropout
    # mask (1 byte) per head per token pair. Fused kernels (sdpa, flash) keep only an s-sized logsumexp.
    scores = m.num_heads * (2 * w + 1) if attention == "eager" else 0.0
    return ActivationConstants(block_bytes_per_token=block, block_bytes_per_token_per_seq=scores,
                               ckpt_bytes_per_token=m.hidden_size * w, head_bytes_per_token=head,
                               head_ckpt_bytes_per_token=head, attention=attention,
                               source=f"Korthikanti et al. 2022 ({attention} attention)")


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


@dataclass(kw_only=True, slots=True)
class MemoryEstimate:
    """The memory model's answer for one strategy."""

    breakdown: dict[str, int]
    """Device bytes per rank by category, at the predicted peak."""
    peak_bytes: int
    """Predicted peak device bytes per rank (the breakdown's sum)."""
    host_bytes_per_node: int
    """Host RAM bytes per node: offloaded state and pinned buffers of every rank, or the weight load."""
    nvme_bytes_per_node: int
    """NVMe bytes per node for offloaded optimizer state and parameters."""
    peak_moment: str = "backward"
    """Which moment is the peak: backward (activations), backward_end (gradient reduce) or step (optimizer)."""
    basis: str = "cpu_tensor_bytes"
    """What peak_bytes counts (launcher.planner.cuda_overhead.Basis): tensor bytes on CPU ranks, reserved plus
    context on CUDA, the thing that OOMs there."""
    overhead: dict[str, int] = field(default_factory=dict)
    """CUDA-only named terms inside breakdown["reserve"], bytes: cublas_workspace, allocator_reserve,
    cuda_context, nccl_buffers (launcher.planner.cuda_overhead)."""
    moment_bytes: dict[str, int] = field(default_factory=dict)
    """Predicted bytes per rank at every moment (backward, backward_end, step), reserve included: what each
    measured phase is compared with (benchmarks/accuracy)."""


def activation_bytes(c: ActivationConstants, num_blocks: int, micro_batch: int, seq_len: int,
                     checkpointing: bool) -> tuple[int, int]:
    """(blocks, head) activation bytes of one micro-batch at the backward peak."""
    tokens = micro_batch * seq_len
    block = c.block_bytes_per_token + c.block_bytes_per_token_per_seq * seq_len
    if not checkpointing:
        return int(tokens * num_blocks * block), int(tokens * c.head_bytes_per_token)
    # Checkpoints of every block [Kort: 2sbh; ZInf: 2·bsz·seq·hd·nl/ci] plus one block recomputed in backward.
    return int(tokens * (num_blocks * c.ckpt_bytes_per_token + block)), int(tokens * c.head_ckpt_bytes_per_token)


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


def deepspeed_states(inp: MemoryInputs, s: Strategy, buckets: Buckets) -> States:
    """[ZeRO Table 1] with DeepSpeed's buffers [DS estimators], split by when each exists."""
    m, n = inp.model, inp.world_size
    w = BYTES[inp.precision]
    psi, psi_t = m.num_params, m.trainable_params
    mixed = inp.precision != "fp32"
    k = OPTIMIZER_STATE_BYTES[inp.optimizer]
    stage = s.zero_stage or 0
    shard_opt = n if stage >= 1 else 1
    shard_grad = n if stage >= 2 else 1
    shard_param = n if stage >= 3 else 1
    accumulating = s.grad_accum_steps > 1

    st = States()
    st.params = w * psi / shard_param
    # The fp32 master partition exists at fp32 too: ZeRO-1/2 and ZeRO-3 build it as a .clone().float() of the
    # flat partition (single_partition_of_fp32_groups, fp32_partitioned_groups_flat), a copy whatever the dtype
    # (measured: fp32 runs hold (4 + K)Ψ/N; counting KΨ/N under-predicted fp32 ZeRO-2 by 11 %).
    st.optimizer = (MASTER_BYTES + k) * psi_t / shard_opt
    grads16 = w * psi_t / shard_grad
    grads32 = 4 * psi_t / shard_opt  # the "4_grads_32bit" of [DS]
    # Gradients of earlier micro-steps persist while accumulating; ZeRO-3 keeps its partition buffer always.
    st.grads = grads16 if stage == 3 or accumulating else 0.0
    # The step adds this step's gradients, their fp32 partition and an fp32 conversion of it.
    st.step_extra = (grads16 - st.grads) + 2 * grads32
    if not mixed and stage in (1, 2):
        # fp32: the working gradients are already fp32 and the partition is taken from them without a 16-bit
        # copy; three fp32 partition-sized tensors live through the step (measured, ZeRO-1 and ZeRO-2).
        st.step_extra = 3 * grads32
    elif stage == 2:
        # get_flat_partition copies the 16-bit partition into averaged_gradients next to grads_in_partition
        # (stage_1_and_2.py; measured: +wΨ/N at the step).
        st.step_extra += grads16
    elif stage == 3:
        # A third fp32 partition-sized tensor lives through the step (measured: +4Ψ/N over 2·grads32).
        st.step_extra += grads32
    st.model_states = st.params + grads16 + grads32 + st.optimizer
    if stage == 3:
        # The reduce bucket is allocated whole, however few parameters train (measured).
        st.buffers = w * buckets.reduce_bucket_size
        st.model_states += 2 * w * m.largest_layer_params
        # Gathered weights live beside the activations from the forward on. The coordinator
        # (partitioned_param_coordinator.py) stops prefetching once __n_available_params reaches
        # max_available_parameters_in_numel (fetch_sub_module) and release_sub_module keeps every parameter used
        # again within max_reuse_distance (__params_to_release); the emitter sets both to stage3_max_live_parameters.
        # So up to min(cap, Ψ) parameters stay gathered, frozen ones (LoRA) included: with the cap at or above Ψ
        # the whole model (measured on GPT-2: +wΨ), below it the cap's worth (a causal LM's head among them).
        st.backward_extra = w * min(buckets.stage3_max_live_parameters, psi)
        # End of backward: the largest layer gathered with its autograd gradient (frozen layers have none), and
        # the last flush of the reduce bucket. stage3.py __avg_scatter_grads -> reduce_scatter_coalesced
        # (comm/coalesced_collectives.py) torch.cat's the bucket's gradients, interleaved per rank, into a new
        # flat buffer of the bucket's elements: a second copy of min(bucket, Ψ_t) gradients next to the bucket.
        trainable_share = m.trainable_params / m.num_params
        flush = w * min(buckets.reduce_bucket_size, psi_t)
        st.backward_end_extra = st.buffers + w * m.largest_layer_params * (1 + trainable_share) + flush
    elif stage in (1, 2):
        # The gradient reduce bucket is allocated whole at the first gradient hook, once the loss's temporaries
        # are freed but with the blocks' activations still saved (measured): its own moment.
        bucket = w * buckets.reduce_bucket_size * (2 if inp.overlap_comm else 1)
        st.backward_end_extra = bucket
        if m.task == "causal_lm":
            # The first hook fires on the output head: its gradient is copied into the bucket the hook has just
            # allocated, so both exist for a moment (contiguous_gradients; measured on tiny GPT-2).
            st.backward_end_extra += w * m.vocab_size * m.hidden_size * m.trainable_params / m.num_params
        st.reduce_with_blocks = True
        if accumulating and mixed:
            # The bucket outlives a micro-step: the next one's backward starts with it (measured, bf16). At fp32 it
            # does not (measured on the fit split's fp32 ZeRO-2 accumulation cell: -0.2 % without it, +15 % with).
            st.backward_extra, st.backward_extra_category = bucket, "buffers"
    if s.offload_optimizer != "none":
        # ZeRO-Offload copies reduced buckets straight to host fp32 gradients: no optimizer state and no
        # gradient partition stay on the device [DS: "gpu_mem = 2 * total_params" for ZeRO-2 offload].
        moved = st.optimizer + 4 * psi_t / shard_opt
        st.optimizer = 0.0
        # ZeRO-3 keeps its 16-bit gradient partition on the device (measured; [DS] leaves it out).
        st.grads = grads16 if stage == 3 else 0.0
        st.step_extra = 0.0
        st.model_states = st.params + st.grads + (2 * w * m.largest_layer_params if stage == 3 else 0.0)
        if stage in (1, 2):
            # stage_1_and_2.py's ZeRO-Offload staging: a 16-bit copy of the partition for the upload, a host and
            # a device buffer the size of the largest parameter (largest layer here), and with accumulation a
            # 16-bit host gradient per partition parameter (accumulated_grads_in_cpu). Measured: exact.
            moved += w * psi_t / shard_opt + w * m.largest_layer_params + (w * psi_t / shard_opt if accumulating else 0)
            st.buffers += w * m.largest_layer_params
            st.backward_end_extra += w * m.largest_layer_params  # the device buffer is not freed by then
        if s.offload_optimizer == "cpu":
            st.host += moved
        else:
            st.nvme += moved
            st.host += min(moved, 4 * buckets.reduce_bucket_size * 4)  # pinned swap buffers (buffer_count 4)
    if s.offload_params != "none":
        st.model_states -= st.params
        moved, st.params = st.params, 0.0
        if s.offload_params == "cpu":
            st.host += moved
        else:
            st.nvme += moved
            # Pinned parameter swap buffers, allocated whole at initialize (partitioned_param_swapper.py).
            buffer_elems = nvme_param_buffer_elems(buckets.stage3_prefetch_bucket_size, m.largest_layer_params, n)
            st.host += NVME_PARAM_BUFFER_COUNT * buffer_elems * w
    return st


def fsdp_shard_ranks(inp: MemoryInputs, s: Strategy) -> int:
    """Ranks one FSDP2 parameter is sharded over: all of them, or with hybrid sharding one node's
    [PyTorch FSDP, arXiv:2304.11277 §3.2.2: hybrid sharding shards within a group and replicates across groups]."""
    return inp.gpus_per_node if s.fsdp_hybrid else inp.world_size


def fsdp_states(inp: MemoryInputs, s: Strategy) -> States:
    """FSDP2 keeps sharded params, grads and optimizer state in fp32; unsharded copies only while in use.

    Every term divides by the shard group, n = fsdp_shard_ranks: hybrid sharding holds the states of full
    sharding at world = gpus_per_node. Its cross-node all-reduce runs in place on the reduce-scatter's output
    (FSDP2 foreach_reduce), so it adds no buffer.
    """
    m, n = inp.model, fsdp_shard_ranks(inp, s)
    w = BYTES[inp.precision]
    k = OPTIMIZER_STATE_BYTES[inp.optimizer]
    st = States()
    st.params = 4 * m.num_params / n
    st.optimizer = k * m.trainable_params / n
    sharded_grads = 4 * m.trainable_params / n
    if s.grad_accum_steps > 1:
        st.grads = sharded_grads
    else:
        st.step_extra = sharded_grads
    # Unsharded working copies at the backward start. FULL_SHARD: the root's params (embeddings, head), which the
    # worker never reshards after forward (launcher.worker.engines.fsdp), and one block's worth: the last
    # block's all-gather buffer, kept as FSDP2's all_gather_state until the next all-gather (_fsdp_param_group.py
    # wait_for_unshard), or the block prefetched for backward (measured: GPT-2 'Unsharded Param' = root,
    # 'All Gather' = one block). SHARD_GRAD_OP: every unit stayed unsharded since its forward, the copy-out
    # buffers long freed (measured: wΨ).
    if s.fsdp_reshard_after_forward:
        st.buffers = w * (m.non_block_params + m.block_params)
    else:
        st.buffers = w * (m.non_block_params + m.num_blocks * m.block_params)
    # They are parameters, gathered: the ranks measure them as such (FSDPMemTracker's 'Unsharded Param').
    st.buffers_category = "params"
    # Backward ends with the root's gradient reduce-scatter: its unsharded gradient in the working dtype, a
    # reduce_dtype (fp32) copy, and the sharded output, next to the blocks' sharded gradients (measured).
    root_trainable = m.non_block_params * m.trainable_params / m.num_params
    unit = max(root_trainable, m.block_params * m.trainable_params / m.num_params)
    # At fp32 the copy-in is the larger instant: _fsdp_collectives.py foreach_reduce allocates the reduce-scatter
    # input (reduce_dtype, 4 bytes) and copies the unsharded gradients into it before clearing them
    # (foreach_reduce_scatter_copy_in, then unsharded_grads.clear()), so w + 4 bytes per element live at once,
    # more than the input plus the sharded output (4 + 4/n) that follow.
    reduce_temp = (2 * w + 4 + 4 / n) * unit if inp.precision != "fp32" else max(w + 4, 4 + 4 / n) * unit
    # The root's parameters stay unsharded through its own gradient reduce: it reshards after it (measured on
    # MiniLM, whose root is half the model: 'Unsharded Param' 48.27 MB beside the reduce's buffers).
    st.backward_end_extra = (w * m.non_block_params + 4 * (m.trainable_params - root_trainable) / n + reduce_temp
                             - st.grads)
    if s.offload_params == "cpu":  # CPUOffloadPolicy moves params, grads and optimizer state together
        # The sharded gradients are created by the reduce, so without accumulation they too exist only for the
        # step (measured: a CPU rank's peak is the same with and without the policy).
        st.host = st.params + st.grads + st.optimizer
        st.host_step_extra = st.step_extra
        st.params = st.grads = st.optimizer = st.step_extra = 0.0
    return st


def init_bytes(inp: MemoryInputs, s: Strategy) -> float:
    """Rank 0's bytes while the weights load and the engine wraps them, before any forward (measured, init phase).

    Host-resident tensors count only where the host is the device (CPU ranks); on a GPU the same instant holds
    only the device parts, which are below training's. Ψ here is the base model: LoRA adapters come after.
      ZeRO-3     transformers reads the checkpoint into rank 0's host memory and copies it in one gathered
                 parameter at a time (integrations/deepspeed.py _load_state_dict_into_zero3_model, map_location
                 "cpu" on rank 0 only): checkpoint + the wΨ/N partition + the largest layer gathered (wL).
      ZeRO-0/1/2 rank 0 builds in fp32 (4Ψ), casts to the working dtype on the host, and deepspeed.initialize
                 flattens the trainable parameters into a copy (wΨ_t) beside the model (wΨ).
      FSDP2      rank 0's fp32 build, kept as the state dict it scatters, beside its 4Ψ/N shards.
    A random init of a causal LM with tied embeddings also allocates the output head before tying it to the input
    embedding (nn.Linear's own weight, replaced by post_init's tie_weights): 4Vh for a moment (measured, GPT-2).
    """
    m, w, n = inp.model, BYTES[inp.precision], inp.world_size
    host = 1.0 if inp.hardware.device_is_host else 0.0
    untied_head = 4 * m.vocab_size * m.hidden_size if (
        m.task == "causal_lm" and m.tied_embeddings and not m.checkpoint_bytes) else 0.0
    build = 4 * m.num_params + untied_head
    # Offloaded parameters (ZeRO-3 offload_param, FSDP2's CPUOffloadPolicy) are partitioned or sharded into host
    # memory: on a GPU they are not on the device at this moment either.
    on_device = 0.0 if s.offload_params != "none" and not host else 1.0
    if s.engine == "deepspeed" and (s.zero_stage or 0) >= 3:
        return host * m.checkpoint_bytes + on_device * w * m.num_params / n + w * m.largest_layer_params
    if s.engine == "deepspeed":
        return max(host * build, w * m.num_params + w * m.trainable_params)
    shards = 4 * m.num_params / fsdp_shard_ranks(inp, s)
    return 4 * m.num_params + max(untied_head, shards) if host else on_device * shards


def estimate_memory(inp: MemoryInputs, s: Strategy, buckets: Buckets) -> MemoryEstimate:
    m = inp.model
    st = deepspeed_states(inp, s, buckets) if s.engine == "deepspeed" else fsdp_states(inp, s)
    blocks, head = activation_bytes(inp.activations, m.num_blocks, s.micro_batch_size, inp.seq_len,
                                    s.activation_checkpointing)
    persistent = st.params + st.grads + st.optimizer + st.buffers
    moments = {
        "backward": persistent + blocks + head + st.backward_extra,
        # FSDP2's unsharded working copies are resharded before the optimizer runs on the shards (measured).
        "step": persistent + st.step_extra - (st.buffers if s.engine == "fsdp" else 0.0),
        "backward_end": persistent - st.buffers + st.backward_end_extra + (blocks if st.reduce_with_blocks else 0.0),
    }
    if inp.hardware.device_is_host:
        moments["step"] += st.host_step_extra
    # Offloaded state on CPU ranks is added to every training moment below (on_device); the load is before it.
    loading = init_bytes(inp, s)
    moments["init"] = loading - (st.host if inp.hardware.device_is_host else 0.0)
    moment = max(moments, key=moments.get)
    breakdown = {
        "params": st.params,
        "grads": st.grads + {"step": st.step_extra, "backward_end": st.backward_end_extra}.get(moment, 0.0),
        "optimizer": st.optimizer,
        "buffers": 0.0,
        "activations": blocks if moment == "backward" or (moment == "backward_end" and st.reduce_with_blocks) else 0.0,
        "logits": head if moment == "backward" else 0.0,
    }
    if not (moment == "backward_end" or (moment == "step" and s.engine == "fsdp")):
        breakdown[st.buffers_category] += st.buffers
    if moment == "backward":
        breakdown[st.backward_extra_category] += st.backward_extra
    hw = inp.hardware
    if hw.device_is_host:
        # CPU ranks: "offloaded" state lives in the same memory the rank is measured in.
        breakdown["offloaded"] = st.host + (st.host_step_extra if moment == "step" else 0.0)
    if moment == "init":  # the weights being loaded (on the host, where that is the device); nothing else yet
        breakdown = dict.fromkeys(breakdown, 0.0) | {"params": loading}
    tensors = sum(breakdown.values())
    # CUDA ranks are judged on reserved plus context (what OOMs); CPU ranks on tensor bytes (MemTracker).
    overhead = cuda_overhead(hw, tensors, inp.world_size)
    breakdown["reserve"] = sum(overhead.values())
    on_device = st.host if hw.device_is_host else 0.0
    moment_bytes = {k: int(v + on_device + sum(cuda_overhead(hw, v + on_device, inp.world_size).values()))
                    for k, v in moments.items()}
    breakdown = {k: int(v) for k, v in breakdown.items()}
    peak = sum(breakdown.values())
    ranks = inp.gpus_per_node
    # The weight load, as launcher.worker.loading does it: rank 0 alone builds the model on its host (one fp32
    # copy, 4Ψ, on one node) and the other ranks build on the meta device and receive it by broadcast (DeepSpeed
    # ZeRO-0/1/2) or as shards (FSDP2: fully_shard on meta, set_model_state_dict(broadcast_from_rank0)) [torchtitan's
    # meta-device init; PyTorch torch.distributed.checkpoint.state_dict]. ZeRO-3 builds inside zero.Init, each rank
    # copying in one parameter at a time [DS: "4nL·f with zero.Init", against 4nP·f without].
    if s.engine == "deepspeed" and (s.zero_stage or 0) >= 3:
        # ...and transformers reads the checkpoint whole into rank 0's host memory first (init_bytes).
        load = 4 * m.largest_layer_params * ranks + m.checkpoint_bytes
    else:
        load = 4 * m.num_params
    host = ranks * peak if hw.device_is_host else ranks * (st.host + st.host_step_extra)
    host = max(host, load)
    return MemoryEstimate(breakdown=breakdown, peak_bytes=int(peak), host_bytes_per_node=int(host),
                          nvme_bytes_per_node=int(ranks * st.nvme), peak_moment=moment,
                          basis=verdict_basis(hw), overhead=overhead, moment_bytes=moment_bytes)


def model_state_bytes(inp: MemoryInputs, s: Strategy, buckets: Buckets) -> int:
    """DeepSpeed-estimator-comparable model states per rank (no activations, no timing of the peak)."""
    return int(deepspeed_states(inp, s, buckets).model_states)
