"""After the ranks: merge their files into report.json and memory.png, print the table, decide the exit code."""

from __future__ import annotations

import dataclasses
import sys

from launcher.backends.base import Outcome
from launcher.errors import EXIT_INTERRUPTED, EXIT_OK, EXIT_OOM, EXIT_OVER_BUDGET, EXIT_TRAINING_FAILED
from launcher.planner.plan import Plan
from launcher.rankenv import plan_digest
from launcher.report import build_report, over_budget_message, plot_memory, render_report
from launcher.rundir import RunDir, redact
from launcher.session.prepare import plan_text


def finish(run: RunDir, plan: Plan, outcome: Outcome) -> int:
    """Merge the rank files, write report.json and memory.png, print the table, and return the exit code."""
    if outcome.ok and plan.nodes > 1:
        run.wait_for_rank_files(plan.world_size, timeout_s=60)
    run.redact_logs()  # before any tail of them is printed or kept
    outcome = other_plan(run, plan, outcome)
    report = build_report(run, plan.to_json(), expected_ranks=plan.world_size)
    report["plan_sha256"] = plan_digest(plan_text(plan))
    report["outcome"] = {"ok": outcome.ok, "interrupted": outcome.interrupted, "message": outcome.message,
                         "failures": [{"rank": f.rank, "exitcode": f.exitcode, "host": f.host} for f in outcome.failures]}
    run.write_json("report.json", report)
    try:
        plot_memory(report, run.path / "memory.png")
    except Exception as e:  # a plot must never turn a good run into a failure
        print(f"launch: warning: memory.png not written: {e}", file=sys.stderr)
    print(render_report(report))
    print(f"run dir: {run.path}")
    if outcome.interrupted:
        run.set_state("interrupted", message=outcome.message)
        print(f"launch: {redact(outcome.message)}; the run dir is marked interrupted (resume with --resume)",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    if not outcome.ok:
        run.set_state("failed", message=outcome.message)
        describe_failure(run, outcome)
        return EXIT_TRAINING_FAILED
    msg = over_budget_message(report)
    if msg:
        run.set_state("over_budget", message=msg)
        print(f"launch: over budget: {msg}", file=sys.stderr)
        return EXIT_OVER_BUDGET
    if not report["within_budget"]:
        run.set_state("failed", message="ranks missing from the report")
        print(f"launch: error: ranks {report['missing_ranks']} wrote no memory file", file=sys.stderr)
        return EXIT_TRAINING_FAILED
    run.set_state("completed")
    return EXIT_OK


def describe_failure(run: RunDir, outcome: Outcome) -> None:
    if outcome.message:
        print(f"launch: error: {redact(outcome.message)}", file=sys.stderr)
    for f in sorted(outcome.failures, key=lambda f: f.rank):
        kind = "ran out of memory" if f.exitcode == EXIT_OOM else f"failed with exit code {f.exitcode}"
        print(f"launch: error: rank {f.rank} on {f.host} {kind}; log: {run.rank_log(f.rank)}", file=sys.stderr)
        log = run.rank_log(f.rank)
        if log.is_file():
            tail = log.read_text(errors="replace").splitlines()[-15:]
            print("\n".join(f"  | {ln}" for ln in tail), file=sys.stderr)


def other_plan(run: RunDir, plan: Plan, outcome: Outcome) -> Outcome:
    """A failure when a rank records having trained another plan.json than the one planned here (ranks started
    without the launcher's digest to check, e.g. by hand): the report's prediction would not describe them."""
    want = plan_digest(plan_text(plan))
    other = sorted(r for r, d in run.rank_reports().items() if d.get("plan_sha256") not in (None, want))
    if not other:
        return outcome
    return dataclasses.replace(outcome, ok=False, message=(
        f"rank(s) {other} trained a plan.json other than the one the launcher planned (sha256 {want[:12]}...): "
        "it was replaced after the launch; this report's prediction does not describe them"))
