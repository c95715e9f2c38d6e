"""FSDP2 (torch.distributed.fsdp.fully_shard): its memory terms, cost terms, candidates, fallback rungs and
config file.

[PyTorch FSDP, arXiv:2304.11277 §3.2.2]: hybrid sharding shards within a group (here a node) and replicates
across groups.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from launcher.config.job import Job
from launcher.emit.exports import ADAM_TITLES, FSDP_NOTES, PURE_BF16_CLIENT
from launcher.emit.fsdp import fsdp_config, fsdp_yaml_text
from launcher.engines.spec import Candidate, EngineSpec
from launcher.model.qlora import NF4_TABLE, block_nf4, dequant_transient_bytes, nf4_bytes, quantize_transient_bytes
from launcher.planner.plan import Buckets, Plan, Strategy, checkpointed
from launcher.planner.terms import (
    BYTES,
    MemoryInputs,
    States,
    Traffic,
    kept_param_bytes,
    optimizer_offload_s,
    optimizer_state_bytes,
    optimizer_step_temp_bytes,
    over_links,
    ring,
    stochastic_rounds,
    tied_embedding_grad_bytes,
    untied_head_bytes,
)

NAME = "fsdp"
LOW_MEMORY_CLASSES = {"adamw8bit": "torchao.optim.AdamW8bit", "adamw4bit": "torchao.optim.AdamW4bit",
                      # torch.optim.Adafactor itself refuses FSDP2's DTensor shards (torch 2.13)
                      "adafactor": "launcher.worker.engines.optimizers.ShardedAdafactor"}
"""What a script of its own builds for Strategy.low_memory_optimizer (the worker: launcher.worker.engines.optimizers)."""


def fsdp_shard_ranks(inp: MemoryInputs, s: Strategy) -> int:
    """Ranks one FSDP2 parameter is sharded over: all of them, or with hybrid sharding one node's."""
    return inp.gpus_per_node if s.fsdp_hybrid else inp.world_size


def qlora_blocks(inp: MemoryInputs, s: Strategy) -> list[int]:
    """Element counts of one block's frozen linear weights that QLoRA stores in NF4 (none without qlora)."""
    return block_nf4(inp.model.block_linear_shapes, fsdp_shard_ranks(inp, s)) if s.qlora else []


def nf4_outside_fsdp(inp: MemoryInputs, s: Strategy) -> bool:
    """QLoRA over a one-rank shard group: FSDP2 copies only a parameter's first all-gather input there (torch
    _fsdp_param_group.py wait_for_unshard, "if world_size == 1"), which NF4Tensor's three cannot pass, so the worker
    leaves the NF4 weights out of FSDP2 (ignored_params): whole on the device, never gathered, not offloaded."""
    return s.qlora and fsdp_shard_ranks(inp, s) == 1


def nf4_resident_bytes(inp: MemoryInputs, s: Strategy) -> float:
    """Device bytes of the NF4 weights FSDP2 leaves alone (nf4_outside_fsdp): every block's, whole; else 0."""
    if not nf4_outside_fsdp(inp, s):
        return 0.0
    return inp.model.num_blocks * sum(nf4_bytes(e, BYTES[inp.precision]) for e in qlora_blocks(inp, s))


def init_copy_bytes(inp: MemoryInputs, s: Strategy) -> float:
    """A GPU rank's one whole tensor beside its shards while they are filled: the largest module's parameters.

    Over several ranks rank 0 alone builds (launcher.worker.loading) and set_model_state_dict(broadcast_from_rank0)
    sends its fp32 state one tensor at a time, each received whole on the process group's device, CPU offload or
    not (torch/distributed/_state_dict_utils.py _broadcast_tensors: ``full_state.detach().to(pg_device)``), then
    copied into the shard. On one rank fully_shard moves each unit's parameters to the device and copies each into
    its padded shard before the original goes (_fsdp_init.py _move_states_to_device, _fsdp_param.py
    _init_sharded_param ``new_zeros`` + ``copy_``), in the dtype the worker gave it (frozen: the working dtype);
    with CPUOffloadPolicy nothing reaches the device. Measured on one H100 (GPU check 2, 2026-11-26): GPT-2 and
    Llama 3.2 1B held their shards plus one vocabulary table at init, the 14-16 % the plan was under.
    """
    m = inp.model
    if inp.world_size > 1:
        return 4.0 * m.largest_layer_params
    if s.offload_params == "cpu":
        return 0.0
    frozen = m.trainable_params < m.num_params  # LoRA: the largest module (the embedding) is in the frozen base
    return (BYTES[inp.precision] if frozen else kept_param_bytes(s.pure_bf16)) * m.largest_layer_params


def sharded_param_bytes(inp: MemoryInputs, s: Strategy) -> float:
    """This rank's parameter shards: trainable ones fp32 (bf16 under pure bf16); frozen ones (LoRA's base) in the
    working dtype, which the worker casts them to before sharding; QLoRA's NF4 weights at their own bytes."""
    m, n, w = inp.model, fsdp_shard_ranks(inp, s), BYTES[inp.precision]
    nf4 = qlora_blocks(inp, s)
    frozen = m.num_params - m.trainable_params - m.num_blocks * sum(nf4)
    return (kept_param_bytes(s.pure_bf16) * m.trainable_params / n + w * frozen / n
            + m.num_blocks * sum(nf4_bytes(e, w, n) for e in nf4))


def trainable_split(m) -> tuple[float, float]:
    """The root's and one block's trainable elements (LoRA's spread over the model in proportion to its size)."""
    root = m.non_block_params * m.trainable_params / m.num_params
    return root, (m.block_params * m.trainable_params / m.num_params if m.num_blocks else 0.0)


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
    pb = kept_param_bytes(s.pure_bf16)  # the shards, their gradients (reduce_dtype) and the optimizer's dtype
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
    elif not s.optimizer_in_backward:
        st.step_extra = sharded_grads
    # A low-memory optimizer's working copies of the one tensor it steps (launcher.planner.terms).
    # (With the step in backward those copies come and go inside backward, one parameter at a time.)
    if not s.optimizer_in_backward:
        st.step_extra += optimizer_step_temp_bytes(inp, s, n, on_host=inp.hardware.device_is_host
                                                   or s.offload_params == "cpu")
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
    if s.fsdp_reshard_after_forward:
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
    if inp.precision == "fp32" or s.pure_bf16:
        reduce_temp = max(w + pb, pb + pb / n) * unit
    else:
        reduce_temp = (2 * w + 4 + 4 / n) * unit
    # The root's parameters stay unsharded through its own gradient reduce: it reshards after it (measured on
    # MiniLM, whose root is half the model: 'Unsharded Param' 48.27 MB beside the reduce's buffers).
    # The blocks' sharded gradients, reduced earlier in backward, wait here for the step; with the step in backward
    # they were stepped and freed unit by unit, and the root's own step in its hook comes after its copy-in, the
    # larger instant (its buffers then: the fp32 reduce input and output, 4 + 4/n, under w + 4).
    waiting_grads = 0.0 if s.optimizer_in_backward else pb * (m.trainable_params - root_trainable) / n
    if s.optimizer_in_backward and stochastic_rounds(inp, s) and inp.hardware.device_is_host:
        # Pure bf16's eager stochastically rounded step holds SR_STEP_COPIES fp32 copies of the tensor it steps:
        # in the root's hook they meet its reduce input and output (the largest tensor, the vocabulary table, is
        # the root's; on CUDA the compiled step holds none).
        in_hook = (pb + pb / n) * unit + optimizer_step_temp_bytes(inp, s, n, on_host=True)
        reduce_temp = max(reduce_temp, in_hook)
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
    if not inp.hardware.device_is_host:
        st.side_stream_cached = side_stream_cached(inp, s, block, unit)
    if s.offload_params == "cpu":  # CPUOffloadPolicy moves params, grads and optimizer state together
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
    """CUDA: bytes FSDP2's two side streams keep cached but unallocated at each moment, from the second step on
    (launcher.planner.cuda_overhead [POOL]: a cached block serves only its own stream).

    Reduce-scatter stream: foreach_reduce allocates each unit's sharded output there and the sharded gradients are
    views of it (_fsdp_collectives.py: "the GPU sharded gradient is allocated in the RS stream"). Without
    accumulation they live until zero_grad(set_to_none=True) after the step, so the pool holds every gradient
    shard, and backward starts with all of it cached (the default stream's freed activations cannot hold them);
    at the end of backward the root's output is still to come (its copy-in is the larger instant), at the step
    all of it is live. With accumulation the first micro-batch's outputs become the gradients (States.grads,
    live at every moment) and each later one's is added in and freed: one unit's shard more. Where backward drops
    each unit's output (the step in its hook, or CPU offload's copy to the host) the pool is the root's and one
    block's. Shards are in reduce_dtype, the kept parameters' bytes (kept_param_bytes).
    All-gather stream: with a shard group of 2 or more, foreach_all_gather allocates each unit's all-gather output
    on the copy-in stream, and in forward wait_for_unshard keeps the previous unit's until the next copy-out
    (_fsdp_param_group.py, implicit prefetch): the root's and the first block's meet, so the pool is the larger of
    the root and a block, plus a block. With one rank FSDP2 copies the shard on the current stream (no pool). At
    the backward start the last block's output is live where units reshard after forward (States.buffers).
    ``block``: one block's all-gather bytes; ``unit``: the larger unit's trainable elements (fsdp_states).
    """
    m, n = inp.model, fsdp_shard_ranks(inp, s)
    pb, w = kept_param_bytes(s.pure_bf16), BYTES[inp.precision]
    root_trainable, block_trainable = trainable_split(m)
    grads = pb * m.trainable_params / n
    if s.optimizer_in_backward or s.offload_params == "cpu":
        rs_live, rs_pool = {}, pb * (root_trainable + block_trainable) / n
    elif s.grad_accum_steps > 1:
        rs_live, rs_pool = dict.fromkeys(("backward", "backward_end", "step"), grads), grads + pb * unit / n
    else:
        rs_live, rs_pool = {"backward_end": grads - pb * root_trainable / n, "step": grads}, grads
    ag_pool = max(w * m.non_block_params, block) + block if n > 1 else 0.0
    ag_live = {"backward": block} if n > 1 and s.fsdp_reshard_after_forward else {}
    return {k: rs_pool - rs_live.get(k, 0.0) + ag_pool - ag_live.get(k, 0.0)
            for k in ("backward", "backward_end", "step")}


class FsdpSpec(EngineSpec):
    """FSDP2 (fully_shard) with full or hybrid sharding, resharding after forward or not, and CPU offload: its layouts,
    memory and cost terms, fallback rungs and fsdp.yaml; the rank side is launcher.worker.engines.fsdp.FsdpEngine."""

    name = NAME
    rank_engine = "FsdpEngine"
    overhead_field = "fsdp_step_overhead_s"
    # The optimizer steps FSDP2's DTensor shards: torchao's low-bit AdamW and ShardedAdafactor both run there
    # (launcher.worker.engines.optimizers).
    levers = frozenset({"loss_chunks", "pure_bf16", "qlora", "optimizer_in_backward", "low_memory_optimizer",
                        "checkpoint_every", "checkpoint_policy", "activation_offload"})
    # torchao's low-bit AdamW steps bf16 shards with bf16_stochastic_round (optimizers.low_memory_optimizer): the
    # parameters, gradients and step of pure bf16 with the quantized moments. Adafactor would keep bf16 factors
    # and round to nearest: not paired.
    pure_bf16_optimizers = frozenset({"adamw8bit", "adamw4bit"})

    def candidates(self, *, nodes: int, nvme: bool) -> list[Candidate]:
        """Reshard after forward or not x CPU offload or none, with full sharding and on several nodes hybrid too."""
        # Hybrid sharding differs from full sharding only across nodes: on one node the two are the same plan.
        groups = ("full", "hybrid") if nodes > 1 else ("full",)
        # CPUOffloadPolicy moves params, grads and optimizer together: both offloaded, or neither.
        return [Candidate(engine=NAME, fsdp_reshard_after_forward=reshard, fsdp_sharding=group,
                          offload_optimizer=off, offload_params=off)
                for group in groups for reshard in (True, False) for off in ("none", "cpu")]

    def states(self, inp: MemoryInputs, s: Strategy, buckets: Buckets) -> States:
        """FSDP2's model states per rank (fsdp_states; the buckets do not apply)."""
        return fsdp_states(inp, s)

    def init_bytes(self, inp: MemoryInputs, s: Strategy) -> float:
        """Rank 0's fp32 build, kept as the state dict it scatters, beside its 4Ψ/N shards (2Ψ/N under pure bf16)
        (on CPU ranks, where host memory is the device); on a GPU the shards (none when CPUOffloadPolicy holds them)
        and the one whole tensor being filled into them (init_copy_bytes)."""
        m = inp.model
        shards = sharded_param_bytes(inp, s)
        # QLoRA quantizes each weight on the rank before it is sharded, one at a time (launcher.worker.qlora): the
        # largest one's to_nf4 temporaries come on top, on the device where the collectives run. On rank 0 that is
        # in the first block, whose weights up to it (module order) have left its fp32 state dict by then.
        nf4 = qlora_blocks(inp, s)
        quantizing = quantize_transient_bytes(max(nf4), BYTES[inp.precision]) if nf4 else 0.0
        if inp.hardware.device_is_host:
            consumed = 4 * sum(nf4[:nf4.index(max(nf4)) + 1]) if nf4 else 0.0
            return 4 * m.num_params + max(untied_head_bytes(m), shards, quantizing - consumed)
        on_device = shards if s.offload_params == "none" else nf4_resident_bytes(inp, s)
        return on_device + max(quantizing, init_copy_bytes(inp, s))

    def fp32_adapters(self, s: Strategy, *, script: bool) -> bool:
        """Never: the rank's MixedPrecisionPolicy (param_dtype the working dtype, launcher.worker.engines.fsdp
        setup; pure bf16 casts every parameter) all-gathers peft's fp32 adapters in bf16/fp16, so in forward
        lora_A.weight has the working dtype and peft's input cast to it (BaseTunerLayer._cast_input_dtype) is a
        no-op: no fp32 copy. Checked with a forward hook on one-rank FSDP2 and FSDP2-offload runs (stop 31)."""
        return False

    def nccl_communicators(self, s: Strategy) -> int:
        """The default group; hybrid sharding's 2-D mesh adds one group per dimension (init_device_mesh creates the
        replicate and the shard group, launcher.worker.engines.fsdp); a 1-D mesh reuses the default group."""
        return 3 if s.fsdp_hybrid else 1

    def load_bytes_per_node(self, inp: MemoryInputs, s: Strategy) -> float:
        """Host bytes per node while loading: rank 0's fp32 model (4Ψ); the other ranks receive their shards."""
        # Rank 0 builds in fp32 on its host; the others build on meta and receive their shards
        # (set_model_state_dict(broadcast_from_rank0)).
        return 4 * inp.model.num_params

    def optimizer_shard_ranks(self, inp: MemoryInputs, s: Strategy) -> int:
        """The ranks a parameter is sharded over (fsdp_shard_ranks): all, or one node's under hybrid sharding."""
        return fsdp_shard_ranks(inp, s)

    def communication(self, inp: MemoryInputs, s: Strategy, bucket_elems: int) -> Traffic:
        """ZeRO-3's traffic with one gather fewer without resharding; hybrid sharding gathers and reduce-scatters
        within a node and all-reduces its 1/n shard of the gradients across nodes."""
        m, w, accum = inp.model, BYTES[inp.precision], s.grad_accum_steps
        grad_payload = w * m.trainable_params
        nf4 = qlora_blocks(inp, s)  # QLoRA's blocks all-gather NF4 codes and scalers for those weights
        param_payload = w * (m.num_params - m.num_blocks * sum(nf4)) + m.num_blocks * sum(
            nf4_bytes(e, w) - w * (1 + NF4_TABLE) for e in nf4)
        gathers = 2 if s.fsdp_reshard_after_forward else 1
        units = m.num_blocks + 1  # one FSDP unit per block, then the root
        volume = accum * (gathers * param_payload + grad_payload)
        calls = accum * (gathers + 1) * units
        if s.fsdp_hybrid and inp.nodes > 1:
            g = inp.gpus_per_node
            # Gather and reduce-scatter inside the node; the node's shard of each gradient (1/g of it) is then
            # all-reduced with the same shard on every other node: 2·(nodes-1)/nodes of it per rank.
            cross = accum * 2 * ring(inp.nodes) * grad_payload / g
            return Traffic(intra_node_bytes=volume * ring(g), inter_node_bytes=cross, calls=calls + accum * units)
        return over_links(inp, volume, calls)

    def dequant_s(self, inp: MemoryInputs, s: Strategy) -> float:
        """LinearNF4 dequantizes each NF4 weight in forward and again in backward (and in the recompute with
        checkpointing): each of get_original_weight's temporaries written once and read once, over the device's
        memory bandwidth. 0 where the profile has no bandwidth (CPU)."""
        nf4, hw = qlora_blocks(inp, s), inp.hardware
        if not nf4 or not hw.memory_bw:
            return 0.0
        # The recompute dequantizes again only in the checkpointed blocks (every checkpoint_every-th).
        n = inp.model.num_blocks
        recomputed = sum(checkpointed(i, s.checkpoint_every) for i in range(n)) if s.activation_checkpointing else 0
        passes = 2 + recomputed / max(n, 1)
        touched = 2 * sum(dequant_transient_bytes(e, BYTES[inp.precision]) for e in nf4) * inp.model.num_blocks
        return s.grad_accum_steps * passes * touched / hw.memory_bw

    def optimizer_on_host(self, s: Strategy) -> bool:
        """True with CPU offload (CPUOffloadPolicy): then the optimizer steps on the host."""
        # CPUOffloadPolicy moves the parameters, gradients and optimizer state together.
        return s.offload_optimizer != "none" or s.offload_params == "cpu"

    def offload_s(self, inp: MemoryInputs, s: Strategy) -> float:
        """Seconds per step of the host optimizer step over this rank's shard, plus with CPU offload the fp32 shards
        copied to the device before each all-gather on every micro-step."""
        m, hw = inp.model, inp.hardware
        offload = 0.0
        if self.optimizer_on_host(s):
            # The optimizer runs over this rank's shard: 1/N of the model, or 1/gpus_per_node under hybrid.
            offload += optimizer_offload_s(inp, m.trainable_params / fsdp_shard_ranks(inp, s),
                                           s.offload_optimizer == "nvme")
        if s.offload_params == "cpu":
            # CPUOffloadPolicy keeps every fp32 shard on the host and copies it to the device before each
            # all-gather: once in forward and again in backward when resharded, every micro-step, frozen (LoRA)
            # weights included, since the device holds no copy between uses [PyTorch FSDP2 offload_policy].
            gathers = 2 if s.fsdp_reshard_after_forward else 1
            offload += s.grad_accum_steps * gathers * sharded_param_bytes(inp, s) / hw.host_link_bw
        return offload

    def rung_options(self, rung: str, s: Strategy, *, nvme: bool) -> list[Strategy]:
        """The fallback ladder's changes: reshard after forward, then CPU offload of everything; no parameter-only or
        NVMe rung."""
        if rung == "sharding":
            return [] if s.fsdp_reshard_after_forward else [dataclasses.replace(s, fsdp_reshard_after_forward=True)]
        if rung == "optimizer_offload":
            if s.offload_optimizer != "none":
                return []
            # CPUOffloadPolicy moves parameters, gradients and optimizer state together.
            return [dataclasses.replace(s, offload_optimizer="cpu", offload_params="cpu")]
        if rung in ("param_offload", "nvme"):
            return []  # parameters move with the optimizer (above); FSDP2 has no NVMe offload
        raise ValueError(f"unknown rung {rung!r}")

    def config_files(self, plan: Plan, job: Job) -> dict[str, str]:
        """fsdp.yaml for the run dir."""
        return {"fsdp.yaml": fsdp_yaml_text(plan, job)}

    def rank_files(self, plan: Plan, job: Job) -> dict[str, str]:
        """None: the ranks read plan.json."""
        return {}  # the ranks read plan.json; fsdp.yaml documents the same settings

    def accelerate_config(self, plan: Plan, job: Job, *, config_dir: Path | None = None) -> dict:
        """fsdp.yaml's accelerate section: accelerate's FSDP2 config for the plan."""
        return fsdp_config(plan, job)["accelerate"]

    def accelerate_title(self, s: Strategy) -> str:
        """"FSDP2", accelerate.yaml's header."""
        return "FSDP2"

    def accelerate_env(self, plan: Plan) -> str:
        """The plan's gradient accumulation as ACCELERATE_GRADIENT_ACCUMULATION_STEPS."""
        # accelerate reads FSDP's accumulation only from its environment.
        return f"ACCELERATE_GRADIENT_ACCUMULATION_STEPS={plan.strategy.grad_accum_steps}"

    def accelerate_notes(self, plan: Plan, config_dir: Path, *, optimizer: str) -> list[str]:
        """What a script launched with this accelerate.yaml must do, and what pure bf16, the optimizer step in
        backward or a low-memory optimizer add to it."""
        notes = list(FSDP_NOTES)
        opt = plan.strategy.low_memory_optimizer
        if plan.strategy.pure_bf16:
            # accelerate's mixed_precision keeps fp32 parameters; pure bf16 is the script's own cast.
            notes.append("Pure bf16: cast the model to bfloat16 (model.to(torch.bfloat16)) before accelerator.prepare;")
            notes.append("  accelerate's bf16 mixed precision alone keeps fp32 parameters and optimizer states.")
            # The rank side's step (launcher.worker.engines.base.build_optimizer): a low-bit AdamW rounds
            # stochastically (optimizers.low_memory_optimizer), as do Adam/AdamW (optimizers.stochastic_round_adam);
            # SGD is torch's.
            if opt != "none":
                notes.append(f"  The plan's {opt} rounds stochastically: build it (below) with "
                             "bf16_stochastic_round=True; rounding to nearest")
                notes.append("  drops updates under half a bf16 spacing of the weight.")
            elif optimizer in PURE_BF16_CLIENT:
                name = ADAM_TITLES[optimizer]
                notes.append(f"  The plan's {name} rounds stochastically: build {PURE_BF16_CLIENT[optimizer]};")
                notes.append(f"  torch's {name} rounds to nearest and drops updates under half a bf16 spacing of the "
                             "weight.")
            else:
                notes.append("  The job's SGD is torch.optim.SGD, as on the plan's ranks: it rounds to nearest, so "
                             "updates under half")
                notes.append("  a bf16 spacing of a weight are lost (torchao has no stochastically rounding SGD).")
        if plan.strategy.optimizer_in_backward:
            # accelerate and the HF Trainer have no setting for it: the script has to do it, or hold the gradients.
            notes += ["The plan steps the optimizer in backward (no gradient buffer, no clipping); accelerate has no",
                      "  setting for it: build one optimizer per parameter and step it from",
                      "  param.register_post_accumulate_grad_hook (as torchtune's optimizer_in_bwd), with no "
                      "clip_grad_norm;",
                      "  a plain optimizer.step() holds every gradient at the step, beyond the plan's peak."]
        if opt != "none":
            # accelerate carries no optimizer: the script builds the one the plan's memory assumes.
            notes.append(f"The plan assumes the {opt} optimizer: build {LOW_MEMORY_CLASSES[opt]} over the prepared "
                         "model's parameters (docs/memory-model.md, Low-memory optimizers).")
        return notes

    def title(self, s: Strategy, nodes: int) -> str:
        """The sharding in FSDP's words (FULL_SHARD / SHARD_GRAD_OP, HYBRID_SHARD), as launch plan prints it."""
        words = "FSDP2 " + ("FULL_SHARD (reshard after forward)" if s.fsdp_reshard_after_forward
                            else "SHARD_GRAD_OP (keep params after forward)")
        if s.fsdp_sharding == "hybrid":
            words += f", HYBRID_SHARD (shard within each node, replicate across the {nodes} nodes)"
        return words
