"""Device memory a CUDA rank uses beyond its tensors: what turns a tensor peak into what actually OOMs.

A CUDA rank runs out of memory when the driver has nothing left to give, so the figure that matters is the
process's whole footprint: the caching allocator's reserved segments plus everything allocated outside it.
Each term is named and sourced; none is fitted here.

  [CTX]   NVIDIA, CUDA C++ Programming Guide, "Lazy Loading" (CUDA 11.7+, on by default since 12.2 via
          CUDA_MODULE_LOADING=LAZY): kernels load on first use, so the context holds a few hundred MiB instead of
          every kernel of every library (1-2 GB on older CUDA; the Hugging Face "Model training anatomy" guide
          measures 1343 MiB for `torch.ones(1).cuda()` on a V100 with CUDA 11.2). The figure is the hardware
          profile's ``context_bytes``, measured by `launch calibrate` on a GPU node.
  [ALLOC] PyTorch, "CUDA semantics: memory management" and c10/cuda/CUDACachingAllocator.cpp: requests round up to
          512 bytes; up to 1 MiB they come from 2 MiB segments, up to 10 MiB from 20 MiB segments, larger ones in
          2 MiB steps; freed blocks stay cached (reserved) and split blocks fragment. reserved - allocated is the
          profile's ``fragmentation`` share of the tensor peak (an assumption until `launch calibrate` measures it).
  [POOL]  c10/cuda/CUDACachingAllocator.cpp: a cached block is reused only by a request on the stream it was
          allocated on (BlockPool is ordered by stream, then size; get_free_block rejects a block of another
          stream; with expandable segments each stream maps its own segment). Blocks an engine allocates on a side
          stream therefore stay reserved beside the default stream's cache: the activations freed in backward
          cannot hold them. FSDP2 allocates every unit's reduce-scatter output on its reduce-scatter stream, and
          the sharded gradients are views of it (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py
          foreach_reduce: "the GPU sharded gradient is allocated in the RS stream"), so from the second step on
          the gradients' blocks are cached there while backward starts with none allocated; its all-gather outputs
          come from the all-gather copy-in stream (foreach_all_gather). Per moment, the engine's
          States.side_stream_cached.
  [BLAS]  PyTorch aten/src/ATen/cuda/CublasHandlePool.cpp, parseChosenWorkspaceSize: the cuBLAS workspace per
          handle and stream defaults to 4096 KiB x 8 = 32 MiB on Hopper (sm90) and 4096 KiB x 2 + 16 KiB x 8 on
          older GPUs (CUBLAS_WORKSPACE_CONFIG overrides it); it comes from the caching allocator, so it counts as
          allocated. Forward/backward on the default stream plus a second stream (NCCL, FSDP2's copy streams)
          give two workspaces.
  [LAZY]  The same "Lazy Loading": a library's kernels take device memory once first used, outside the allocator
          (cuBLAS/cuBLASLt at the first matmul, the attention kernels): the profile's ``kernel_bytes``.
  [COMM]  Each NCCL communicator holds device memory outside the allocator from its creation, peers or not: the
          process's first (NCCL's per-process state with it) ``nccl_comm_bytes``, each further one
          ``nccl_extra_comm_bytes``. How many a rank holds is its engine's (EngineSpec.nccl_communicators): the
          default process group, plus DeepSpeed's clone of it, plus FSDP2's two hybrid-mesh groups.
          Measured on an H100 (launcher.planner.hardware, KERNEL_MIB and NCCL_*_MIB).
  [NCCL]  NVIDIA, NCCL User Guide, "Environment Variables: NCCL_BUFFSIZE": the buffer used between a pair of GPUs,
          default 4194304 bytes (4 MiB), per channel per peer; NCCL allocates it with cudaMalloc, outside PyTorch's
          allocator. A ring keeps one per channel towards each of its two neighbours.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from launcher.planner.hardware import HardwareProfile
from launcher.units import KiB, MiB

Basis = Literal["cpu_tensor_bytes", "cuda_allocated", "cuda_reserved", "cuda_reserved_plus_context"]
"""What a peak counts. cpu_tensor_bytes: MemTracker's tensor bytes on a CPU rank. cuda_allocated:
torch.cuda.max_memory_allocated. cuda_reserved: torch.cuda.max_memory_reserved (allocated plus the allocator's
cache). cuda_reserved_plus_context: reserved plus what lives outside the allocator (CUDA context, NCCL buffers);
nvidia-smi's per-process "used" counts the same."""

CUBLAS_WORKSPACE_HOPPER_BYTES = 4096 * KiB * 8  # [BLAS] ":4096:8" on sm90
CUBLAS_WORKSPACE_OLDER_BYTES = 4096 * KiB * 2 + 16 * KiB * 8  # [BLAS] ":4096:2:16:8" before Hopper
CUBLAS_WORKSPACES = 2  # [BLAS] one per (handle, stream): the compute stream and a communication/copy stream
NCCL_BUFFSIZE_BYTES = 4 * MiB  # [NCCL] NCCL_BUFFSIZE default
NCCL_RING_PEERS = 2  # [NCCL] a ring channel talks to the previous and the next rank


def verdict_basis(hw: HardwareProfile) -> Basis:
    """The basis a prediction for ``hw`` is made on: what actually OOMs there."""
    return "cpu_tensor_bytes" if hw.device_is_host else "cuda_reserved_plus_context"


def cublas_workspace_bytes(hw: HardwareProfile) -> int:
    """[BLAS] PyTorch's default cuBLAS workspaces for this GPU generation."""
    per = CUBLAS_WORKSPACE_HOPPER_BYTES if hw.hopper_or_later else CUBLAS_WORKSPACE_OLDER_BYTES
    return CUBLAS_WORKSPACES * per


def nccl_channels(hw: HardwareProfile) -> int:
    """Channels NCCL opens per communicator (an assumption: NVLink nodes run many rings, PCIe cards few).

    NCCL picks the count at init from the topology (NCCL_MIN_NCHANNELS / NCCL_MAX_NCHANNELS bound it); 16 is
    what an 8-GPU NVLink node typically reports in NCCL_DEBUG=INFO, 2 a PCIe-only node.
    """
    return 16 if hw.intra_node_bw >= 100e9 else 2


def nccl_buffer_bytes(hw: HardwareProfile, world_size: int) -> int:
    """[NCCL] NCCL_BUFFSIZE per channel per ring neighbour; none on a single rank (no communicator traffic)."""
    if world_size <= 1:
        return 0
    return NCCL_BUFFSIZE_BYTES * nccl_channels(hw) * NCCL_RING_PEERS


def nccl_communicator_bytes(hw: HardwareProfile, communicators: int) -> int:
    """[COMM] What ``communicators`` NCCL communicators of one process hold outside the allocator."""
    if communicators <= 0:
        return 0
    return int(hw.nccl_comm_bytes + (communicators - 1) * hw.nccl_extra_comm_bytes)


def cuda_overhead(hw: HardwareProfile, tensor_bytes: float, world_size: int, communicators: int = 1,
                  stream_pool_bytes: float = 0.0) -> dict[str, int]:
    """The named terms a CUDA rank adds to its tensor peak; empty on CPU ranks (MemTracker counts tensors only).

    cublas_workspace, allocator_reserve and stream_pools are inside torch.cuda.max_memory_reserved; cuda_context,
    cuda_kernels, nccl_communicators and nccl_buffers are outside the allocator, seen only by the driver.
    ``communicators``: the NCCL communicators the rank's engine creates (EngineSpec.nccl_communicators).
    ``stream_pool_bytes``: what the engine's side streams keep cached at this moment ([POOL]); the fragmentation
    share applies to the tensors only, since a pool's blocks are reused whole, step after step.
    """
    if hw.device_is_host:
        return {}
    return {
        "cublas_workspace": cublas_workspace_bytes(hw),
        "allocator_reserve": int(hw.fragmentation * tensor_bytes),
        **({"stream_pools": int(stream_pool_bytes)} if stream_pool_bytes > 0 else {}),
        "cuda_context": int(hw.context_bytes),
        "cuda_kernels": int(hw.kernel_bytes),
        "nccl_communicators": nccl_communicator_bytes(hw, communicators),
        "nccl_buffers": nccl_buffer_bytes(hw, world_size),
    }


def overhead_total(hw: HardwareProfile, world_size: int, communicators: int = 1) -> Callable[[float, float], int]:
    """``sum(cuda_overhead(hw, x, world_size, communicators, pool).values())`` as a function of ``(x, pool)``: the
    terms that depend on neither summed once. estimate_memory totals each of its moments with it (thousands of
    candidates, four or five moments each); tests/planner/test_cuda_overhead.py holds it to the sum."""
    if hw.device_is_host:
        return lambda tensor_bytes, stream_pool_bytes=0.0: 0
    # Every term but allocator_reserve and stream_pools is a constant of (hw, world_size, communicators); with no
    # tensors and no pool those two are 0 (int(fragmentation * 0.0), and stream_pools left out). Integers, so
    # summing them apart is exact.
    fixed, fragmentation = sum(cuda_overhead(hw, 0.0, world_size, communicators).values()), hw.fragmentation

    def total(tensor_bytes: float, stream_pool_bytes: float = 0.0) -> int:
        pools = int(stream_pool_bytes) if stream_pool_bytes > 0 else 0
        return fixed + int(fragmentation * tensor_bytes) + pools

    return total


NOT_YET_AT_INIT = ("cublas_workspace", "cuda_kernels")
"""Terms a rank does not hold yet while the weights load and the engine wraps them (the init moment): the cuBLAS
workspace comes with a handle's first use on a stream ([BLAS]: getCurrentCUDABlasHandle sets it), a library's
kernels with their first launch ([LAZY]); no matmul runs before the first forward. Measured on one H100 (GPU
check 2): FSDP2's and ZeRO-3's init peaks held their tensors and no workspace."""


def absent_at(moment: str) -> tuple[str, ...]:
    """The cuda_overhead terms not yet there at ``moment``."""
    return NOT_YET_AT_INIT if moment == "init" else ()


OUTSIDE_ALLOCATOR = ("cuda_context", "cuda_kernels", "nccl_communicators", "nccl_buffers")
IN_RESERVED_NOT_ALLOCATED = ("allocator_reserve", "stream_pools")


def peak_on_basis(tensor_bytes: int, overhead: dict[str, int], basis: Basis) -> int:
    """The predicted peak counted the way ``basis`` counts it, from the tensor peak and the named terms."""
    if basis == "cpu_tensor_bytes":
        return int(tensor_bytes)
    total = int(tensor_bytes) + sum(overhead.values())
    if basis == "cuda_reserved_plus_context":
        return total
    total -= sum(overhead.get(k, 0) for k in OUTSIDE_ALLOCATOR)
    if basis == "cuda_reserved":
        return total
    if basis == "cuda_allocated":
        return total - sum(overhead.get(k, 0) for k in IN_RESERVED_NOT_ALLOCATED)
    raise ValueError(f"basis: {basis!r} is not one of cpu_tensor_bytes, cuda_allocated, cuda_reserved, "
                     "cuda_reserved_plus_context")
