"""`launch plan`: print, or write, the plan for a job without running it."""

from __future__ import annotations

import argparse
import json
import sys

from launcher.cli.common import add_job_args, dir_path, job_from_args
from launcher.cli.plan_sweep import plan_sweep
from launcher.cli.render import no_fit_reasons, no_fit_suggestions, render_plan, render_slurm_resources
from launcher.config.job import InlineArch, Job
from launcher.emit.slurm_alloc import SlurmResources
from launcher.errors import ConfigError, NoPlanError
from launcher.planner.duration import TotalTime
from launcher.records.datasummary import summary_lines
from launcher.session.planning import PlanOptions, PlanResult, check_plan_options, plan_for

EPILOG = """examples:
  launch plan --gpus 4 --budget 16GB job.yaml
  launch plan --gpus 8 --nodes 128 --budget 80GB --hardware h100-80gb examples/llama-70b.yaml --json
  launch plan --gpus 2 --budget 2GB examples/minilm-embed.yaml --out /tmp/plan
"""


def add_parser(sub) -> None:
    """Register `launch plan` and its flags on the verbs' subparsers."""
    p = sub.add_parser("plan", help="compute and explain a plan; run nothing", epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_job_args(p)
    p.add_argument("--json", action="store_true",
                   help='print one JSON object: the plan, {"status": "no_fit", "reasons", "suggestions"} (exit 2), '
                        'or {"status": "bad_input", "errors"} (exit 2, the errors also on stderr)')
    p.add_argument("--out", type=dir_path,
                   help="write the exports into this directory: job.yaml (resolved), plan.json, accelerate.yaml, and "
                        "ds_config.json (checked by DeepSpeed's parser) with ds_config.hf.json, or fsdp.yaml")
    p.add_argument("--sbatch", action="store_true", help="also write an sbatch script (with --out) or print it")
    p.add_argument("--script", metavar="PATH",
                   help="plan for your own training script, as `launch JOB --script PATH` runs it (or accelerate "
                        "launch with the --out exports): only the levers a script receives are tried, those the "
                        "launcher's recipes apply stay off unless strategy: pins them")
    p.set_defaults(func=run)


def model_desc(job: Job) -> str:
    """The model as the plan's text names it: the job's model id, or the inline architecture's family and size."""
    if isinstance(job.model, InlineArch):
        return f"inline {job.model.family} (h={job.model.hidden_size}, layers={job.model.num_layers})"
    return job.model


def no_fit_json(e: NoPlanError) -> dict:
    """`launch plan --json`'s answer when nothing fits: status no_fit with reasons and suggestions."""
    return {"status": "no_fit", "reasons": no_fit_reasons(e.no_fit), "suggestions": no_fit_suggestions(e)}


def run(args: argparse.Namespace) -> int:
    """`launch plan`: plan the job (launcher.session.planning.plan_for) and print it (text or --json); with --out
    the exports are written, with --sbatch the script too; the exit code."""
    opts = PlanOptions(force=args.force, script=args.script, sbatch=args.sbatch, out=args.out)
    try:
        check_plan_options(opts)
        if args.json and args.sbatch and not args.out:
            raise ConfigError("--sbatch: with --json the script cannot go to stdout too (--json prints one JSON "
                              "object); add --out DIR to write it there")
        # An sbatch script is a run to be: it needs what a run needs (train.max_steps, the data file).
        job = job_from_args(args, for_run=args.sbatch)
        if job.sweep is not None:
            return plan_sweep(args, job)
        result = plan_for(job, opts)
    except NoPlanError as e:
        if not args.json:
            raise
        print(json.dumps(no_fit_json(e), indent=2))
        return e.exit_code
    except ConfigError as e:
        if args.json:  # stdout still holds one object a script can read; stderr has the lines as always
            print(json.dumps({"status": "bad_input", "errors": e.problems}, indent=2))
        raise
    render(result, job, as_json=args.json)
    return 0


def render(result: PlanResult, job: Job, *, as_json: bool) -> None:
    """Print what `launch plan` found: the sbatch script alone (--sbatch without --out), else the plan as text or
    one JSON object, with its warnings and the files written (on stderr with --json)."""
    plan, total, slurm, data = result.plan, result.total, result.slurm, result.data
    if result.sbatch is not None and not result.written:
        print(result.sbatch)  # stdout is the script alone; its header says how each allocation value was reached
        return
    if result.warning:
        print(f"launch: warning: {result.warning}", file=sys.stderr)
    if total.too_long and as_json:  # the text plan says it in its own lines
        print(f"launch: warning: {total.warning()}", file=sys.stderr)
    if as_json:
        print(json.dumps(plan.to_json() | {"total_time": total_time_json(total)}
                         | {"data": data.to_json() if data else None, "data_note": result.data_note}
                         | ({"slurm": slurm_json(slurm)} if slurm else {}), indent=2))
    else:
        print(render_plan(plan, job.name, model_desc(job), total))
        print("\n".join(summary_lines(data)) if data else f"data: not read ({result.data_note})")
        if slurm:
            print(render_slurm_resources(slurm, plan.hardware))
    # With --json, stdout is the JSON object alone: what was written is said on stderr.
    say = (lambda line: print(line, file=sys.stderr)) if as_json else print
    for path in result.written:
        say(f"wrote {path}")


def total_time_json(t: TotalTime) -> dict:
    """`launch plan --json`'s total_time: the predicted seconds (null when unknown, with why) and the warning."""
    return {"predicted_total_s": t.total_s, "total_steps": t.total_steps, "basis": t.basis,
            "warn_after_s": t.warn_after_s, "too_long": t.too_long}


def slurm_json(res: SlurmResources) -> dict:
    """What a Slurm job of this plan asks for, how, and which values the plan derived (``launch plan --json``)."""
    import dataclasses

    return dataclasses.asdict(res) | {"derived": res.derived, "startup_s": res.startup.total_s}
