"""Environment variables the launcher sets on every rank, and the run-dir layout they point into."""

from __future__ import annotations

import json
import os
from pathlib import Path

from launcher.errors import EXIT_OOM, ConfigError  # noqa: F401  (EXIT_OOM: re-exported for scripts)
from launcher.rankenv import (  # noqa: F401  (the names ranks read, defined once in a module that imports nothing)
    DS_CONFIG_ENV,
    ENFORCE_ENV,
    EXTENSIONS_ENV,
    PLAN_DIGEST_ENV,
    PLAN_ENV,
    RUN_DIR_ENV,
    SNAPSHOT_ENV,
    TRACK_ENV,
    default_extensions_dir,
    extensions_dir,
    plan_digest,
)


def load_plan(path: str | os.PathLike | None = None):
    """The run's Plan, from ``path`` or from the file named by $LAUNCHER_PLAN."""
    from launcher.planner.plan import Plan

    path = path or os.environ.get(PLAN_ENV)
    if not path:
        raise ConfigError(
            f"${PLAN_ENV} is not set; start this script through the launcher, or export {PLAN_ENV}=RUN_DIR/plan.json"
        )
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{PLAN_ENV}={path}: no such file; point it at the run dir's plan.json") from None
    check_plan_digest(raw, path)
    return Plan.from_json(json.loads(raw))


def check_plan_digest(raw: bytes, path: str | os.PathLike) -> str:
    """The plan's sha256; ConfigError when $LAUNCHER_PLAN_SHA256 names another one. The launcher sets it to the
    plan.json it wrote for this attempt: a rank that read a file replaced since (another `launch plan --out`
    into the run dir, an edit) would train a plan the launcher neither checked nor reports."""
    got = plan_digest(raw)
    want = os.environ.get(PLAN_DIGEST_ENV, "").strip().lower()
    if want and got != want:
        raise ConfigError(
            f"{path}: this plan.json is not the one the launcher wrote for this run (sha256 {got[:12]}..., "
            f"${PLAN_DIGEST_ENV} says {want[:12]}...): it was replaced after the launch; nothing was trained. "
            "Relaunch (launch ... --run-dir DIR --overwrite) and do not write into a run dir while it runs")
    return got


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


def set_extensions_dir() -> str:
    """Point TORCH_EXTENSIONS_DIR at the shared cache unless the user chose one; call before importing deepspeed."""
    os.environ[EXTENSIONS_ENV] = chosen = extensions_dir()
    return chosen
