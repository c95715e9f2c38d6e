"""Seconds per optimizer step for one strategy: the cost model that ranks fitting plans.

compute   = 6·Ψ·tokens FLOPs (8·Ψ·tokens with full recompute) [Kaplan et al. 2020; Korthikanti et al. 2022 §5]
            LoRA skips frozen weight gradients: 4·Ψ·tokens (+2·Ψ with recompute). Ψ is the active parameters:
            a mixture of experts runs each token through top-k of its E experts [Mixtral, arXiv:2401.04088 §2].
comm      = ring collectives move (N-1)/N of the payload per rank [ZeRO §7: DP 2Ψ, ZeRO-3 3Ψ per step];
            FSDP2 hybrid sharding gathers and reduce-scatters within a node and all-reduces its 1/n shard of
            the gradients across nodes [PyTorch FSDP, arXiv:2304.11277 §3.2.2].
offload   = PCIe traffic of grads and params, plus CPU Adam over the partition [ZeRO-Offload, arXiv:2101.06840];
            parameter offload moves every weight (frozen ones too) host to device in each forward and backward.
engine    = a fixed per-step cost of the engine itself, fitted from measured runs (`launch calibrate --from`).
"""

from __future__ import annotations

from dataclasses import dataclass

from launcher.planner.memory import BYTES, MemoryInputs, fsdp_shard_ranks
from launcher.planner.plan import Strategy


@dataclass(kw_only=True, slots=True, frozen=True)
class Traffic:
    """What one rank sends per optimizer step, by link."""

    intra_node_bytes: float
    """Bytes over the node's own link (NVLink), ring factor included."""
    inter_node_bytes: float
    """Bytes over the network between nodes, ring factor included."""
    calls: int
    """Collective calls, each paying the link's fixed latency."""


def _ring(ranks: int) -> float:
    """Share of the payload each rank sends in a ring all-gather or reduce-scatter [ZeRO §7]."""
    return (ranks - 1) / ranks if ranks > 1 else 0.0


def communication(inp: MemoryInputs, s: Strategy, bucket_elems: int) -> Traffic:
    """Per-rank collective traffic of one optimizer step.

    ZeRO-0 all-reduces the gradients once (2Ψ: reduce-scatter + all-gather) and ZeRO-1 all-gathers the
    updated parameters once more; ZeRO-2 reduce-scatters every micro-step and gathers once; ZeRO-3 gathers
    parameters in forward and backward and reduce-scatters gradients every micro-step (3Ψ) [ZeRO §7].
    FSDP2 is ZeRO-3 with one gather fewer without resharding. A group that spans nodes runs at the network's
    speed, so everything but hybrid sharding counts as inter-node traffic once nodes > 1.
    """
    m, n = inp.model, inp.world_size
    if n <= 1:
        return Traffic(intra_node_bytes=0.0, inter_node_bytes=0.0, calls=0)
    w = BYTES[inp.precision]
    grad_payload = w * m.trainable_params
    param_payload = w * m.num_params
    accum = s.grad_accum_steps
    if s.engine == "fsdp":
        gathers = 2 if s.fsdp_reshard_after_forward else 1
        units = m.num_blocks + 1  # one FSDP unit per block, then the root
        volume = accum * (gathers * param_payload + grad_payload)
        calls = accum * (gathers + 1) * units
        if s.fsdp_hybrid and inp.nodes > 1:
            g = inp.gpus_per_node
            # Gather and reduce-scatter inside the node; the node's shard of each gradient (1/g of it) is then
            # all-reduced with the same shard on every other node: 2·(nodes-1)/nodes of it per rank.
            cross = accum * 2 * _ring(inp.nodes) * grad_payload / g
            return Traffic(intra_node_bytes=volume * _ring(g), inter_node_bytes=cross, calls=calls + accum * units)
    else:
        stage = s.zero_stage or 0
        buckets = max(1, -(-grad_payload // max(1, w * bucket_elems)))
        if stage <= 1:
            volume = 2 * grad_payload + (param_payload if stage == 1 else 0)  # all-reduce once; ZeRO-1 regathers
            calls = buckets
        elif stage == 2:
            volume = accum * grad_payload + param_payload  # reduce-scatter every micro-step, all-gather once
            calls = accum * buckets + 1
        else:
            volume = accum * (2 * param_payload + grad_payload)  # gather fwd + bwd, reduce-scatter
            calls = accum * 3 * m.num_blocks
    if inp.nodes == 1:
        return Traffic(intra_node_bytes=volume * _ring(n), inter_node_bytes=0.0, calls=calls)
    return Traffic(intra_node_bytes=0.0, inter_node_bytes=volume * _ring(n), calls=calls)


def step_time_terms(inp: MemoryInputs, s: Strategy, bucket_elems: int) -> dict[str, float]:
    """Seconds per optimizer step by term: compute, communication (the part not hidden), offload, engine."""
    m, hw, n = inp.model, inp.hardware, inp.world_size
    tokens_per_rank = s.micro_batch_size * s.grad_accum_steps * inp.seq_len
    fwd_bwd = 6.0 if m.trainable_params == m.num_params else 4.0
    # A token runs through the active parameters only: all of a dense model, top-k of E experts of an MoE.
    flops_per_token = (fwd_bwd + (2.0 if s.activation_checkpointing else 0.0)) * m.active_params
    peak = hw.flops_fp32 if inp.precision == "fp32" else hw.flops_bf16
    compute = flops_per_token * tokens_per_rank / (peak * hw.mfu)
    # Small micro-batches pay the fixed per-block cost more often for the same tokens.
    overhead = s.grad_accum_steps * m.num_blocks * hw.block_overhead_s * (1.5 if s.activation_checkpointing else 1.0)

    traffic = communication(inp, s, bucket_elems)
    comm = (traffic.intra_node_bytes / hw.intra_node_bw + traffic.inter_node_bytes / hw.inter_node_bw
            + traffic.calls * hw.collective_latency_s)

    w = BYTES[inp.precision]
    accum = s.grad_accum_steps
    offload = 0.0
    # The optimizer runs over this rank's shard: 1/N of the model, or 1/gpus_per_node under hybrid FSDP2.
    trainable_shard = m.trainable_params / (fsdp_shard_ranks(inp, s) if s.engine == "fsdp" else n)
    if s.offload_optimizer != "none" or (s.engine == "fsdp" and s.offload_params == "cpu"):
        pcie = 2 * w * trainable_shard / hw.host_link_bw  # grads down, updated params up
        adam = trainable_shard * inp.gpus_per_node / hw.cpu_adam_params_per_s
        offload += pcie + adam
        if s.offload_optimizer == "nvme":
            offload += 2 * 16 * trainable_shard * inp.gpus_per_node / hw.nvme_bw
    if s.engine == "fsdp" and s.offload_params == "cpu":
        # CPUOffloadPolicy keeps every fp32 shard on the host and copies it to the device before each all-gather:
        # once in forward and again in backward when resharded, every micro-step, frozen (LoRA) weights
        # included, since the device holds no copy between uses [PyTorch FSDP2 fully_shard offload_policy].
        gathers = 2 if s.fsdp_reshard_after_forward else 1
        offload += accum * gathers * 4 * m.num_params / fsdp_shard_ranks(inp, s) / hw.host_link_bw
    if s.offload_params != "none" and s.engine == "deepspeed":
        offload += accum * 2 * w * m.num_params / n / hw.host_link_bw
        if s.offload_params == "nvme":
            offload += accum * 2 * w * m.num_params / n * inp.gpus_per_node / hw.nvme_bw
    if hw.device_is_host:
        # CPU ranks: "offloaded" state stays in the same memory and the optimizer runs on the same cores either
        # way, so offload moves nothing (measured: offloaded runs as fast or faster, plan_quality.md).
        offload = 0.0
    exposed_comm = comm * (1.0 - hw.comm_overlap)
    engine = hw.deepspeed_step_overhead_s if s.engine == "deepspeed" else hw.fsdp_step_overhead_s
    return {"compute": compute + overhead, "communication": exposed_comm, "offload": offload, "engine": engine}


def step_time_s(inp: MemoryInputs, s: Strategy, bucket_elems: int) -> float:
    return sum(step_time_terms(inp, s, bucket_elems).values())
