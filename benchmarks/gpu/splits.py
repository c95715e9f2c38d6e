"""Validation splits for the CUDA side of the memory model: runs of scripts/gpu-check.sh named before they ran.

GPU_VALIDATION_1 was committed on 2026-11-26, after the first GPU check (benchmarks/results/gpu.md, one H100) and
before the CUDA overhead terms it led to (cuda_kernels, nccl_communicators; launcher.planner.cuda_overhead) and
before expandable segments on CUDA ranks. Those terms come from benchmarks/gpu/context.py's stage-by-stage
measurement and the first check's FSDP2 vs DeepSpeed runs; none of these three runs had run on a GPU then (the
pure-bf16 one was cut off by the time limit before its first step). The next lent GPU judges them.
"""

from __future__ import annotations

GPU_VALIDATION_1 = ("levers-qlora-fsdp", "levers-pure-bf16-fsdp", "zero3-offload-1")
"""gpu-check run names. Criteria: what lies outside the allocator within 5 % of measured; the verdict-basis peak
within 10 %; the allocated-basis moments within 5 % (the CPU-rank bar)."""

OUTSIDE_TOLERANCE = 0.05
"""Outside-allocator bytes: predicted (cuda_context + cuda_kernels + nccl_communicators + nccl_buffers) vs device
used - reserved, relative."""
PEAK_TOLERANCE = 0.10
"""The verdict-basis peak (reserved plus outside), relative."""
MOMENT_TOLERANCE = 0.05
"""Each allocated-basis moment against its phase, relative."""
