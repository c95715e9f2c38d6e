"""Slurm through submitit: submit a planned run (one task per node, each running the torchrun agent), follow it.

    launch --gpus 4 --budget 16GB job.yaml --slurm [--wait]      (or launcher: slurm in the job)

The plan is made before anything is submitted (launcher.session.run), so a job that cannot fit never waits in
the queue.
What runs on the nodes is launcher.backends.slurm_task.SlurmTask; sweeps go through launcher.backends.slurm_array.
"""

from __future__ import annotations

import os
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path

from launcher.backends.base import Backend, LaunchSpec
from launcher.backends.slurm_state import SLURM_JSON, SlurmRecord, is_active, submitit_results
from launcher.backends.slurm_task import SlurmTask, outcome_from_results
from launcher.config.job import Job
from launcher.emit.slurm_params import SlurmResources, executor_parameters, slurm_resources
from launcher.errors import ConfigError
from launcher.files.rundir import RunDir
from launcher.planner.plan import Plan
from launcher.processes.rankenv import safe_python
from launcher.records.runreport import RunOutcome

Report = Callable[[RunDir, Plan, RunOutcome], int]
"""report.json, memory.png and the exit code from a run dir, its plan and how the ranks ended."""
POLL_S = 1.0
SACCT_REFRESH_S = 2.0
# submitit's results land before slurmdbd records the job's end; this long at most we wait for the record too.
SETTLE_S = 60.0


def make_executor(folder: Path, params: dict, *, max_requeues: int):
    """submitit's SlurmExecutor with our parameters; its own checks turned into exit-2 errors."""
    from submitit import SlurmExecutor

    try:
        # submitit's timeout requeue budget (max_num_timeout) is set to ours, so both count the same way;
        # submitit never limits preemption requeues, SlurmTask.checkpoint does.
        # submitit's `python -u -m submitit.core._submit` would import the launcher from the task's working dir.
        ex = SlurmExecutor(folder=folder, max_num_timeout=max_requeues, python=shlex.join(safe_python()))
    except RuntimeError as e:
        raise ConfigError(f"launcher: 'slurm' needs Slurm's srun on PATH here ({e}); submit from a login node, "
                          "or use launcher: local") from None
    try:
        ex.update_parameters(**params)
    except ValueError as e:
        raise ConfigError(f"slurm: submitit refused the parameters: {str(e).splitlines()[0]}; fix slurm: "
                          "in the job") from None
    return ex


def task_for(run: RunDir, job: Job, plan: Plan, spec: LaunchSpec, report: Report | None = None, *,
             resources: SlurmResources | None = None) -> SlurmTask:
    """What the nodes run: the session's launch spec (rank environment, script) plus the job's Slurm settings;
    ``resources``: the allocation the job asks for (default: what the plan alone derives)."""
    env = dict(spec.env)
    if "OMP_NUM_THREADS" not in os.environ:  # the ranks share the task's CPUs (CPU Adam's threads among them)
        env["OMP_NUM_THREADS"] = str((resources or slurm_resources(job, plan)).threads_per_rank)
    return SlurmTask(run_dir=str(run.path), nodes=plan.nodes, gpus_per_node=plan.gpus_per_node, env=env,
                     script=spec.script, script_args=list(spec.script_args), hang_timeout_s=spec.hang_timeout_s,
                     signal_delay_s=job.slurm.signal_delay_s, max_requeues=job.slurm.max_requeues, report=report)


def slurm_record(job: Job, plan: Plan, *, kind: str, folder: Path, job_ids: list[str],
                 resources: SlurmResources | None = None, **extra) -> SlurmRecord:
    """The slurm.json record of a submission: job ids, submitit folder, nodes and time limit from the plan and job
    (``resources``: the allocation submitted, default what the plan alone derives)."""
    return SlurmRecord(kind=kind, job_id=job_ids[0].split("_")[0] if job_ids else None, job_ids=job_ids,
                       submitit_folder=str(folder), submitted_at=time.time(), nodes=plan.nodes,
                       gpus_per_node=plan.gpus_per_node,
                       timeout_min=(resources or slurm_resources(job, plan)).time_min,
                       signal_delay_s=job.slurm.signal_delay_s, max_requeues=job.slurm.max_requeues, **extra)


class SlurmBackend(Backend):
    """Backend.run for Slurm: submit one job; with ``follow`` (--wait) block until it ends, else return at once
    with a pending RunOutcome. ``report`` runs on node 0 when the ranks end (the session's finish), so a job that
    nobody follows still writes report.json and its verdict."""

    name = "slurm"

    def __init__(self, job: Job, plan: Plan, *, follow: bool = True, report: Report | None = None,
                 resources: SlurmResources | None = None):
        self.job, self.plan, self.follow, self.report = job, plan, follow, report
        self.resources = resources or slurm_resources(job, plan)
        """The allocation the job asks for (the session's, from what it found on disk: launcher.session.prepare)."""

    @classmethod
    def create(cls, job: Job, plan: Plan, *, follow: bool, report: Report | None,
               resources: SlurmResources | None) -> SlurmBackend:
        """The Slurm backend for ``plan``, every slurm: problem refused now (ConfigError), before a run dir exists."""
        executor_parameters(job, plan, resources=resources)
        return cls(job, plan, follow=follow, report=report, resources=resources)

    def time_limit_min(self) -> int | None:
        """The job's --time, minutes (the allocation derived at submit time)."""
        return self.resources.time_min

    def submit(self, run: RunDir, task: SlurmTask):
        """Submit ``task`` through submitit, write slurm.json and mark the run submitted; returns the submitit job."""
        params = executor_parameters(self.job, self.plan, resources=self.resources)
        ex = make_executor(run.path / "submitit", params, max_requeues=self.job.slurm.max_requeues)
        sjob = ex.submit(task)
        run.write_json(SLURM_JSON, slurm_record(self.job, self.plan, kind="job", folder=ex.folder,
                                                job_ids=[sjob.job_id], resources=self.resources).to_json())
        run.set_state("submitted", slurm_job_id=sjob.job_id)
        return sjob

    def run(self, run: RunDir, spec: LaunchSpec) -> RunOutcome:
        """Submit the job; with follow, wait for it to end and return its outcome, else return at once (pending)."""
        sjob = self.submit(run, task_for(run, self.job, self.plan, spec, self.report, resources=self.resources))
        self.started(sjob.job_id)
        if not self.follow:
            return RunOutcome(ok=True, pending=True, message=f"submitted slurm job {sjob.job_id}")
        try:
            wait_jobs([sjob], print_state)
        except KeyboardInterrupt:
            return RunOutcome(ok=False, pending=True, interrupted=True,
                           message=f"stopped following; slurm job {sjob.job_id} keeps running "
                                   f"(launch cancel {run.path} stops it)")
        run.redact_submitit_logs()  # the job has ended: nothing writes them now, submitit's last lines included
        return job_outcome(sjob)


def wait_jobs(jobs: list, on_state=None, *, timeout_s: float | None = None) -> None:
    """Poll until every job is done: result pickles first, sacct (one call for all jobs) every 2 s."""
    from submitit.slurm.slurm import SlurmJob

    last: dict[str, str] = {}
    last_refresh = 0.0
    settle_until = 0.0
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
            # Every result is written; return once Slurm's accounting says the jobs ended too, so a
            # `launch status` right after --wait agrees with the verdict (bounded: accounting may lag or be off).
            settle_until = settle_until or time.monotonic() + SETTLE_S
            if not any(is_active(last[j.job_id]) for j in jobs) or time.monotonic() > settle_until:
                return
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"slurm jobs {[j.job_id for j in pending]} still running after {timeout_s} s")
        time.sleep(POLL_S)


def job_outcome(sjob) -> RunOutcome:
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
        return RunOutcome(ok=False, message=f"slurm job {sjob.job_id} task {errors[0]} failed: {last} "
                                         f"(traceback: {task_paths(sjob, errors[0]).stderr})")
    interrupted = state.startswith(("CANCELLED", "PREEMPTED", "TIMEOUT", "NODE_FAIL"))
    return RunOutcome(ok=False, interrupted=interrupted,
                   message=f"slurm job {sjob.job_id} ended {state or 'in an unknown state'} without a result "
                           f"(submitit log: {task_paths(sjob, 0).stderr})")


def task_paths(sjob, task: int):
    """submitit's file paths (result pickle, logs) of one task of a submitted job."""
    from submitit.core.utils import JobPaths

    return JobPaths(sjob.paths.folder, job_id=sjob.job_id, task_id=task)


def print_state(sjob, state: str) -> None:
    """Print a job's Slurm state with the time to stderr while following it (not UNKNOWN: sacct has not seen it yet)."""
    if state and state != "UNKNOWN":  # UNKNOWN: sacct has not seen the job yet
        print(f"[{time.strftime('%H:%M:%S')}] slurm job {sjob.job_id}: {state}", file=sys.stderr, flush=True)
