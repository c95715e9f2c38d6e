"""Before the ranks start: the plan a resume keeps, the run dir and its files, the ranks' environment."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

from launcher.backends.base import LaunchSpec
from launcher.backends.slurm_state import live_state
from launcher.config.job import Job
from launcher.config.jobfile import job_to_data
from launcher.emit.slurm_alloc import RunFacts, SlurmResources, plan_facts, slurm_resources
from launcher.engines import engine_spec
from launcher.errors import ConfigError
from launcher.files.fsutil import atomic_write
from launcher.files.rundir import RunDir, default_run_dir, latest_checkpoint_tag
from launcher.model.offline import OFFLINE_ENV
from launcher.planner.duration import TotalTime
from launcher.planner.fallback import pins_for
from launcher.planner.plan import Plan, read_plan
from launcher.processes.procs import ProcessRef
from launcher.processes.rankenv import (
    ENFORCE_ENV,
    EXPANDABLE_SEGMENTS,
    EXTENSIONS_ENV,
    GRAD_ACCUM_ENV,
    GRAD_CKPT_ENV,
    MICRO_BATCH_ENV,
    PLAN_DIGEST_ENV,
    PLAN_ENV,
    RUN_DIR_ENV,
    SNAPSHOT_ENV,
    extensions_dir,
    plan_digest,
)
from launcher.records.datasummary import DATA_JSON, DataSummary
from launcher.session.options import RunOptions


def resume_plan(opts: RunOptions, job: Job, plan: Plan) -> tuple[Job, Plan]:
    """--resume keeps the strategy recorded in the run dir (the rung a fallback ladder ended on): its checkpoint
    is in that engine's layout, and a re-plan could pick another."""
    recorded = (opts.run_dir or Path()) / "plan.json"
    if not opts.run_dir or not recorded.is_file():
        return job, plan
    try:
        old = read_plan(recorded.parent)
    except (OSError, ValueError):  # a newer launcher's plan.json (ConfigError) is refused, as before
        return job, plan
    if old.strategy == plan.strategy:
        return job, plan
    job = dataclasses.replace(job, strategy=pins_for(old.strategy, job.strategy.safety_margin))
    print(f"launch: --resume keeps the run dir's strategy {old.strategy.label()} (its checkpoint is in that layout)",
          file=sys.stderr)
    from launcher.inputs.plan_inputs import plan_job

    return job, plan_job(job, force=True, script=plan.script)


def rank_env(run: RunDir, plan: Plan, job: Job, enforce: bool, snapshot: bool = False) -> dict[str, str]:
    """The environment every rank gets: the run dir, plan.json and its digest, the engine's config files, the budget
    cap (enforce) and snapshot switches, and offline, thread and compile-cache settings."""
    env = {
        RUN_DIR_ENV: str(run.path),
        PLAN_ENV: str(run.path / "plan.json"),
        # The ranks refuse a plan.json other than the one written for this attempt (launcher.processes.rankenv).
        PLAN_DIGEST_ENV: plan_digest(plan_text(plan)),
        **OFFLINE_ENV,
        "TOKENIZERS_PARALLELISM": "false",
    }
    for var, name in engine_spec(plan.strategy.engine).config_env:
        env[var] = str(run.path / name)
    if enforce:
        env[ENFORCE_ENV] = str(plan.budget_bytes)
    if snapshot:
        env[SNAPSHOT_ENV] = "1"
    # A rank aborted by the hang watchdog (SIGABRT) writes its Python stack into its log on the way out.
    env["PYTHONFAULTHANDLER"] = "1"
    # CUDA ranks grow their allocator segments in place instead of caching whole blocks (a user's own setting wins):
    # launcher.processes.rankenv.EXPANDABLE_SEGMENTS says why. Scripts' ranks get it too; CPU ranks ignore it.
    env["PYTORCH_CUDA_ALLOC_CONF"] = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", EXPANDABLE_SEGMENTS)
    # torchrun's own default for several ranks per node, set here so it does not warn about it.
    env["OMP_NUM_THREADS"] = os.environ.get("OMP_NUM_THREADS", "1")
    # DeepSpeed compiles its ops once per machine into this cache instead of at every start.
    env[EXTENSIONS_ENV] = extensions_dir()
    return env


def script_env(run: RunDir, plan: Plan, job: Job) -> dict[str, str]:
    """What a --script rank reads the plan from, with no launcher import: accelerate's own variables (which HF
    Trainer reads through accelerate too, and the rank's seam, launcher.runtime.script_args, applies where the
    libraries build their arguments) and the three the libraries have no name for."""
    s = plan.strategy
    return {
        **engine_spec(s.engine).script_env(plan, job, config_dir=run.path),
        MICRO_BATCH_ENV: str(s.micro_batch_size),
        GRAD_ACCUM_ENV: str(s.grad_accum_steps),
        GRAD_CKPT_ENV: "1" if s.activation_checkpointing else "0",
    }


def plan_text(plan: Plan) -> str:
    """plan.json's text, byte for byte: its sha256 is what the ranks check (PLAN_DIGEST_ENV)."""
    return json.dumps(plan.to_json(), indent=2) + "\n"


def plan_files(plan: Plan, job: Job) -> dict[str, str]:
    """plan.json plus the engine's config, by file name."""
    return {"plan.json": plan_text(plan), **engine_spec(plan.strategy.engine).config_files(plan, job)}


def write_plan_outputs(out: Path, plan: Plan, job: Job) -> list[Path]:
    """plan.json plus the engine's config, each written atomically; the other engine's config, left by an
    earlier plan in this dir, is removed so the dir never holds both."""
    from launcher.files.rundir import ENGINE_FILES

    out.mkdir(parents=True, exist_ok=True)
    files = plan_files(plan, job)
    written = [atomic_write(out / name, text) for name, text in files.items()]
    for name in ENGINE_FILES:
        if name not in files:
            (out / name).unlink(missing_ok=True)
    return written


def prepare_run_dir(opts: RunOptions, job: Job, plan: Plan, data: DataSummary | None = None) -> RunDir:
    """Create (or reopen) the run dir and write job.yaml, plan.json, the engine's configs and the data's summary
    (data.json, for report.json) into it; with --resume it must already hold a checkpoint."""
    path = opts.run_dir or default_run_dir(job.name)
    if opts.resume and not latest_checkpoint_tag(Path(path) / "checkpoint"):  # before anything is created
        raise ConfigError(f"--resume: {str(path)!r} has no checkpoint to resume from; run without --resume")
    run = None
    try:
        run = RunDir.create(path, overwrite=opts.overwrite, resume=opts.resume, job_state=live_state)
        run.write_yaml("job.yaml", job_to_data(job))
        write_plan_outputs(run.path, plan, job)
        if data is not None:
            run.write_json(DATA_JSON, data.to_json())
    except OSError as e:  # a full disk or a read-only mount: one line, no traceback, nothing started
        if run is not None:
            run.unlock()
        raise unwritable(path, e) from None
    return run


def unwritable(path: Path, e: OSError) -> ConfigError:
    """The one line for a run dir the launcher cannot write (a full disk, a read-only mount), before any rank runs."""
    return ConfigError(f"--run-dir: {str(path)!r} cannot be written ({e.strerror or e}); free space there, or "
                       "choose another --run-dir")


def mark_running(run: RunDir, **fields) -> None:
    """state.json: running, owned by this launch (its pid and start time, what liveness is decided by), no rank
    started yet (the backend records them once torchrun has)."""
    try:
        run.set_state("running", launch=ProcessRef.of(os.getpid()), ranks=[], **fields)
    except OSError as e:
        raise unwritable(run.path, e) from None


def total_time_of(job: Job, plan: Plan, data: DataSummary | None = None):
    """The plan's predicted training time (launcher.planner.duration.TotalTime); a train.epochs job counts its
    training sequences from the data's summary (or the data), so a plan made without the data says it cannot
    know."""
    from launcher.planner.duration import total_time
    from launcher.session.checks import count_train_examples

    examples, why = None, ""
    if job.train.max_steps is None and job.train.epochs is not None:
        examples, why = count_train_examples(job, data)
    s = plan.strategy
    return total_time(step_time_s=plan.estimate.step_time_s, max_steps=job.train.max_steps, epochs=job.train.epochs,
                      train_examples=examples, unknown_why=why, world_size=plan.world_size,
                      samples_per_step=s.micro_batch_size * s.grad_accum_steps,
                      warn_after_h=job.train.warn_total_time_h)


def weight_bytes(job: Job) -> tuple[int | None, bool]:
    """(bytes of the weight files the first rank reads, measured); (0, True) for a model without weight files
    (random init), (None, False) when the model dir cannot be found here."""
    from launcher.config.job import InlineArch
    from launcher.model.build import resolve_model_dir

    if isinstance(job.model, InlineArch):
        return 0, True
    try:
        d = resolve_model_dir(job.model, job.base_dir)
    except ConfigError:
        return None, False
    if d is None:
        return 0, True  # a bundled config: random weights
    files = list(d.glob("*.safetensors")) or list(d.glob("*.bin"))  # from_pretrained prefers safetensors
    return sum(f.stat().st_size for f in files), True


def run_facts(job: Job, plan: Plan, total: TotalTime | None = None) -> RunFacts:
    """What a Slurm job's allocation rests on, found here (launcher.emit.slurm_alloc.RunFacts): the run's steps
    (``total``, else total_time_of: a train.epochs job counts its data), the weight files' size and the DeepSpeed
    ops the plan loads that this machine's extensions cache lacks."""
    from launcher.processes.ops import missing

    total = total or total_time_of(job, plan)
    facts = plan_facts(job, plan)
    size, measured = weight_bytes(job)
    return dataclasses.replace(facts, train_steps=total.total_steps, steps_basis=total.basis,
                               weight_bytes=facts.weight_bytes if size is None else size, weights_measured=measured,
                               ops_to_build=tuple(missing(facts.ops_to_build)))


def slurm_allocation(job: Job, plan: Plan, total: TotalTime | None = None) -> SlurmResources:
    """The Slurm allocation of ``plan`` from the facts found here (run_facts): what `launch --slurm`, `launch plan`
    and its sbatch script ask for."""
    return slurm_resources(job, plan, run_facts(job, plan, total))


def say_total_time(job: Job, plan: Plan, data: DataSummary | None = None) -> None:
    """launch run: the predicted training time under the plan line, and the warning past the threshold."""
    total = total_time_of(job, plan, data)
    print(f"predicted training time: {total.describe()}", flush=True)
    if total.warning():
        print(f"launch: warning: {total.warning()}", file=sys.stderr, flush=True)


def announce(plan: Plan, run_dir: RunDir, attempt: int | None = None) -> None:
    """Print the plan's one-line summary (strategy, predicted peak of the budget in GB, run dir), with the ladder's
    attempt number."""
    head = f"attempt {attempt}: " if attempt else ""
    print(f"{head}plan: {plan.strategy.label()}, predicted peak per rank "
          f"{plan.estimate.peak_bytes / 1e9:.3f} GB of {plan.budget_bytes / 1e9:.3f} GB; run dir {run_dir.path}",
          flush=True)


def launch_spec(opts: RunOptions, job: Job, plan: Plan, run_dir: RunDir) -> LaunchSpec:
    """What the backend starts on this node: ranks, rendezvous, the user's script, the rank environment, the hang
    timeout and the interrupt grace."""
    return LaunchSpec(gpus_per_node=plan.gpus_per_node, nodes=plan.nodes, node_rank=opts.node_rank,
                      rdzv_endpoint=opts.rdzv_endpoint,
                      script=str(Path(opts.script).resolve()) if opts.script else None,
                      script_args=list(opts.script_args),
                      env={**rank_env(run_dir, plan, job, opts.enforce, opts.memory_snapshot),
                           **(script_env(run_dir, plan, job) if opts.script else {})},
                      hang_timeout_s=opts.hang_timeout_s, checkpoint_on_interrupt_s=interrupt_grace_s(opts, job))


def interrupt_grace_s(opts: RunOptions, job: Job) -> float:
    """Seconds a signal waits for the ranks' checkpoint: the flag or the job's checkpoint_on_interrupt asks for it."""
    return float(opts.checkpoint_timeout_s) if (opts.checkpoint_on_interrupt or job.checkpoint_on_interrupt) else 0.0
