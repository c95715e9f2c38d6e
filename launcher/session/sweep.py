"""A job with a ``sweep:`` section: plan every variant at submit time, submit the plannable ones as one array.

    RUN/job.yaml  sweep.json  slurm.json  submitit/     the array (slurm.json kind 'array')
    RUN/variants/<k>-<name>/                            one full run dir per variant (slurm.json kind 'array-task')

Variants that cannot be planned are listed with their reason at submit time and in slurm.json ('unplanned');
the others are still submitted. Exit code: launcher.backends.slurm_array.array_exit_code.
"""

from __future__ import annotations

import contextlib
import io
import sys
import time
from collections.abc import Callable

from launcher.backends import backend_spec
from launcher.backends.slurm import job_outcome, print_state, slurm_record, task_for, wait_jobs
from launcher.backends.slurm_array import array_exit_code, submit_array, summary_table, variant_dir
from launcher.backends.slurm_state import SLURM_JSON, SweepRow, UnplannedVariant, live_state
from launcher.config.job import Job
from launcher.config.jobfile import job_from_data, job_to_data
from launcher.emit.slurm_params import combined, executor_parameters
from launcher.errors import EXIT_BAD_INPUT, EXIT_OK, ConfigError, LauncherError
from launcher.files.rundir import RunDir, default_run_dir
from launcher.inputs.variants import Variant, expand
from launcher.planner.plan import Plan
from launcher.session.checks import check_runnable
from launcher.session.finish import finish
from launcher.session.options import RunOptions, own_lines
from launcher.session.prepare import launch_spec, slurm_allocation, write_plan_outputs
from launcher.units import format_bytes


def plan_variants(job: Job, variants: list[Variant], *, force: bool = False,
                  error_lines: Callable[[Exception], list[str]] = own_lines):
    """(planned [(variant, job, plan)], unplanned [(variant, reason)]); each variant planned for itself, a reason
    worded by ``error_lines`` (RunOptions.error_lines)."""
    from launcher.inputs.plan_inputs import plan_job, request_problems

    base = job_to_data(job)
    base.pop("sweep", None)
    planned, unplanned = [], []
    for v in variants:
        try:
            vjob = job_from_data(base, job.base_dir, v.overrides, checks=request_problems)
            plan = plan_job(vjob, force=force)
            check_runnable(vjob, plan)
            executor_parameters(vjob, plan, resources=slurm_allocation(vjob, plan))
            planned.append((v, vjob, plan))
        except LauncherError as e:
            unplanned.append((v, " / ".join(error_lines(e))))
    return planned, unplanned


def run_sweep(job: Job, opts: RunOptions) -> int:
    """Plan every variant of the job's sweep and submit the plannable ones as one Slurm array under one root run dir;
    returns the exit code (with --wait, the variants' combined code)."""
    if not backend_spec(job.launcher).arrays:
        raise ConfigError("sweep: a sweep runs as a Slurm array; add --slurm (or launcher: slurm), or remove sweep: "
                          "to run one job")
    if opts.script or opts.node_rank or opts.rdzv_endpoint:
        raise ConfigError("sweep: --script, --node-rank and --rdzv-endpoint do not apply to an array; drop them")
    variants = expand({"grid": job.sweep.grid, "list": job.sweep.list})
    planned, unplanned = plan_variants(job, variants, force=opts.force, error_lines=opts.error_lines)
    for v, reason in unplanned:
        print(f"launch: variant {v.index} ({v.name}) not submitted: {reason}", file=sys.stderr)
    if not planned:
        raise ConfigError([f"sweep: variant {v.index} ({v.name}): {reason}" for v, reason in unplanned])
    # One allocation for the array: the largest time, memory and CPUs any variant's plan derives.
    resources = combined([slurm_allocation(vj, p) for _, vj, p in planned])
    params = [executor_parameters(vj, p, resources=resources) for _, vj, p in planned]
    if any(p != params[0] for p in params):
        raise ConfigError("sweep: the variants need different Slurm allocations, which one array cannot give; "
                          "vary only training keys")
    root = RunDir.create(opts.run_dir or default_run_dir(job.name), overwrite=opts.overwrite, resume=opts.resume,
                         job_state=live_state)
    for d in (root.ranks, root.steps, root.logs, root.control):
        with contextlib.suppress(OSError):
            d.rmdir()  # the array's root holds variants, not ranks
    root.write_yaml("job.yaml", job_to_data(job))
    runs = []
    for v, vjob, plan in planned:
        run = RunDir.create(variant_dir(root.path, v), overwrite=True, resume=opts.resume, job_state=live_state)
        run.write_yaml("job.yaml", job_to_data(vjob))
        write_plan_outputs(run.path, plan, vjob)
        runs.append(run)
    tasks = [task_for(run, vjob, plan, launch_spec(opts, vjob, plan, run), report=finish, resources=resources)
             for run, (_, vjob, plan) in zip(runs, planned, strict=True)]
    folder, sjobs = submit_array(root.path / "submitit", params[0], tasks, max_requeues=job.slurm.max_requeues)
    rows = []
    for run, sjob, (v, _, plan) in zip(runs, sjobs, planned, strict=True):
        run.write_json(SLURM_JSON, slurm_record(job, plan, kind="array-task", folder=folder, job_ids=[sjob.job_id],
                                                resources=resources, array_run_dir=str(root.path),
                                                variant=v.name).to_json())
        run.set_state("submitted", slurm_job_id=sjob.job_id)
        rows.append(SweepRow(index=v.index, name=v.name, overrides=v.overrides, run_dir=str(run.path),
                             job_id=sjob.job_id, plan=plan.strategy.label(),
                             predicted_peak_bytes=plan.estimate.peak_bytes))
    missing = [UnplannedVariant(index=v.index, name=v.name, overrides=v.overrides, reason=r) for v, r in unplanned]
    record = slurm_record(job, planned[0][2], kind="array", folder=folder, job_ids=[j.job_id for j in sjobs],
                          resources=resources, variants=rows, unplanned=missing)
    data = record.to_json()
    root.write_json("sweep.json", {"variants": data["variants"], "unplanned": data["unplanned"]})
    root.write_json(SLURM_JSON, data)
    root.set_state("submitted", slurm_job_id=sjobs[0].job_id.split("_")[0])
    print(f"submitted slurm array {sjobs[0].job_id.split('_')[0]}: {len(sjobs)} variant(s)"
          f"{f', {len(unplanned)} not planned' if unplanned else ''}, at most {job.slurm.array_parallelism} at once; "
          f"run dir {root.path}")
    for r in rows:
        print(f"  {r.job_id:>12}  {r.name}: {r.plan}, predicted {format_bytes(r.predicted_peak_bytes)}")
    sys.stdout.flush()
    if not opts.wait:
        return EXIT_BAD_INPUT if unplanned else EXIT_OK
    wait_jobs(sjobs, print_state if opts.verbose else None)
    root.redact_submitit_logs()  # one submitit folder for the whole array, under the root
    codes = [finish_quietly(run, plan, sjob) for run, sjob, (_, _, plan) in zip(runs, sjobs, planned, strict=True)]
    print(summary_table(root.path))
    root.set_state("completed" if not any(codes) and not unplanned else "failed", updated_summary=time.time())
    return array_exit_code(codes + [EXIT_BAD_INPUT] * len(unplanned))


def finish_quietly(run: RunDir, plan: Plan, sjob) -> int:
    """The same report and exit code as a local run (session.finish), without its per-rank table on stdout."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = finish(run, plan, job_outcome(sjob))
    return code
