"""The OOM ladder (--auto-fallback): relaunch down launcher.planner.fallback's rungs until an attempt fits the
budget."""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable

from launcher.config.job import Job
from launcher.config.jobfile import job_to_data
from launcher.errors import EXIT_OK, EXIT_OOM, EXIT_OVER_BUDGET, EXIT_TRAINING_FAILED
from launcher.files.rundir import RunDir
from launcher.planner.fallback import Measurement, next_strategy, pins_for
from launcher.planner.plan import Plan
from launcher.records.runreport import (
    Attempt,
    AttemptOom,
    FallbackSummary,
    NextRung,
    RunOutcome,
    RunReport,
    read_report,
)
from launcher.session.prepare import announce, mark_running, write_plan_outputs


def measure_attempt(run: RunDir, code: int, outcome: RunOutcome) -> Measurement | None:
    """What the attempt measured when it ended for lack of memory (OOM or over budget); None for any other end."""
    rows = list(run.rank_reports().values())
    ooms = [r for r in rows if r.status == "oom"]
    if ooms:
        worst = max(ooms, key=lambda r: r.measured_peak_bytes)
        oom = worst.oom  # None in a rank file whose OOM record was not written
        return Measurement(kind="oom", rank=worst.rank, phase=oom and oom.phase, step=oom and oom.step,
                           peak_bytes=int((oom and oom.crossed_at_bytes) or worst.measured_peak_bytes),
                           by_category=worst.peak_by_category or (oom and oom.current_by_category) or {})
    if code == EXIT_TRAINING_FAILED and any(f.exitcode == EXIT_OOM for f in outcome.failures):
        rank = min(f.rank for f in outcome.failures if f.exitcode == EXIT_OOM)
        return Measurement(kind="oom", rank=rank, peak_bytes=0)  # a script that wrote no rank report
    if code == EXIT_OVER_BUDGET and rows:
        worst = max(rows, key=lambda r: r.measured_peak_bytes)
        return Measurement(kind="over_budget", rank=worst.rank, peak_bytes=worst.measured_peak_bytes,
                           by_category=worst.peak_by_category or {})
    return None


def _outcome_name(code: int, outcome: RunOutcome, m: Measurement | None) -> str:
    if m is not None:
        return m.kind
    if outcome.interrupted:
        return "interrupted"
    return {EXIT_OK: "ok", EXIT_OVER_BUDGET: "over_budget"}.get(code, "failed")


def run_ladder(job: Job, plan: Plan, run_dir: RunDir,
               attempt_run: Callable[[Job, Plan], tuple[int, RunOutcome]]) -> int:
    """Attempt 1 is the plan; each OOM or over-budget end moves one rung down the ladder (launcher.planner.fallback)
    until an attempt ends within budget, a non-memory failure or interrupt ends it (its own exit code), or the
    tries run out or no rung is predicted to fit (exit 3). A rung predicted over the budget is never launched."""
    from launcher.inputs.plan_inputs import plan_job, plan_request

    tries = job.auto_fallback
    records: list[Attempt] = []
    tried = [plan.strategy]
    attempt = 1
    while True:
        t0 = time.monotonic()
        code, outcome = attempt_run(job, plan)
        m = measure_attempt(run_dir, code, outcome)
        report = read_report(run_dir.path)
        record = Attempt(
            attempt=attempt, label=plan.strategy.label(), strategy=plan.strategy,
            outcome=_outcome_name(code, outcome, m), exit_code=code,
            global_batch_size=plan.global_batch_size, predicted_peak_bytes=plan.estimate.peak_bytes,
            budget_bytes=plan.budget_bytes,
            measured_peak_bytes=m.peak_bytes if m else max(
                (r.measured_peak_bytes for r in (report.ranks if report else [])), default=None),
            oom=AttemptOom(rank=m.rank, phase=m.phase, step=m.step) if m and m.kind == "oom" else None,
            seconds=round(time.monotonic() - t0, 1), dir=".", next=None,
        )
        records.append(record)
        if m is None:
            break  # within budget, or a failure no memory rung can fix (or an interrupt)
        # From here the ladder ends only for lack of memory: exit 3, the budget was not met (README's exit codes),
        # whether the last attempt measured over it or ran out of memory.
        if attempt > tries:
            record.stopped = f"auto_fallback: all {tries} relaunch(es) used"
            print(f"launch: auto-fallback: all {tries} relaunch(es) used; the last attempt ended {record.outcome}",
                  file=sys.stderr)
            code = EXIT_OVER_BUDGET
            break
        req = plan_request(job, force=True, script=plan.script)
        fb = next_strategy(plan.strategy, plan.estimate, req, m, tried)
        if fb.strategy is None:  # no rung left, or none predicted to fit: nothing over budget is launched
            record.stopped = fb.reason
            print(f"launch: auto-fallback: {fb.reason}", file=sys.stderr)
            code = EXIT_OVER_BUDGET
            break
        record.next = NextRung(label=fb.strategy.label(), rung=fb.rung, reason=fb.reason,
                               predicted_peak_bytes=fb.predicted_peak_bytes,
                               corrected_peak_bytes=fb.corrected_peak_bytes, skipped=list(fb.skipped))
        record.dir = f"attempts/{attempt}"
        run_dir.archive_attempt(attempt)
        print(f"launch: auto-fallback {attempt}/{tries}: {fb.reason}; attempt {attempt} kept in "
              f"{run_dir.path / record.dir}", file=sys.stderr, flush=True)
        job = dataclasses.replace(job, strategy=pins_for(fb.strategy, job.strategy.safety_margin))
        # every field pinned: the planner rebuilds buckets and configs for it
        plan = plan_job(job, force=True, script=plan.script)
        tried.append(plan.strategy)
        attempt += 1
        run_dir.write_yaml("job.yaml", job_to_data(job))
        write_plan_outputs(run_dir.path, plan, job)
        mark_running(run_dir, attempt=attempt)
        announce(plan, run_dir, attempt)
    finish_ladder(run_dir, records, tries, code)
    return code


def finish_ladder(run_dir: RunDir, records: list[Attempt], tries: int, code: int) -> None:
    """report.json of the last attempt gains the ladder: every attempt, its outcome and why the next one."""
    report = read_report(run_dir.path) or RunReport()
    report.auto_fallback = FallbackSummary(tries=tries, relaunches=len(records) - 1,
                                           ended_within_budget=code == EXIT_OK)
    report.attempts = records
    run_dir.write_json("report.json", report.to_json())
    state = "over_budget" if code == EXIT_OVER_BUDGET else run_dir.run_state().state or "failed"
    run_dir.set_state(state, attempts=len(records))
    if len(records) > 1:
        last = records[-1]
        verdict = "ended within budget" if code == EXIT_OK else f"ended {last.outcome} (exit {code})"
        print(f"launch: auto-fallback: {verdict} on attempt {last.attempt} with {last.label} after "
              f"{len(records) - 1} relaunch(es); the ladder is in report.json under attempts", file=sys.stderr)
