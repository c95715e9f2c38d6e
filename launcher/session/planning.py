"""`launch plan` decided: the plan, the data's summary, the total time, the allocation a queued backend asks for,
the sbatch script and the `--out` set, as one typed PlanResult that launcher.cli.plan only renders (as run_job is
for running)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from launcher.backends import backend_spec
from launcher.config.job import Job
from launcher.emit.slurm_alloc import SlurmResources
from launcher.errors import ConfigError
from launcher.planner.duration import TotalTime
from launcher.planner.plan import Plan
from launcher.records.datasummary import DataSummary
from launcher.session.checks import check_script, lora_base_warning
from launcher.session.prepare import plan_files, slurm_allocation, total_time_of


@dataclass(kw_only=True, slots=True)
class PlanOptions:
    """What `launch plan` was asked for besides the job."""

    force: bool = False
    """Give the best plan even when it is predicted over budget."""
    script: str | None = None
    """Plan for this training script (its path) rather than the launcher's recipe."""
    sbatch: bool = False
    """Also make an sbatch script: written into ``out``, or printed without it."""
    out: Path | None = None
    """Write the export set into this directory."""


@dataclass(kw_only=True, slots=True)
class PlanResult:
    """What `launch plan` found and did, for the CLI to render."""

    plan: Plan
    """The plan."""
    data: DataSummary | None
    """The data as `launch run` would count it; None when not read."""
    data_note: str
    """Why the data was not read ("" when it was)."""
    total: TotalTime
    """The predicted training time."""
    slurm: SlurmResources | None = None
    """The allocation a queued backend's job (or the sbatch script) asks for; None for a local job."""
    sbatch: str | None = None
    """The sbatch script's text (--sbatch)."""
    written: list[Path] = field(default_factory=list)
    """The files written into --out."""
    warning: str | None = None
    """A warning about the job to print beside the plan (a LoRA base in a low-bit dtype)."""


def check_plan_options(opts: PlanOptions) -> None:
    """Refuse (ConfigError) a combination `launch plan` cannot honour, before the job is read."""
    if opts.script and opts.sbatch:
        raise ConfigError("--script: --sbatch writes a script that runs the launcher's recipe, not yours; drop "
                          "--sbatch, and submit your script with launch --slurm JOB --script PATH")
    check_script(opts.script)
    if opts.sbatch and opts.out is not None:
        from launcher.config.slurm_rules import check_shell_path

        bad_out = check_shell_path(opts.out, "--out")  # the script names it in #SBATCH --output and RUN_DIR
        if bad_out:
            raise ConfigError(bad_out)


def plan_for(job: Job, opts: PlanOptions) -> PlanResult:
    """Plan ``job`` (NoPlanError when nothing fits), read its data, and with --sbatch / --out make the script and
    write the export set; every problem is refused (ConfigError) before anything is written."""
    from launcher.inputs.plan_inputs import plan_job

    if opts.sbatch:
        from launcher.inputs.machine import submit_host_problem

        problem = submit_host_problem(job)
        if problem:
            raise ConfigError(problem)
    plan = plan_job(job, force=opts.force, script=bool(opts.script))
    data, data_note = plan_data(job, script=bool(opts.script))
    total = total_time_of(job, plan, data)
    slurm = slurm_allocation(job, plan, total) if backend_spec(job.launcher).queued or opts.sbatch else None
    script = None
    if opts.sbatch:  # before anything is written: a problem in slurm: leaves --out untouched
        from launcher.emit.sbatch import sbatch_text
        from launcher.files.rundir import slug

        # Absolute, so the script runs from any directory; slugged, as launch run's default.
        run_dir = (opts.out if opts.out else Path("runs") / slug(job.name)).absolute()
        script = sbatch_text(plan, job, run_dir=run_dir, run_dir_flag="--out" if opts.out else "run dir",
                             resources=slurm)
    written = write_exports(opts.out, plan, job, script=script) if opts.out else []
    return PlanResult(plan=plan, data=data, data_note=data_note, total=total, slurm=slurm, sbatch=script,
                      written=written, warning=None if opts.script else lora_base_warning(job))


def plan_data(job: Job, *, script: bool) -> tuple[DataSummary | None, str]:
    """(the data's summary, "") as `launch run` would check it (bad data is refused here too), or (None, why it
    was not read): a --script reads its own data, and data not on this machine is planned without."""
    if script:
        return None, "--script: your script reads its own data"
    from launcher.session.checks import check_data
    from launcher.worker.sources import DataNotFound

    try:
        return check_data(job), ""
    except DataNotFound as e:
        return None, f"not on this machine: {e.problems[0]}"


def export_files(out: Path, plan: Plan, job: Job, *, script: str | None = None) -> dict[str, str]:
    """`plan --out`: the run dir's files plus what other tools take as they are: the resolved job.yaml, the
    DeepSpeed config checked by DeepSpeed's own parser, its HF Trainer variant, an accelerate config, and the
    sbatch ``script`` when given. All built and checked here, before anything is written (ConfigError: exit 2)."""
    import yaml

    from launcher.config.jobfile import job_to_data
    from launcher.engines import engine_spec

    spec = engine_spec(plan.strategy.engine)
    extra = spec.export_files(plan, job)  # checked (DeepSpeed's parser) before the rest is built
    files = plan_files(plan, job)
    files["job.yaml"] = yaml.safe_dump(job_to_data(job), sort_keys=False)
    files.update(extra)
    files["accelerate.yaml"] = spec.accelerate_yaml(plan, job, config_dir=out)
    if script is not None:
        files["job.sbatch"] = script
    return files


def write_exports(out: Path, plan: Plan, job: Job, *, script: str | None = None) -> list[Path]:
    """The export set written into ``out`` as one (launcher.session.outdir), or nothing."""
    from launcher.session.outdir import check_out_dir, write_out_dir

    check_out_dir(out)  # a path that cannot be the dir is named before the plan's files are built
    return write_out_dir(out, export_files(out, plan, job, script=script))
