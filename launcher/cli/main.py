"""`launch`: plan, run and verify memory-budgeted fine-tunes.

`launch --gpus 4 --budget 16GB job.yaml` is `launch run ...`.
"""

from __future__ import annotations

import argparse
import difflib
import functools
import re
import sys
from pathlib import Path

from launcher.errors import EXIT_BAD_INPUT, EXIT_INTERRUPTED, LauncherError
from launcher.units import BYTES_HELP

VERBS = ("run", "plan", "calibrate", "status", "logs", "cancel", "export")

DESCRIPTION = f"""Plan, run and verify a fine-tune under a per-GPU memory budget.

  launch --gpus 4 --budget 16GB job.yaml          plan, run through torchrun, check every rank's peak
  launch plan --gpus 4 --budget 16GB job.yaml     print the plan and why; run nothing
  launch plan job.yaml train.lr=1e-4 strategy.zero_stage=3   set any job key after the job file

Budgets: {BYTES_HELP}.
Exit codes: 0 every rank within budget; 1 training failed; 2 bad input or no plan fits;
3 a rank exceeded the budget."""


class LaunchParser(argparse.ArgumentParser):
    """argparse, except that `launch plan --json` answers its usage errors with one JSON object on stdout too
    (``{"status": "bad_input", "errors": [...]}``), as it answers every other outcome; the usage line and the
    error still go to stderr with exit 2."""

    def __init__(self, *args, json_errors: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.json_errors = json_errors  # answer usage errors with the bad_input JSON object too

    def error(self, message: str):
        """Print a usage error as the bad_input JSON object too when --json asked for it; then argparse's exit 2."""
        if self.json_errors:
            import json

            print(json.dumps({"status": "bad_input", "errors": [f"{self.prog}: {message}"]}, indent=2))
        super().error(message)


def build_parser(*, json_errors: bool = False) -> argparse.ArgumentParser:
    """The `launch` parser with every verb's subparser (usage errors as JSON when ``json_errors``)."""
    from launcher.cli import calibrate, export, manage, plan, run

    parser = LaunchParser(prog="launch", description=DESCRIPTION, json_errors=json_errors,
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", "-V", action="version", version=f"launch {version()}")
    # Each verb's parser is a LaunchParser with the same json_errors (an instance setting, not a class flag).
    sub = parser.add_subparsers(dest="verb", metavar="{" + ",".join(VERBS) + "}",
                                parser_class=functools.partial(LaunchParser, json_errors=json_errors))
    for mod in (run, plan, calibrate, manage, export):
        mod.add_parser(sub)
    return parser


# Flags taking one number or size: "--budget -4GB" must reach the flag's own check, which names the rule.
VALUE_FLAGS = ("--budget", "--gpus", "--nproc-per-node", "--nproc_per_node", "--nodes", "--nnodes", "--seq-len",
               "--global-batch", "--auto-fallback", "--hang-timeout", "--checkpoint-timeout", "--node-rank",
               "--array-parallelism")


def attach_negative_values(argv: list[str]) -> list[str]:
    """``--budget -4GB`` as ``--budget=-4GB``: argparse takes a dash-led word that is not a plain number for a
    flag, and would answer "expected one argument" instead of the flag's own message."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        nxt = argv[i + 1] if i + 1 < len(argv) else None
        if (a in VALUE_FLAGS and nxt is not None and len(nxt) > 1 and nxt[0] == "-"
                and (nxt[1].isdigit() or nxt[1] == ".")):
            out.append(f"{a}={nxt}")
            i += 2
            continue
        out.append(a)
        i += 1
    return out


def version() -> str:
    """The installed launcher's version, or a note that it is not installed."""
    import importlib.metadata

    try:
        return importlib.metadata.version("launcher")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


OVERRIDE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*=")
"""A dotted job key set from the command line: train.lr=1e-4 (torchtune's and Hydra's form)."""


def unknown_verb(word: str) -> str | None:
    """The one-line answer for a first word that is neither a verb, a flag nor a job file, or None."""
    if word in VERBS or word.startswith("-") or OVERRIDE_RE.match(word) or Path(word).exists():
        return None
    near = difflib.get_close_matches(word, VERBS, n=1, cutoff=0.6)
    if near:
        return f"unknown command {word!r}; did you mean {near[0]!r}?"
    if Path(word).suffix or "/" in word:  # reads as a path: the job-file check names it
        return None
    return f"unknown command {word!r}; use one of {', '.join(VERBS)}, or give a job file (launch job.yaml)"


def split_argv(argv: list[str]) -> tuple[list[str], list[str], list[str]]:
    """(our arguments, KEY=VALUE overrides, the --script's own arguments).

    After ``--``: with --script, the rest is the script's, untouched; without it, ``--`` ends our options as
    usual (``launch plan -- job.yaml``). Overrides may stand anywhere before the script's arguments.
    """
    script_args: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        if any(a == "--script" or a.startswith("--script=") for a in argv[:cut]):
            argv, script_args = argv[:cut], argv[cut + 1:]
    ours = [a for a in argv if not OVERRIDE_RE.match(a)]
    return ours, [a for a in argv if OVERRIDE_RE.match(a)], script_args


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default sys.argv; a bare job file means `run`), run the verb and return its exit code;
    LauncherError becomes its "launch: error:" lines and exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        print("launch: error: no job file given; use launch [run|plan] JOB.yaml --gpus N --budget SIZE "
              "(launch --help for more)", file=sys.stderr)
        return EXIT_BAD_INPUT
    if argv[0] not in VERBS and argv[0] not in ("-h", "--help", "-V", "--version"):
        problem = unknown_verb(argv[0])
        if problem:
            print(f"launch: error: {problem}", file=sys.stderr)
            return EXIT_BAD_INPUT
        argv.insert(0, "run")
    parser = build_parser(json_errors=argv[0] == "plan" and "--json" in argv)
    argv, overrides, script_args = split_argv(argv)
    args = parser.parse_args(attach_negative_values(argv))
    args.script_args = script_args
    args.overrides = overrides
    if overrides and args.verb not in ("run", "plan"):
        print(f"launch: error: {overrides[0]}: KEY=VALUE job overrides apply to run and plan, not to {args.verb}; "
              "drop it", file=sys.stderr)
        return EXIT_BAD_INPUT
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_BAD_INPUT
    try:
        return int(args.func(args) or 0)
    except LauncherError as e:
        from launcher.cli.render import error_lines

        for line in error_lines(e):
            print(f"launch: error: {line}" if not line.startswith("  ") else line, file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("launch: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
