"""`launch plan` of a job with a ``sweep:`` section: every variant planned for itself, as `launch run --slurm`
would submit them (launcher.session.sweep.plan_variants), never the base job alone; at most
bounds.SWEEP_VARIANTS of them, counted before any is made."""

from __future__ import annotations

import argparse
import json

from launcher.cli.render import error_lines
from launcher.config.job import Job
from launcher.errors import EXIT_BAD_INPUT, EXIT_OK, ConfigError
from launcher.inputs.variants import expand
from launcher.units import format_bytes


def plan_sweep(args: argparse.Namespace, job: Job) -> int:
    """Plan each variant and print one line per variant (or, with --json, one object with a list); exit 2 when
    any variant cannot be planned, as the submission would leave it out."""
    if args.out or args.sbatch:
        raise ConfigError("sweep: --out and --sbatch write one job's files, and this job has a sweep: of variants "
                          "(launch run --slurm writes one run dir per variant); drop --out/--sbatch, or plan one "
                          "variant alone with sweep: removed and its keys set (KEY=VALUE after the job file)")
    if args.script:
        raise ConfigError("sweep: --script does not apply to an array; drop it")
    from launcher.session.sweep import plan_variants

    variants = expand({"grid": job.sweep.grid, "list": job.sweep.list})
    planned, unplanned = plan_variants(job, variants, force=args.force, error_lines=error_lines)
    why = dict((v.index, reason) for v, reason in unplanned)
    plans = {v.index: plan for v, _, plan in planned}
    if args.json:
        rows = [{"index": v.index, "name": v.name, "overrides": v.overrides}
                | ({"plan": plans[v.index].to_json()} if v.index in plans else {"error": why[v.index]})
                for v in variants]
        print(json.dumps({"status": "sweep" if not unplanned else "sweep_partly_planned", "variants": rows},
                         indent=2, default=str))
    else:
        print(f"sweep: {len(variants)} variant(s) of {job.name}, each planned for itself "
              f"({len(planned)} planned, {len(unplanned)} not)")
        for v in variants:
            if v.index in plans:
                p = plans[v.index]
                print(f"  {v.index:>4}  {v.name}: {p.strategy.label()}, predicted peak "
                      f"{format_bytes(p.estimate.peak_bytes)} of {format_bytes(p.budget_bytes)}")
            else:
                print(f"  {v.index:>4}  {v.name}: not planned: {why[v.index]}")
    return EXIT_BAD_INPUT if unplanned else EXIT_OK
