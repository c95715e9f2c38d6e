"""Load a job file, apply CLI overrides, and check what types alone cannot."""

from __future__ import annotations

import copy
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from launcher.config import bounds
from launcher.config.datasource import FILE_SUFFIXES, looks_like_hub_id
from launcher.config.job import InlineArch, Job
from launcher.config.load import from_dict_partial, load_yaml, parse_yaml_value, show
from launcher.config.problem import Problem
from launcher.config.slurm_rules import check_job_name, check_slurm_values
from launcher.errors import ConfigError
from launcher.files.fsutil import not_a_file
from launcher.levers import LEVERS
from launcher.units import GB, MB, format_bytes

DATA_SUFFIXES = FILE_SUFFIXES


def set_dotted(data: dict, dotted: str, value: Any) -> None:
    """Set ``a.b.c`` in nested plain data, creating mappings on the way."""
    keys = dotted.split(".")
    node = data
    for k in keys[:-1]:
        if not isinstance(node.get(k), dict):
            node[k] = {} if node.get(k) is None else node[k]
            if not isinstance(node[k], dict):
                raise ConfigError(f"{dotted}: {k!r} is not a mapping in the job, so {dotted} cannot be set; fix the "
                                  "key")
        node = node[k]
    node[keys[-1]] = value


def load_job_data(path: str | Path) -> dict:
    """The job file's YAML as a dict; ConfigError when it is empty or not a mapping."""
    data = load_yaml(path)
    if data is None:
        raise ConfigError(f"{path}: the job file is empty; start from examples/minilm-embed.yaml")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the job file must be a mapping of keys, got {type(data).__name__}; "
                          "write name:, model:, task:, data:, train: lines")
    return data


def parse_overrides(items: list[str]) -> list[tuple[str, Any]]:
    """``["train.lr=1e-4", "strategy.zero_stage=3"]`` as (dotted key, YAML value) pairs, in order.

    A value is read as one YAML value (1e-4 a number, 3 an int, true a bool, [a, b] a list, null None), so a
    key set here gets exactly the checks it would get in the file.
    """
    problems, out = [], []
    for item in items:
        key, _, raw = item.partition("=")
        if len(item) > bounds.OVERRIDE_CHARS:  # before YAML reads it: its pure-Python reader is slow on megabytes
            problems.append(f"{key[:100]}: the value given on the command line is {len(raw)} characters, over the "
                            f"{bounds.OVERRIDE_CHARS} an override may hold; set long values in the job file")
            continue
        try:
            out.append((key, parse_yaml_value(raw)))
        except ValueError as e:
            problems.append(f"{key}: {show(raw)} (from the command line) is not a YAML value ({e}); "
                            "quote it or fix its syntax")
    if problems:
        raise ConfigError(problems)
    return out


def job_from_data(data: dict, base_dir: str | Path, overrides: dict[str, Any] | None = None, *,
                  sets: list[tuple[str, Any]] | None = None, for_run: bool = True,
                  checks: Callable[[Job], list[Problem]] | None = None) -> Job:
    """Typed Job from plain data plus dotted overrides; every problem in one ConfigError.

    ``sets`` are KEY=VALUE overrides from the command line (None is a value there: key=null); ``overrides``
    are the flags (None: not given), applied after them. Type and key problems, the rules over values, and the
    caller's ``checks`` (the CLI passes launcher.inputs.plan_inputs.request_problems: budget against the card, batch
    against the ranks) are gathered together; a value refused by its type is not judged again. Without ``checks``
    nothing runs beyond this module, so loading a job never probes the machine. ``for_run`` adds the rules only a run
    needs (train.max_steps or epochs, a data file with records). Relative model, data and NVMe paths become absolute
    against ``base_dir``.
    """
    data = copy.deepcopy(data)
    problems: list[str] = []
    for key, value in [*(sets or []), *((k, v) for k, v in (overrides or {}).items() if v is not None)]:
        try:
            set_dotted(data, key, value)
        except ConfigError as e:
            problems += e.problems
    built = from_dict_partial(Job, data)
    problems += built.problems
    job: Job | None = built.value
    if job is not None:
        job.base_dir = str(Path(base_dir).resolve())
        resolve_paths(job)
        if job.gpus is None and job.cluster.gpus_per_node is not None:
            job.gpus = job.cluster.gpus_per_node
        rules = check_job(job, for_run=for_run)
        if checks is not None and job.sweep is None:  # a sweep's variants change gpus and batch: each is checked
            rules += checks(job)
        problems += [p for p in rules if not p.judges(built.failed)]
    if problems:
        raise ConfigError(problems)
    return job  # type: ignore[return-value]


def _absolute(path: str, base_dir: str) -> str:
    """``path`` with ~ expanded and, if relative, joined to ``base_dir`` (normalized, symlinks kept)."""
    p = Path(path).expanduser()
    return str(p) if p.is_absolute() else os.path.normpath(Path(base_dir) / p)


def resolve_paths(job: Job) -> None:
    """Relative paths in the job start at the job file's directory, wherever plan, run or Slurm reads them.

    Made absolute once here, so the run dir's job.yaml (read by the ranks with the run dir as their base) and
    an sbatch script name the same files. A model name that is no directory there (a bundled config, a hub
    id) stays as written unless it is spelled as a path (./ or ../).
    """
    base = job.base_dir
    try:
        raw = job.data.path
        if raw.strip() and not (looks_like_hub_id(raw) and not Path(_absolute(raw, base)).exists()):
            job.data.path = _absolute(raw, base)  # a hub dataset id that is no local path stays as written
        if job.cluster.nvme_path:
            job.cluster.nvme_path = _absolute(job.cluster.nvme_path, base)
        if isinstance(job.model, str) and job.model.strip():
            local = _absolute(job.model, base)
            if job.model.startswith(("./", "../", "~")) or Path(local).is_dir():
                job.model = local
    except (OSError, RuntimeError, ValueError):  # a NUL byte, an unknown ~user: the checks name the value
        pass


def load_job(path: str | Path, overrides: dict[str, Any] | None = None, *,
             sets: list[tuple[str, Any]] | None = None, for_run: bool = True,
             checks: Callable[[Job], list[Problem]] | None = None) -> Job:
    """The typed Job from a job file (job_from_data, relative paths against the file's directory); every problem in
    one ConfigError."""
    return job_from_data(load_job_data(path), Path(path).resolve().parent, overrides, sets=sets, for_run=for_run,
                         checks=checks)


def data_path(job: Job) -> Path:
    """The job's data.path with ~ expanded, absolute against the job file's directory."""
    p = Path(job.data.path).expanduser()
    return p if p.is_absolute() else Path(job.base_dir) / p


def _positive(problems: list[Problem], where: str, value, fix: str) -> None:
    if value is not None and value <= 0:
        problems.append(Problem(where, f"{value!r} must be greater than 0; {fix}"))


def check_arch(arch: InlineArch, max_seq_len: int) -> list[Problem]:
    """What transformers would refuse (or crash on) when it builds the model, said before any planning."""
    p: list[Problem] = []
    for name in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size", "vocab_size",
                 "max_position_embeddings"):
        _positive(p, f"model.{name}", getattr(arch, name), f"give {name} as a whole number, e.g. 64")
    if p:
        return p
    if arch.hidden_size % arch.num_heads:
        p.append(Problem("model.hidden_size", f"{arch.hidden_size} is not divisible by model.num_heads "
                         f"{arch.num_heads}; use a multiple of {arch.num_heads} "
                         f"(e.g. {arch.num_heads * max(1, arch.hidden_size // arch.num_heads)})",
                         reads=("model.num_heads",)))
    if arch.num_kv_heads is not None and arch.num_heads % arch.num_kv_heads:
        p.append(Problem("model.num_kv_heads", f"{arch.num_kv_heads} does not divide model.num_heads "
                         f"{arch.num_heads}; use a divisor of {arch.num_heads} (grouped-query attention shares each "
                         "KV head evenly)", reads=("model.num_heads",)))
    if max_seq_len > arch.max_position_embeddings:
        p.append(Problem("data.max_seq_len", f"{max_seq_len} is longer than model.max_position_embeddings "
                         f"{arch.max_position_embeddings}; use --seq-len {arch.max_position_embeddings} or raise "
                         "max_position_embeddings", reads=("model.max_position_embeddings",)))
    return p


def check_data_path(job: Job) -> list[Problem]:
    """The problem with data.path, if any (unknown suffix, missing, unreadable, no records); [] too when it names a
    directory or hub dataset, whose rows are checked before launch."""
    try:
        dp = data_path(job)
        if dp.is_dir() or (looks_like_hub_id(job.data.path) and not dp.exists()):
            return []  # a save_to_disk dir or a cached hub dataset: the rows are checked before launch (session)
        if dp.suffix.lower() not in DATA_SUFFIXES:
            return [Problem("data.path", f"{job.data.path!r} must end in .jsonl, .json, .csv, .parquet or .arrow, or "
                            "name a save_to_disk directory or a hub dataset id; convert the data to JSONL")]
        kind = not_a_file(dp)
        if kind == "missing":
            return [Problem("data.path", f"{str(dp)!r} does not exist; check the path "
                            "(relative paths start at the job file's directory)")]
        if kind:
            return [Problem("data.path", f"{str(dp)!r} is {kind}, not a data file; give the path of a regular "
                            "JSONL, CSV, JSON, parquet or Arrow file")]
        if not _has_records(dp):
            return [Problem("data.path", f"{str(dp)!r} holds no examples; add at least one record")]
    except (OSError, RuntimeError, ValueError) as e:  # a name too long, an unknown ~user, a NUL byte, unreadable
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e) or type(e).__name__
        return [Problem("data.path", f"{show(job.data.path)} cannot be read ({why}); give the path of a readable "
                        "JSONL file")]
    return []


def check_job(job: Job, *, for_run: bool = True) -> list[Problem]:
    """Rules that span fields or touch the file system; returns every problem found.

    Planning reads neither the length of training nor the data, so without ``for_run`` those are not required.
    """
    p: list[Problem] = []
    if not job.name.strip():
        p.append(Problem("name", "'' must not be empty; give the job a name, e.g. name: my-finetune"))
    elif len(job.name) > bounds.NAME_CHARS:
        p.append(Problem("name", f"{show(job.name)} is {len(job.name)} characters, over the {bounds.NAME_CHARS} a job "
                         "name may hold (run dirs and file names are built from it); give a shorter name"))
    p += check_job_name(job.name)
    # Whatever the launcher: `plan --sbatch` writes them for a local job too.
    p += check_slurm_values(job.slurm, job.cluster)
    _positive(p, "data.max_seq_len", job.data.max_seq_len, "use e.g. max_seq_len: 512 (or --seq-len 512)")
    _positive(p, "train.global_batch_size", job.train.global_batch_size, "use e.g. global_batch_size: 32")
    _positive(p, "train.lr", job.train.lr, "use e.g. lr: 2.0e-5")
    _positive(p, "train.max_steps", job.train.max_steps, "use e.g. max_steps: 100")
    _positive(p, "train.epochs", job.train.epochs, "use e.g. epochs: 1")
    _positive(p, "train.log_every_steps", job.train.log_every_steps, "use e.g. log_every_steps: 10")
    _positive(p, "train.warn_total_time_h", job.train.warn_total_time_h,
              "use e.g. warn_total_time_h: 24, or null to never warn")
    _positive(p, "gpus", job.gpus, "use e.g. --gpus 4")
    _positive(p, "nodes", job.nodes, "use e.g. --nodes 1")
    _positive(p, "strategy.micro_batch_size", job.strategy.micro_batch_size,
              "use e.g. micro_batch_size: 4 or leave it out")
    _positive(p, "cluster.gpus_per_node", job.cluster.gpus_per_node, "use e.g. gpus_per_node: 8")
    _positive(p, "cluster.cpus_per_node", job.cluster.cpus_per_node, "use the CPUs `sinfo -o %c` lists, e.g. 64")
    per_node = job.cluster.gpus_per_node
    if job.gpus and per_node and job.gpus > per_node:
        # gpus is per node: planning 16 on an 8-GPU node would export a world no node can hold.
        p.append(Problem("gpus", f"{job.gpus} per node is more than cluster.gpus_per_node {per_node}; use --gpus "
                         f"{per_node} --nodes {-(-job.gpus * (job.nodes or 1) // per_node)}, or fix "
                         "cluster.gpus_per_node", reads=("cluster.gpus_per_node", "nodes")))
    _positive(p, "slurm.timeout_min", job.slurm.timeout_min, "use e.g. timeout_min: 60")
    for name in ("warmup_steps", "eval_every_steps", "checkpoint_every_steps", "seed"):
        v = getattr(job.train, name)
        if v < 0:
            p.append(Problem(f"train.{name}", f"{v!r} must not be negative; use 0 or more"))
    clip = job.train.max_grad_norm
    if clip is not None and not (math.isfinite(clip) and clip >= 0):
        p.append(Problem("train.max_grad_norm", f"{clip!r} must be a finite number >= 0; use e.g. 1.0, or 0 (or "
                         "null) to turn gradient clipping off"))
    if job.auto_fallback < 0:
        p.append(Problem("auto_fallback", f"{job.auto_fallback!r} must not be negative; use 0 (off) or the number of "
                         "retries"))
    if for_run and job.train.max_steps is None and job.train.epochs is None:
        p.append(Problem("train.max_steps", "missing; give train.max_steps (e.g. 100) or train.epochs (e.g. 1)",
                         reads=("train.epochs",)))
    if job.train.max_steps is not None and job.train.epochs is not None:
        p.append(Problem("train.epochs", "given together with train.max_steps; keep one of them",
                         reads=("train.max_steps",)))
    if not 0.0 <= job.data.eval_fraction <= 0.5:
        p.append(Problem("data.eval_fraction", f"{job.data.eval_fraction!r} must be between 0 and 0.5; use e.g. 0.1"))
    if not 0.0 <= job.strategy.safety_margin < 0.5:
        p.append(Problem("strategy.safety_margin",
                         f"{job.strategy.safety_margin!r} must be in [0, 0.5); use e.g. 0.05"))
    if job.train.lora is not None:
        lo = job.train.lora
        _positive(p, "train.lora.r", lo.r, "use e.g. r: 8")
        _positive(p, "train.lora.alpha", lo.alpha, "use e.g. alpha: 16")
        if not lo.target_modules:
            p.append(Problem("train.lora.target_modules", "[] must name at least one module; e.g. [q_proj, v_proj]"))
        if not 0.0 <= lo.dropout < 1.0:
            p.append(Problem("train.lora.dropout", f"{lo.dropout!r} must be in [0, 1); use e.g. 0.05"))
    p += lever_problems(job)
    if job.budget_bytes is not None:
        p += check_budget(job.budget_bytes)
    p += bounds.job_problems(job)
    if isinstance(job.model, InlineArch):
        p += check_arch(job.model, job.data.max_seq_len)
    elif not job.model.strip() or "\x00" in job.model:
        p.append(Problem("model", f"{job.model!r} names no model; give a local model dir, a bundled name such as "
                         "gpt2-124m, a hub id, or an inline architecture"))
    else:
        try:
            Path(job.model).expanduser()
        except RuntimeError as e:  # '~nosuchuser/model'
            p.append(Problem("model", f"{job.model!r} cannot be expanded ({e}); give an absolute path or a hub id"))
    _positive(p, "data.num_labels", job.data.num_labels, "leave it out to count the labels in the data")
    if for_run:
        p += check_data_path(job)
    return p


def lever_problems(job: Job) -> list[Problem]:
    """The lever pins and permissions must agree (launcher.planner.levers chooses among what they leave): a math
    lever's pin needs its train.allow_levers word, and each lever's own rules (LeverSpec.pin_problems)."""
    pins, allow, out = job.strategy, job.train.allow_levers, []
    if len(set(allow)) != len(allow):
        out.append(Problem("train.allow_levers", f"{allow!r} names a lever twice; list each once"))
    for spec in LEVERS.values():
        v = spec.of(pins)
        word = None if v is None else spec.permit_word(v)
        if word is not None and word not in allow:
            out.append(Problem(f"strategy.{spec.field}", f"{v!r} changes the training math, which this job does not "
                               f"allow; add {word} to train.allow_levers, or leave strategy.{spec.field} out",
                               reads=("train.allow_levers",)))
    for spec in LEVERS.values():
        out += spec.pin_problems(job)
    return out


def check_budget(budget_bytes: int, where: str = "budget") -> list[Problem]:
    """The problem with a per-GPU budget in bytes that is implausible (under 16 MB or over 10 TB: a unit slip)."""
    if budget_bytes < 16 * MB:
        return [Problem(where, f"{format_bytes(budget_bytes)} is below 16 MB, too small to hold any model; "
                        "did you mean GB (e.g. --budget 16GB)?")]
    if budget_bytes > 10_000 * GB:
        return [Problem(where, f"{format_bytes(budget_bytes)} per GPU is absurd (no accelerator has 10 TB); "
                        "give the per-GPU budget, e.g. --budget 80GB")]
    return []


def _has_records(path: Path) -> bool:
    with path.open("rb") as f:
        lines = [ln for ln in (f.readline() for _ in range(3)) if ln.strip()]
    if path.suffix.lower() == ".csv":
        return len(lines) >= 2  # a header and one row
    return bool(lines)


def job_to_data(job: Job) -> dict:
    """The job as plain data for the run dir's job.yaml, with data.path made absolute."""
    from launcher.config.load import to_dict

    data = to_dict(job)
    data["data"]["path"] = str(data_path(job))
    return data
