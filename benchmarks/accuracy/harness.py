"""Running real jobs through the `launch` CLI for the benchmarks, and reading back what they wrote.

Shared by benchmarks/accuracy, benchmarks/plan_quality and benchmarks/overhead. Every benchmark process uses
its own launcher cache (BENCH_CACHE) so a calibration or refit it writes never changes anyone else's plans,
and anyone's refit in ~/.cache/launcher never changes a benchmark figure.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from launcher.files.rundir import RunDir
from launcher.records.rankreport import RankReport

REPO = Path(__file__).resolve().parents[2]
LAUNCH = REPO / ".venv" / "bin" / "launch"
PYTHON = REPO / ".venv" / "bin" / "python"
BENCH_CACHE = REPO / ".cache" / "bench-launcher"
RUNS = REPO / "runs" / "bench"
RESULTS = REPO / "benchmarks" / "results"
DATA = REPO / "examples" / "data"


def bench_env(cache: Path | None = None) -> dict[str, str]:
    env = {**os.environ, "LAUNCHER_CACHE": str(cache or BENCH_CACHE), "HF_HUB_OFFLINE": "1"}
    env.pop("LAUNCHER_PROFILE_FILE", None)
    return env


@dataclass(kw_only=True, slots=True)
class LaunchResult:
    run_dir: Path
    returncode: int
    wall_s: float
    output_tail: str


def write_job(job: dict, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(job, sort_keys=False))
    return path


def launch(job_file: Path, run_dir: Path, *, gpus: int = 2, budget: str = "4GB", extra: list[str] | None = None,
           cache: Path | None = None, timeout_s: float = 900) -> LaunchResult:
    """`launch --gpus N --budget B JOB --run-dir D --overwrite --quiet` as a user would type it."""
    argv = [str(LAUNCH), "--gpus", str(gpus), "--budget", budget, str(job_file), "--run-dir", str(run_dir),
            "--overwrite", "--quiet", *(extra or [])]
    t = time.perf_counter()
    try:
        p = subprocess.run(argv, env=bench_env(cache), capture_output=True, text=True, timeout=timeout_s)
        rc, out = p.returncode, (p.stdout + p.stderr)
    except subprocess.TimeoutExpired as e:
        rc, out = 124, f"timed out after {timeout_s} s: {e}"
    return LaunchResult(run_dir=run_dir, returncode=rc, wall_s=time.perf_counter() - t, output_tail=out[-3000:])


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def rank_files(run_dir: Path) -> dict[int, RankReport]:
    """rank -> its ranks/rank-K.json, typed (a file that cannot be read is left out)."""
    return RunDir(run_dir).rank_reports()


def step_times_s(run_dir: Path, rank: int = 0, warmup: int = 1) -> list[float]:
    """Seconds between consecutive steps' 'time' stamps in steps/rank-K.jsonl, the first ``warmup`` dropped.

    The first stamp closes step 1, which includes the first forward's one-off costs; differences of
    stamps are the steady state (step_time_s of the same lines agrees, but the stamps also include logging).
    """
    path = run_dir / "steps" / f"rank-{rank}.jsonl"
    if not path.is_file():
        return []
    stamps = [json.loads(line)["time"] for line in path.read_text().splitlines() if line.strip()]
    diffs = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
    return diffs[max(0, warmup - 1):]


def median_or_none(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def machine() -> dict[str, object]:
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    return {"machine": platform.machine(), "cores": os.cpu_count(), "python": platform.python_version(),
            "load_avg_1m": round(load[0], 2), "time": time.strftime("%Y-%m-%d %H:%M:%S"),
            "planner_memory_sha": git_blob(REPO / "launcher" / "planner" / "memory.py"),
            "planner_cost_sha": git_blob(REPO / "launcher" / "planner" / "cost.py")}


def git_blob(path: Path) -> str | None:
    """The file's git blob hash: which version of the planner produced a figure (it is refit concurrently)."""
    try:
        out = subprocess.run(["git", "hash-object", str(path)], capture_output=True, text=True, cwd=REPO, timeout=10)
        return out.stdout.strip()[:12] or None
    except OSError:
        return None


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)
