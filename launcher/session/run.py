"""A run from start to verdict: plan, check, write the run dir, start the ranks through a backend, report.

The CLI builds the Job and the RunOptions and calls run_job; every backend (launcher.backends.base.Backend) is
driven the same way: run(run_dir, spec) -> RunOutcome, then finish() turns the rank files into the verdict.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from launcher.backends import backend_spec
from launcher.backends.base import Backend
from launcher.config.job import Job
from launcher.errors import EXIT_INTERRUPTED, EXIT_OK, EXIT_TRAINING_FAILED, ConfigError, NoPlanError
from launcher.files.fsutil import private_dir
from launcher.files.rundir import RunDir
from launcher.planner.plan import Plan
from launcher.records.datasummary import DataSummary
from launcher.records.runreport import RunOutcome
from launcher.session.checks import check_data, check_launch, check_runnable, cluster_hints, lora_base_warning
from launcher.session.finish import finish
from launcher.session.options import RunOptions
from launcher.session.prepare import (
    announce,
    launch_spec,
    mark_running,
    prepare_run_dir,
    resume_plan,
    say_total_time,
    slurm_allocation,
    total_time_of,
)


def run_job(job: Job, opts: RunOptions) -> int:
    """`launch run`: the exit code is the verdict (launcher.errors)."""
    queued = backend_spec(job.launcher).queued
    if queued and opts.run_dir is not None:
        from launcher.config.slurm_rules import check_shell_path

        # submitit's script names the run dir in #SBATCH lines: one line of text, like every value there.
        bad_dir = check_shell_path(opts.run_dir, "--run-dir")
        if bad_dir:
            raise ConfigError(bad_dir)
    if job.sweep is not None:  # each variant is planned for itself, so the base job is not planned here
        from launcher.session.sweep import run_sweep

        return run_sweep(job, opts)
    job, plan, data = plan_run(job, opts)
    backend = make_backend(job, plan, opts, data)
    if queued:
        say_total_time(job, plan, data)
        return run_attempt(opts, job, plan, prepare_run_dir(opts, job, plan, data), backend)[0]
    if opts.node_rank > 0:
        if not opts.run_dir:
            raise ConfigError("--node-rank: nodes after the first need the shared --run-dir of node 0")
        run_dir = RunDir(private_dir(opts.run_dir).resolve())
    else:
        run_dir = prepare_run_dir(opts, job, plan, data)
        announce(plan, run_dir)
        say_total_time(job, plan, data)
        mark_running(run_dir)
    if job.auto_fallback:
        from launcher.session.ladder import run_ladder

        return run_ladder(job, plan, run_dir, lambda j, p: run_attempt(opts, j, p, run_dir, backend))
    return run_attempt(opts, job, plan, run_dir, backend)[0]


def plan_run(job: Job, opts: RunOptions) -> tuple[Job, Plan, DataSummary | None]:
    """The plan and the data's summary (None for a --script run, which reads its own data), or the one error that
    says why there is none; a resume keeps the run dir's strategy."""
    from launcher.inputs.plan_inputs import plan_job

    check_launch(job, opts)
    try:
        plan = plan_job(job, force=opts.force, script=bool(opts.script))
    except NoPlanError as e:
        raise e.with_hints(cluster_hints(job, e.short_of)) from None
    if opts.resume:
        job, plan = resume_plan(opts, job, plan)
    data = None if opts.script else check_data(job)
    check_runnable(job, plan, opts)
    lora = None if opts.script else lora_base_warning(job)
    if lora:
        print(f"launch: warning: {lora}", file=sys.stderr)
    if plan.status == "forced":
        print(f"launch: warning: running a plan predicted over budget because of --force: {plan.reasons[0]}",
              file=sys.stderr)
    return job, plan, data


def make_backend(job: Job, plan: Plan, opts: RunOptions, data: DataSummary | None = None) -> Backend:
    """The backend the job's ``launcher:`` names (launcher.backends.BACKENDS), its settings checked now, before a run
    dir exists; a queued one gets its allocation (its time from the data's counted sequences for a train.epochs
    job)."""
    spec = backend_spec(job.launcher)
    resources = None
    if spec.queued:
        if opts.node_rank or opts.rdzv_endpoint:
            raise ConfigError(f"--node-rank/--rdzv-endpoint: a {spec.name} job finds its head node itself; drop them "
                              f"with launcher: {spec.name}")
        resources = slurm_allocation(job, plan, total_time_of(job, plan, data))
    return spec.load().create(job, plan, follow=opts.wait, report=finish, resources=resources)


def run_attempt(opts: RunOptions, job: Job, plan: Plan, run_dir: RunDir, backend: Backend) -> tuple[int, RunOutcome]:
    """Start the ranks through the backend with the live view on, and judge what they left."""
    from launcher.records.live import LiveView, view_mode

    view = LiveView(run_dir.path, plan.world_size, job.train.max_steps, mode=view_mode(opts.quiet, opts.verbose),
                    budget_bytes=plan.budget_bytes)
    backend.on_start = started(plan, run_dir, opts, view, backend.time_limit_min())
    try:
        outcome = backend.run(run_dir, launch_spec(opts, job, plan, run_dir))
    finally:
        view.stop()
    if outcome.pending:  # submitted and not followed (or no longer followed): the job writes its own report
        if outcome.interrupted:
            print(f"launch: {outcome.message}", file=sys.stderr)
            return EXIT_INTERRUPTED, outcome
        return EXIT_OK, outcome
    if opts.node_rank > 0:
        return (EXIT_OK if outcome.ok else EXIT_TRAINING_FAILED), outcome
    return finish(run_dir, plan, outcome), outcome


def started(plan: Plan, run_dir: RunDir, opts: RunOptions, view, time_min: int | None) -> Callable[[str], None]:
    """What the session says and starts once the backend has the ranks on their way (a Slurm job id, or '');
    ``time_min``: the scheduler's time limit."""

    def on_start(job_id: str) -> None:
        if job_id:
            print(f"plan: {plan.strategy.label()}, predicted peak per rank {plan.estimate.peak_bytes / 1e9:.3f} GB "
                  f"of {plan.budget_bytes / 1e9:.3f} GB")
            print(f"submitted slurm job {job_id} ({plan.nodes} node(s) x {plan.gpus_per_node} rank(s), "
                  f"time limit {time_min} min); run dir {run_dir.path}")
            print(f"  launch status {run_dir.path} | launch logs {run_dir.path} --follow | launch cancel "
                  f"{run_dir.path}")
            sys.stdout.flush()
            if opts.wait:
                view.start()
            return
        view.start()
        preload_plotting()

    return on_start


def preload_plotting() -> None:
    """Import matplotlib while the ranks train: it costs most of a second that would otherwise come after the
    ranks exit, between the last step and the verdict (benchmarks/results/overhead.md)."""
    import threading

    def load() -> None:
        try:
            import matplotlib.backends.backend_agg  # noqa: F401
            import matplotlib.figure  # noqa: F401
        except Exception:  # plotting is optional; plot_memory reports its own failure
            pass

    threading.Thread(target=load, name="preload-matplotlib", daemon=True).start()
