"""What this machine has: its GPU (nvidia-smi or rocm-smi), host RAM, free NVMe space, and the hardware profile to plan for."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from launcher.cache import cache_dir
from launcher.config.job import Job
from launcher.errors import ConfigError
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
        raise ConfigError(f"{where}: auto found a {gpu!r}, which has no profile; set {where} to the card closest to "
                          f"it in memory and speed ({cards})")
    return name


def hardware_profile(job: Job) -> HardwareProfile:
    name = job.cluster.hardware
    if name == "auto":
        name = auto_profile_name(detect_gpu_name())
    if name not in PROFILES:
        raise ConfigError(f"cluster.hardware: {name!r} is not a known profile; use one of {', '.join(PROFILES)} or auto")
    profile = PROFILES[name]
    calib = cache_dir() / "profiles" / f"{name}.json"
    if os.environ.get("LAUNCHER_PROFILE_FILE"):
        calib = Path(os.environ["LAUNCHER_PROFILE_FILE"])
    if calib.is_file():
        profile = profile.with_overrides(json.loads(calib.read_text()).get("hardware", {}))
    return profile


def host_ram_bytes() -> int:
    import psutil

    return int(psutil.virtual_memory().total)


def nvme_free_bytes(job: Job) -> int | None:
    if job.cluster.nvme_path is None:
        return None
    if job.cluster.nvme_free_bytes is not None:
        return job.cluster.nvme_free_bytes
    p = Path(job.cluster.nvme_path)
    while not p.exists() and p != p.parent:
        p = p.parent
    return shutil.disk_usage(p).free
