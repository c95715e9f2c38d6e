"""What this machine has: its GPU (nvidia-smi), host RAM, free NVMe space, and the hardware profile to plan for."""

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


def detect_gpu_name() -> str | None:
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    names = [ln.strip() for ln in out.stdout.splitlines() if ln.strip()]
    return names[0] if out.returncode == 0 and names else None


def hardware_profile(job: Job) -> HardwareProfile:
    name = job.cluster.hardware
    if name == "auto":
        gpu = detect_gpu_name()
        name = profile_for_gpu_name(gpu) if gpu else "cpu"
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
