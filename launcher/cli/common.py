"""Arguments shared by the verbs that plan: the job file and its CLI overrides."""

from __future__ import annotations

import argparse

from launcher.config.job import Job
from launcher.config.jobfile import load_job
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
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number; give e.g. 3") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must not be negative; give 0 (off) or e.g. 3") from None
    return v


def seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds; give e.g. 120") from None
    if not 0 <= v < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be 0 or more seconds (0: off); give e.g. 120") from None
    return v


def add_job_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("job", help="the job file (YAML)")
    p.add_argument("--gpus", type=_positive_int, help="GPUs (or CPU ranks) per node; overrides gpus: in the job")
    p.add_argument("--budget", type=_size, help=f"memory budget per GPU; {BYTES_HELP}")
    # --nnodes is torchrun's name for it; multi-node c10d users reach for it first.
    p.add_argument("--nodes", "--nnodes", dest="nodes", type=_positive_int, help="nodes (default 1)")
    p.add_argument("--seq-len", type=_positive_int, help="override data.max_seq_len, tokens")
    p.add_argument("--global-batch", type=_positive_int, help="override train.global_batch_size, sequences")
    p.add_argument("--hardware", help="override cluster.hardware: a100-40gb, a100-80gb, h100-80gb, l4, v100-16gb, cpu")
    p.add_argument("--force", action="store_true",
                   help="run a fully pinned plan even if its prediction is over the budget (to exercise the check)")


def job_from_args(args: argparse.Namespace, extra: dict | None = None) -> Job:
    overrides = {
        "gpus": args.gpus, "budget": args.budget, "nodes": args.nodes, "data.max_seq_len": args.seq_len,
        "train.global_batch_size": args.global_batch, "cluster.hardware": args.hardware, **(extra or {}),
    }
    return load_job(args.job, overrides)
