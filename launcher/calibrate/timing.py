"""Fit each engine's fixed seconds per step from finished runs: measured step time minus the cost model's
other terms (launcher.planner.cost), the median over runs, per hardware profile and engine."""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from launcher.engines import NAMES
from launcher.planner.hardware import OVERHEAD_SUFFIX
from launcher.planner.plan import PLAN_JSON, read_plan
from launcher.records.steprow import read_rows

FIELD = {name: name + OVERHEAD_SUFFIX for name in NAMES}
"""The calibration file key each engine's overhead is written to (HardwareProfile.with_overrides reads it into
step_overhead_s, keyed by engine)."""
MIN_INTERVALS = 2
"""Step-to-step intervals a run needs after its first step (which carries one-off start-up costs)."""


@dataclass(kw_only=True, slots=True)
class StepSample:
    """One finished run's step time: measured on rank 0 against the cost model's terms other than the engine's."""

    run: str
    profile: str
    engine: str
    measured_s: float
    """Median seconds between consecutive steps on rank 0, the first step left out."""
    modeled_s: float
    """The plan's predicted seconds per step without its engine term."""

    @property
    def residual_s(self) -> float:
        """Measured minus modeled seconds per step: this run's estimate of the engine's fixed overhead."""
        return self.measured_s - self.modeled_s


def measured_step_s(run_dir: Path) -> float | None:
    """Median seconds between consecutive step lines of rank 0; None with fewer than MIN_INTERVALS intervals."""
    path = run_dir / "steps" / "rank-0.jsonl"
    if not path.is_file():
        return None
    stamps = [r.time for r in read_rows(path.read_text().splitlines()) if r.time is not None]
    intervals = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
    return statistics.median(intervals) if len(intervals) >= MIN_INTERVALS else None


def step_sample(run_dir: Path) -> StepSample | None:
    """A run dir's StepSample; None when it has too few steps, no plan.json, an unknown engine or no step-time terms."""
    measured = measured_step_s(run_dir)
    if measured is None or not (run_dir / PLAN_JSON).is_file():
        return None
    plan = read_plan(run_dir)
    terms, engine = plan.estimate.step_time_terms, plan.strategy.engine
    if engine not in FIELD or not terms:
        return None
    modeled = sum(v for k, v in terms.items() if k != "engine")
    return StepSample(run=str(run_dir), profile=plan.hardware, engine=engine, measured_s=measured, modeled_s=modeled)


def fit_overheads(run_dirs: list[Path]) -> dict[str, dict[str, tuple[float, list[StepSample]]]]:
    """{profile: {HardwareProfile field: (seconds, samples)}}; never negative (a faster run than modeled means
    the other terms over-predict, which is not the engine's doing)."""
    groups: dict[tuple[str, str], list[StepSample]] = defaultdict(list)
    for d in run_dirs:
        s = step_sample(Path(d))
        if s is not None:
            groups[(s.profile, s.engine)].append(s)
    out: dict[str, dict[str, tuple[float, list[StepSample]]]] = defaultdict(dict)
    for (profile, engine), samples in groups.items():
        out[profile][FIELD[engine]] = (max(0.0, statistics.median(s.residual_s for s in samples)), samples)
    return dict(out)
