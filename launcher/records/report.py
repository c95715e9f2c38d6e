"""Merge the ranks' memory files into report.json, decide the verdict, and render it."""

from __future__ import annotations

import io
import typing
from pathlib import Path

from launcher.files.fsutil import atomic_write
from launcher.files.rundir import FINAL_STATUSES, RunDir
from launcher.planner.cuda_overhead import peak_on_basis
from launcher.planner.plan import Plan
from launcher.processes.procs import exit_words, stopped_by_request
from launcher.records.categories import CATEGORY_GROUPS, grown_category
from launcher.records.categories import measured_bytes as measured_group
from launcher.records.categories import predicted_bytes as predicted_group
from launcher.records.datasummary import read_data_summary
from launcher.records.live import last_line
from launcher.records.rankreport import RankReport, ScriptOverride
from launcher.records.runreport import RankRow, RunReport, RunVerdict
from launcher.records.steprow import StepRow
from launcher.units import decimal_unit, format_bytes

# One vocabulary (launcher.records.categories), re-exported for its readers.
__all__ = ["CATEGORY_GROUPS", "grown_category"]

FAILED_STATUSES = ("failed", "oom")
"""Rank statuses (launcher.worker.main) of a rank that ended with an error."""
STOPPED_STATUSES = ("checkpointed", "interrupted")
"""Rank statuses of a rank that stopped before its last step because it was asked to (a signal such as a
scheduler's SIGTERM, the control file), saving a checkpoint first where it could."""


def rank_verdict(status: str, measured_bytes: int, budget_bytes: int, *, interrupted: bool = False) -> str:
    """ok, OVER, oom, failed or interrupted. Only a rank that completed (ran every planned step) and measured
    something is "ok": 0 bytes measured is no evidence of fitting. A rank that stopped on request, or that did not
    complete in an interrupted run, is "interrupted" (the signal ended it, whatever it wrote on the way out) unless
    it was already over the budget or out of memory: facts the interrupt does not change. Any other status after
    the run (still "running": the process died without a word, killed by SIGKILL or the OOM killer) is "failed"."""
    if status == "oom":
        return "oom"
    if status != "completed" and (interrupted or status in STOPPED_STATUSES):
        return "OVER" if measured_bytes > budget_bytes else "interrupted"
    if status != "completed" or measured_bytes <= 0:
        return "failed"
    return "ok" if measured_bytes <= budget_bytes else "OVER"


RUN_VERDICTS = typing.get_args(RunVerdict)
"""report.json's "verdict": what the run showed, in the order the exit code is decided (launcher.session.finish):
interrupted (130: a signal to the launcher or to a rank), oom or failed (1), a rank stopped on request (130),
over_budget (3), incomplete (1: a rank wrote no memory file), within_budget (0: every rank completed every step,
measured, and stayed within the budget)."""


def run_verdict(rows: list[RankRow], missing: list[int], *, interrupted: bool = False, failed: bool = False) -> str:
    """report.json's verdict (RUN_VERDICTS) from the ranks' rows, the ranks without a file, and how it ended."""
    verdicts = {r.verdict for r in rows}
    if interrupted:
        return "interrupted"
    if failed or verdicts & {"failed", "oom"}:
        return "oom" if "oom" in verdicts else "failed"
    if "interrupted" in verdicts:
        return "interrupted"
    if "OVER" in verdicts:
        return "over_budget"
    if missing or not rows:
        return "incomplete"
    return "within_budget"


def predicted_on_basis(plan: Plan, basis: str) -> int:
    """The plan's peak counted as a rank measured it: a plan made for a GPU profile but run on CPU ranks is
    compared on tensor bytes, its CUDA-only terms (the estimate's overhead) dropped."""
    est = plan.estimate
    if basis == est.basis:
        return est.peak_bytes
    tensors = est.peak_bytes - int(est.breakdown.get("reserve", 0))
    if basis in ("cpu_tensor_bytes", "cuda_allocated"):
        # What counts no side-stream pool peaks at the largest tensor moment, which a pool may have made another
        # than the verdict's (launcher.planner.memory).
        tensors = max(tensors, est.tensor_peak_bytes)
    return peak_on_basis(tensors, est.overhead, basis)


def last_seen(run: RunDir, r: RankReport) -> RankReport:
    """A rank file whose status was never made final (the process died: SIGKILL, the OOM killer) was written when
    training began: its peak and step count are then raised to what its last step line says, so a killed rank's
    row shows what it measured, not a stale early figure."""
    if r.status in FINAL_STATUSES:
        return r
    line = last_line(run.steps / f"rank-{r.rank}.jsonl") or StepRow()
    if isinstance(line.mem_peak_bytes, int) and line.mem_peak_bytes > r.measured_peak_bytes:
        r.measured_peak_bytes = line.mem_peak_bytes
    r.steps_done = max(r.steps_done, line.step)
    return r


def rank_row(r: RankReport, plan: Plan, *, interrupted: bool, exitcode: int | None = None) -> RankRow:
    """One rank file's line of the report; ``exitcode`` is how its process ended when not with 0 (negative: a
    signal), where the backend saw it."""
    budget = plan.budget_bytes
    measured = r.measured_peak_bytes
    predicted = predicted_on_basis(plan, r.basis)
    cats = {k: int(v) for k, v in (r.peak_by_category or {}).items()}
    grew, growth = grown_category(plan.estimate.breakdown, cats)
    verdict = rank_verdict(r.status, measured, budget, interrupted=interrupted)
    return RankRow(
        rank=r.rank, host=r.host, device=r.device, status=r.status, verdict=verdict, measured=measured > 0,
        basis=r.basis, measured_peak_bytes=measured, predicted_peak_bytes=predicted, budget_bytes=budget,
        headroom_bytes=budget - measured,
        # Only a rank that completed, measured and stayed within is "within": nothing measured is no evidence,
        # and a failed or interrupted rank did not run the whole job.
        within_budget=verdict == "ok",
        relative_error=(predicted - measured) / measured if measured else None,
        largest_category=max(cats, key=cats.get) if cats else None,
        grew_most=grew, grew_most_bytes=growth, measured_breakdown=cats, phases=dict(r.phases),
        peak_rss_bytes=r.peak_rss_bytes, max_memory_allocated_bytes=r.max_memory_allocated_bytes,
        max_memory_reserved_bytes=r.max_memory_reserved_bytes, outside_allocator_bytes=r.outside_allocator_bytes,
        first_loss=r.first_loss, final_loss=r.final_loss, eval_loss=r.eval_loss, eval_accuracy=r.eval_accuracy,
        steps_done=r.steps_done, stop_reason=r.stop_reason,
        ended=exit_words(exitcode) if exitcode else None,
    )


def build_report(run: RunDir, plan: Plan, *, expected_ranks: int, interrupted: bool = False,
                 failed: bool = False, exitcodes: dict[int, int] | None = None) -> RunReport:
    """report.json from the rank files; ``interrupted`` and ``failed`` say how the run ended (the backend's
    RunOutcome), ``exitcodes`` how the ranks that did not exit 0 ended, so the table, report.json and the exit code
    give one verdict. Ranks killed by a stop signal (SIGTERM, SIGINT, SIGHUP: a preemption) interrupt the run as
    a signal to the launcher does, when nothing else ended any rank: after a rank fails, torchrun stops the others
    with SIGTERM itself."""
    exitcodes = exitcodes or {}
    interrupted = interrupted or bool(exitcodes) and all(stopped_by_request(c) for c in exitcodes.values())
    ranks = run.rank_reports()
    rows = [rank_row(last_seen(run, ranks[k]), plan, interrupted=interrupted, exitcode=exitcodes.get(k))
            for k in sorted(ranks)]
    missing = sorted(set(range(expected_ranks)) - {row.rank for row in rows})
    bases = {row.basis for row in rows}
    plan_basis = plan.estimate.basis
    basis = bases.pop() if len(bases) == 1 else ("mixed" if bases else plan_basis)
    verdict = run_verdict(rows, missing, interrupted=interrupted, failed=failed)
    # The eval metrics are reduced over the ranks (every rank holds the same value): the run's, from the lowest rank.
    first = rows[0] if rows else None
    return RunReport(
        verdict=verdict,
        eval_loss=first.eval_loss if first else None,
        eval_accuracy=first.eval_accuracy if first else None,
        within_budget=verdict == "within_budget",
        # What measured and predicted peaks count: cpu_tensor_bytes (MemTracker) or cuda_reserved_plus_context.
        basis=basis,
        predicted_basis=plan_basis,
        budget_bytes=plan.budget_bytes,
        predicted_peak_bytes=predicted_on_basis(plan, basis) if basis != "mixed" else plan.estimate.peak_bytes,
        predicted_breakdown=dict(plan.estimate.breakdown),
        plan=plan.strategy.label(),
        # What the plan turned off in the training math (clipping, under the optimizer step in backward): its own
        # field, never picked out of the reasons by their words.
        math_notes=list(plan.math_notes),
        world_size=expected_ranks,
        missing_ranks=missing,
        ranks=rows,
        script_overrides=script_overrides(ranks.values()),
        data=read_data_summary(run.path),
    )


def script_overrides(ranks) -> list[ScriptOverride] | None:
    """The values a --script run's plan set in place of the script's own, each once over the ``ranks``
    (RankReports); None when no rank recorded any (not a script, or a script that builds no HF arguments)."""
    seen: dict[ScriptOverride, None] = {}
    for r in sorted(ranks, key=lambda r: r.rank):
        seen.update(dict.fromkeys(r.script_overrides or ()))
    return list(seen) or None


def over_budget_message(report: RunReport) -> str | None:
    """One sentence on the rank furthest over the budget and the category that grew most; None when none is over."""
    worst = [r for r in report.ranks if r.measured_peak_bytes > r.budget_bytes]
    if not worst:
        return None
    r = max(worst, key=lambda row: row.measured_peak_bytes)
    others = f" ({len(worst) - 1} more rank(s) over)" if len(worst) > 1 else ""
    return (f"rank {r.rank} on {r.host} peaked at {format_bytes(r.measured_peak_bytes)}, over the budget of "
            f"{format_bytes(r.budget_bytes)} by {format_bytes(-r.headroom_bytes)}; {r.grew_most} grew most "
            f"(+{format_bytes(r.grew_most_bytes)} over its prediction){others}")


def render_report(report: RunReport) -> str:
    """The report as printed: one line per rank (predicted, measured, budget, headroom, verdict, largest category),
    then missing ranks, evaluation and the verdict."""
    head = (f"{'rank':>4}  {'host':<12} {'predicted':>10} {'measured':>10} {'budget':>10} {'headroom':>10}  "
            f"{'verdict':<11} largest")
    lines = [head]
    for r in report.ranks:
        lines.append(
            f"{r.rank:>4}  {r.host[:12]:<12} {format_bytes(r.predicted_peak_bytes):>10} "
            f"{format_bytes(r.measured_peak_bytes) if r.measured else '-':>10} {format_bytes(r.budget_bytes):>10} "
            f"{format_bytes(r.headroom_bytes) if r.measured else '-':>10}  {r.verdict:<11} {r.largest_category or '-'}"
        )
    if report.missing_ranks:
        lines.append(f"missing ranks (no memory file): {report.missing_ranks}")
    if isinstance(report.eval_loss, (int, float)):
        acc = report.eval_accuracy
        lines.append(f"eval: loss {report.eval_loss:.4f}"
                     + (f", accuracy {acc:.1%}" if isinstance(acc, (int, float)) else ""))
    lines += report.math_notes
    if report.script_overrides:
        lines.append("the plan set in the script (script's value -> plan's): "
                     + "; ".join(f"{o.setting} {o.script} -> {o.plan}" for o in report.script_overrides))
    lines.append("verdict: " + verdict_line(report) + (f" (peaks count {report.basis})" if report.basis else ""))
    return "\n".join(lines)


def unmeasured(report: RunReport) -> list[int]:
    """Ranks that completed (exit 0, status completed) yet measured no memory: a script that made no tensor the
    probe sees, or exited at once. Their verdict is "failed" (0 bytes is no evidence of fitting), but nothing
    failed: the words must say so."""
    return [r.rank for r in report.ranks if r.status == "completed" and not r.measured and r.verdict == "failed"]


def verdict_line(report: RunReport) -> str:
    """The table's last line: the same verdict report.json records, in words."""
    verdict = report.verdict

    def which(v: str) -> list[int]:
        return [r.rank for r in report.ranks if r.verdict == v]

    over = f"; rank(s) {which('OVER')} already over budget" if which("OVER") else ""
    idle = unmeasured(report)
    failed = [r for r in which("failed") if r not in idle]
    said = "; ".join(([f"rank(s) {failed} failed"] if failed else []) + ([
        f"rank(s) {idle} completed without measuring any memory"] if idle else []))
    return {
        "within_budget": "every rank within budget",
        "interrupted": f"interrupted: the run stopped before it finished, so NOT shown within budget{over}",
        "oom": f"NOT within budget: rank(s) {which('oom')} ran out of memory",
        "failed": "NOT within budget: " + (said or "the run failed") + over,
        "over_budget": f"NOT within budget: rank(s) {which('OVER')} over",
        "incomplete": f"NOT within budget: rank(s) {report.missing_ranks} wrote no memory file",
    }.get(verdict, f"NOT within budget ({verdict})")


BUDGET_OFF_CHART = 3.0
"""memory.png draws the budget line only when the budget is at most this many times the largest peak; beyond
that a linear axis would flatten the bars, so the title states the budget instead."""


def plot_unit(largest_bytes: float) -> tuple[str, float]:
    """The decimal unit the peaks read best in (the same units users type), spelled out for an axis label."""
    unit, size = decimal_unit(largest_bytes)
    return ("bytes", 1.0) if unit == "B" else (unit, size)


def plot_memory(report: RunReport, path: Path) -> Path | None:
    """memory.png: per-rank measured peak vs prediction and budget, and the breakdown bars."""
    # The Figure API without pyplot, fixed margins and legend places: a third of the time of the pyplot
    # version with tight_layout and loc="best" (it sits between the ranks' exit and the verdict).
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    ranks = report.ranks
    if not ranks:
        return None
    budget = report.budget_bytes
    peak = max(max(r.measured_peak_bytes, r.predicted_peak_bytes) for r in ranks)
    budget_drawn = budget <= BUDGET_OFF_CHART * peak
    unit, size = plot_unit(max(peak, budget) if budget_drawn else peak)
    fig = Figure(figsize=(11, 4))
    FigureCanvasAgg(fig)
    ax1, ax2 = fig.subplots(1, 2)
    fig.subplots_adjust(left=0.07, right=0.98, bottom=0.24, top=0.9, wspace=0.35)
    xs = [r.rank for r in ranks]
    for dx, key, label in ((-0.2, "measured_peak_bytes", "measured"), (0.2, "predicted_peak_bytes", "predicted")):
        bars = ax1.bar([x + dx for x in xs], [getattr(r, key) / size for r in ranks], width=0.4, label=label)
        if len(ranks) <= 8:  # beyond that the labels overlap
            ax1.bar_label(bars, fmt="%.3g", fontsize=7)
    if budget_drawn:
        ax1.axhline(budget / size, color="red", linestyle="--", label="budget")
        ax1.set_title(f"peak per rank (budget {format_bytes(budget)})")
    else:
        ax1.set_title(f"peak per rank; budget {format_bytes(budget)} is {budget / peak:.0f}x the peak, off the chart")
    ax1.margins(y=0.15)
    ax1.set_xticks(xs)
    ax1.set_xlabel("rank")
    ax1.set_ylabel(f"{unit} (decimal)" if unit != "bytes" else "bytes")
    ax1.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncols=3, frameon=False)
    cats = list(CATEGORY_GROUPS)
    pred = [predicted_group(report.predicted_breakdown, c) / size for c in cats]
    meas = [measured_group(ranks[0].measured_breakdown, c) / size for c in cats]
    idx = range(len(cats))
    ax2.barh([i - 0.2 for i in idx], meas, height=0.4, label=f"measured (rank {ranks[0].rank})")
    ax2.barh([i + 0.2 for i in idx], pred, height=0.4, label="predicted")
    ax2.set_yticks(list(idx), cats)
    ax2.set_xlabel(f"{unit} at peak")
    ax2.set_title("breakdown")
    ax2.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncols=2, frameon=False)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    return atomic_write(path, buf.getvalue())  # 0600 like every file of the run dir (launcher.files.fsutil)
