"""SlurmConfig + plan -> submitit's SlurmExecutor parameters, checked against what submitit and sbatch accept.

Pure apart from reading the tables of valid keys, which have one source of truth: submitit's own
``SlurmExecutor._valid_parameters()`` (read from the signature of ``_make_sbatch_string``), plus sbatch's long
options as ``sbatch --help`` lists them where sbatch is installed. The sbatch emitter (launcher.emit.sbatch) renders the
same directives from ``directives()``.
"""

from __future__ import annotations

import difflib
import functools
import re
import shutil
import subprocess

from launcher.config.job import ClusterConfig, Job, SlurmConfig
from launcher.config.problem import Problem
from launcher.config.slurm_rules import KEY, check_job_name, check_slurm_values
from launcher.emit.slurm_alloc import SlurmResources, combined, slurm_resources
from launcher.errors import ConfigError
from launcher.files.rundir import slug
from launcher.planner.plan import Plan
from launcher.units import GiB

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


def check_slurm(cfg: SlurmConfig, *, cluster: ClusterConfig | None = None,
                sbatch_options: frozenset[str] | None = None) -> list[Problem]:
    """Every problem with the slurm: section (sizes against ``cluster``'s node where given), typed: the field, the
    rest of its line (value, rule, fix) and the other fields the rule read; ``str()`` of each is the line the user
    reads."""
    p = check_slurm_values(cfg, cluster)  # syntax, sizes and control characters; setup lines are raw shell
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


def executor_parameters(job: Job, plan: Plan, *, sbatch_options: frozenset[str] | None = None,
                        resources: SlurmResources | None = None) -> dict[str, object]:
    """Keyword arguments for ``SlurmExecutor.update_parameters``; ConfigError lists every problem.

    ``resources`` (a sweep's combined allocation) replaces what ``slurm_resources(job, plan)`` would derive.
    """
    cfg = job.slurm
    problems = check_job_name(job.name) + check_slurm(cfg, cluster=job.cluster, sbatch_options=sbatch_options)
    if problems:
        raise ConfigError(problems)
    res = resources or slurm_resources(job, plan)
    if res.time_min is None:
        raise ConfigError(Problem("slurm.timeout_min", f"not set, and the plan cannot derive it: "
                                  f"{res.facts.steps_basis}; set slurm.timeout_min (minutes), or train.max_steps"))
    if not 0 <= cfg.signal_delay_s < res.time_min * 60:
        raise ConfigError(Problem("slurm.signal_delay_s", f"{cfg.signal_delay_s!r} must be in [0, time limit*60 = "
                                  f"{res.time_min * 60}) so the checkpoint signal comes before the limit; e.g. 90"))
    params: dict[str, object] = {
        "job_name": slug(job.name), "time": res.time_min, "nodes": plan.nodes, "ntasks_per_node": 1,
        "signal_delay_s": cfg.signal_delay_s, "array_parallelism": cfg.array_parallelism,
    }
    if res.gpus_per_node:  # CPU ranks ask for none: Slurm would hold GPUs nothing uses
        params["gpus_per_node"] = res.gpus_per_node
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


__all__ = ["SlurmResources", "check_slurm", "combined", "directives", "executor_parameters", "slurm_resources"]
