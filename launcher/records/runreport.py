"""RUN_DIR/report.json: the run's verdict, one row per rank, and with --auto-fallback the ladder's attempts.

Built by launcher.records.report.build_report (the rows and verdict), launcher.session.finish (how the ranks ended) and
launcher.session.ladder (the attempts). The keys on disk are the field names, as before the type existed.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from launcher.planner.plan import Strategy
from launcher.records.datasummary import DataSummary
from launcher.records.rankreport import RankStatus, ScriptOverride

REPORT_SCHEMA = 1
"""Version of report.json's layout; from_json refuses a newer one rather than misread it."""
RunVerdict = Literal["within_budget", "over_budget", "oom", "failed", "interrupted", "incomplete"]
"""The run's one verdict (launcher.records.report.run_verdict), which decides state.json and the exit code."""
RankVerdict = Literal["ok", "OVER", "oom", "failed", "interrupted"]
"""One rank's verdict (launcher.records.report.rank_verdict): ok only for a rank that ran every step within budget."""


def _known(cls, d: dict) -> dict:
    """The entries of ``d`` that are fields of ``cls``: a key an older or newer writer added is ignored."""
    return {f.name: d[f.name] for f in dataclasses.fields(cls) if f.name in d}


@dataclass(kw_only=True, slots=True)
class RankRow:
    """One rank's line of the report: its measured peak against the prediction and the budget."""

    rank: int
    """Global rank."""
    host: str = "?"
    """Host name of the node."""
    device: str = "cpu"
    """Device type: cpu or cuda."""
    status: RankStatus = "unknown"
    """The status its rank file records (launcher.records.rankreport.RankReport.status)."""
    verdict: RankVerdict = "failed"
    """ok, OVER, oom, failed or interrupted (launcher.records.report.rank_verdict)."""
    measured: bool = False
    """Whether the rank measured a peak (above 0 bytes)."""
    basis: str = "cpu_tensor_bytes"
    """What measured and predicted count: cpu_tensor_bytes, cuda_reserved_plus_context (cuda_allocated: old)."""
    measured_peak_bytes: int = 0
    """Its measured peak, bytes."""
    predicted_peak_bytes: int = 0
    """The plan's peak on the same basis, bytes."""
    budget_bytes: int = 0
    """The per-GPU budget, bytes."""
    headroom_bytes: int = 0
    """Budget less the measured peak, bytes (negative: over)."""
    within_budget: bool = False
    """Completed, measured, and at most the budget."""
    relative_error: float | None = None
    """(predicted - measured) / measured; None when nothing was measured."""
    largest_category: str | None = None
    """The largest category of the measured peak."""
    grew_most: str | None = None
    """The category group most over its prediction (launcher.records.categories.grown_category)."""
    grew_most_bytes: int = 0
    """By how much, bytes."""
    measured_breakdown: dict[str, int] = field(default_factory=dict)
    """Measured bytes by category at the peak."""
    phases: dict[str, int] = field(default_factory=dict)
    """Measured peak per phase, bytes."""
    peak_rss_bytes: int | None = None
    """The rank's peak resident set, bytes."""
    max_memory_allocated_bytes: int | None = None
    """CUDA: max_memory_allocated, bytes."""
    max_memory_reserved_bytes: int | None = None
    """CUDA: max_memory_reserved, bytes."""
    outside_allocator_bytes: int | None = None
    """CUDA: bytes outside the caching allocator, bytes."""
    first_loss: float | None = None
    """The first logged loss."""
    final_loss: float | None = None
    """The last logged loss."""
    eval_loss: float | None = None
    """The run's last eval loss."""
    eval_accuracy: float | None = None
    """seq_cls: the run's last eval accuracy, a fraction."""
    steps_done: int | None = None
    """Optimizer steps the rank did."""
    stop_reason: str | None = None
    """Why it stopped before its last step (SIGTERM, SIGUSR2, control file, another rank asked), as it recorded."""
    ended: str | None = None
    """How its process ended when not with exit 0, where the backend saw it: "killed by SIGKILL", "exit code 1"."""

    def to_json(self) -> dict:
        """The row as report.json's dict."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> RankRow:
        """A row read from report.json; rows written before ``measured`` and ``verdict`` existed get them derived."""
        row = cls(**_known(cls, d))
        if "measured" not in d:  # rows before the field
            row.measured = row.measured_peak_bytes > 0
        if "verdict" not in d:  # rows before the field knew only within or over
            row.verdict = ("ok" if row.within_budget else "OVER" if row.measured_peak_bytes > row.budget_bytes
                           else "failed")
        return row


@dataclass(kw_only=True, slots=True)
class RankFailure:
    """A rank process that exited non-zero: which, with what code, on which host."""

    rank: int
    """Global rank."""
    exitcode: int
    """Its exit code; launcher.errors.EXIT_OOM (75) means the rank ran out of memory."""
    host: str = "?"
    """Its node."""


@dataclass(kw_only=True, slots=True)
class RunOutcome:
    """How the ranks ended before the memory verdict, as the backend saw them (launcher.backends.base.Backend.run
    returns it; report.json keeps it)."""

    ok: bool
    """Every rank process exited 0."""
    interrupted: bool = False
    """A signal or a cancel stopped the run."""
    message: str = ""
    """The backend's words for how it ended."""
    failures: list[RankFailure] = field(default_factory=list)
    """The ranks that exited non-zero."""
    pending: bool = False
    """The ranks were handed to a scheduler and are not followed (Slurm without --wait, or a follower stopped by
    Ctrl-C): no verdict yet, the job writes its own report. Not kept in report.json (a report has a verdict)."""

    def to_json(self) -> dict:
        """The outcome as report.json's dict."""
        out = dataclasses.asdict(self)
        del out["pending"]
        return out

    @classmethod
    def from_json(cls, d: dict) -> RunOutcome:
        """An outcome read from report.json, its rank failures included; unknown keys are ignored."""
        known = _known(cls, d)
        known["failures"] = [RankFailure(**_known(RankFailure, f)) for f in d.get("failures", [])]
        return cls(**{"ok": False, **known})


@dataclass(kw_only=True, slots=True)
class AttemptOom:
    """Where an attempt's worst rank ran out of memory."""

    rank: int | None
    """The rank."""
    phase: str | None
    """The phase (forward, backward, optimizer_step, ...)."""
    step: int | None
    """The optimizer step (1-based)."""


@dataclass(kw_only=True, slots=True)
class NextRung:
    """What the ladder tried next after an attempt, and why (launcher.planner.fallback.Fallback)."""

    label: str
    """The next strategy's label."""
    rung: str | None
    """The rung whose change made it fit."""
    reason: str
    """One line: what failed, what changes, the corrected prediction."""
    predicted_peak_bytes: int = 0
    """The planner's prediction for it, bytes."""
    corrected_peak_bytes: int = 0
    """The same corrected by the measurement, bytes."""
    skipped: list[str] = field(default_factory=list)
    """Rungs passed over on the way, each with why."""


@dataclass(kw_only=True, slots=True)
class Attempt:
    """One attempt of the --auto-fallback ladder (launcher.session.ladder)."""

    attempt: int
    """1 for the plan, then one more per relaunch."""
    label: str
    """Its strategy's label."""
    strategy: Strategy
    """The strategy it ran."""
    outcome: str
    """ok, oom, over_budget, interrupted or failed."""
    exit_code: int
    """The attempt's exit code (launcher.errors)."""
    global_batch_size: int
    """Sequences per optimizer step over all ranks."""
    predicted_peak_bytes: int
    """The plan's predicted peak per rank, bytes."""
    budget_bytes: int
    """The per-GPU budget, bytes."""
    measured_peak_bytes: int | None = None
    """The worst rank's measured peak, bytes (for an OOM where it stopped: a lower bound); None: unmeasured."""
    oom: AttemptOom | None = None
    """Where it ran out of memory, if it did."""
    seconds: float = 0.0
    """Wall time of the attempt, seconds."""
    dir: str = "."
    """Where its files are, relative to the run dir: "." (the last) or attempts/<k>."""
    next: NextRung | None = None
    """The next attempt's strategy and why; None for the last."""
    stopped: str | None = None
    """Why the ladder stopped after it, when it stopped for lack of memory (written only then)."""

    def to_json(self) -> dict:
        """The attempt as report.json's dict (``stopped`` only when set)."""
        out = dataclasses.asdict(self)
        out["strategy"] = self.strategy.to_json()  # flat, as plan.json writes it
        if self.stopped is None:
            del out["stopped"]
        return out

    @classmethod
    def from_json(cls, d: dict) -> Attempt:
        """An attempt read from report.json, with its strategy, OOM and next rung; unknown keys are ignored."""
        known = _known(cls, d)
        known["strategy"] = Strategy.from_json(d["strategy"])
        known["oom"] = AttemptOom(**_known(AttemptOom, d["oom"])) if d.get("oom") else None
        known["next"] = NextRung(**_known(NextRung, d["next"])) if d.get("next") else None
        return cls(**known)


@dataclass(kw_only=True, slots=True)
class FallbackSummary:
    """report.json's "auto_fallback": how the ladder went."""

    tries: int
    """Relaunches allowed (--auto-fallback N)."""
    relaunches: int
    """Relaunches made."""
    ended_within_budget: bool
    """The last attempt ended within the budget."""


# Written only when set: finish() adds plan_sha256 and outcome, the ladder adds auto_fallback and attempts.
_WHEN_SET = ("plan_sha256", "outcome", "auto_fallback", "attempts", "script_overrides", "data")


@dataclass(kw_only=True, slots=True)
class RunReport:
    """report.json: one verdict for the run (launcher.records.report.RUN_VERDICTS) and a row per rank that wrote a
    file."""

    verdict: RunVerdict = "incomplete"
    """within_budget, over_budget, oom, failed, interrupted or incomplete."""
    eval_loss: float | None = None
    """The run's last eval loss, from the lowest rank."""
    eval_accuracy: float | None = None
    """seq_cls: the run's last eval accuracy, a fraction."""
    within_budget: bool = False
    """verdict == within_budget."""
    basis: str = "cpu_tensor_bytes"
    """What the ranks' peaks count (mixed: ranks differ)."""
    predicted_basis: str = "cpu_tensor_bytes"
    """What the plan's prediction counted."""
    budget_bytes: int = 0
    """The per-GPU budget, bytes."""
    predicted_peak_bytes: int = 0
    """The plan's peak on the ranks' basis, bytes."""
    predicted_breakdown: dict[str, int] = field(default_factory=dict)
    """The plan's bytes per rank by category."""
    plan: str | None = None
    """The plan's strategy label."""
    math_notes: list[str] = field(default_factory=list)
    """The plan's words for math a lever changed (clipping off under the step in backward)."""
    world_size: int = 0
    """Ranks expected."""
    missing_ranks: list[int] = field(default_factory=list)
    """Ranks that wrote no file."""
    ranks: list[RankRow] = field(default_factory=list)
    """One row per rank file, by rank."""
    script_overrides: list[ScriptOverride] | None = None
    """launch --script: each value the plan set in place of the script's own, over all ranks (each once)."""
    plan_sha256: str | None = None
    """Digest of the plan.json the launcher planned (launcher.processes.rankenv.plan_digest)."""
    outcome: RunOutcome | None = None
    """How the backend saw the ranks end."""
    auto_fallback: FallbackSummary | None = None
    """With --auto-fallback: how the ladder went."""
    attempts: list[Attempt] | None = None
    """With --auto-fallback: every attempt, first to last."""
    data: DataSummary | None = None
    """What the data held as the ranks trained on it (the launcher's count before the launch: RUN/data.json);
    None for a --script run and for reports written before it."""
    schema: int = REPORT_SCHEMA
    """Layout version of this file."""

    def to_json(self) -> dict:
        """The report as report.json's dict: optional fields only when set, ranks and attempts as their own dicts."""
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None and f.name in _WHEN_SET:
                continue
            if f.name == "ranks":
                value = [r.to_json() for r in value]
            elif f.name in ("attempts", "script_overrides"):
                value = [a.to_json() for a in value]
            elif f.name == "data":
                value = value.to_json()
            elif dataclasses.is_dataclass(value):
                value = dataclasses.asdict(value)
            out[f.name] = value
        return out

    @classmethod
    def from_json(cls, d: dict) -> RunReport:
        """A report.json; one written before a field (the schema included) reads with that field's default."""
        if int(d.get("schema", 1)) > REPORT_SCHEMA:
            raise ValueError(f"report.json schema {d['schema']} is newer than this launcher reads "
                             f"({REPORT_SCHEMA}); upgrade launcher")
        known = _known(cls, d)
        known["ranks"] = [RankRow.from_json(r) for r in d.get("ranks", [])]
        if d.get("outcome") is not None:
            known["outcome"] = RunOutcome.from_json(d["outcome"])
        if d.get("auto_fallback") is not None:
            known["auto_fallback"] = FallbackSummary(**_known(FallbackSummary, d["auto_fallback"]))
        if isinstance(d.get("script_overrides"), list):
            known["script_overrides"] = [ScriptOverride.from_json(o) for o in d["script_overrides"]
                                         if isinstance(o, dict)]
        if d.get("attempts") is not None:
            known["attempts"] = [Attempt.from_json(a) for a in d["attempts"]]
        if d.get("data") is not None:
            known["data"] = DataSummary.from_json(d["data"])
        if "within_budget" in d and "verdict" not in d:  # reports before the verdict field
            known["verdict"] = "within_budget" if d["within_budget"] else "over_budget"
        return cls(**known)


def read_report(run_dir: Path) -> RunReport | None:
    """RUN_DIR/report.json, or None where there is none (the run has not finished) or it cannot be read."""
    p = Path(run_dir) / "report.json"
    try:
        return RunReport.from_json(json.loads(p.read_text()))
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None
