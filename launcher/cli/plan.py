"""`launch plan`: print, or write, the plan for a job without running it."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from launcher.backends import backend_spec
from launcher.cli.common import add_job_args, dir_path, job_from_args
from launcher.cli.plan_sweep import plan_sweep
from launcher.cli.render import no_fit_reasons, no_fit_suggestions, render_plan, render_slurm_resources
from launcher.config.job import InlineArch, Job
from launcher.datasummary import DataSummary, summary_lines
from launcher.emit.slurm_alloc import SlurmResources
from launcher.errors import ConfigError, NoPlanError
from launcher.plan_inputs import plan_job
from launcher.planner.duration import TotalTime
from launcher.planner.plan import Plan
from launcher.session.checks import check_script, lora_base_warning
from launcher.session.prepare import plan_files, slurm_allocation, total_time_of

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


def run(args: argparse.Namespace) -> int:
    """`launch plan`: plan the job and print it (text or --json), write the exports with --out and the sbatch script
    with --sbatch; the exit code."""
    try:
        if args.script and args.sbatch:
            raise ConfigError("--script: --sbatch writes a script that runs the launcher's recipe, not yours; drop "
                              "--sbatch, and submit your script with launch --slurm JOB --script PATH")
        check_script(args.script)
        if args.json and args.sbatch and not args.out:
            raise ConfigError("--sbatch: with --json the script cannot go to stdout too (--json prints one JSON "
                              "object); add --out DIR to write it there")
        if args.sbatch and args.out is not None:
            from launcher.config.slurm_rules import check_shell_path

            bad_out = check_shell_path(args.out, "--out")  # the script names it in #SBATCH --output and RUN_DIR
            if bad_out:
                raise ConfigError(bad_out)
        # An sbatch script is a run to be: it needs what a run needs (train.max_steps, the data file).
        job = job_from_args(args, for_run=args.sbatch)
        if job.sweep is not None:
            return plan_sweep(args, job)
        if args.sbatch:
            from launcher.machine import submit_host_problem

            problem = submit_host_problem(job)
            if problem:
                raise ConfigError(problem)
        plan = plan_job(job, force=args.force, script=bool(args.script))
        data, data_note = plan_data(job, script=bool(args.script))
        total = total_time_of(job, plan, data)
        slurm = slurm_allocation(job, plan, total) if backend_spec(job.launcher).queued or args.sbatch else None
        script = None
        if args.sbatch:  # before anything is written: a problem in slurm: leaves --out untouched
            from launcher.emit.sbatch import sbatch_text
            from launcher.rundir import slug

            # Absolute, so the script runs from any directory; slugged, as launch run's default.
            run_dir = (args.out if args.out else Path("runs") / slug(job.name)).absolute()
            script = sbatch_text(plan, job, run_dir=run_dir, run_dir_flag="--out" if args.out else "run dir",
                                 resources=slurm)
        written = write_exports(args.out, plan, job, script=script) if args.out else []
    except NoPlanError as e:
        if not args.json:
            raise
        print(json.dumps(no_fit_json(e), indent=2))
        return e.exit_code
    except ConfigError as e:
        if args.json:  # stdout still holds one object a script can read; stderr has the lines as always
            print(json.dumps({"status": "bad_input", "errors": e.problems}, indent=2))
        raise
    if script is not None and not args.out:
        print(script)  # stdout is the script alone; its header says how each allocation value was reached
        return 0
    lora = None if args.script else lora_base_warning(job)
    if lora:
        print(f"launch: warning: {lora}", file=sys.stderr)
    if total.too_long and args.json:  # the text plan says it in its own lines
        print(f"launch: warning: {total.warning()}", file=sys.stderr)
    if args.json:
        print(json.dumps(plan.to_json() | {"total_time": total_time_json(total)}
                         | {"data": data.to_json() if data else None, "data_note": data_note}
                         | ({"slurm": slurm_json(slurm)} if slurm else {}), indent=2))
    else:
        print(render_plan(plan, job.name, model_desc(job), total))
        print("\n".join(summary_lines(data)) if data else f"data: not read ({data_note})")
        if slurm:
            print(render_slurm_resources(slurm, plan.hardware))
    # With --json, stdout is the JSON object alone: what was written is said on stderr.
    say = (lambda line: print(line, file=sys.stderr)) if args.json else print
    for path in written:
        say(f"wrote {path}")
    return 0


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


def total_time_json(t: TotalTime) -> dict:
    """`launch plan --json`'s total_time: the predicted seconds (null when unknown, with why) and the warning."""
    return {"predicted_total_s": t.total_s, "total_steps": t.total_steps, "basis": t.basis,
            "warn_after_s": t.warn_after_s, "too_long": t.too_long}


def slurm_json(res: SlurmResources) -> dict:
    """What a Slurm job of this plan asks for, how, and which values the plan derived (``launch plan --json``)."""
    import dataclasses

    return dataclasses.asdict(res) | {"derived": res.derived, "startup_s": res.startup.total_s}
