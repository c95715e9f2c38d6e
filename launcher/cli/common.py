"""Arguments shared by the verbs that plan: the job file and its CLI overrides."""

from __future__ import annotations

import argparse
from pathlib import Path

from launcher.config.job import Job
from launcher.config.jobfile import load_job, parse_overrides
from launcher.inputs.plan_inputs import request_problems
from launcher.planner.hardware import PROFILES
from launcher.units import BYTES_HELP, parse_bytes


def _size(text: str) -> int:
    if text.strip().startswith("-"):
        # parse_bytes would only say "not a size"; the sign is the mistake, so say that.
        raise argparse.ArgumentTypeError(f"{text!r} must be greater than 0 (memory per GPU); give e.g. 16GB")
    try:
        return parse_bytes(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    except OverflowError:  # '1e400GB' is an infinite float
        raise argparse.ArgumentTypeError(f"{text!r} is too large to be a size; {BYTES_HELP}") from None


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number; give e.g. 4") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be greater than 0; give e.g. 4")
    return v


def non_negative_int(text: str) -> int:
    """argparse type: a whole number, 0 or more."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number; give e.g. 3") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must not be negative; give 0 (off) or e.g. 3") from None
    return v


def seconds(text: str) -> float:
    """argparse type: a finite number of seconds, 0 or more (0: off)."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds; give e.g. 120") from None
    if not 0 <= v < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be 0 or more seconds (0: off); give e.g. 120") from None
    return v


def dir_path(text: str) -> Path:
    """A directory argument; '' is refused: Path('') is the working directory, which nobody means by it."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is empty, which would mean the current directory; give a "
                                         "directory path, e.g. runs/my-run")
    return Path(text)


class RanksPerNode(argparse.Action):
    """--gpus and --nproc-per-node set one value: given twice with two values, argparse would keep the last
    without a word, so the second is refused, naming both."""

    def __call__(self, parser, namespace, values, option_string=None):
        given = getattr(namespace, "_ranks_per_node_flag", None)
        if given is not None and given[1] != values:
            parser.error(f"argument {option_string}: {given[0]} {given[1]} and {option_string} {values}: both set "
                         "the ranks per node and they disagree; give one of them")
        namespace._ranks_per_node_flag = (option_string, values)
        setattr(namespace, self.dest, values)


def add_job_args(p: argparse.ArgumentParser) -> None:
    """The flags `run` and `plan` share: the job file with KEY=VALUE overrides, ranks, budget, nodes, sequence,
    batch, hardware and the other job overrides."""
    p.add_argument("job", help="the job file (YAML); KEY=VALUE after it sets any job key, e.g. train.lr=1e-4 "
                               "strategy.zero_stage=3 (values read as YAML, checked as the file is)")
    p.add_argument("--gpus", type=_positive_int, action=RanksPerNode,
                   help="GPUs (or CPU ranks) per node (torchrun's --nproc-per-node works too); overrides gpus: in the "
                        "job")
    # torchrun's name for it; a separate flag so an error names the one the user typed.
    p.add_argument("--nproc-per-node", "--nproc_per_node", dest="gpus", type=_positive_int, action=RanksPerNode,
                   help=argparse.SUPPRESS)
    p.add_argument("--budget", type=_size, help=f"memory budget per GPU; {BYTES_HELP}")
    # --nnodes is torchrun's name for it; multi-node c10d users reach for it first.
    p.add_argument("--nodes", "--nnodes", dest="nodes", type=_positive_int, help="nodes (default 1)")
    p.add_argument("--seq-len", type=_positive_int, help="override data.max_seq_len, tokens")
    p.add_argument("--global-batch", type=_positive_int, help="override train.global_batch_size, sequences")
    p.add_argument("--hardware", help=f"override cluster.hardware: {', '.join(PROFILES)}, or auto (the card "
                                      "nvidia-smi or rocm-smi names here)")
    p.add_argument("--force", action="store_true",
                   help="run a fully pinned plan even if its prediction is over the budget (to exercise the check)")


def job_from_args(args: argparse.Namespace, extra: dict | None = None, *, for_run: bool = True) -> Job:
    """The job file, then the KEY=VALUE overrides, then the flags; ``for_run`` adds what only a run needs
    (train.max_steps or epochs, an existing data file)."""
    flags = {
        "gpus": args.gpus, "budget": args.budget, "nodes": args.nodes, "data.max_seq_len": args.seq_len,
        "train.global_batch_size": args.global_batch, "cluster.hardware": args.hardware, **(extra or {}),
    }
    sets = parse_overrides(getattr(args, "overrides", None) or [])
    return load_job(args.job, flags, sets=sets, for_run=for_run, checks=request_problems)
