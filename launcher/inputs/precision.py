"""train.precision: auto: the rule that picks bf16 or fp32 from what the ranks' devices compute natively.

Pure: launcher.inputs.machine detects the support (environment, /proc/cpuinfo, nvidia-smi); ``choose_precision`` turns
it into a dtype and a reason, and both go to the planner as inputs, like the hardware profile.

Why it matters on CPU: without AMX or AVX512-BF16, oneDNN emulates bf16 matmuls and they run ~10x slower than
fp32 (measured on the dev VM with ONEDNN_MAX_CPU_ISA=AVX2, benchmarks/results/newcomer.md); with them bf16 is
the fast path. On GPUs bf16 needs compute capability 8.0 (Ampere) or newer.
"""

from __future__ import annotations

from dataclasses import dataclass

GPU_BF16_MIN_CAPABILITY = 8.0
"""CUDA compute capability from which bf16 tensor cores exist (Ampere; NVIDIA's CUDA C++ guide, bf16 arithmetic)."""


@dataclass(frozen=True, slots=True)
class Bf16Support:
    """Whether the rank's device computes bf16 natively, and the evidence, in words."""

    native: bool
    device: str
    """cpu or cuda."""
    evidence: str
    """What was read, e.g. "/proc/cpuinfo has amx_bf16" or "ONEDNN_MAX_CPU_ISA=AVX2"."""


def choose_precision(requested: str, support: Bf16Support) -> tuple[str, str]:
    """(precision, reason): the job's precision, or for auto bf16 where it is native and fp32 elsewhere."""
    where = "the GPUs" if support.device == "cuda" else "the CPU ranks"
    if requested != "auto":
        reason = f"precision {requested}: set by the job"
        if requested == "bf16" and support.device == "cpu" and not support.native:
            reason += (f"; note {where} lack native bf16 ({support.evidence}), where bf16 matmuls run ~10x slower "
                       "than fp32: precision auto would choose fp32")
        return requested, reason
    if support.native:
        return "bf16", f"precision bf16 (auto): {where} compute bf16 natively ({support.evidence})"
    if support.device == "cuda":
        return "fp32", (f"precision fp32 (auto): {where} lack bf16 ({support.evidence}, bf16 needs "
                        f"{GPU_BF16_MIN_CAPABILITY:g}+); set train.precision: fp16 for mixed precision")
    return "fp32", (f"precision fp32 (auto): {where} lack native bf16 ({support.evidence}), where bf16 matmuls "
                    "run ~10x slower than fp32")
