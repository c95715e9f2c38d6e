"""Hardware profiles: the constants the memory and cost models read.

Figures are vendor datasheet numbers (dense, no sparsity, each profile names its source) scaled by an
achievable fraction; ``launch calibrate`` measures the ``cpu`` profile (and a
GPU profile on a GPU node) and writes an override file the CLI passes in.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from launcher.units import GB, GiB, MiB


@dataclass(kw_only=True, slots=True, frozen=True)
class HardwareProfile:
    """One accelerator type's constants (memory, FLOP/s, link and host bandwidths, fixed overheads) that the memory
    and cost models read; `launch calibrate` can override them per machine."""

    name: str
    memory_bytes: int
    """Device memory of one accelerator, bytes."""
    context_bytes: int
    """Per-process device bytes outside the caching allocator (CUDA context, library handles), bytes; `launch calibrate`
    measures it as total - free - reserved. cuBLAS workspaces and NCCL buffers are separate terms (cuda_overhead)."""
    fragmentation: float
    """Allocator reserve as a share of the tensor peak (reserved / allocated - 1)."""
    kernel_bytes: int = 0
    """Device bytes the libraries' kernels take once loaded, outside the caching allocator, bytes: CUDA loads
    modules lazily, on a kernel's first use (cuBLAS/cuBLASLt at the first matmul, the attention kernels); a rank
    that trains has used them all. `launch calibrate` measures it after its matmuls."""
    nccl_comm_bytes: int = 0
    """Device bytes outside the allocator that NCCL takes for a process's first communicator (its per-process
    state and device code with it), before any peer's ring buffers (cuda_overhead's nccl_buffers), bytes."""
    nccl_extra_comm_bytes: int = 0
    """Device bytes each further communicator of the process takes (an engine's own process groups), bytes."""
    flops_bf16: float
    """Dense bf16 matmul FLOP/s of one device."""
    flops_fp32: float
    """Dense fp32 (or TF32) matmul FLOP/s of one device."""
    mfu: float
    """Share of peak FLOP/s the model's matmuls reach, 0 to 1 (the memory-bound kernels between them are the cost
    model's bandwidth term, launcher.planner.cost.elementwise_s)."""
    intra_node_bw: float
    """Collective bus bandwidth inside a node, bytes/s (NVLink, or gloo over loopback)."""
    inter_node_bw: float
    """Collective bus bandwidth across nodes per device, bytes/s (InfiniBand / Ethernet)."""
    host_link_bw: float
    """Device to host copy bandwidth per device, bytes/s (PCIe)."""
    cpu_adam_params_per_s: float
    """Parameters one node's CPU Adam updates per second: DeepSpeed's vectorized CPU Adam (ZeRO-Offload's); torch's
    AdamW on the host runs launcher.planner.terms.TORCH_HOST_ADAM_RATIO times slower."""
    nvme_bw: float
    """NVMe read/write bandwidth per node, bytes/s."""
    block_overhead_s: float = 3e-4
    """Fixed seconds per transformer block per micro-step (kernel launches, Python), forward plus backward."""
    collective_latency_s: float = 5e-5
    """Fixed seconds per collective call (NCCL / gloo latency)."""
    step_overhead_s: tuple[tuple[str, float], ...] = ()
    """Fixed seconds each engine adds per optimizer step, as (engine name, seconds) pairs (DeepSpeed: flat-buffer
    copies, hooks, overflow check, the engine's Python; FSDP2: hooks, DTensor bookkeeping); an engine not listed
    adds 0 until `launch calibrate --from` fits it from finished runs. A calibration file holds them as
    ``<engine>_step_overhead_s`` (OVERHEAD_SUFFIX; ``with_overrides``)."""
    comm_overlap: float = 0.5
    """Share of communication hidden behind compute, 0 to 1; never more than the compute's own length hides."""
    device_is_host: bool = False
    """True for CPU ranks: device memory is host memory, so ranks add up in host RAM."""
    memory_bw: float = 0.0
    """Device memory bandwidth, bytes/s (datasheet)."""
    source: str = ""
    """Where the figures come from: the vendor datasheet's URL."""
    compute_capability: float | None = None
    """CUDA compute capability (NVIDIA's "CUDA GPUs" list): the GPU generation, which decides native bf16 (>= 8.0)
    and cuBLAS's workspace size (>= 9.0, Hopper); None off CUDA (CPU ranks, AMD)."""
    host_cpus_per_device: int = 8
    """CPUs a node gives each device, the Slurm job's --cpus-per-task per rank when cluster.cpus_per_node does not
    say: 8, the low end of GPU nodes (DGX A100 128 cores for 8 GPUs, DGX H100 112, 8-GPU cloud instances 96-192
    vCPUs), since sbatch refuses a job asking for more than a node has. CPU ranks: 1, what their rates were
    measured with (torchrun's OMP_NUM_THREADS=1)."""

    @property
    def hopper_or_later(self) -> bool:
        """sm90 and newer (H100, H200, B200): where PyTorch's cuBLAS workspace config differs."""
        return self.compute_capability is not None and self.compute_capability >= 9.0

    def step_overhead(self, engine: str) -> float:
        """The engine's fixed seconds per optimizer step (step_overhead_s), 0 where none was fitted."""
        for name, seconds in self.step_overhead_s:
            if name == engine:
                return seconds
        return 0.0

    def with_overrides(self, values: dict) -> HardwareProfile:
        """A copy with the fields named in `values` replaced (a calibration's figures), an engine's step seconds
        given as ``<engine>_step_overhead_s``; unknown keys are ignored."""
        known = {f.name for f in dataclasses.fields(self)} - {"step_overhead_s"}
        overheads = dict(self.step_overhead_s) | {k.removesuffix(OVERHEAD_SUFFIX): float(v) for k, v in values.items()
                                                  if k.endswith(OVERHEAD_SUFFIX)}
        return dataclasses.replace(self, **{k: v for k, v in values.items() if k in known},
                                   step_overhead_s=tuple(overheads.items()))


OVERHEAD_SUFFIX = "_step_overhead_s"
"""An engine's step seconds in a calibration file: ``<engine name>`` + this (HardwareProfile.step_overhead_s)."""


# Measured on one H100 80GB HBM3 (torch 2.11.0+cu130, driver 580.159.04; benchmarks/results/gpu.md "Outside the
# allocator"), device used - reserved after each stage of benchmarks/gpu/context.py: the context 619 MiB; the first
# bf16 matmul +130 MiB (cuBLAS, cuBLASLt) and flash attention +18 MiB; init_process_group("nccl") +562 MiB with one
# rank; and a further communicator 386 MiB (DeepSpeed's runs, which add the clone of the world group,
# deepspeed/utils/groups.py _clone_world_group, held 1.806 GB outside against FSDP2's 1.402 GB). Every other CUDA
# profile takes the same figures until `launch calibrate` measures its node: kernel code and NCCL's state depend
# on the libraries more than on the card.
KERNEL_MIB = 148
NCCL_COMM_MIB = 562
NCCL_EXTRA_COMM_MIB = 386


# Fitted on the published step-time fit split (benchmarks/published/steptime/split.yaml, 12 runs on A100, H100 and
# V100; benchmarks/results/published-steptime.md) with the cost model's attention and bandwidth terms: the matmuls
# at 0.8 of the datasheet peak (torchtitan's A100 runs report 58 % MFU counting whole steps; with about a third
# of the step in memory-bound kernels that is ~0.8 in the matmuls), and FSDP2's prefetched gathers and reduce-scatters
# hidden behind compute up to its length (torchtitan's 70B on 64 A100s: 16 s of collectives at HDR rates inside a
# 23 s step). Were 0.4 and 0.5, which put a 70B step at 44 s and 8B on H100 at 2.3 s against 23 and 2.8 published.
GPU_MATMUL_SHARE = 0.8
GPU_COMM_OVERLAP = 1.0


def _gpu(name, mem_gib, flops_bf16, flops_fp32, intra, inter, pcie, *, memory_bw, source, capability,
         context_mib=600) -> HardwareProfile:
    return HardwareProfile(
        name=name, memory_bytes=int(mem_gib * GiB), context_bytes=context_mib * MiB, fragmentation=0.08,
        kernel_bytes=KERNEL_MIB * MiB, nccl_comm_bytes=NCCL_COMM_MIB * MiB,
        nccl_extra_comm_bytes=NCCL_EXTRA_COMM_MIB * MiB,
        flops_bf16=flops_bf16, flops_fp32=flops_fp32, mfu=GPU_MATMUL_SHARE, comm_overlap=GPU_COMM_OVERLAP,
        intra_node_bw=intra, inter_node_bw=inter,
        host_link_bw=pcie, cpu_adam_params_per_s=1.0e9, nvme_bw=3.0 * GB, memory_bw=memory_bw, source=source,
        compute_capability=capability,
    )


# Each card from its vendor's datasheet: memory (the datasheet's "GB" of HBM/GDDR, which nvidia-smi reports in
# MiB within 1 %, so read as GiB), dense bf16 tensor and plain fp32 FLOP/s (no sparsity), memory bandwidth, and the
# GPU-to-GPU link. fp32 is the datasheet's non-tensor FP32, not its TF32 tensor figure (8x it on A100): torch leaves
# TF32 matmuls off (torch.backends.cuda.matmul.allow_tf32 is False since 1.12) and the ranks never turn them on, so
# an fp32 plan runs plain fp32 matmuls. B200's FP32 is the HGX (1,000 W) figure, 80 TFLOPS
# (https://glennklockwood.com/garden/processors/B200, from NVIDIA's Blackwell datasheet).
# intra_node_bw is one direction of the link (the datasheets quote NVLink both ways); PCIe-only
# cards talk over PCIe (Gen4 x16: 32 GB/s a direction). inter_node_bw is one NIC per GPU: HDR 200 Gb/s on A100
# systems, NDR 400 Gb/s on H100/H200/B200/MI300X systems, 100 Gb/s Ethernet shared by a PCIe box's cards.
PROFILES: dict[str, HardwareProfile] = {
    "a10g": _gpu("a10g", 24, 70e12, 31.2e12, 16 * GB, 3 * GB, 16 * GB, capability=8.6, memory_bw=600 * GB,
                 context_mib=400,
                 source="https://aws.amazon.com/ec2/instance-types/g5/ ; A10G vs A10 figures: "
                        "https://www.baseten.co/blog/nvidia-a10-vs-a10g-for-ml-model-inference/"),
    "l4": _gpu("l4", 24, 121e12, 30.3e12, 32 * GB, 12 * GB, 32 * GB, capability=8.9, memory_bw=300 * GB,
               context_mib=400,
               source="https://www.nvidia.com/en-us/data-center/l4/"),
    "l40s": _gpu("l40s", 48, 362e12, 91.6e12, 32 * GB, 12 * GB, 32 * GB, capability=8.9, memory_bw=864 * GB,
                 context_mib=400,
                 source="https://www.nvidia.com/en-us/data-center/l40s/"),
    "a100-40gb": _gpu("a100-40gb", 40, 312e12, 19.5e12, 300 * GB, 25 * GB, 32 * GB, capability=8.0, memory_bw=1555 * GB,
                      source="https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
                             "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"),
    "a100-80gb": _gpu("a100-80gb", 80, 312e12, 19.5e12, 300 * GB, 25 * GB, 32 * GB, capability=8.0, memory_bw=2039 * GB,
                      source="https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
                             "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"),
    "h100-80gb": _gpu("h100-80gb", 80, 989e12, 67e12, 450 * GB, 50 * GB, 64 * GB, capability=9.0, memory_bw=3350 * GB,
                      source="https://www.nvidia.com/en-us/data-center/h100/ (H100 SXM)"),
    "h100-pcie": _gpu("h100-pcie", 80, 756e12, 51e12, 300 * GB, 50 * GB, 64 * GB, capability=9.0, memory_bw=2000 * GB,
                      source="https://www.nvidia.com/en-us/data-center/h100/ (H100 PCIe; NVLink bridge 600 GB/s)"),
    "h200": _gpu("h200", 141, 989e12, 67e12, 450 * GB, 50 * GB, 64 * GB, capability=9.0, memory_bw=4800 * GB,
                 source="https://www.nvidia.com/en-us/data-center/h200/ (H200 SXM)"),
    "b200": _gpu("b200", 180, 2250e12, 80e12, 900 * GB, 50 * GB, 64 * GB, capability=10.0, memory_bw=7700 * GB,
                 source="https://www.nvidia.com/en-us/data-center/hgx/ (HGX B200: 1,440 GB over 8 GPUs, "
                        "18 PFLOPS sparse bf16 over 8 GPUs, NVLink 5 1.8 TB/s)"),
    "mi300x": _gpu("mi300x", 192, 1307e12, 163.4e12, 448 * GB, 50 * GB, 64 * GB, capability=None, memory_bw=5300 * GB,
                   source="https://www.amd.com/en/products/accelerators/instinct/mi300/mi300x.html "
                          "(Infinity Fabric 896 GB/s aggregate, both ways)"),
    "rtx4090": _gpu("rtx4090", 24, 165e12, 82.6e12, 25 * GB, 3 * GB, 25 * GB, capability=8.9, memory_bw=1008 * GB,
                    context_mib=400,
                    source="https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf "
                           "(Appendix A: bf16 tensor with fp32 accumulate; no NVLink, no P2P)"),
    "v100-16gb": _gpu("v100-16gb", 16, 125e12, 15.7e12, 150 * GB, 12 * GB, 16 * GB, capability=7.0, memory_bw=900 * GB,
                      context_mib=400, source="https://images.nvidia.com/content/technologies/volta/pdf/"
                                              "volta-v100-datasheet-update-us-1165301-r5.pdf (no bf16: the fp16 "
                                              "figure)"),
    # CPU ranks (gloo): MemTracker counts tensor bytes only, so no context or allocator reserve.
    # Throughputs are placeholders that `launch calibrate` replaces with measured ones.
    "cpu": HardwareProfile(
        name="cpu", memory_bytes=0, context_bytes=0, fragmentation=0.0, flops_bf16=20e9, flops_fp32=50e9,
        mfu=1.0, intra_node_bw=1.0 * GB, inter_node_bw=1.0 * GB, host_link_bw=5.0 * GB,
        cpu_adam_params_per_s=2.0e8, nvme_bw=1.0 * GB, block_overhead_s=2e-3, collective_latency_s=5e-4,
        # Measured minus predicted seconds per step of the confirmed runs in benchmarks/results/plan_quality.md
        # (2 CPU ranks, 1.35M-parameter GPT-2): DeepSpeed 0.90-1.01 s, FSDP2 0.00-0.17 s. The plain engine's DDP
        # has none fitted: on the same job (bf16, micro-batch 2) it stepped in 0.67 s, FSDP2 in 1.25 s (medians
        # of 8 intervals each, one after the other on a shared machine, 2026-11-29), so no fixed cost shows.
        step_overhead_s=(("deepspeed", 1.0), ("fsdp", 0.09)),
        comm_overlap=0.0, device_is_host=True, host_cpus_per_device=1, source="measured by `launch calibrate`",
    ),
}

# Device names as nvidia-smi --query-gpu=name, torch.cuda.get_device_name and rocm-smi write them, upper-cased,
# tested first to last: the PCIe and 40 GB variants before the names they contain.
GPU_NAME_PATTERNS: list[tuple[str, str]] = [
    (r"\bH200\b", "h200"),
    (r"\bH100\b.*\bPCIE\b", "h100-pcie"),
    (r"\bH100\b(?!.*\bNVL\b)", "h100-80gb"),
    (r"\bB200\b", "b200"),
    (r"\bA100\b.*\b40GB\b", "a100-40gb"),
    (r"\bA100\b", "a100-80gb"),
    (r"\bA10G\b", "a10g"),
    (r"\bL40S\b", "l40s"),
    (r"\bL4\b", "l4"),
    (r"\bRTX 4090\b", "rtx4090"),
    (r"\bMI300X\b", "mi300x"),
    (r"\bV100\b.*\b16GB\b", "v100-16gb"),
]


def ranks_on_host(plan) -> bool:
    """A plan's (launcher.planner.plan.Plan) ranks compute on the host (CPU ranks): its profile says so, or for
    a profile not known here its memory basis."""
    profile = PROFILES.get(plan.hardware)
    return profile.device_is_host if profile else plan.estimate.basis == "cpu_tensor_bytes"


def profile_for_gpu_name(gpu_name: str) -> str | None:
    """The profile of a device name, or None for a card without one (never a guess: a wrong card's memory would
    pass or refuse budgets it should not)."""
    name = " ".join(gpu_name.upper().replace("-", " ").split())
    for pattern, profile in GPU_NAME_PATTERNS:
        if re.search(pattern, name):
            return profile
    return None
