"""After the ranks: merge their files into report.json and memory.png, print the table, decide the exit code."""

from __future__ import annotations

import dataclasses
import signal
import sys

import yaml

from launcher.errors import EXIT_INTERRUPTED, EXIT_OK, EXIT_OOM, EXIT_OVER_BUDGET, EXIT_TRAINING_FAILED
from launcher.files.ranklog import wait_settled
from launcher.files.redact import redact
from launcher.files.rundir import RunDir
from launcher.planner.plan import Plan
from launcher.processes.procs import exit_words
from launcher.processes.rankenv import plan_digest
from launcher.records.report import build_report, over_budget_message, plot_memory, render_report, unmeasured
from launcher.records.runreport import RunOutcome, RunReport
from launcher.session.prepare import plan_text

ENDINGS = {"interrupted": ("interrupted", EXIT_INTERRUPTED), "oom": ("failed", EXIT_TRAINING_FAILED),
           "failed": ("failed", EXIT_TRAINING_FAILED), "over_budget": ("over_budget", EXIT_OVER_BUDGET),
           "incomplete": ("failed", EXIT_TRAINING_FAILED), "within_budget": ("completed", EXIT_OK)}
"""report.json's verdict -> (state.json's state, the exit code): one table, so they cannot disagree."""


def finish(run: RunDir, plan: Plan, outcome: RunOutcome) -> int:
    """Merge the rank files, write report.json and memory.png, print the table, and return the exit code.

    One verdict (launcher.records.report.run_verdict) decides the table's last line, report.json's "verdict" and
    "within_budget", state.json and the exit code, so they cannot disagree. A file that cannot be written (a full
    disk) ends nothing early: report.json missing makes the run failed, said so in the table, state.json (which
    keeps room for it, launcher.files.fsutil.write_reserved) and the exit code."""
    if outcome.ok and plan.nodes > 1:
        run.wait_for_rank_files(plan.world_size, timeout_s=60)
    # The ranks are gone; their logs' redactors may still write the last bytes (2 s at most in all).
    wait_settled(*(run.rank_log(rank) for rank in range(plan.world_size)))
    # Before any tail of them is printed or kept (they were redacted as written: a backstop).
    lost = unwritten("the rank logs' final scrub", run.redact_logs)
    outcome = other_plan(run, plan, outcome)
    report = build_report(run, plan, expected_ranks=plan.world_size, interrupted=outcome.interrupted,
                          failed=not outcome.ok, exitcodes={f.rank: f.exitcode for f in outcome.failures})
    report.plan_sha256 = plan_digest(plan_text(plan))
    report.outcome = outcome
    unsaved = unwritten("report.json", lambda: run.write_json("report.json", report.to_json()))
    if unsaved:  # the verdict is not kept: a run whose report is lost did not deliver it
        report.verdict, report.within_budget = "failed", False
        outcome = dataclasses.replace(outcome, ok=False, message=unsaved)
    else:
        try:
            plot_memory(report, run.path / "memory.png")
        except Exception as e:  # a plot must never turn a good run into a failure
            print(f"launch: warning: memory.png not written: {e}", file=sys.stderr)
    print(render_report(report))
    print(f"run dir: {run.path}")
    verdict = report.verdict
    state, code = ENDINGS.get(verdict, ENDINGS["incomplete"])
    if verdict == "interrupted":
        message = outcome.message or stop_message(run, report)
        print(f"launch: {redact(message)}; the run dir is marked interrupted; {next_step_after_interrupt(run)}",
              file=sys.stderr)
    elif verdict in ("failed", "oom"):
        message = outcome.message or f"rank(s) ended with {verdict}"
        describe_failure(run, outcome, report)
    elif verdict == "over_budget":
        message = over_budget_message(report)
        print(f"launch: over budget: {message}", file=sys.stderr)
    elif verdict == "incomplete":
        message = "ranks missing from the report"
        print(f"launch: error: ranks {report.missing_ranks} wrote no memory file", file=sys.stderr)
    else:
        message = None
    lost += unwritten("state.json", lambda: run.set_state(state, message=message))
    if lost:
        print(f"launch: error: {lost}", file=sys.stderr)
    return code


def unwritten(what: str, write) -> str:
    """Call ``write``; '' when it worked, else one line saying what could not be written and why (a full disk,
    a read-only mount), so the run still ends with its verdict and exit code instead of a traceback."""
    try:
        write()
    except OSError as e:
        return f"{what} could not be written ({e.strerror or e}); free space where the run dir is"
    return ""


def stop_message(run: RunDir, report: RunReport) -> str:
    """Why a run that no signal to the launcher stopped is interrupted: which rank was asked to stop, by what,
    after which step, and the checkpoint the ranks saved."""
    parts = [f"rank {r.rank} {r.ended or 'stopped on ' + (r.stop_reason or 'request')} after step {r.steps_done}"
             for r in report.ranks if r.verdict in ("interrupted", "OVER") and r.status != "completed"
             and r.stop_reason != "another rank asked"]
    tag = run.latest_checkpoint
    saved = f"; the ranks saved checkpoint {tag}" if tag and any(r.status == "checkpointed" for r in report.ranks) \
        else ""
    return "stopped before the last step: " + ("; ".join(parts) or "a rank was asked to stop") + saved


def next_step_after_interrupt(run: RunDir) -> str:
    """What to do with an interrupted run dir: --resume only where `launch --resume` will accept it (a checkpoint
    to continue from, and no --auto-fallback, which --resume refuses)."""
    if run.latest_checkpoint:  # what prepare_run_dir and check_resume look for
        ladder = " --auto-fallback 0" if _job_auto_fallback(run) else ""
        return f"continue it with the same job file and --run-dir {run.path} --resume{ladder}"
    return (f"no checkpoint was saved, so --resume cannot continue it: start again with --run-dir {run.path} "
            "--overwrite (or another --run-dir); with --checkpoint-on-interrupt, Ctrl-C saves one first")


def _job_auto_fallback(run: RunDir) -> int:
    try:
        return int((yaml.safe_load((run.path / "job.yaml").read_text()) or {}).get("auto_fallback") or 0)
    except (OSError, ValueError, TypeError, AttributeError, yaml.YAMLError):
        return 0


KILL_HINT = " (the OOM killer, a kill -9, or torchrun after its grace; its peak is the last it measured)"
"""Said after a rank killed by SIGKILL: who sends one, and why its row's peak may be short of its true one (the
rank could not write its last word; its last step line is the latest figure, launcher.records.report.last_seen)."""


def describe_failure(run: RunDir, outcome: RunOutcome, report: RunReport | None = None) -> None:
    """Print why the run failed to stderr: the backend's message, ranks whose file records a failure, and each failed
    rank's exit (OOM or code) with the last 15 lines of its log."""
    if outcome.message:
        print(f"launch: error: {redact(outcome.message)}", file=sys.stderr)
    if outcome.ok and report is not None:  # every process exited 0, yet a rank file records a failure
        idle = unmeasured(report)
        bad = [r.rank for r in report.ranks if r.verdict in ("failed", "oom") and r.rank not in idle]
        if bad:
            print(f"launch: error: rank(s) {bad} recorded a failure in ranks/rank-K.json; logs in {run.logs}",
                  file=sys.stderr)
        if idle:
            print(f"launch: error: rank(s) {idle} completed without measuring any memory (peak 0 B): the script "
                  "made no tensor the probe sees or exited at once, so the budget cannot be judged; check that "
                  f"it trains (logs in {run.logs})", file=sys.stderr)
    for f in sorted(outcome.failures, key=lambda f: f.rank):
        kind = "ran out of memory" if f.exitcode == EXIT_OOM else \
            f"was {exit_words(f.exitcode)}{KILL_HINT}" if f.exitcode == -signal.SIGKILL else \
            f"was {exit_words(f.exitcode)}" if f.exitcode < 0 else f"failed with exit code {f.exitcode}"
        print(f"launch: error: rank {f.rank} on {f.host} {kind}; log: {run.rank_log(f.rank)}", file=sys.stderr)
        log = run.rank_log(f.rank)
        if log.is_file():
            tail = log.read_text(errors="replace").splitlines()[-15:]
            print("\n".join(f"  | {ln}" for ln in tail), file=sys.stderr)


def other_plan(run: RunDir, plan: Plan, outcome: RunOutcome) -> RunOutcome:
    """A failure when a rank records having trained another plan.json than the one planned here (ranks started
    without the launcher's digest to check, e.g. by hand): the report's prediction would not describe them."""
    want = plan_digest(plan_text(plan))
    other = sorted(r for r, d in run.rank_reports().items() if d.plan_sha256 not in (None, want))
    if not other:
        return outcome
    return dataclasses.replace(outcome, ok=False, message=(
        f"rank(s) {other} trained a plan.json other than the one the launcher planned (sha256 {want[:12]}...): "
        "it was replaced after the launch; this report's prediction does not describe them"))
