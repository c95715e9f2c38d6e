"""FSDP2's memory terms (torch.distributed.fsdp.fully_shard): sharded states, the unsharded working copies, the
gradient reduce, CPU offload, QLoRA's NF4 base and the side streams' pools.

[PyTorch FSDP, arXiv:2304.11277 §3.2.2]: hybrid sharding shards within a group (here a node) and replicates
across groups.
"""

from __future__ import annotations

import math

from launcher.levers import LOW_MEMORY_OPTIMIZER, OPTIMIZER_IN_BACKWARD, PURE_BF16, QLORA
from launcher.model.qlora import NF4_TABLE, block_nf4, dequant_transient_bytes, nf4_bytes
from launcher.planner.plan import Strategy
from launcher.planner.terms import (
    BYTES,
    LOW_BIT_STATE,
    LOW_BIT_STEP_COPIES,
    SR_STEP_COPIES,
    MemoryInputs,
    States,
    kept_param_bytes,
    optimizer_state_bytes,
    optimizer_step_temp_bytes,
    page_state,
    rounds_stochastically,
    tied_embedding_grad_bytes,
)


def fsdp_shard_ranks(inp: MemoryInputs, s: Strategy) -> int:
    """Ranks one FSDP2 parameter is sharded over: all of them, or with hybrid sharding one node's."""
    return inp.gpus_per_node if s.layout.hybrid else inp.world_size


def qlora_blocks(inp: MemoryInputs, s: Strategy) -> list[int]:
    """Element counts of one block's frozen linear weights that QLoRA stores in NF4 (none without qlora)."""
    return block_nf4(inp.model.block_linear_shapes, fsdp_shard_ranks(inp, s)) if QLORA.on(s) else []


def nf4_outside_fsdp(inp: MemoryInputs, s: Strategy) -> bool:
    """QLoRA over a one-rank shard group: FSDP2 copies only a parameter's first all-gather input there (torch
    _fsdp_param_group.py wait_for_unshard, "if world_size == 1"), which NF4Tensor's three cannot pass, so the worker
    leaves the NF4 weights out of FSDP2 (ignored_params): whole on the device, never gathered, not offloaded."""
    return QLORA.on(s) and fsdp_shard_ranks(inp, s) == 1


def nf4_resident_bytes(inp: MemoryInputs, s: Strategy) -> float:
    """Device bytes of the NF4 weights FSDP2 leaves alone (nf4_outside_fsdp): every block's, whole; else 0."""
    if not nf4_outside_fsdp(inp, s):
        return 0.0
    return inp.model.num_blocks * sum(nf4_bytes(e, BYTES[inp.precision]) for e in qlora_blocks(inp, s))


def init_copy_bytes(inp: MemoryInputs, s: Strategy) -> float:
    """A GPU rank's one whole tensor beside its shards while they are filled: the largest module's parameters
    (docs/memory-model.md#fsdp2s-one-whole-tensor-on-a-gpu-at-init)."""
    m = inp.model
    if inp.world_size > 1:
        return 4.0 * m.largest_layer_params
    if s.layout.offload_params == "cpu":
        return 0.0
    frozen = m.trainable_params < m.num_params  # LoRA: the largest module (the embedding) is in the frozen base
    return (BYTES[inp.precision] if frozen else kept_param_bytes(PURE_BF16.on(s))) * m.largest_layer_params


def sharded_param_bytes(inp: MemoryInputs, s: Strategy) -> float:
    """This rank's parameter shards: trainable ones fp32 (bf16 under pure bf16); frozen ones (LoRA's base) in the
    working dtype, which the worker casts them to before sharding; QLoRA's NF4 weights at their own bytes."""
    m, n, w = inp.model, fsdp_shard_ranks(inp, s), BYTES[inp.precision]
    nf4 = qlora_blocks(inp, s)
    frozen = m.num_params - m.trainable_params - m.num_blocks * sum(nf4)
    return (kept_param_bytes(PURE_BF16.on(s)) * m.trainable_params / n + w * frozen / n
            + m.num_blocks * sum(nf4_bytes(e, w, n) for e in nf4))


def trainable_split(m) -> tuple[float, float]:
    """The root's and one block's trainable elements (LoRA's spread over the model in proportion to its size)."""
    root = m.non_block_params * m.trainable_params / m.num_params
    return root, (m.block_params * m.trainable_params / m.num_params if m.num_blocks else 0.0)


def hook_step_copies(inp: MemoryInputs, s: Strategy) -> bool:
    """Whether the step in backward holds working copies inside backward's hooks: on CPU ranks, where torchao's
    single_param_adam runs eagerly (launcher.worker.engines.optimizers._eager) for a low-bit AdamW or pure bf16's
    stochastically rounded step. On CUDA torchao compiles that step into fused kernels, which hold none
    (terms.optimizer_step_temp_bytes), so the combination adds nothing there."""
    stepped = rounds_stochastically(inp, s) or LOW_MEMORY_OPTIMIZER.of(s) in LOW_BIT_STATE
    return OPTIMIZER_IN_BACKWARD.on(s) and inp.hardware.device_is_host and stepped


def fsdp_states(inp: MemoryInputs, s: Strategy) -> States:
    """FSDP2 keeps sharded params, grads and optimizer state in fp32 (bf16 under pure bf16: the worker casts the
    parameters before sharding and reduces in bf16; frozen ones in the working dtype, QLoRA's in NF4,
    sharded_param_bytes); unsharded copies only while in use.

    Every term divides by the shard group, n = fsdp_shard_ranks: hybrid sharding holds the states of full
    sharding at world = gpus_per_node. Its cross-node all-reduce runs in place on the reduce-scatter's output
    (FSDP2 foreach_reduce), so it adds no buffer.
    """
    m, n = inp.model, fsdp_shard_ranks(inp, s)
    w = BYTES[inp.precision]
    pb = kept_param_bytes(PURE_BF16.on(s))  # the shards, their gradients (reduce_dtype) and the optimizer's dtype
    # QLoRA: the frozen block linears NF4Tensor can shard (launcher.model.qlora), in the working dtype's NF4.
    nf4 = qlora_blocks(inp, s)
    # One block's, all-gathered; none where FSDP2 leaves the NF4 weights alone (nf4_outside_fsdp).
    gathered_nf4 = 0.0 if nf4_outside_fsdp(inp, s) else sum(nf4_bytes(e, w) - w * (1 + NF4_TABLE) for e in nf4)
    # The unsharded working copies are resharded before the optimizer runs on the shards (measured).
    st = States(step_frees_buffers=True)
    st.params = sharded_param_bytes(inp, s)
    st.optimizer = optimizer_state_bytes(inp, s, n)
    sharded_grads = pb * m.trainable_params / n
    if s.grad_accum_steps > 1:
        st.grads = sharded_grads
    elif not OPTIMIZER_IN_BACKWARD.on(s):
        st.step_extra = sharded_grads
    # A low-memory optimizer's working copies of the one tensor it steps (launcher.planner.terms).
    # (With the step in backward those copies come and go inside backward, one parameter at a time.)
    if not OPTIMIZER_IN_BACKWARD.on(s):
        st.step_extra += optimizer_step_temp_bytes(inp, s, n, on_host=inp.hardware.device_is_host
                                                   or s.layout.offload_params == "cpu")
    # With the optimizer step in backward no sharded gradient reaches a step: each unit's is stepped and dropped in
    # its post-accumulate-grad hook inside foreach_reduce (docs/memory-model.md "Optimizer step in backward").
    # Unsharded working copies at the backward start. FULL_SHARD: the root's params (embeddings, head), which the
    # worker never reshards after forward (launcher.worker.engines.fsdp), and one block's worth: the last
    # block's all-gather buffer, kept as FSDP2's all_gather_state until the next all-gather (_fsdp_param_group.py
    # wait_for_unshard), or the block prefetched for backward (measured: GPT-2 'Unsharded Param' = root,
    # 'All Gather' = one block). SHARD_GRAD_OP: every unit stayed unsharded since its forward, the copy-out
    # buffers long freed (measured: wΨ).
    # QLoRA's blocks gather their NF4 codes and scalers (fsdp_post_all_gather), not working-dtype weights.
    block = w * (m.block_params - sum(nf4)) + gathered_nf4
    if s.layout.fsdp_reshard_after_forward:
        st.buffers = w * m.non_block_params + block
    else:
        st.buffers = w * m.non_block_params + m.num_blocks * block
    # LinearNF4 dequantizes the whole weight in forward and again in backward, one linear at a time.
    st.dequant_transient = dequant_transient_bytes(max(nf4), w) if nf4 else 0.0
    # They are parameters, gathered: the ranks measure them as such (FSDPMemTracker's 'Unsharded Param').
    st.buffers_category = "params"
    # Backward ends with the root's gradient reduce-scatter: its unsharded gradient in the working dtype, a
    # reduce_dtype (fp32) copy, and the sharded output, next to the blocks' sharded gradients (measured).
    root_trainable, block_trainable = trainable_split(m)
    unit = max(root_trainable, block_trainable)
    # At fp32 the copy-in is the larger instant: _fsdp_collectives.py foreach_reduce allocates the reduce-scatter
    # input (reduce_dtype, 4 bytes) and copies the unsharded gradients into it before clearing them
    # (foreach_reduce_scatter_copy_in, then unsharded_grads.clear()), so w + 4 bytes per element live at once,
    # more than the input plus the sharded output (4 + 4/n) that follow.
    # Pure bf16 reduces in the gradients' own dtype (reduce_dtype = param_dtype = bf16): no cast, the fp32 case
    # with 2 bytes for 4.
    if inp.precision == "fp32" or PURE_BF16.on(s):
        reduce_temp = max(w + pb, pb + pb / n) * unit
    else:
        reduce_temp = (2 * w + 4 + 4 / n) * unit
    # The root's parameters stay unsharded through its own gradient reduce: it reshards after it (measured on
    # MiniLM, whose root is half the model: 'Unsharded Param' 48.27 MB beside the reduce's buffers).
    # The blocks' sharded gradients, reduced earlier in backward, wait here for the step; with the step in backward
    # they were stepped and freed unit by unit, and the root's own step in its hook comes after its copy-in, the
    # larger instant (its buffers then: the fp32 reduce input and output, 4 + 4/n, under w + 4).
    waiting_grads = 0.0 if OPTIMIZER_IN_BACKWARD.on(s) else pb * (m.trainable_params - root_trainable) / n
    if hook_step_copies(inp, s):
        # The eager step's fp32 copies of the tensor it steps (terms.optimizer_step_temp_bytes): in the root's hook
        # they meet its reduce input and output (the largest tensor, the vocabulary table, is the root's).
        in_hook = (pb + pb / n) * unit + optimizer_step_temp_bytes(inp, s, n, on_host=True)
        reduce_temp = max(reduce_temp, in_hook)
        # A block's hook steps its tensors while the blocks before it keep their saved activations, after the
        # head's temporaries are gone: a transient of the blocks' backward, of the largest trainable block tensor
        # (ModelStats.grad_layout; without it no larger than a block, nor than the trainable parameters).
        in_blocks = [numel for numel, block in m.grad_layout if block >= 0]
        block_tensor = max(in_blocks) if in_blocks else min(m.largest_layer_params, m.block_params,
                                                              max(1, m.trainable_params))
        copies = SR_STEP_COPIES if rounds_stochastically(inp, s) else LOW_BIT_STEP_COPIES
        block_step = copies * 4 * math.ceil(block_tensor / n)
        st.dequant_transient = max(st.dequant_transient, block_step)
    st.backward_end_extra = w * m.non_block_params + waiting_grads + reduce_temp - st.grads
    # The instant before that reduce: the input embedding's backward, the last op of autograd's pass. Every block is
    # reduced, and the last one's reduce-scatter input (reduce_dtype, pb bytes) is still held: post_backward appends
    # it to comm_ctx.reduce_scatter_states, and only the next unit's post_backward (the root's) pops it
    # (_fsdp_param_group.py, reduce_scatter_max_input_buffers = 1). The root's gradients made earlier in backward
    # (the head's, position embeddings, final norm) are unsharded, and a tied embedding's three vocabulary tables
    # meet (terms.tied_embedding_grad_bytes: one of them is the root's own gradient of that weight). Measured on
    # BWDEND_DEV's tied GPT-2: exact to the byte; with a 16k vocabulary it exceeds the reduce by about one table.
    # The table's own gradient is one of the three tied tables and already in w * root_trainable.
    root_grads = w * root_trainable + tied_embedding_grad_bytes(m, w) * 2 / 3
    st.backward_end_late = (w * m.non_block_params + waiting_grads + pb * block_trainable + root_grads
                            - st.grads)
    page_state(inp, s, st)  # paged_adamw8bit (one rank): its large states in host memory, paged in at the step
    if not inp.hardware.device_is_host:
        st.side_stream_cached = side_stream_cached(inp, s, block, unit)
    if s.layout.offload_params == "cpu":  # CPUOffloadPolicy moves params, grads and optimizer state together
        # The sharded gradients are created by the reduce, so without accumulation they too exist only for the
        # step (measured: a CPU rank's peak is the same with and without the policy).
        # NF4 weights outside FSDP2 stay on the device (nf4_outside_fsdp).
        resident = nf4_resident_bytes(inp, s)
        st.host = st.params - resident + st.grads + st.optimizer
        st.host_step_extra = st.step_extra
        st.grads = st.optimizer = st.step_extra = 0.0
        st.params = resident
    return st


def side_stream_cached(inp: MemoryInputs, s: Strategy, block: float, unit: float) -> dict[str, float]:
    """CUDA: bytes FSDP2's two side streams (reduce-scatter, all-gather) keep cached but unallocated at each moment,
    from the second step on (docs/memory-model.md#side-stream-pools-stream_pools-fsdp2). ``block``: one block's
    all-gather bytes; ``unit``: the larger unit's trainable elements (fsdp_states).
    """
    m, n = inp.model, fsdp_shard_ranks(inp, s)
    pb, w = kept_param_bytes(PURE_BF16.on(s)), BYTES[inp.precision]
    root_trainable, block_trainable = trainable_split(m)
    grads = pb * m.trainable_params / n
    if OPTIMIZER_IN_BACKWARD.on(s) or s.layout.offload_params == "cpu":
        rs_live, rs_pool = {}, pb * (root_trainable + block_trainable) / n
    elif s.grad_accum_steps > 1:
        rs_live, rs_pool = dict.fromkeys(("backward", "backward_end", "step"), grads), grads + pb * unit / n
    else:
        rs_live, rs_pool = {"backward_end": grads - pb * root_trainable / n, "step": grads}, grads
    ag_pool = max(w * m.non_block_params, block) + block if n > 1 else 0.0
    ag_live = {"backward": block} if n > 1 and s.layout.fsdp_reshard_after_forward else {}
    return {k: rs_pool - rs_live.get(k, 0.0) + ag_pool - ag_live.get(k, 0.0)
            for k in ("backward", "backward_end", "step")}
