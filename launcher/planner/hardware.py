"""Hardware profiles: the constants the memory and cost models read.

Figures are vendor datasheet numbers (dense, no sparsity) scaled by an
achievable fraction; ``launch calibrate`` measures the ``cpu`` profile (and a
GPU profile on a GPU node) and writes an override file the CLI passes in.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from launcher.units import GB, GiB, MiB


@dataclass(kw_only=True, slots=True, frozen=True)
class HardwareProfile:
    name: str
    memory_bytes: int
    """Device memory of one accelerator, bytes."""
    context_bytes: int
    """Fixed per-process cost outside the tensor allocator (CUDA context, cuBLAS workspaces), bytes."""
    fragmentation: float
    """Allocator reserve as a share of the tensor peak (reserved / allocated - 1)."""
    flops_bf16: float
    """Dense bf16 matmul FLOP/s of one device."""
    flops_fp32: float
    """Dense fp32 (or TF32) matmul FLOP/s of one device."""
    mfu: float
    """Share of peak FLOP/s a fine-tune reaches, 0 to 1."""
    intra_node_bw: float
    """Collective bus bandwidth inside a node, bytes/s (NVLink, or gloo over loopback)."""
    inter_node_bw: float
    """Collective bus bandwidth across nodes per device, bytes/s (InfiniBand / Ethernet)."""
    host_link_bw: float
    """Device to host copy bandwidth per device, bytes/s (PCIe)."""
    cpu_adam_params_per_s: float
    """Parameters one node's CPU Adam updates per second."""
    nvme_bw: float
    """NVMe read/write bandwidth per node, bytes/s."""
    block_overhead_s: float = 3e-4
    """Fixed seconds per transformer block per micro-step (kernel launches, Python), forward plus backward."""
    collective_latency_s: float = 5e-5
    """Fixed seconds per collective call (NCCL / gloo latency)."""
    deepspeed_step_overhead_s: float = 0.0
    """Fixed seconds the DeepSpeed engine adds per optimizer step (flat-buffer copies, hooks, overflow check,
    the engine's Python); 0 until `launch calibrate --from` fits it from finished runs."""
    fsdp_step_overhead_s: float = 0.0
    """The same for FSDP2 (hooks, DTensor bookkeeping); 0 until fitted."""
    comm_overlap: float = 0.5
    """Share of communication hidden behind compute, 0 to 1."""
    device_is_host: bool = False
    """True for CPU ranks: device memory is host memory, so ranks add up in host RAM."""

    def with_overrides(self, values: dict) -> HardwareProfile:
        known = {f.name for f in dataclasses.fields(self)}
        return dataclasses.replace(self, **{k: v for k, v in values.items() if k in known})


def _gpu(name, mem_gib, flops_bf16, flops_fp32, nvlink, ib, pcie, context_mib=600) -> HardwareProfile:
    return HardwareProfile(
        name=name, memory_bytes=int(mem_gib * GiB), context_bytes=context_mib * MiB, fragmentation=0.08,
        flops_bf16=flops_bf16, flops_fp32=flops_fp32, mfu=0.4, intra_node_bw=nvlink, inter_node_bw=ib,
        host_link_bw=pcie, cpu_adam_params_per_s=1.0e9, nvme_bw=3.0 * GB,
    )


PROFILES: dict[str, HardwareProfile] = {
    # Datasheets: A100 312 TF bf16 / 156 TF tf32, NVLink3 600 GB/s; H100 SXM 989 TF / 494 TF, NVLink4 900 GB/s;
    # L4 121 TF / 60 TF, PCIe only; V100 125 TF fp16 (no bf16: fp16 figure) / 15.7 TF, NVLink2 300 GB/s.
    "a100-40gb": _gpu("a100-40gb", 40, 312e12, 156e12, 300 * GB, 25 * GB, 25 * GB),
    "a100-80gb": _gpu("a100-80gb", 80, 312e12, 156e12, 300 * GB, 25 * GB, 25 * GB),
    "h100-80gb": _gpu("h100-80gb", 80, 989e12, 494e12, 450 * GB, 50 * GB, 50 * GB),
    "l4": _gpu("l4", 24, 121e12, 60e12, 25 * GB, 12 * GB, 25 * GB, context_mib=400),
    "v100-16gb": _gpu("v100-16gb", 16, 125e12, 15.7e12, 150 * GB, 12 * GB, 12 * GB, context_mib=400),
    # CPU ranks (gloo): MemTracker counts tensor bytes only, so no context or allocator reserve.
    # Throughputs are placeholders that `launch calibrate` replaces with measured ones.
    "cpu": HardwareProfile(
        name="cpu", memory_bytes=0, context_bytes=0, fragmentation=0.0, flops_bf16=20e9, flops_fp32=50e9,
        mfu=1.0, intra_node_bw=1.0 * GB, inter_node_bw=1.0 * GB, host_link_bw=5.0 * GB,
        cpu_adam_params_per_s=2.0e8, nvme_bw=1.0 * GB, block_overhead_s=2e-3, collective_latency_s=5e-4,
        # Measured minus predicted seconds per step of the confirmed runs in benchmarks/results/plan_quality.md
        # (2 CPU ranks, 1.35M-parameter GPT-2): DeepSpeed 0.90-1.01 s, FSDP2 0.00-0.17 s.
        deepspeed_step_overhead_s=1.0, fsdp_step_overhead_s=0.09,
        comm_overlap=0.0, device_is_host=True,
    ),
}

GPU_NAME_TO_PROFILE = {"H100": "h100-80gb", "H200": "h100-80gb", "A100-SXM4-40GB": "a100-40gb",
                       "A100-PCIE-40GB": "a100-40gb", "A100": "a100-80gb", "L4": "l4", "V100": "v100-16gb"}


def profile_for_gpu_name(gpu_name: str) -> str:
    for key, prof in GPU_NAME_TO_PROFILE.items():
        if key in gpu_name:
            return prof
    return "a100-80gb"
