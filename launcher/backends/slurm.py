"""Slurm through submitit: submit a planned run (one task per node, each running the torchrun agent), follow it.

    launch --gpus 4 --budget 16GB job.yaml --slurm [--wait]      (or launcher: slurm in the job)

The plan is made before anything is submitted (cli/run.py), so a job that cannot fit never waits in the queue.
What runs on the nodes is launcher.backends.slurm_task.SlurmTask; sweeps go through launcher.backends.slurm_array.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from launcher.backends.base import Backend, LaunchSpec, Outcome
from launcher.backends.slurm_params import executor_parameters
from launcher.backends.slurm_state import SLURM_JSON, submitit_results
from launcher.backends.slurm_task import SlurmTask, outcome_from_results
from launcher.config.job import Job
from launcher.errors import ConfigError
from launcher.planner.plan import Plan
from launcher.rundir import RunDir

POLL_S = 1.0
SACCT_REFRESH_S = 2.0


def make_executor(folder: Path, params: dict, *, max_requeues: int):
    """submitit's SlurmExecutor with our parameters; its own checks turned into exit-2 errors."""
    from submitit import SlurmExecutor

    try:
        # submitit's timeout requeue budget (max_num_timeout) is set to ours, so both count the same way;
        # submitit never limits preemption requeues, SlurmTask.checkpoint does.
        ex = SlurmExecutor(folder=folder, max_num_timeout=max_requeues)
    except RuntimeError as e:
        raise ConfigError(f"launcher: 'slurm' needs Slurm's srun on PATH here ({e}); submit from a login node, "
                          "or use launcher: local") from None
    try:
        ex.update_parameters(**params)
    except ValueError as e:
        raise ConfigError(f"slurm: submitit refused the parameters: {str(e).splitlines()[0]}; fix slurm: "
                          "in the job") from None
    return ex


def task_for(run: RunDir, job: Job, plan: Plan, args: argparse.Namespace | None = None) -> SlurmTask:
    from launcher.cli.run import rank_env

    enforce = bool(getattr(args, "enforce", False))
    snapshot = bool(getattr(args, "memory_snapshot", False))
    script = getattr(args, "script", None)
    return SlurmTask(run_dir=str(run.path), nodes=plan.nodes, gpus_per_node=plan.gpus_per_node,
                     env=rank_env(run, plan, job, enforce, snapshot), script=str(Path(script).resolve()) if script else None,
                     script_args=list(getattr(args, "script_args", []) or []),
                     hang_timeout_s=float(getattr(args, "hang_timeout", 0.0) or 0.0),
                     signal_delay_s=job.slurm.signal_delay_s, max_requeues=job.slurm.max_requeues)


def slurm_record(job: Job, plan: Plan, *, kind: str, folder: Path, job_ids: list[str], **extra) -> dict:
    return {"kind": kind, "job_id": job_ids[0].split("_")[0] if job_ids else None, "job_ids": job_ids,
            "submitit_folder": str(folder), "submitted_at": time.time(), "nodes": plan.nodes,
            "gpus_per_node": plan.gpus_per_node, "timeout_min": job.slurm.timeout_min,
            "signal_delay_s": job.slurm.signal_delay_s, "max_requeues": job.slurm.max_requeues, **extra}


class SlurmBackend(Backend):
    """Backend.run for Slurm: submit one job and block until it ends (what --wait does)."""

    name = "slurm"

    def __init__(self, job: Job, plan: Plan):
        self.job, self.plan = job, plan

    def submit(self, run: RunDir, task: SlurmTask):
        params = executor_parameters(self.job, self.plan)
        ex = make_executor(run.path / "submitit", params, max_requeues=self.job.slurm.max_requeues)
        sjob = ex.submit(task)
        run.write_json(SLURM_JSON, slurm_record(self.job, self.plan, kind="job", folder=ex.folder,
                                                job_ids=[sjob.job_id]))
        run.set_state("submitted", slurm_job_id=sjob.job_id)
        return sjob

    def run(self, run: RunDir, spec: LaunchSpec) -> Outcome:
        task = task_for(run, self.job, self.plan)
        task.script, task.script_args, task.env = spec.script, list(spec.script_args), {**task.env, **spec.env}
        sjob = self.submit(run, task)
        wait_jobs([sjob])
        run.redact_submitit_logs()
        return job_outcome(sjob)


def wait_jobs(jobs: list, on_state=None, *, timeout_s: float | None = None) -> None:
    """Poll until every job is done: result pickles first, sacct (one call for all jobs) every 2 s."""
    from submitit.slurm.slurm import SlurmJob

    last: dict[str, str] = {}
    last_refresh = 0.0
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        if time.monotonic() - last_refresh >= SACCT_REFRESH_S:
            SlurmJob.watcher.update_if_long_enough(mode="force")
            last_refresh = time.monotonic()
        pending = []
        for j in jobs:
            state = j.watcher.get_state(j.job_id, mode="cache")
            if on_state is not None and state != last.get(j.job_id):
                on_state(j, state)
            last[j.job_id] = state
            if not j.done():
                pending.append(j)
        if not pending:
            return
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"slurm jobs {[j.job_id for j in pending]} still running after {timeout_s} s")
        time.sleep(POLL_S)


def job_outcome(sjob) -> Outcome:
    """The nodes' results when every task wrote one; otherwise what Slurm and submitit say happened."""
    from submitit.core.utils import pickle_load

    tasks = max(1, sjob.num_tasks)
    kinds = submitit_results(sjob.paths.folder, sjob.job_id, tasks)
    state = sjob.watcher.get_state(sjob.job_id, mode="force")
    if all(k == "success" for k in kinds):
        results = [pickle_load(task_paths(sjob, t).result_pickle)[1] for t in range(tasks)]
        return outcome_from_results(sorted(results, key=lambda r: r.get("node_rank", 0)))
    errors = [t for t, k in enumerate(kinds) if k == "error"]
    if errors:
        trace = str(pickle_load(task_paths(sjob, errors[0]).result_pickle)[1]).strip().splitlines()
        last = trace[-1] if trace else "no traceback"
        return Outcome(ok=False, message=f"slurm job {sjob.job_id} task {errors[0]} failed: {last} "
                                         f"(traceback: {task_paths(sjob, errors[0]).stderr})")
    interrupted = state.startswith(("CANCELLED", "PREEMPTED", "TIMEOUT", "NODE_FAIL"))
    return Outcome(ok=False, interrupted=interrupted,
                   message=f"slurm job {sjob.job_id} ended {state or 'in an unknown state'} without a result "
                           f"(submitit log: {task_paths(sjob, 0).stderr})")


def task_paths(sjob, task: int):
    from submitit.core.utils import JobPaths

    return JobPaths(sjob.paths.folder, job_id=sjob.job_id, task_id=task)


def print_state(sjob, state: str) -> None:
    if state and state != "UNKNOWN":  # UNKNOWN: sacct has not seen the job yet
        print(f"[{time.strftime('%H:%M:%S')}] slurm job {sjob.job_id}: {state}", file=sys.stderr, flush=True)


def submit_from_cli(args: argparse.Namespace, job: Job, plan: Plan) -> int:
    """`launch ... --slurm`: check, write the run dir, submit, print the job id; with --wait follow to the report."""
    from launcher.cli.run import finish, prepare_run_dir, total_steps

    if args.node_rank or args.rdzv_endpoint:
        raise ConfigError("--node-rank/--rdzv-endpoint: a Slurm job finds its head node itself; drop them with --slurm")
    backend = SlurmBackend(job, plan)
    executor_parameters(job, plan)  # every slurm: problem before a run dir exists
    run = prepare_run_dir(args, job, plan)
    sjob = backend.submit(run, task_for(run, job, plan, args))
    print(f"plan: {plan.strategy.label()}, predicted peak per rank {plan.estimate.peak_bytes / 1e9:.3f} GB of "
          f"{plan.budget_bytes / 1e9:.3f} GB")
    print(f"submitted slurm job {sjob.job_id} ({plan.nodes} node(s) x {plan.gpus_per_node} rank(s), "
          f"time limit {job.slurm.timeout_min} min); run dir {run.path}")
    print(f"  launch status {run.path} | launch logs {run.path} --follow | launch cancel {run.path}")
    sys.stdout.flush()
    if not args.wait:
        return 0
    from launcher.live import LiveView, view_mode

    view = LiveView(run.path, plan.world_size, total_steps(job), mode=view_mode(args.quiet, args.verbose))
    view.start()
    try:
        wait_jobs([sjob], print_state)
    except KeyboardInterrupt:
        print(f"launch: stopped following; slurm job {sjob.job_id} keeps running (launch cancel {run.path} "
              "stops it)", file=sys.stderr)
        return 130
    finally:
        view.stop()
    run.redact_submitit_logs()  # the job has ended: nothing writes them now, submitit's last lines included
    return finish(run, plan, job_outcome(sjob))
