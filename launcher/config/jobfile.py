"""Load a job file, apply CLI overrides, and check what types alone cannot."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

from launcher.config.job import Job
from launcher.config.load import from_dict, load_yaml
from launcher.errors import ConfigError
from launcher.units import GB, MB, format_bytes

DATA_SUFFIXES = (".jsonl", ".json", ".csv")


def set_dotted(data: dict, dotted: str, value: Any) -> None:
    """Set ``a.b.c`` in nested plain data, creating mappings on the way."""
    keys = dotted.split(".")
    node = data
    for k in keys[:-1]:
        if not isinstance(node.get(k), dict):
            node[k] = {} if node.get(k) is None else node[k]
            if not isinstance(node[k], dict):
                raise ConfigError(f"{dotted}: {k!r} is not a mapping in the job, so {dotted} cannot be set; fix the key")
        node = node[k]
    node[keys[-1]] = value


def load_job_data(path: str | Path) -> dict:
    data = load_yaml(path)
    if data is None:
        raise ConfigError(f"{path}: the job file is empty; start from examples/minilm-embed.yaml")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the job file must be a mapping of keys, got {type(data).__name__}; "
                          "write name:, model:, task:, data:, train: lines")
    return data


def job_from_data(data: dict, base_dir: str | Path, overrides: dict[str, Any] | None = None) -> Job:
    """Typed Job from plain data plus dotted overrides; every problem in one ConfigError."""
    data = copy.deepcopy(data)
    for key, value in (overrides or {}).items():
        if value is not None:
            set_dotted(data, key, value)
    job = from_dict(Job, data)
    job.base_dir = str(Path(base_dir).resolve())
    problems = check_job(job)
    if problems:
        raise ConfigError(problems)
    return job


def load_job(path: str | Path, overrides: dict[str, Any] | None = None) -> Job:
    return job_from_data(load_job_data(path), Path(path).resolve().parent, overrides)


def data_path(job: Job) -> Path:
    p = Path(job.data.path).expanduser()
    return p if p.is_absolute() else Path(job.base_dir) / p


def _positive(problems: list[str], where: str, value, fix: str) -> None:
    if value is not None and value <= 0:
        problems.append(f"{where}: {value!r} must be greater than 0; {fix}")


def check_job(job: Job) -> list[str]:
    """Rules that span fields or touch the file system; returns every problem found."""
    p: list[str] = []
    if not job.name.strip():
        p.append("name: '' must not be empty; give the job a name, e.g. name: my-finetune")
    _positive(p, "data.max_seq_len", job.data.max_seq_len, "use e.g. max_seq_len: 512 (or --seq-len 512)")
    _positive(p, "train.global_batch_size", job.train.global_batch_size, "use e.g. global_batch_size: 32")
    _positive(p, "train.lr", job.train.lr, "use e.g. lr: 2.0e-5")
    _positive(p, "train.max_steps", job.train.max_steps, "use e.g. max_steps: 100")
    _positive(p, "train.epochs", job.train.epochs, "use e.g. epochs: 1")
    _positive(p, "train.log_every_steps", job.train.log_every_steps, "use e.g. log_every_steps: 10")
    _positive(p, "gpus", job.gpus, "use e.g. --gpus 4")
    _positive(p, "nodes", job.nodes, "use e.g. --nodes 1")
    _positive(p, "strategy.micro_batch_size", job.strategy.micro_batch_size, "use e.g. micro_batch_size: 4 or leave it out")
    _positive(p, "cluster.gpus_per_node", job.cluster.gpus_per_node, "use e.g. gpus_per_node: 8")
    _positive(p, "slurm.timeout_min", job.slurm.timeout_min, "use e.g. timeout_min: 60")
    for name in ("warmup_steps", "eval_every_steps", "checkpoint_every_steps", "seed"):
        v = getattr(job.train, name)
        if v < 0:
            p.append(f"train.{name}: {v!r} must not be negative; use 0 or more")
    if job.auto_fallback < 0:
        p.append(f"auto_fallback: {job.auto_fallback!r} must not be negative; use 0 (off) or the number of retries")
    if job.train.max_steps is None and job.train.epochs is None:
        p.append("train.max_steps: missing; give train.max_steps (e.g. 100) or train.epochs (e.g. 1)")
    if job.train.max_steps is not None and job.train.epochs is not None:
        p.append("train.epochs: given together with train.max_steps; keep one of them")
    if not 0.0 <= job.data.eval_fraction <= 0.5:
        p.append(f"data.eval_fraction: {job.data.eval_fraction!r} must be between 0 and 0.5; use e.g. 0.1")
    if not 0.0 <= job.strategy.safety_margin < 0.5:
        p.append(f"strategy.safety_margin: {job.strategy.safety_margin!r} must be in [0, 0.5); use e.g. 0.05")
    if job.train.lora is not None:
        lo = job.train.lora
        _positive(p, "train.lora.r", lo.r, "use e.g. r: 8")
        _positive(p, "train.lora.alpha", lo.alpha, "use e.g. alpha: 16")
        if not lo.target_modules:
            p.append("train.lora.target_modules: [] must name at least one module; e.g. [q_proj, v_proj]")
        if not 0.0 <= lo.dropout < 1.0:
            p.append(f"train.lora.dropout: {lo.dropout!r} must be in [0, 1); use e.g. 0.05")
    if job.budget_bytes is not None:
        p += check_budget(job.budget_bytes)
    dp = data_path(job)
    if dp.suffix.lower() not in DATA_SUFFIXES:
        p.append(f"data.path: {job.data.path!r} must end in .jsonl, .json or .csv; convert the data to JSONL")
    elif not dp.is_file():
        p.append(f"data.path: {str(dp)!r} does not exist; check the path (relative paths start at the job file's directory)")
    elif not _has_records(dp):
        p.append(f"data.path: {str(dp)!r} holds no examples; add at least one record")
    return p


def check_budget(budget_bytes: int, where: str = "budget") -> list[str]:
    if budget_bytes < 16 * MB:
        return [f"{where}: {format_bytes(budget_bytes)} is below 16 MB, too small to hold any model; "
                "did you mean GB (e.g. --budget 16GB)?"]
    if budget_bytes > 10_000 * GB:
        return [f"{where}: {format_bytes(budget_bytes)} per GPU is absurd (no accelerator has 10 TB); "
                "give the per-GPU budget, e.g. --budget 80GB"]
    return []


def _has_records(path: Path) -> bool:
    with path.open("rb") as f:
        lines = [ln for ln in (f.readline() for _ in range(3)) if ln.strip()]
    if path.suffix.lower() == ".csv":
        return len(lines) >= 2  # a header and one row
    return bool(lines)


def job_to_data(job: Job) -> dict:
    from launcher.config.load import to_dict

    data = to_dict(job)
    data["data"]["path"] = str(data_path(job))
    return data


def replace(job: Job, **changes) -> Job:
    return dataclasses.replace(job, **changes)
