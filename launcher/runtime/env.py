"""Environment variables the launcher sets on every rank, and the run-dir layout they point into."""

from __future__ import annotations

import json
import os
from pathlib import Path

from launcher.errors import ConfigError

PLAN_ENV = "LAUNCHER_PLAN"
"""Path of the run's plan.json."""
RUN_DIR_ENV = "LAUNCHER_RUN_DIR"
"""The run directory: ranks/, steps/, checkpoint/ and control/ live under it."""
DS_CONFIG_ENV = "LAUNCHER_DS_CONFIG"
"""Path of the emitted ds_config.json (DeepSpeed plans only)."""
ENFORCE_ENV = "LAUNCHER_ENFORCE_BYTES"
"""Per-rank byte cap set by --enforce; crossing it raises torch.OutOfMemoryError."""
TRACK_ENV = "LAUNCHER_TRACK_CATEGORIES"
"""'1' tracks tensors by category with MemTracker on CUDA too (always on for CPU ranks; slows CUDA runs)."""
SNAPSHOT_ENV = "LAUNCHER_MEMORY_SNAPSHOT"
"""Set to 1 (launch --memory-snapshot): CUDA ranks record the allocator's history through their first step and
dump it to RUN_DIR/memory-snapshot/rank-K.pickle (open it at pytorch.org/memory_viz)."""

EXIT_OOM = 75
"""Exit code of a rank that ran out of memory (or crossed the enforced cap); other failures exit 1."""


def load_plan(path: str | os.PathLike | None = None):
    """The run's Plan, from ``path`` or from the file named by $LAUNCHER_PLAN."""
    from launcher.planner.plan import Plan

    path = path or os.environ.get(PLAN_ENV)
    if not path:
        raise ConfigError(
            f"${PLAN_ENV} is not set; start this script through the launcher, or export {PLAN_ENV}=RUN_DIR/plan.json"
        )
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"{PLAN_ENV}={path}: no such file; point it at the run dir's plan.json") from None
    return Plan.from_json(data)


def run_dir() -> Path | None:
    d = os.environ.get(RUN_DIR_ENV)
    return Path(d) if d else None


def enforce_bytes() -> int | None:
    raw = os.environ.get(ENFORCE_ENV, "").strip()
    if not raw:
        return None
    try:
        n = int(float(raw))
    except ValueError:
        raise ConfigError(f"{ENFORCE_ENV}={raw!r} is not a byte count; set it to an integer such as 16000000000") from None
    if n <= 0:
        raise ConfigError(f"{ENFORCE_ENV}={raw!r} must be positive; unset it to run without a cap")
    return n


def rank_info() -> tuple[int, int, int]:
    """(rank, local_rank, world_size) from torchrun's variables; (0, 0, 1) outside torchrun."""
    return int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def default_extensions_dir() -> Path:
    """Where compiled DeepSpeed ops are cached: <repo>/.cache/torch_extensions (repo = parent of launcher/)."""
    return Path(__file__).resolve().parents[2] / ".cache" / "torch_extensions"


def set_extensions_dir() -> str:
    """Point TORCH_EXTENSIONS_DIR at the shared cache unless the user chose one; call before importing deepspeed."""
    return os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(default_extensions_dir()))
