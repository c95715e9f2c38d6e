"""Seconds per optimizer step for one strategy: the cost model that ranks fitting plans.

compute   = 6·Ψ·tokens FLOPs (8·Ψ·tokens with full recompute) [Kaplan et al. 2020; Korthikanti et al. 2022 §5]
            LoRA skips frozen weight gradients: 4·Ψ·tokens (+2·Ψ with recompute).
comm      = ring collectives move (N-1)/N of the payload per rank [ZeRO §7: DP 2Ψ, ZeRO-3 3Ψ per step].
offload   = PCIe traffic of grads and params, plus CPU Adam over the partition [ZeRO-Offload, arXiv:2101.06840].
engine    = a fixed per-step cost of the engine itself, fitted from measured runs (`launch calibrate --from`).
"""

from __future__ import annotations

from launcher.planner.memory import BYTES, MemoryInputs
from launcher.planner.plan import Strategy


def step_time_terms(inp: MemoryInputs, s: Strategy, bucket_elems: int) -> dict[str, float]:
    m, hw, n = inp.model, inp.hardware, inp.world_size
    tokens_per_rank = s.micro_batch_size * s.grad_accum_steps * inp.seq_len
    fwd_bwd = 6.0 if m.trainable_params == m.num_params else 4.0
    flops_per_token = (fwd_bwd + (2.0 if s.activation_checkpointing else 0.0)) * m.num_params
    peak = hw.flops_fp32 if inp.precision == "fp32" else hw.flops_bf16
    compute = flops_per_token * tokens_per_rank / (peak * hw.mfu)
    # Small micro-batches pay the fixed per-block cost more often for the same tokens.
    overhead = s.grad_accum_steps * m.num_blocks * hw.block_overhead_s * (1.5 if s.activation_checkpointing else 1.0)

    w = BYTES[inp.precision]
    grad_payload = w * m.trainable_params
    param_payload = w * m.num_params
    ring = (n - 1) / n if n > 1 else 0.0
    bw = hw.intra_node_bw if inp.nodes == 1 else hw.inter_node_bw
    accum = s.grad_accum_steps
    buckets = max(1, -(-grad_payload // max(1, w * bucket_elems)))
    if s.engine == "deepspeed":
        stage = s.zero_stage or 0
        if stage <= 1:
            volume = 2 * grad_payload + (param_payload if stage == 1 else 0)  # all-reduce once; ZeRO-1 regathers
            calls = buckets
        elif stage == 2:
            volume = accum * grad_payload + param_payload  # reduce-scatter every micro-step, all-gather once
            calls = accum * buckets + 1
        else:
            volume = accum * (2 * param_payload + grad_payload)  # gather fwd + bwd, reduce-scatter
            calls = accum * 3 * m.num_blocks
    else:
        gathers = 2 if s.fsdp_reshard_after_forward else 1
        volume = accum * (gathers * param_payload + grad_payload)
        calls = accum * (gathers + 1) * (m.num_blocks + 1)
    comm = (volume * ring / bw + calls * hw.collective_latency_s) if n > 1 else 0.0

    offload = 0.0
    trainable_shard = m.trainable_params / n
    if s.offload_optimizer != "none" or (s.engine == "fsdp" and s.offload_params == "cpu"):
        pcie = 2 * w * trainable_shard / hw.host_link_bw  # grads down, updated params up
        adam = trainable_shard * inp.gpus_per_node / hw.cpu_adam_params_per_s
        offload += pcie + adam
        if s.offload_optimizer == "nvme":
            offload += 2 * 16 * trainable_shard * inp.gpus_per_node / hw.nvme_bw
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
