"""SlurmConfig + plan -> submitit's SlurmExecutor parameters, checked against what submitit and sbatch accept.

Pure apart from reading the tables of valid keys, which have one source of truth: submitit's own
``SlurmExecutor._valid_parameters()`` (read from the signature of ``_make_sbatch_string``), plus sbatch's long
options as ``sbatch --help`` lists them where sbatch is installed. The sbatch emitter (launcher.emit.sbatch) renders the same directives from ``directives()``.
"""

from __future__ import annotations

import difflib
import functools
import math
import re
import shutil
import subprocess
from dataclasses import dataclass
from typing import Literal

from launcher.config.job import Job, SlurmConfig
from launcher.config.problem import Problem
from launcher.config.slurm_rules import KEY, TIMEOUT_MAX_MIN, check_job_name, check_slurm_values
from launcher.engines import engine_spec
from launcher.errors import ConfigError
from launcher.planner.plan import Plan
from launcher.rundir import slug
from launcher.units import GB, GiB

# Keys this backend derives from SlurmConfig fields or from the plan: a user sets the field, not the key.
OWNED = {
    "time": "slurm.timeout_min", "nodes": "nodes (or --nodes)", "ntasks_per_node": "nothing (one task per node)",
    "ntasks": "nothing (one task per node)", "gpus_per_node": "gpus (or --gpus)", "gpus_per_task": "gpus (or --gpus)",
    "num_gpus": "gpus (or --gpus)", "gpus": "gpus (or --gpus)", "job_name": "name", "partition": "slurm.partition",
    "account": "slurm.account", "qos": "slurm.qos", "mem": "slurm.mem_gb", "cpus_per_task": "slurm.cpus_per_task",
    "constraint": "slurm.constraint", "exclusive": "slurm.exclusive", "signal_delay_s": "slurm.signal_delay_s",
    "signal": "slurm.signal_delay_s", "setup": "slurm.setup", "array_parallelism": "slurm.array_parallelism",
    "array": "sweep: (arrays come from the sweep)", "additional_parameters": "slurm.additional_parameters",
    "output": "nothing (logs go to the run dir)", "error": "nothing (logs go to the run dir)",
    "open_mode": "nothing", "use_srun": "nothing (each node runs one srun task)", "map_count": "nothing",
    "requeue": "slurm.max_requeues", "no_requeue": "slurm.max_requeues (0 never requeues)", "wrap": "nothing",
    "parsable": "nothing", "chdir": "nothing",
}


def submitit_parameters() -> dict[str, object]:
    """submitit's valid SlurmExecutor parameters with their defaults (from its own function signature)."""
    from submitit.slurm import slurm

    return {k: slurm._get_default_parameters()[k] for k in sorted(slurm.SlurmExecutor._valid_parameters())}


@functools.lru_cache(maxsize=1)
def sbatch_long_options() -> frozenset[str] | None:
    """sbatch's long options (underscored) from ``sbatch --help``; None where sbatch is not installed."""
    if shutil.which("sbatch") is None:
        return None
    try:
        out = subprocess.run(["sbatch", "--help"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    return frozenset(m.replace("-", "_") for m in re.findall(r"^\s+(?:-\w, )?--([a-z][a-z0-9-]*)", out, re.M))


def _key(k: str) -> str:
    return k.replace("-", "_")


def check_slurm(cfg: SlurmConfig, *, sbatch_options: frozenset[str] | None = None) -> list[Problem]:
    """Every problem with the slurm: section, typed: the field, the rest of its line (value, rule, fix) and the
    other fields the rule read; ``str()`` of each is the line the user reads."""
    p = check_slurm_values(cfg)  # syntax and control characters; setup lines are raw shell
    if cfg.timeout_min is not None and cfg.timeout_min < 1:
        p.append(Problem("slurm.timeout_min", f"{cfg.timeout_min!r} must be at least 1 (Slurm's unit is minutes); "
                         "e.g. 60"))
    elif cfg.signal_delay_s < 0:
        p.append(Problem("slurm.signal_delay_s", f"{cfg.signal_delay_s!r} must not be negative; e.g. 90"))
    elif cfg.timeout_min is not None and cfg.signal_delay_s >= cfg.timeout_min * 60:
        p.append(Problem("slurm.signal_delay_s", f"{cfg.signal_delay_s!r} must be in [0, timeout_min*60 = "
                         f"{cfg.timeout_min * 60}) so the checkpoint signal comes before the limit; e.g. 90",
                         reads=("slurm.timeout_min",)))
    if cfg.max_requeues < 0:
        p.append(Problem("slurm.max_requeues", f"{cfg.max_requeues!r} must not be negative; 0 never requeues, "
                         "e.g. 3"))
    if cfg.array_parallelism < 1:
        p.append(Problem("slurm.array_parallelism", f"{cfg.array_parallelism!r} must be at least 1; e.g. 64"))
    if cfg.cpus_per_task is not None and cfg.cpus_per_task < 1:
        p.append(Problem("slurm.cpus_per_task", f"{cfg.cpus_per_task!r} must be at least 1; leave it out to derive "
                         "it from the plan"))
    if cfg.mem_gb is not None and cfg.mem_gb <= 0:
        p.append(Problem("slurm.mem_gb", f"{cfg.mem_gb!r} must be greater than 0; e.g. 64, or leave it out to derive "
                         "it from the plan"))
    p += check_additional(cfg.additional_parameters, sbatch_options=sbatch_options)
    return p


def check_additional(extra: dict[str, object], *, sbatch_options: frozenset[str] | None = None) -> list[Problem]:
    """Problems with slurm.additional_parameters, one per key (field slurm.additional_parameters.KEY): keys the
    launcher sets itself, keys neither submitit nor sbatch knows (with the nearest valid one), and values that are
    not a string, number or true."""
    sbatch_options = sbatch_long_options() if sbatch_options is None else sbatch_options
    native = set(submitit_parameters())
    valid = (native | (sbatch_options or set())) - set(OWNED)
    p: list[Problem] = []
    for raw, value in extra.items():
        key = _key(str(raw))
        where = f"slurm.additional_parameters.{raw}"
        if not KEY.fullmatch(str(raw)):
            continue  # not an option name at all (a newline, a space): check_slurm_values names it
        if key in OWNED:
            p.append(Problem(where, f"is set by the launcher; set {OWNED[key]} instead"))
        elif key not in valid:
            near = difflib.get_close_matches(key, sorted(valid), n=1)
            hint = f"did you mean {near[0]!r}? " if near else ""
            source = "submitit's SlurmExecutor parameters or sbatch --help" if sbatch_options else (
                "submitit's SlurmExecutor parameters (sbatch is not installed here, so its other options "
                "cannot be checked)")
            p.append(Problem(where, f"unknown key, not in {source}; {hint}valid keys: {', '.join(sorted(valid))}"))
        elif value is None or value is False or isinstance(value, (list, dict)):
            p.append(Problem(where, f"{value!r} must be a string or number (true for a bare flag); "
                             "remove the key to leave it unset"))
    return p


TIME_FACTOR = 1.5
"""Margin on the predicted training time: the cost model's step time is a prediction (benchmarks/results/
plan_quality.md), and a run that outlives its limit still checkpoints and requeues (slurm.max_requeues)."""
STARTUP_S = 600
"""Added to the predicted training time for start-up and the end: imports, the weight load, DeepSpeed's op build,
rendezvous, checkpoints and the report."""
MEM_FACTOR = 1.25
"""Margin on the plan's host RAM per node (offloaded optimizer states and parameters, the weight load)."""
RANK_PROCESS_BYTES = {"cuda_reserved_plus_context": 4 * GB, "cpu_tensor_bytes": 1 * GB}
"""Host memory of one rank's process beyond the plan's tensors, bytes, by the plan's basis (GPU or CPU ranks):
Python, torch, transformers, DeepSpeed and the data (CPU ranks: 0.43 GB peak RSS measured, docs/reliability/slurm.md);
on GPU ranks also CUDA's libraries and pinned staging buffers (assumed, not measured here)."""
HOST_OPTIMIZER_CPUS_PER_RANK = 4
"""CPUs per rank when the optimizer steps on the host (DeepSpeedCPUAdam, FSDP2 CPU offload): an OpenMP loop over
the rank's fp32 shard, so the ranks get OMP_NUM_THREADS of them; one CPU per rank otherwise."""
MEM_KEYS_ELSEWHERE = ("mem_per_cpu", "mem_per_gpu")
"""additional_parameters that set memory another way: sbatch refuses them beside --mem, so none is derived."""
CPU_KEYS_ELSEWHERE = ("cpus_per_gpu",)
"""additional_parameters that set CPUs another way: sbatch refuses them beside --cpus-per-task."""

Source = Literal["job", "plan", "default", "none"]


@dataclass(kw_only=True, slots=True, frozen=True)
class SlurmResources:
    """Time, memory and CPUs a Slurm job asks for, and where each came from: the job (pinned in slurm:), the plan
    (derived), a default (time, when the job gives epochs), or none (set another way through
    additional_parameters). The sbatch script and the submitit parameters both use it; cli/ renders it."""

    time_min: int
    """--time, minutes."""
    time_source: Source
    """Where time_min came from."""
    predicted_train_s: float | None
    """Predicted step time x train.max_steps, seconds; None when the job gives epochs."""
    mem_bytes: int | None
    """--mem per node, bytes (rendered in whole GiB when derived); None: not set (mem_per_cpu or mem_per_gpu)."""
    mem_source: Source
    """Where mem_bytes came from."""
    predicted_host_bytes: int
    """The plan's host RAM per node, bytes, before the margin."""
    mem_capped: bool
    """The derivation was cut to cluster.host_ram_per_node (a node cannot give more)."""
    cpus_per_task: int | None
    """--cpus-per-task (the node's one task runs every rank); None: not set (cpus_per_gpu)."""
    cpus_source: Source
    """Where cpus_per_task came from."""
    host_optimizer: bool
    """The optimizer steps on the host (CPU Adam), so each rank gets HOST_OPTIMIZER_CPUS_PER_RANK CPUs."""
    threads_per_rank: int
    """OMP_NUM_THREADS for the ranks: cpus_per_task shared by the node's ranks (1 when not set)."""

    @property
    def derived(self) -> list[str]:
        """The sbatch options derived from the plan, sbatch spelling."""
        return [o for o, src in (("--time", self.time_source), ("--mem", self.mem_source),
                                 ("--cpus-per-task", self.cpus_source)) if src == "plan"]


def host_optimizer(plan: Plan) -> bool:
    """The optimizer steps on the host CPUs (offloaded optimizer, or FSDP2 parameters on the CPU); CPU ranks
    always step on their own cores, so they are not counted here."""
    s = plan.strategy
    if plan.estimate.basis == "cpu_tensor_bytes":
        return False
    return engine_spec(s.engine).optimizer_on_host(s)


def slurm_resources(job: Job, plan: Plan) -> SlurmResources:
    """--time, --mem and --cpus-per-task: the job's when it pins them, else derived from the plan (pure)."""
    cfg, ranks = job.slurm, plan.gpus_per_node
    extra = {_key(str(k)) for k in cfg.additional_parameters}
    steps = job.train.max_steps
    train_s = plan.estimate.step_time_s * steps if steps else None
    if cfg.timeout_min is not None:
        time_min, time_src = cfg.timeout_min, "job"
    elif train_s is not None:
        # At least one minute past the checkpoint signal, so USR2 always comes inside the limit.
        time_min = max(math.ceil((train_s * TIME_FACTOR + STARTUP_S) / 60), cfg.signal_delay_s // 60 + 1)
        time_min, time_src = min(time_min, TIMEOUT_MAX_MIN), "plan"
    else:
        time_min, time_src = max(60, cfg.signal_delay_s // 60 + 1), "default"
    host = plan.estimate.host_bytes_per_node
    capped = False
    if cfg.mem_gb is not None:
        mem, mem_src = int(cfg.mem_gb * GiB), "job"
    elif extra & set(MEM_KEYS_ELSEWHERE):
        mem, mem_src = None, "none"
    else:
        need = host * MEM_FACTOR + ranks * RANK_PROCESS_BYTES.get(plan.estimate.basis, 4 * GB)
        mem, mem_src = math.ceil(need / GiB) * GiB, "plan"
        node = job.cluster.host_ram_per_node_bytes
        if node is not None and mem > node:
            mem, capped = node // GiB * GiB, True
    on_host = host_optimizer(plan)
    if cfg.cpus_per_task is not None:
        cpus, cpus_src = cfg.cpus_per_task, "job"
    elif extra & set(CPU_KEYS_ELSEWHERE):
        cpus, cpus_src = None, "none"
    else:
        cpus, cpus_src = ranks * (HOST_OPTIMIZER_CPUS_PER_RANK if on_host else 1), "plan"
    return SlurmResources(time_min=time_min, time_source=time_src, predicted_train_s=train_s, mem_bytes=mem,
                          mem_source=mem_src, predicted_host_bytes=host, mem_capped=capped, cpus_per_task=cpus,
                          cpus_source=cpus_src, host_optimizer=on_host,
                          threads_per_rank=max(1, (cpus or ranks) // ranks))


def combined(resources: list[SlurmResources]) -> SlurmResources:
    """One allocation for several plans (a sweep's array): the largest of each, so every variant fits."""
    best = resources[0]
    for r in resources[1:]:
        best = SlurmResources(
            time_min=max(best.time_min, r.time_min), time_source=best.time_source,
            predicted_train_s=max(best.predicted_train_s or 0.0, r.predicted_train_s or 0.0) or None,
            mem_bytes=None if best.mem_bytes is None else max(best.mem_bytes, r.mem_bytes or 0),
            mem_source=best.mem_source, predicted_host_bytes=max(best.predicted_host_bytes, r.predicted_host_bytes),
            mem_capped=best.mem_capped or r.mem_capped,
            cpus_per_task=None if best.cpus_per_task is None else max(best.cpus_per_task, r.cpus_per_task or 0),
            cpus_source=best.cpus_source, host_optimizer=best.host_optimizer or r.host_optimizer,
            threads_per_rank=max(best.threads_per_rank, r.threads_per_rank))
    return best


def executor_parameters(job: Job, plan: Plan, *, sbatch_options: frozenset[str] | None = None,
                        resources: SlurmResources | None = None) -> dict[str, object]:
    """Keyword arguments for ``SlurmExecutor.update_parameters``; ConfigError lists every problem.

    ``resources`` (a sweep's combined allocation) replaces what ``slurm_resources(job, plan)`` would derive.
    """
    cfg = job.slurm
    problems = check_job_name(job.name) + check_slurm(cfg, sbatch_options=sbatch_options)
    if problems:
        raise ConfigError(problems)
    res = resources or slurm_resources(job, plan)
    if not 0 <= cfg.signal_delay_s < res.time_min * 60:
        raise ConfigError(Problem("slurm.signal_delay_s", f"{cfg.signal_delay_s!r} must be in [0, time limit*60 = "
                                  f"{res.time_min * 60}) so the checkpoint signal comes before the limit; e.g. 90"))
    params: dict[str, object] = {
        "job_name": slug(job.name), "time": res.time_min, "nodes": plan.nodes, "ntasks_per_node": 1,
        "gpus_per_node": plan.gpus_per_node, "signal_delay_s": cfg.signal_delay_s,
        "array_parallelism": cfg.array_parallelism,
    }
    if res.cpus_per_task is not None:
        params["cpus_per_task"] = res.cpus_per_task
    for name in ("partition", "account", "qos", "constraint"):
        if getattr(cfg, name) is not None:
            params[name] = getattr(cfg, name)
    if res.mem_source == "job":
        params["mem"] = _mem(cfg.mem_gb)
    elif res.mem_bytes is not None:
        params["mem"] = f"{res.mem_bytes // GiB}G"
    if cfg.exclusive:
        params["exclusive"] = True
    if cfg.setup:
        params["setup"] = list(cfg.setup)
    native = set(submitit_parameters())
    extra = {}
    for raw, value in cfg.additional_parameters.items():
        key = _key(str(raw))
        if key in native:
            params[key] = value  # submitit's own parameter: let it check and render the value
        else:
            extra[key] = value
    if extra:
        params["additional_parameters"] = extra
    return params


def _mem(mem_gb: float) -> str:
    # submitit's own rule (_convert_mem); memory per node, since there is one task per node.
    return f"{int(mem_gb)}GB" if mem_gb == int(mem_gb) else f"{int(mem_gb * 1024)}MB"


def directives(job: Job, plan: Plan, *, sbatch_options: frozenset[str] | None = None,
               resources: SlurmResources | None = None) -> dict[str, object]:
    """The #SBATCH directives (sbatch spelling, dashed) the plain sbatch script carries, in a stable order."""
    params = executor_parameters(job, plan, sbatch_options=sbatch_options, resources=resources)
    out: dict[str, object] = {}
    for key in ("job_name", "nodes", "ntasks_per_node", "gpus_per_node", "cpus_per_task", "mem", "time",
                "partition", "account", "qos", "constraint", "exclusive"):
        if key in params:
            out[key.replace("_", "-")] = params[key]
    for key, value in params.items():
        if key in native_sbatch_keys():
            out[key.replace("_", "-")] = value
    for key, value in dict(params.get("additional_parameters") or {}).items():
        out[key.replace("_", "-")] = value
    return out


def native_sbatch_keys() -> set[str]:
    """submitit parameters that are sbatch options under the same name (the rest are submitit's own knobs)."""
    not_sbatch = {"additional_parameters", "array_parallelism", "setup", "signal_delay_s", "srun_args",
                  "stderr_to_stdout", "teardown", "use_srun", "num_gpus"}
    return set(submitit_parameters()) - not_sbatch - set(OWNED)
