"""DeepSpeed ZeRO 0-3's memory terms: the model states per rank, its buffers, offload and the weight load.

Memory sources: [ZeRO] Rajbhandari et al., arXiv:1910.02054, Table 1; [DS] DeepSpeed's
estimate_zero2/3_model_states_mem_needs (stage_1_and_2.py, stage3.py). The states are built in steps, each a
pure function of the one before: the partitioned model states, then the stage's communication buffers, then
what optimizer offload and parameter offload move off the device.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from launcher.engines.deepspeed.zero_flush import zero2_reduce
from launcher.levers import CHECKPOINT_EVERY, LOW_MEMORY_OPTIMIZER, PURE_BF16, RELEASE_FROZEN_WEIGHTS
from launcher.levers.checkpoint_every import checkpoint_count
from launcher.model.introspect import ModelStats
from launcher.planner.cuda_overhead import cuda_overhead
from launcher.planner.plan import Buckets, Strategy
from launcher.planner.terms import (
    BYTES,
    LOW_BIT_STATE,
    LOW_BIT_STEP_COPIES,
    MASTER_BYTES,
    NVME_PARAM_BUFFER_COUNT,
    PURE_BF16_BYTES,
    SR_STEP_COPIES,
    MemoryInputs,
    States,
    gloo_reduce_scatter_copies,
    input_embedding_params,
    low_bit_tensor_bytes,
    nvme_param_buffer_elems,
    optimizer_state_bytes,
    optimizer_step_temp_bytes,
    rounds_stochastically,
    tied_embedding_grad_bytes,
)

DEEPSPEED_COMMUNICATORS = 2
"""NCCL communicators a DeepSpeed rank holds: the default group and its clone, DeepSpeed's data-parallel group
(deepspeed/utils/groups.py _get_data_parallel_group -> _clone_world_group: dist.new_group(range(world_size))).

On several GPUs the clone always holds one: DeepSpeed binds the default group to the device (comm/torch.py
init_process_group passes device_id unless the world size is 1), and torch then builds every later group at once
by ncclCommSplit (distributed_c10d.py new_group: split_from when the default group has a bound_device_id). On one
GPU nothing is bound, and a group makes its communicator at its first collective: ZeRO-0/1/2 reduce and broadcast
on the clone, while a ZeRO-3 model built under zero.Init (the launcher's ranks, HF Trainer, accelerate's
zero3_init_flag) runs every collective on the world group (partition_parameters.py Init: ds_process_group =
dist.get_world_group() when no data_parallel_group is given; engine.py skips _broadcast_model for it), so its
clone holds none (tests/emit test_one_rank_zero3_runs_no_collective_outside_the_world_group; the second GPU
check's one-GPU ZeRO-3 offload run measured one communicator). The plan still counts two there, on purpose: that
same run's allocator cache was 874 MB against 279 MB planned (reserved - allocated, 30 % of allocated), most likely
the pool of ZeRO-3's reduce_and_partition_stream, where stage3.py moves, reduces and partitions every gradient
bucket and which no term models yet; counting one communicator would put its verdict 10.3 % under the measured
peak instead of 2.5 %. scripts/gpu-check.sh runs it again with the allocator's snapshot, whose
segments carry their stream: the count drops to one with a term for that pool."""




def flat_partition_elems(inp: MemoryInputs) -> int:
    """Elements of the flat fp32 partition ZeRO-1/2 hand the optimizer on each rank (one parameter group).

    stage_1_and_2.py DeepSpeedZeroOptimizer.__init__ pads the group's flat buffer to a multiple of
    nccl_start_alignment_factor (2) x N (aligned_numel; parameter_alignment off) and gives each rank 1/N of it,
    so single_partition_of_fp32_groups[0] has 2 * ceil(Ψ_t / 2N) elements on every rank."""
    n = inp.world_size
    return 2 * math.ceil(inp.model.trainable_params / (2 * n))


@dataclass(kw_only=True, slots=True, frozen=True)
class Partition:
    """How ZeRO divides the model states over N ranks at one stage, and the gradient sizes that follow."""

    stage: int
    w: int
    """Bytes per working-dtype element."""
    psi: int
    """All parameters, Ψ."""
    psi_t: int
    """Trainable parameters, Ψ_t."""
    shard_opt: int
    shard_grad: int
    shard_param: int
    mixed: bool
    """A 16-bit working dtype (fp32 masters kept apart)."""
    pure: bool = False
    """Pure bf16 (bf16_master_weights_and_grads, bf16_optimizer_states): the master partition, its gradient and the
    optimizer states take bf16."""
    accumulating: bool
    step_elems: float
    """Trainable elements whose fp32 gradient the optimizer step holds at once: ZeRO-3 steps one sub-group at a
    time (sub_group_elems); ZeRO-0/1/2 step their whole partition."""

    @property
    def grads16(self) -> float:
        """Working-dtype gradient bytes per rank (partitioned from ZeRO-2 on)."""
        return self.w * self.psi_t / self.shard_grad

    @property
    def master_elem_bytes(self) -> int:
        """Bytes per element of the master partition and its gradient (master_elem_bytes)."""
        return master_elem_bytes(self.pure)

    @property
    def grads32(self) -> float:
        """Master-dtype gradient bytes per rank the optimizer step holds, partitioned from ZeRO-1 on: fp32 (the
        "4_grads_32bit" of [DS]), bf16 under pure bf16."""
        return self.master_elem_bytes * self.psi_t / self.shard_opt


def master_elem_bytes(pure_bf16: bool) -> int:
    """Bytes per element of the master partition and its gradient: fp32, or bf16 under pure bf16."""
    return PURE_BF16_BYTES if pure_bf16 else MASTER_BYTES


def sub_group_elems(inp: MemoryInputs, sub_group_size: int) -> float:
    """The largest ZeRO-3 optimizer sub-group of one rank, elements.

    stage3.py _create_fp16_sub_groups keeps the whole partition as one sub-group when sub_group_size reaches it,
    else adds parameters' partitions to a sub-group until it holds sub_group_size or more: so at most
    sub_group_size plus one parameter's partition (ceil(L/N), L the largest layer), and never over the partition.
    """
    m, n = inp.model, inp.world_size
    return float(min(m.trainable_params / n, sub_group_size + math.ceil(m.largest_layer_params / n)))


def partition(inp: MemoryInputs, s: Strategy, buckets: Buckets) -> Partition:
    """The Partition a strategy's ZeRO stage gives on this request's ranks: shard counts for optimizer, gradients and
    parameters, and the elements one optimizer step holds."""
    stage, n = s.layout.zero_stage or 0, inp.world_size
    shard_opt = n if stage >= 1 else 1
    step_elems = (sub_group_elems(inp, buckets.sub_group_size) if stage == 3
                  else inp.model.trainable_params / shard_opt)
    return Partition(stage=stage, w=BYTES[inp.precision], psi=inp.model.num_params, psi_t=inp.model.trainable_params,
                     shard_opt=shard_opt, shard_grad=n if stage >= 2 else 1,
                     shard_param=n if stage >= 3 else 1, mixed=inp.precision != "fp32", pure=PURE_BF16.on(s),
                     accumulating=s.grad_accum_steps > 1, step_elems=step_elems)


def step_extra_bytes(p: Partition, grads: float) -> float:
    """What the optimizer step adds: this step's gradients, their fp32 partition and an fp32 conversion of it."""
    if p.stage == 3:
        # stage3.py step() runs one sub-group at a time: _prepare_fp32_grad_for_sub_group flattens the sub-group's
        # 16-bit gradients into an fp32 copy, unscale_and_clip_grads and _optimizer_step update it, and
        # _release_sub_group frees it (.grad = None) before the next. So the three fp32 tensors measured through
        # the step (the fp32 gradient and the optimizer's two temporaries, measured +4Ψ/N over 2·grads32 on
        # models whose partition is one sub-group) are a sub-group's, not the partition's. The 16-bit gradient
        # partition itself persists (grads).
        return 3 * 4 * p.step_elems
    if not p.mixed and p.stage in (1, 2):
        # fp32: the working gradients are already fp32 and the partition is taken from them without a 16-bit
        # copy; three fp32 partition-sized tensors live through the step (measured, ZeRO-1 and ZeRO-2).
        return 3 * p.grads32
    extra = (p.grads16 - grads) + 2 * p.grads32
    if p.stage == 2:
        # get_flat_partition copies the 16-bit partition into averaged_gradients next to grads_in_partition
        # (stage_1_and_2.py; measured: +wΨ/N at the step).
        extra += p.grads16
    return extra


def pure_bf16_step_bytes(inp: MemoryInputs, s: Strategy, p: Partition, grads: float) -> float:
    """What the optimizer step adds under pure bf16: the larger of the flattening and the step (ZeRO-3: one sub-group
    at a time); the flat bf16 gradient is the master gradient, no fp32 copy, and on the host the stochastically
    rounding step adds SR_STEP_COPIES fp32 copies (docs/memory-model.md#pure-bf16-on-deepspeed)."""
    copies = SR_STEP_COPIES * 4 if rounds_stochastically(inp, s) and inp.hardware.device_is_host else 0.0
    if p.stage == 3:
        return (PURE_BF16_BYTES + copies) * p.step_elems
    flatten = (p.grads16 - grads) + p.grads32 + (p.grads16 if p.stage == 2 else 0.0)
    step = p.grads32 + copies * flat_partition_elems(inp) - grads
    return max(flatten, step)


def model_states(inp: MemoryInputs, s: Strategy, p: Partition) -> States:
    """[ZeRO Table 1]: parameters, gradients and optimizer state, each on its own partition."""
    params = p.w * p.psi / p.shard_param
    # The fp32 master partition exists at fp32 too: ZeRO-1/2 and ZeRO-3 build it as a .clone().float() of the
    # flat partition (single_partition_of_fp32_groups, fp32_partitioned_groups_flat), a copy whatever the dtype
    # (measured: fp32 runs hold (4 + K)Ψ/N; counting KΨ/N under-predicted fp32 ZeRO-2 by 11 %).
    # ZeRO-0 at fp32 has none: engine.py _configure_optimizer keeps the optimizer over the fp32 parameters
    # themselves (no wrapper), measured on the ZeRO-0 dev cells (issue 21).
    # Pure bf16 keeps a master partition too, at bf16 (2Ψ_t/N): ZeRO-1/2 clone the partition
    # (stage_1_and_2.py __init__: .detach().clone().to(dtype=master_weights_and_grads_dtype)). ZeRO-3 would alias
    # its bf16 partition when dtype and device match (stage3.py _create_fp32_partitions), but it compares the
    # tensor's torch.device with self.device, a string ('cpu', 'cuda:0'), which is never equal: it clones
    # (measured on the ZeRO-3 dev cell: the 2Ψ/N master is there).
    masters = 0.0 if p.stage == 0 and not p.mixed else p.master_elem_bytes * p.psi_t / p.shard_opt
    optimizer = masters + low_memory_state_bytes(inp, s, p)
    # Gradients of earlier micro-steps persist while accumulating; ZeRO-3 keeps its partition buffer always.
    grads = p.grads16 if p.stage == 3 or p.accumulating else 0.0
    if p.stage == 0 and not p.mixed:
        # The unwrapped optimizer steps the parameters' own fp32 gradients, one tensor at a time: the step holds
        # those gradients and the optimizer's temporaries of the largest tensor, nothing flat (measured: exact).
        step_extra = p.grads16 - grads + optimizer_step_temp_bytes(inp, s, 1, on_host=inp.hardware.device_is_host)
    else:
        step_extra = step_extra_bytes(p, grads) + low_memory_step_bytes(inp, s, p)
    if p.pure:
        step_extra = pure_bf16_step_bytes(inp, s, p, grads)
    # ZeRO-0 at bf16/fp16 wraps the optimizer in FP16_UnfusedOptimizer, whose __init__ calls
    # initialize_optimizer_states (runtime/fp16/unfused_optimizer.py): zero .grad on every 16-bit and fp32
    # parameter, then optimizer.step(), so the states and the step's temporaries exist before training. Measured
    # on one H100 (GPU check 1, GPT-2 bf16 ZeRO-0): init 3.02 GB allocated beside a 3.09 GB step, planned 0.81.
    runs_step = p.stage == 0 and p.mixed
    return States(params=params, optimizer=optimizer, grads=grads, step_extra=step_extra,
                  model_states=params + p.grads16 + p.grads32 + optimizer, init_runs_step=runs_step)


def low_memory_state_bytes(inp: MemoryInputs, s: Strategy, p: Partition) -> float:
    """The optimizer's state on one rank, fp32 masters apart: per tensor of one unsharded rank at ZeRO-0, one flat
    partition quantized whole or not at all at ZeRO-1/2 ("DeepSpeed" in
    docs/memory-model.md#low-memory-optimizers-low_memory_optimizer)."""
    if LOW_MEMORY_OPTIMIZER.of(s) in LOW_BIT_STATE and p.stage in (1, 2):
        return low_bit_tensor_bytes(LOW_MEMORY_OPTIMIZER.of(s), flat_partition_elems(inp),
                                    param_bytes=master_elem_bytes(PURE_BF16.on(s)))
    return optimizer_state_bytes(inp, s, p.shard_opt)


def low_memory_step_bytes(inp: MemoryInputs, s: Strategy, p: Partition) -> float:
    """What a low-memory optimizer's step holds beyond the step_extra_bytes of the job's AdamW: on the host
    LOW_BIT_STEP_COPIES fp32 copies of the flat partition (ZeRO-1/2, in place of AdamW's two) or of the largest
    parameter (ZeRO-0); none on CUDA ("DeepSpeed" in
    docs/memory-model.md#low-memory-optimizers-low_memory_optimizer)."""
    opt = LOW_MEMORY_OPTIMIZER.of(s)
    if opt == "none":
        return 0.0
    on_host = inp.hardware.device_is_host
    if p.stage in (1, 2):
        adam = 2 * p.grads32 if not p.mixed else 0.0
        return (LOW_BIT_STEP_COPIES * 4 * flat_partition_elems(inp) if on_host else 0.0) - adam
    # ZeRO-0 with FP16_UnfusedOptimizer (bf16/fp16): its per-parameter fp32 copies are stepped one at a time
    # (at fp32 model_states counts the whole step itself).
    return optimizer_step_temp_bytes(inp, s, 1, on_host=on_host)


def pinned_linear_elems(m: ModelStats, s: Strategy) -> int:
    """Gathered ZeRO-3 weight elements that torch's linear keeps alive from their forward to their backward: it saves
    ``weight.t()``, a view that free_param's swap cannot free. Under LoRA only, without release_frozen_weights
    (docs/memory-model.md#zero-3s-pinned-linears-pinned_linear_elems)."""
    if not m.lora_params or RELEASE_FROZEN_WEIGHTS.on(s):
        return 0
    per_block = sum(out_f * in_f for out_f, in_f in m.block_linear_shapes)
    if s.activation_checkpointing:
        blocks = m.num_blocks - checkpoint_count(m.num_blocks, CHECKPOINT_EVERY.of(s)) + 1
    else:
        blocks = m.num_blocks
    head = m.vocab_size * m.hidden_size if m.is_causal else 0
    return per_block * blocks + head


def refetched_params(m: ModelStats) -> int:
    """Parameters that ZeRO-3's backward gathers again under LoRA: all but the input tables the frozen embedding
    modules read (no pre-backward hook fires for them), a causal LM's tied token table kept: the head reads it again
    (docs/memory-model.md#what-stays-gathered-at-the-backward-start)."""
    table = m.vocab_size * m.hidden_size
    reused = table if m.is_causal and m.tied_embeddings else 0
    return max(0, m.num_params - input_embedding_params(m) + reused)


def released_gathered_elems(m: ModelStats, buckets: Buckets) -> int:
    """Weight elements ZeRO-3 keeps gathered at the backward start when LoRA's frozen linears run DeepSpeed's
    LinearFunctionForZeroStage3 (release_frozen_weights): the forward's tail up to the live cap, an upper bound when an
    evaluation runs first (docs/memory-model.md#what-stays-gathered-at-the-backward-start)."""
    return min(buckets.stage3_max_live_parameters, refetched_params(m))


def stage3_buffers(inp: MemoryInputs, p: Partition, s: Strategy, buckets: Buckets, st: States) -> States:
    """ZeRO-3's reduce bucket, the gathered weights beside the activations, and the end-of-backward flush."""
    m = inp.model
    # The reduce bucket is allocated whole, however few parameters train (measured).
    buffers = p.w * buckets.reduce_bucket_size
    # Gathered weights live beside the activations from the forward on. The coordinator
    # (partitioned_param_coordinator.py) stops prefetching once __n_available_params reaches
    # max_available_parameters_in_numel (fetch_sub_module) and release_sub_module keeps every parameter used
    # again within max_reuse_distance (__params_to_release); the emitter sets both to stage3_max_live_parameters.
    # So up to min(cap, Ψ) parameters stay gathered, frozen ones (LoRA) included: with the cap at or above Ψ
    # the whole model (measured on GPT-2: +wΨ), below it the cap's worth (a causal LM's head among them).
    gathered = p.w * min(buckets.stage3_max_live_parameters, p.psi)
    if m.lora_params and RELEASE_FROZEN_WEIGHTS.on(s):
        gathered = p.w * released_gathered_elems(m, buckets)
    # Beyond the cap: the weights torch's linear pins until their backward (pinned_linear_elems; LoRA only).
    gathered = max(gathered, p.w * pinned_linear_elems(m, s))
    # One partition (a single rank): nothing is gathered. partition_parameters.py all_gather_coalesced returns
    # _no_gather_coalesced when every partition world size is 1, whose NoGatherHandle points param.data at a view of
    # the partition itself (ds_tensor.data.to(its own device).view(ds_shape)): no copy, so neither the live
    # parameters nor what a linear pins add bytes. Measured on one CPU rank (ZeRO-3 GPT-2, with and without
    # optimizer offload): the prediction was over by exactly wΨ, the tracker's parameters one partition.
    alone = p.shard_param == 1
    if alone:
        gathered = 0.0
    # A flush of the reduce bucket (stage3.py __reduce_and_partition_ipg_grads; reduce_scatter is DeepSpeed's
    # default, so __avg_scatter_grads, not the contiguous path): reduce_scatter_coalesced
    # (comm/coalesced_collectives.py) torch.cat's the bucket's gradients, interleaved per rank, into a new flat
    # buffer of min(bucket, Ψt) elements beside the bucket (the parameters' .grad are views of it,
    # __add_grad_to_ipg_bucket), and on CPU ranks gloo's reduce_scatter clones that buffer
    # (terms.gloo_reduce_scatter_copies; NCCL does not). partition_grads then copies the rank's share into
    # grad_partitions_flat_buffer, which persists (st.grads), and frees the copies.
    flush = p.w * min(buckets.reduce_bucket_size, p.psi_t)
    copies = flush * (1 + gloo_reduce_scatter_copies(inp.hardware.device_is_host))
    # The last instants (measured on BWDEND_DEV's ZeRO-3 tiny GPT-2: -12.3 % -> within 0.1 %). The final flush
    # runs inside the last gradient hook (independent_gradient_partition_epilogue, from
    # update_hook_state_and_maybe_run_epilogue), before the coordinator releases the modules whose backward ran
    # last: the input embeddings (token and position tables) are still gathered beside the bucket and its copies.
    # One instant earlier a tied embedding's backward holds its three tables (terms.tied_embedding_grad_bytes)
    # beside the same bucket and gathered tables; on CUDA ranks (one copy) that instant can be the larger. Under
    # LoRA the embeddings are frozen and run no backward: there the largest layer gathered with its gradient stays
    # the estimate (not measured at the end of backward).
    if m.lora_params:
        gathered_end = p.w * m.largest_layer_params * ((0 if alone else 1) + m.trainable_params / m.num_params)
    else:
        gathered_end = 0.0 if alone else p.w * input_embedding_params(m)
    late = buffers + gathered_end + max(copies, tied_embedding_grad_bytes(m, p.w))
    # On a GPU, deepspeed.initialize's own allocations come after the weight load (init_bytes): stage3.py
    # _setup_for_real_optimizer makes the master partition on the device (_create_fp32_partitions: a converted
    # clone per sub-group), then initialize_optimizer_states a zero gradient of the largest sub-group in the master
    # dtype (freed at its end), then the reduce bucket (``bucket.buffer = torch.empty(reduce_bucket_size)`` with
    # contiguous_gradients). offload_optimizer moves the master and that gradient to the host.
    master = p.master_elem_bytes * p.psi_t / p.shard_opt
    init_extra = master + max(p.master_elem_bytes * p.step_elems, buffers)
    return dataclasses.replace(
        st, buffers=buffers, model_states=st.model_states + 2 * p.w * m.largest_layer_params,
        backward_extra=gathered, backward_end_extra=buffers + copies, backward_end_late=late, init_extra=init_extra)


def stage12_bucket(inp: MemoryInputs, p: Partition, buckets: Buckets, st: States) -> States:
    """ZeRO-1/2's gradient reduce bucket: allocated whole at the first gradient hook, once the loss's temporaries
    are freed but with the blocks' activations still saved (measured): its own moment."""
    m = inp.model
    bucket = p.w * buckets.reduce_bucket_size * (2 if inp.overlap_comm else 1)
    end = bucket
    if m.task == "causal_lm":
        # The first hook fires on the output head: its gradient is copied into the bucket the hook has just
        # allocated, so both exist for a moment (contiguous_gradients; measured on tiny GPT-2).
        end += p.w * m.vocab_size * m.hidden_size * m.trainable_params / m.num_params
    st = dataclasses.replace(st, backward_end_extra=end, reduce_with_blocks=True)
    if p.stage == 2:
        # The last instants of backward, the blocks' activations freed (ZeRO-2; measured on BWDEND_DEV, exact):
        # - the final flush (independent_gradient_partition_epilogue -> reduce_ipg_grads -> average_tensor): with
        #   use_multi_rank_bucket_allreduce (DeepSpeed's default) every slice of the bucket goes to
        #   allreduce_and_scatter, whose allreduce_bucket flattens its slices (self.flatten, a torch.cat: a new
        #   tensor) in chunks of reduce_bucket_size; the other path (allreduce_no_retain) flattens the same way. So a
        #   copy of the bucket's gradients, min(bucket, Ψt) elements, lives beside the bucket;
        # - a tied embedding's backward (terms.tied_embedding_grad_bytes): its three tables are outside the bucket
        #   (the shared weight's hook fires only after AccumulateGrad), every other gradient is in it.
        flush = p.w * min(buckets.reduce_bucket_size, p.psi_t)
        st = dataclasses.replace(st, backward_end_late=bucket + max(flush, tied_embedding_grad_bytes(m, p.w)))
    elif p.stage == 1 and not inp.overlap_comm:
        # ZeRO-1 (stage_1_and_2.py; measured on BWDEND_DEV's ZeRO-1 cells: -18.9 / -20.0 % -> within 0.1 %). Its
        # gradient hook (grad_handling_hook -> process_gradients) allocates the bucket (setup_buckets) but moves
        # nothing into it: reduce_ready_partitions_and_remove_grads runs there only with partition_gradients or
        # overlap_comm. So every gradient stays in its own .grad until backward ends, and two instants follow:
        # - the input embedding's backward, the last op: the bucket beside every gradient (wΨt), a tied table's
        #   two more (terms.tied_embedding_grad_bytes: the head's, still buffered, and the sum);
        # - the reduce after backward (engine allreduce_gradients -> reduce_gradients): each .grad is copied into
        #   the bucket and its own storage freed (reduce_independent_p_g_buckets_and_remove_grads), then
        #   reduce_ipg_grads -> average_tensor -> allreduce_and_scatter -> allreduce_bucket flattens the bucket's
        #   gradients (self.flatten, a torch.cat: min(bucket, Ψt) elements) and copy_grads_in_partition allocates
        #   grads_in_partition (the rank's Ψt/N, in the working dtype) for the partition's gradients. The tracker
        #   held the copy and grads_in_partition at once on the Llama's second rank (146.85 MB, the cell's peak),
        #   so both are counted: at most wΨt/N over a rank that frees the copy first.
        # While accumulating, the .grad persist between micro-steps and are already in st.grads (and the reduce
        # frees them into the bucket).
        held = st.grads
        tied_extra = max(0.0, tied_embedding_grad_bytes(m, p.w) - p.w * m.vocab_size * m.hidden_size)
        grads_all = p.w * p.psi_t - held + tied_extra
        reduce = p.w * min(buckets.reduce_bucket_size, p.psi_t) + p.w * p.psi_t / p.shard_opt - held
        st = dataclasses.replace(st, backward_end_late=bucket + max(grads_all, reduce))
    if p.accumulating and p.mixed:
        # The bucket outlives a micro-step: the next one's backward starts with it (measured, bf16). At fp32 it
        # does not (measured on the fit split's fp32 ZeRO-2 accumulation cell: -0.2 % without it, +15 % with).
        st = dataclasses.replace(st, backward_extra=bucket, backward_extra_category="buffers")
    return st


def stage2_flushes(inp: MemoryInputs, p: Partition, buckets: Buckets, st: States) -> States:
    """ZeRO-2's end of backward hook by hook where the model's grad_layout is known (launcher.engines.zero_flush):
    a bucket smaller than the model is flushed during backward, and each rank's grads_in_partition holds every
    tensor overlapping its partition, whole (stage_1_and_2.py copy_grads_in_partition, get_partition_info: MiniLM's
    rank 1 held the whole model, -16.9 % against Ψt/N). Not with an offloaded optimizer, whose gradients go to the
    host instead (copy_grads_in_partition returns before grads_in_partition)."""
    bucket = p.w * buckets.reduce_bucket_size * (2 if inp.overlap_comm else 1)
    kept, instants = zero2_reduce(inp.model, p.w, inp.world_size, buckets.reduce_bucket_size, p.accumulating, bucket)
    if p.accumulating:
        # The micro-step's grads_in_partition, kept for the next to add into (all_grad_tensors), is the largest
        # rank's, not Ψt/N; the step's total stays as measured (its gradient views are the same tensors).
        st = dataclasses.replace(st, grads=kept, step_extra=st.step_extra - (kept - st.grads))
    return dataclasses.replace(st, reduce_instants=instants)


def offload_optimizer(inp: MemoryInputs, p: Partition, s: Strategy, buckets: Buckets, st: States) -> States:
    """ZeRO-Offload copies reduced buckets straight to host fp32 gradients: no optimizer state and no gradient
    partition stay on the device [DS: "gpu_mem = 2 * total_params" for ZeRO-2 offload]."""
    largest = inp.model.largest_layer_params
    moved = st.optimizer + 4 * p.psi_t / p.shard_opt
    # ZeRO-3's 16-bit gradient partition ([DS] leaves it out) goes to the host too: stage3.py sets self.device to
    # "cpu" when the optimizer is offloaded and allocates grad_partitions_flat_buffer there (pinned with
    # pin_memory), for CPU and NVMe offload alike. CPU ranks measured it all along (their host is the device); the
    # first GPU check's ZeRO-3 offload run held the partition and the bucket at the step, not this buffer
    # (566 MB measured, 814 predicted with it; benchmarks/results/gpu-validation.md).
    pinned_grads = p.grads16 if p.stage == 3 else 0.0
    # At ZeRO-3 only the reduce bucket of deepspeed.initialize's allocations stays on the device (stage3_buffers):
    # measured on one H100 with the partition and one bf16 vocabulary table (init_bytes' wL), to the 0.1 MB.
    init_extra = st.buffers if p.stage == 3 else st.init_extra  # stage3_buffers' buffers: the bucket
    st = dataclasses.replace(st, optimizer=0.0, grads=0.0, step_extra=0.0, host=st.host + pinned_grads,
                             model_states=st.params + (2 * p.w * largest if p.stage == 3 else 0.0),
                             init_extra=init_extra)
    if p.stage in (1, 2):
        # stage_1_and_2.py's ZeRO-Offload staging: a 16-bit copy of the partition for the upload, a host and
        # a device buffer the size of the largest parameter (largest layer here), and with accumulation a
        # 16-bit host gradient per partition parameter (accumulated_grads_in_cpu). Measured: exact.
        moved += (p.w * p.psi_t / p.shard_opt + p.w * largest
                  + (p.w * p.psi_t / p.shard_opt if p.accumulating else 0))
        st = dataclasses.replace(st, buffers=st.buffers + p.w * largest,
                                 # the device buffer is not freed by then
                                 backward_end_extra=st.backward_end_extra + p.w * largest,
                                 backward_end_late=st.backward_end_late + (p.w * largest if st.backward_end_late
                                                                           else 0.0))
    if s.layout.offload_optimizer == "cpu":
        return dataclasses.replace(st, host=st.host + moved)
    # NVMe, with pinned swap buffers: buffer_count 4, each the largest sub-group in fp32 (swap_tensor/optimizer_utils.py
    # OptimizerSwapper: largest_numel, the largest of fp16_partitioned_groups_flat_numel; the emitter writes
    # sub_group_size).
    return dataclasses.replace(st, nvme=st.nvme + moved, host=st.host + min(moved, 4 * p.step_elems * 4))


def offload_params(inp: MemoryInputs, p: Partition, s: Strategy, buckets: Buckets, st: States) -> States:
    """ZeRO-3 parameter offload: the partition leaves the device for host RAM or NVMe."""
    moved = st.params
    st = dataclasses.replace(st, model_states=st.model_states - st.params, params=0.0)
    if s.layout.offload_params == "cpu":
        return dataclasses.replace(st, host=st.host + moved)
    # Pinned parameter swap buffers, allocated whole at initialize (partitioned_param_swapper.py).
    buffer_elems = nvme_param_buffer_elems(buckets.stage3_prefetch_bucket_size, inp.model.largest_layer_params,
                                           inp.world_size)
    return dataclasses.replace(st, nvme=st.nvme + moved, host=st.host + NVME_PARAM_BUFFER_COUNT * buffer_elems * p.w)


def deepspeed_states(inp: MemoryInputs, s: Strategy, buckets: Buckets) -> States:
    """[ZeRO Table 1] with DeepSpeed's buffers [DS estimators], split by when each exists."""
    p = partition(inp, s, buckets)
    st = model_states(inp, s, p)
    if p.stage == 3:
        st = stage3_buffers(inp, p, s, buckets, st)
    elif p.stage in (1, 2):
        st = stage12_bucket(inp, p, buckets, st)
    if p.stage == 2 and s.layout.offload_optimizer == "none" and inp.model.grad_layout:
        st = stage2_flushes(inp, p, buckets, st)
    if s.layout.offload_optimizer != "none":
        st = offload_optimizer(inp, p, s, buckets, st)
    if s.layout.offload_params != "none":
        st = offload_params(inp, p, s, buckets, st)
    return st


def cuda_init_bytes(inp: MemoryInputs, s: Strategy) -> float:
    """ZeRO-0/1/2 on a CUDA rank: the model in the working dtype (wΨ), plus ZeRO-1/2's flat copy (wΨ_t) where the
    rank's usable budget has room for it, else flattened through the host; ZeRO-0's fp32 masters (4Ψ_t) when mixed
    (docs/memory-model.md#the-init-moment-on-cuda)."""
    m, w = inp.model, BYTES[inp.precision]
    model = w * m.num_params
    if (s.layout.zero_stage or 0) == 0:
        return model + (MASTER_BYTES * m.trainable_params if inp.precision != "fp32" else 0.0)
    flatten_on_device = model + w * m.trainable_params
    room = inp.device_room_bytes or inp.hardware.memory_bytes
    in_use = flatten_on_device + sum(cuda_overhead(inp.hardware, flatten_on_device, inp.world_size,
                                                   DEEPSPEED_COMMUNICATORS).values())
    flattening = flatten_on_device if in_use <= room else model
    # Then, the parameters views of the flat buffer (wΨ again), the master partition (a .clone() of the flat
    # partition in the master dtype, single_partition_of_fp32_groups) and initialize_optimizer_states' zero gradient
    # of the same size (freed at its end without offload), on the device unless the optimizer is offloaded: above the
    # flattening where 2·4Ψt/N exceeds wΨt, at few ranks.
    master = master_elem_bytes(PURE_BF16.on(s)) * m.trainable_params / inp.world_size
    wrapped = model + (2 * master if s.layout.offload_optimizer == "none" else 0.0)
    return max(flattening, wrapped)
