"""The last step of the `launch plan --sbatch` script: the verdict of the ranks its srun started.

    python -m launcher.cli.finish RUN_DIR SRUN_EXIT_CODE

The same as `launch` writes after its ranks (launcher.session.finish): report.json, memory.png, the table, state.json,
and the verdict's exit code, which the script exits with, so Slurm's job state says what the report says.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from launcher.errors import EXIT_BAD_INPUT, EXIT_INTERRUPTED, ConfigError
from launcher.files.rundir import RunDir
from launcher.planner.plan import read_plan
from launcher.records.runreport import RunOutcome
from launcher.session.finish import finish

SIGNALLED = {EXIT_INTERRUPTED, 128 + 15}
"""srun's exit codes for ranks a signal stopped (SIGINT, SIGTERM: Slurm's cancel and time limit)."""


def main(argv: list[str] | None = None) -> int:
    """Judge the run dir's rank files after srun ended with ``SRUN_EXIT_CODE``; the verdict's exit code."""
    ap = argparse.ArgumentParser(prog="python -m launcher.cli.finish", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("srun_exit_code", type=int)
    a = ap.parse_args(argv)
    run = RunDir(a.run_dir.resolve())
    try:
        plan = read_plan(run.path)
    except (OSError, ValueError, ConfigError) as e:
        print(f"launch: {run.path / 'plan.json'} cannot be read ({e}); no verdict", file=sys.stderr)
        return EXIT_BAD_INPUT
    code = a.srun_exit_code
    checkpointed = "checkpointed" in run.rank_statuses(plan.world_size).values()
    interrupted = code in SIGNALLED or (code == 0 and checkpointed)
    message = "" if code == 0 and not checkpointed else (
        "the ranks checkpointed and the job is out of requeues (slurm.max_requeues)" if checkpointed
        else f"srun ended with exit code {code}")
    return finish(run, plan, RunOutcome(ok=code == 0, interrupted=interrupted, message=message))


if __name__ == "__main__":
    sys.exit(main())
