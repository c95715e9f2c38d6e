"""`launch run` (the default verb): parse the flags, then hand the job to the run session (launcher.session)."""

from __future__ import annotations

import argparse
import sys

from launcher.cli.common import add_job_args, dir_path, job_from_args, non_negative_int, seconds
from launcher.cli.pipes import closed_output_note, outliving_closed_output
from launcher.errors import EXIT_BAD_INPUT
from launcher.session.options import RunOptions

EPILOG = """examples:
  launch --gpus 2 --budget 2GB examples/minilm-embed.yaml
  launch --gpus 2 --budget 1GB examples/tiny-gpt2.yaml --run-dir runs/tiny --overwrite
  launch --gpus 2 --budget 1GB job.yaml --script train.py -- --epochs 1
  launch --gpus 2 --nodes 2 --node-rank 0 --rdzv-endpoint head:29400 --run-dir /shared/run job.yaml
  launch --gpus 2 --budget 16MB job.yaml --enforce --auto-fallback 3     relaunch down the OOM ladder
  launch --gpus 2 --budget 1GB job.yaml --run-dir runs/a --checkpoint-on-interrupt   then --resume after Ctrl-C
"""


def add_parser(sub) -> None:
    """Register `launch run` and its flags on the verbs' subparsers."""
    p = sub.add_parser("run", help="plan, run through torchrun (or Slurm), and check every rank's peak memory",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_args(p)
    p.set_defaults(func=run)


def add_run_args(p: argparse.ArgumentParser) -> None:
    """The flags of `launch run`: the job's (add_job_args) plus run dir, resume, enforcement, multi-node, script,
    watchdog, interrupt checkpoint, Slurm and output."""
    add_job_args(p)
    p.add_argument("--run-dir", type=dir_path, help="where the run writes (default runs/<name>-<timestamp>)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace a run dir launch made (only its own files; any other non-empty dir is refused)")
    p.add_argument("--resume", action="store_true", help="continue an interrupted run dir from its last checkpoint")
    p.add_argument("--enforce", action="store_true",
                   help="cap each rank at the budget (CUDA: per-process memory fraction; CPU: the probe raises OOM)")
    p.add_argument("--memory-snapshot", action="store_true",
                   help="CUDA: record the allocator's history through the first step into "
                        "RUN/memory-snapshot/rank-K.pickle (view it at pytorch.org/memory_viz)")
    p.add_argument("--node-rank", type=int, default=0, help="this node's rank in a multi-node run")
    p.add_argument("--rdzv-endpoint", help="host:port of the c10d rendezvous for multi-node runs")
    p.add_argument("--script", help="run this training script under the launcher instead of the built-in recipe")
    p.add_argument("--hang-timeout", type=seconds, default=0.0, metavar="S",
                   help="end the run when no rank progresses for S seconds and name the rank that did not arrive "
                        "(0: off)")
    p.add_argument("--auto-fallback", type=non_negative_int, metavar="N",
                   help="when a rank runs out of memory or the run ends over budget, relaunch down the ladder "
                        "(smaller micro-batch, checkpointing, more sharding, offload) up to N times; the global "
                        "batch never changes (auto_fallback: in the job)")
    p.add_argument("--checkpoint-on-interrupt", action="store_true",
                   help="on Ctrl-C or SIGTERM ask the ranks to checkpoint and wait for them (then --resume continues; "
                        "checkpoint_on_interrupt: true in the job)")
    p.add_argument("--checkpoint-timeout", type=seconds, default=120.0, metavar="S",
                   help="with --checkpoint-on-interrupt: wait at most S seconds for the checkpoint (default 120)")
    p.add_argument("--slurm", action="store_true", help="submit through submitit to Slurm (as launcher: slurm)")
    p.add_argument("--wait", action="store_true", help="with Slurm: follow the job and end with the memory report")
    p.add_argument("--array-parallelism", type=int, metavar="N",
                   help="with a sweep: at most N array tasks run at once (slurm.array_parallelism)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--quiet", action="store_true", help="no live view and no step lines")
    g.add_argument("--verbose", action="store_true",
                   help="plain step lines (one per log step) even on a terminal; they are the default elsewhere")


def options_from_args(args: argparse.Namespace) -> RunOptions:
    """The parsed flags as the session's RunOptions."""
    from launcher.cli.render import error_lines

    return RunOptions(
        run_dir=args.run_dir, overwrite=args.overwrite, resume=args.resume, force=args.force, enforce=args.enforce,
        memory_snapshot=args.memory_snapshot, node_rank=args.node_rank, rdzv_endpoint=args.rdzv_endpoint,
        script=args.script, script_args=list(getattr(args, "script_args", None) or []),
        hang_timeout_s=args.hang_timeout, checkpoint_on_interrupt=args.checkpoint_on_interrupt,
        checkpoint_timeout_s=args.checkpoint_timeout, wait=args.wait, quiet=args.quiet, verbose=args.verbose,
        error_lines=error_lines,
    )


def run(args: argparse.Namespace) -> int:
    """`launch run`: the job with --slurm, --array-parallelism and --auto-fallback applied, run by the session; the
    exit code (the run's verdict, also when stdout was closed on the way: launcher.cli.pipes)."""
    from launcher.session.run import run_job

    extra = {"launcher": "slurm"} if args.slurm else {}
    if args.array_parallelism is not None:
        extra["slurm.array_parallelism"] = args.array_parallelism
    if args.auto_fallback is not None:
        extra["auto_fallback"] = args.auto_fallback
    job, opts = job_from_args(args, extra), options_from_args(args)
    with outliving_closed_output() as (out, _):  # `launch ... | head`: the run goes on to its verdict
        code = run_job(job, opts)
        note = closed_output_note(out)
        if note:
            print(note, file=sys.stderr)
    return code


__all__ = ["run", "add_parser", "EXIT_BAD_INPUT"]
