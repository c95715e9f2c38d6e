"""A job with a ``sweep:`` section: plan every variant at submit time, submit the plannable ones as one array.

    RUN/job.yaml  sweep.json  slurm.json  submitit/     the array (slurm.json kind 'array')
    RUN/variants/<k>-<name>/                            one full run dir per variant (slurm.json kind 'array-task')

Variants that cannot be planned are listed with their reason at submit time and in slurm.json ('unplanned');
the others are still submitted. Exit code: 1 if a variant failed, else 130 if one was interrupted, else 3 if one
went over budget, else 2 if one could not be planned, else 0 (without --wait: 2 if any could not be planned).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import time
from pathlib import Path

from launcher.backends.slurm import job_outcome, make_executor, print_state, slurm_record, task_for, wait_jobs
from launcher.backends.slurm_params import executor_parameters
from launcher.backends.slurm_state import SLURM_JSON
from launcher.config.job import Job
from launcher.config.jobfile import job_from_data, job_to_data
from launcher.errors import EXIT_BAD_INPUT, EXIT_OK, EXIT_OVER_BUDGET, EXIT_TRAINING_FAILED, ConfigError, LauncherError
from launcher.planner.plan import Plan
from launcher.rundir import RunDir, default_run_dir, slug
from launcher.sweep import Variant, expand
from launcher.units import format_bytes

EXIT_INTERRUPTED = 130
SEVERITY = (EXIT_TRAINING_FAILED, EXIT_INTERRUPTED, EXIT_OVER_BUDGET, EXIT_BAD_INPUT)
VERDICTS = {EXIT_OK: "ok", EXIT_TRAINING_FAILED: "failed", EXIT_OVER_BUDGET: "OVER budget",
            EXIT_INTERRUPTED: "interrupted", EXIT_BAD_INPUT: "not planned"}


def array_exit_code(codes: list[int]) -> int:
    for code in SEVERITY:
        if code in codes:
            return code
    return next((c for c in codes if c), EXIT_OK)


def plan_variants(job: Job, variants: list[Variant], *, force: bool = False):
    """(planned [(variant, job, plan)], unplanned [(variant, reason)]); each variant planned for itself."""
    from launcher.cli.run import check_runnable
    from launcher.plan_inputs import plan_job, request_problems

    base = job_to_data(job)
    base.pop("sweep", None)
    planned, unplanned = [], []
    for v in variants:
        try:
            vjob = job_from_data(base, job.base_dir, v.overrides, checks=request_problems)
            plan = plan_job(vjob, force=force)
            check_runnable(vjob, plan)
            executor_parameters(vjob, plan)
            planned.append((v, vjob, plan))
        except LauncherError as e:
            unplanned.append((v, " / ".join(str(e).splitlines())))
    return planned, unplanned


def variant_dir(root: Path, v: Variant) -> Path:
    return root / "variants" / f"{v.index}-{slug(v.name)}"


def submit_sweep_from_cli(args: argparse.Namespace, job: Job) -> int:
    from launcher.cli.plan import write_plan_outputs

    if job.launcher != "slurm":
        raise ConfigError("sweep: a sweep runs as a Slurm array; add --slurm (or launcher: slurm), or remove sweep: "
                          "to run one job")
    if args.script or args.node_rank or args.rdzv_endpoint:
        raise ConfigError("sweep: --script, --node-rank and --rdzv-endpoint do not apply to an array; drop them")
    variants = expand({"grid": job.sweep.grid, "list": job.sweep.list})
    planned, unplanned = plan_variants(job, variants, force=args.force)
    for v, reason in unplanned:
        print(f"launch: variant {v.index} ({v.name}) not submitted: {reason}", file=sys.stderr)
    if not planned:
        raise ConfigError([f"sweep: variant {v.index} ({v.name}): {reason}" for v, reason in unplanned])
    params = [executor_parameters(vj, p) for _, vj, p in planned]
    if any(p != params[0] for p in params):
        raise ConfigError("sweep: the variants need different Slurm allocations, which one array cannot give; "
                          "vary only training keys")
    root = RunDir.create(args.run_dir or default_run_dir(job.name), overwrite=args.overwrite, resume=args.resume)
    for d in (root.ranks, root.steps, root.logs, root.control):
        with contextlib.suppress(OSError):
            d.rmdir()  # the array's root holds variants, not ranks
    root.write_yaml("job.yaml", job_to_data(job))
    runs = []
    for v, vjob, plan in planned:
        run = RunDir.create(variant_dir(root.path, v), overwrite=True, resume=args.resume)
        run.write_yaml("job.yaml", job_to_data(vjob))
        write_plan_outputs(run.path, plan, vjob)
        runs.append(run)
    ex = make_executor(root.path / "submitit", params[0], max_requeues=job.slurm.max_requeues)
    with ex.batch():
        sjobs = [ex.submit(task_for(run, vjob, plan, args)) for run, (_, vjob, plan) in zip(runs, planned, strict=True)]
    rows = []
    for run, sjob, (v, _, plan) in zip(runs, sjobs, planned, strict=True):
        run.write_json(SLURM_JSON, slurm_record(job, plan, kind="array-task", folder=ex.folder, job_ids=[sjob.job_id],
                                                array_run_dir=str(root.path), variant=v.name))
        run.set_state("submitted", slurm_job_id=sjob.job_id)
        rows.append({"index": v.index, "name": v.name, "overrides": v.overrides, "run_dir": str(run.path),
                     "job_id": sjob.job_id, "plan": plan.strategy.label(),
                     "predicted_peak_bytes": plan.estimate.peak_bytes})
    missing = [{"index": v.index, "name": v.name, "overrides": v.overrides, "reason": r} for v, r in unplanned]
    root.write_json("sweep.json", {"variants": rows, "unplanned": missing})
    root.write_json(SLURM_JSON, slurm_record(job, planned[0][2], kind="array", folder=ex.folder,
                                             job_ids=[j.job_id for j in sjobs], variants=rows, unplanned=missing))
    root.set_state("submitted", slurm_job_id=sjobs[0].job_id.split("_")[0])
    print(f"submitted slurm array {sjobs[0].job_id.split('_')[0]}: {len(sjobs)} variant(s)"
          f"{f', {len(unplanned)} not planned' if unplanned else ''}, at most {job.slurm.array_parallelism} at once; "
          f"run dir {root.path}")
    for r in rows:
        print(f"  {r['job_id']:>12}  {r['name']}: {r['plan']}, predicted {format_bytes(r['predicted_peak_bytes'])}")
    sys.stdout.flush()
    if not args.wait:
        return EXIT_BAD_INPUT if unplanned else EXIT_OK
    wait_jobs(sjobs, print_state if args.verbose else None)
    root.redact_submitit_logs()  # one submitit folder for the whole array, under the root
    codes = [finish_quietly(run, plan, sjob) for run, sjob, (_, _, plan) in zip(runs, sjobs, planned, strict=True)]
    print(summary_table(root.path))
    root.set_state("completed" if not any(codes) and not unplanned else "failed", updated_summary=time.time())
    return array_exit_code(codes + [EXIT_BAD_INPUT] * len(unplanned))


def finish_quietly(run: RunDir, plan: Plan, sjob) -> int:
    """The same report and exit code as a local run (cli.run.finish), without its per-rank table on stdout."""
    from launcher.cli.run import finish

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = finish(run, plan, job_outcome(sjob))
    return code


def variant_row(run_dir: Path) -> dict:
    """variant, plan, measured peak, verdict and final loss, from a variant's run dir files."""
    row = {"measured_peak_bytes": None, "final_loss": None, "verdict": "-"}
    rp = run_dir / "report.json"
    state = {}
    if (run_dir / "state.json").is_file():
        state = json.loads((run_dir / "state.json").read_text())
    if rp.is_file():
        rep = json.loads(rp.read_text())
        ranks = rep.get("ranks", [])
        if ranks:
            row["measured_peak_bytes"] = max(r["measured_peak_bytes"] for r in ranks)
            row["final_loss"] = next((r.get("final_loss") for r in ranks if r["rank"] == 0), None)
    row["verdict"] = {"completed": "ok", "over_budget": "OVER budget"}.get(state.get("state"), state.get("state", "-"))
    return row


def summary_table(root: Path) -> str:
    sweep = json.loads((root / "sweep.json").read_text())
    lines = [f"{'variant':<28} {'job':>10}  {'plan':<34} {'peak':>10}  {'verdict':<12} {'final loss':>10}"]
    for v in sweep["variants"]:
        r = variant_row(Path(v["run_dir"]))
        peak = format_bytes(r["measured_peak_bytes"]) if r["measured_peak_bytes"] is not None else "-"
        loss = f"{r['final_loss']:.4f}" if isinstance(r["final_loss"], (int, float)) else "-"
        name = f"{v['index']}-{v['name']}"
        lines.append(f"{name[:28]:<28} {v['job_id']:>10}  {v['plan'][:34]:<34} {peak:>10}  {r['verdict']:<12} {loss:>10}")
    for v in sweep["unplanned"]:
        name = f"{v['index']}-{v['name']}"
        lines.append(f"{name[:28]:<28} {'-':>10}  {'-':<34} {'-':>10}  {'not planned':<12} {'-':>10}  {v['reason']}")
    return "\n".join(lines)
