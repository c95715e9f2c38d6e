"""What this machine has: its GPU (nvidia-smi or rocm-smi), host RAM, free NVMe space, and the hardware profile to plan
for."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from launcher.calibrate.profiles import hardware_path
from launcher.config.job import Job
from launcher.config.problem import Problem
from launcher.errors import ConfigError
from launcher.inputs.cache import profile_file
from launcher.inputs.precision import GPU_BF16_MIN_CAPABILITY, Bf16Support
from launcher.planner.hardware import PROFILES, HardwareProfile, profile_for_gpu_name


def _run(argv: list[str]) -> str | None:
    if shutil.which(argv[0]) is None:
        return None
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def rocm_product_name(text: str) -> str | None:
    """The first GPU's product name in ``rocm-smi --showproductname`` output ("Card Series: AMD Instinct MI300X
    OAM"; older releases print the marketing name under "Card SKU" or "Card model")."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        for key in ("Card Series", "Card SKU", "Card model", "Card Model"):
            if f"{key}:" in line:
                found.setdefault(key.lower(), line.split(f"{key}:", 1)[1].strip())
    for key in ("card series", "card sku", "card model"):
        if "MI" in found.get(key, "").upper():
            return found[key]
    return found.get("card series")


def detect_gpu_name() -> str | None:
    """The first GPU's name from nvidia-smi, or from rocm-smi on AMD machines; None without either."""
    out = _run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"])
    names = [ln.strip() for ln in (out or "").splitlines() if ln.strip()]
    if names:
        return names[0]
    out = _run(["rocm-smi", "--showproductname"])
    return rocm_product_name(out) if out else None


def auto_profile_name(gpu: str | None, where: str = "cluster.hardware") -> str:
    """The profile for the detected card ("cpu" without one); bad input when the card has no profile."""
    if gpu is None:
        return "cpu"
    name = profile_for_gpu_name(gpu)
    if name is None:
        cards = ", ".join(n for n in PROFILES if n != "cpu")
        raise ConfigError(Problem(where, f"auto found a {gpu!r}, which has no profile; set {where} to the card "
                                  f"closest to it in memory and speed ({cards})"))
    return name


def submit_host_problem(job: Job) -> Problem | None:
    """`launch plan --sbatch` writes a job for the cluster's nodes, not for this host: cluster.hardware auto reads
    this host's GPU, and on a host without one (a login node) it would plan CPU ranks for nodes that may hold GPUs.
    The one rule: refuse auto there, naming the profiles; a named profile (cpu included) plans for itself."""
    if job.cluster.hardware != "auto" or detect_gpu_name() is not None:
        return None
    cards = ", ".join(n for n in PROFILES if n != "cpu")
    return Problem("cluster.hardware", "auto found no GPU on this host, so the sbatch script would plan CPU ranks for "
                   "the cluster's nodes; set cluster.hardware (or --hardware) to the nodes' card "
                   f"({cards}), or to cpu for CPU ranks")


def hardware_profile(job: Job) -> HardwareProfile:
    """The job's hardware profile (cluster.hardware, or the detected card for auto), with the calibrated figures from
    `launch calibrate` ($LAUNCHER_PROFILE_FILE, else the cache's profiles dir) applied when there are any."""
    name = job.cluster.hardware
    if name == "auto":
        name = auto_profile_name(detect_gpu_name())
    if name not in PROFILES:
        raise ConfigError(Problem("cluster.hardware", f"{name!r} is not a known profile; use one of "
                                  f"{', '.join(PROFILES)} or auto"))
    profile = PROFILES[name]
    calib = profile_file() or hardware_path(name)
    if calib.is_file():
        profile = profile.with_overrides(json.loads(calib.read_text()).get("hardware", {}))
    return profile


def host_ram_bytes() -> int:
    """This machine's total RAM, bytes."""
    import psutil

    return int(psutil.virtual_memory().total)


def nvme_free_bytes(job: Job) -> int | None:
    """Free bytes at cluster.nvme_path (or the job's cluster.nvme_free_bytes); None without an NVMe path."""
    if job.cluster.nvme_path is None:
        return None
    if job.cluster.nvme_free_bytes is not None:
        return job.cluster.nvme_free_bytes
    p = Path(job.cluster.nvme_path)
    while not p.exists() and p != p.parent:
        p = p.parent
    return shutil.disk_usage(p).free


# -- native bf16 (train.precision: auto) ------------------------------------------------------------------------------

CPU_BF16_FLAGS = ("amx_bf16", "avx512_bf16")
"""/proc/cpuinfo flags of the instructions oneDNN runs bf16 matmuls with (Intel AMX, AVX512-BF16 on Intel and
AMD Zen 4+)."""

ONEDNN_BF16_ISA_MARKS = ("BF16", "AMX", "FP16", "AVX10")
"""ONEDNN_MAX_CPU_ISA values that still allow bf16 instructions all carry one of these (AVX512_CORE_BF16,
AVX512_CORE_AMX, AVX512_CORE_FP16, AVX10_1_512...); the lower caps (AVX2, AVX512_CORE, ...) do not. ALL and
DEFAULT cap nothing. Names from oneDNN's docs, "CPU Dispatcher Control"."""

ATEN_BELOW_BF16 = ("default", "avx2")
"""ATEN_CPU_CAPABILITY values that keep ATen's own kernels off AVX512, where its bf16 paths live."""

NATIVE_BF16_WITHOUT_CUDA = {"mi300x": "AMD CDNA3 computes bf16 natively"}
"""GPU profiles outside CUDA's capability numbering, with why they count as native bf16."""


CPUINFO = Path("/proc/cpuinfo")
"""Where Linux lists the CPU's flags."""


def cpu_bf16_support(env: dict[str, str] | None = None, cpuinfo: Path | None = None) -> Bf16Support:
    """Native bf16 on this CPU, as the ranks (which inherit this environment) will see it.

    The oneDNN and ATen dispatch caps come first: with ONEDNN_MAX_CPU_ISA=AVX2 a CPU that has AMX still runs
    bf16 emulated, which is also how a test exercises both branches on one machine.
    """
    env = os.environ if env is None else env
    cpuinfo = cpuinfo or CPUINFO
    isa = env.get("ONEDNN_MAX_CPU_ISA", env.get("DNNL_MAX_CPU_ISA", "")).strip().upper()
    if isa and isa not in ("ALL", "DEFAULT") and not any(mark in isa for mark in ONEDNN_BF16_ISA_MARKS):
        return Bf16Support(False, "cpu", f"ONEDNN_MAX_CPU_ISA={isa} caps oneDNN below the bf16 instructions")
    aten = env.get("ATEN_CPU_CAPABILITY", "").strip().lower()
    if aten in ATEN_BELOW_BF16:
        return Bf16Support(False, "cpu", f"ATEN_CPU_CAPABILITY={aten} keeps ATen below AVX512")
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return Bf16Support(False, "cpu", f"{cpuinfo} is not readable, so native bf16 cannot be confirmed")
    flags = set()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            flags.update(line.partition(":")[2].split())
    found = [f for f in CPU_BF16_FLAGS if f in flags]
    if found:
        return Bf16Support(True, "cpu", f"{cpuinfo} has {' and '.join(found)}")
    return Bf16Support(False, "cpu", f"{cpuinfo} has neither {' nor '.join(CPU_BF16_FLAGS)}")


def gpu_compute_capability() -> float | None:
    """The first GPU's compute capability from nvidia-smi, or None where it cannot tell."""
    out = _run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"]) or ""
    try:
        return float(out.split()[0]) if out.split() else None
    except ValueError:
        return None


def gpu_bf16_support(profile_name: str, detected: bool) -> Bf16Support:
    """bf16 on the profile's GPU: the capability nvidia-smi reports when the profile was detected here, else the
    profile's own (a plan made on a login node for another machine)."""
    if profile_name in NATIVE_BF16_WITHOUT_CUDA:
        return Bf16Support(True, "cuda", f"{NATIVE_BF16_WITHOUT_CUDA[profile_name]} (the {profile_name} profile)")
    cap = gpu_compute_capability() if detected else None
    source = "nvidia-smi" if cap is not None else f"the {profile_name} profile"
    if cap is None:
        known = PROFILES.get(profile_name)  # the profile's own generation, for plans made off the GPU node
        cap = known.compute_capability if known else None
    if cap is None:
        return Bf16Support(False, "cuda", f"the compute capability of {profile_name} is unknown")
    return Bf16Support(cap >= GPU_BF16_MIN_CAPABILITY, "cuda", f"compute capability {cap:g} ({source})")


def bf16_support(job: Job, profile: HardwareProfile) -> Bf16Support:
    """What the ranks' devices compute natively: this CPU for CPU ranks (the ranks inherit this environment),
    else the GPU: nvidia-smi's when the profile was detected here (hardware: auto), the profile's otherwise."""
    if profile.device_is_host:
        return cpu_bf16_support()
    return gpu_bf16_support(profile.name, detected=job.cluster.hardware == "auto")
