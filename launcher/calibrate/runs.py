"""Read finished run dirs into fit samples: the planner's activation terms beside the measured bytes."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from launcher.calibrate.fit import Sample, coefficients
from launcher.calibrate.profiles import numeric_fields
from launcher.config.job import Job
from launcher.config.load import from_dict, load_yaml
from launcher.errors import ConfigError
from launcher.files.rundir import RunDir
from launcher.planner.memory import ActivationConstants
from launcher.planner.plan import read_plan
from launcher.records.categories import CATEGORY_GROUPS
from launcher.records.rankreport import RankReport
from launcher.records.runreport import read_report

ACTIVATION_PHASES = ("forward", "backward")
"""Phases whose peak holds the saved activations (the optimizer step's peak holds none)."""
PRED_KEYS, MEAS_KEYS = CATEGORY_GROUPS["activations"]
SCALE = 1e12
"""Constants are multiplied by this before predicting, so the backward start (where the activation group lives)
is the planner's peak moment whatever the states and buffers are; the bytes are divided back. That relies on
activation bytes being proportional to the constants, which activation_bytes() checks."""


def measured_activation_bytes(rank: RankReport) -> float:
    """Activations + temp at the forward or backward peak, whichever holds more; 0 when not recorded."""
    by_phase = rank.phase_breakdown or {}
    vals = [sum(int(by_phase[p].get(k, 0)) for k in MEAS_KEYS) for p in ACTIVATION_PHASES if p in by_phase]
    if vals:
        return float(max(vals))
    cats = rank.peak_by_category or {}
    return float(sum(int(cats.get(k, 0)) for k in MEAS_KEYS))


def rank_records(run_dir: Path) -> list[RankReport]:
    """The run's rank files; where they are gone, what report.json kept of them (its rows' peak breakdown)."""
    reports = RunDir(run_dir).rank_reports()
    if reports:
        return [reports[r] for r in sorted(reports)]
    report = read_report(run_dir)
    return [RankReport(rank=row.rank, status=row.status, steps_done=row.steps_done or 0,
                       measured_peak_bytes=row.measured_peak_bytes, peak_by_category=row.measured_breakdown)
            for row in (report.ranks if report else [])]


def constants_dict(c: ActivationConstants) -> dict[str, float]:
    """The constants' numeric fields as a dict."""
    return {k: float(getattr(c, k)) for k in numeric_fields()}


def with_constants(c: ActivationConstants, values: dict[str, float]) -> ActivationConstants:
    """A copy with ``values`` applied, marked as fitted (source "fit")."""
    return dataclasses.replace(c, **values, source="fit")


def run_job(run_dir: Path) -> Job:
    """The run's job as the ranks read it (launcher.worker.main): no check that its data still exists."""
    job = from_dict(Job, load_yaml(run_dir / "job.yaml"))
    job.base_dir = str(run_dir)
    return job


def activation_bytes(req, strategy, consts: ActivationConstants, values: dict[str, float]) -> dict[str, float]:
    """The planner's activation-group bytes (by predicted key) under ``values``, at the backward start.

    Raises ConfigError when the bytes are not proportional to the constants (the scaling would be wrong).
    """
    from launcher.planner.search import score

    def at(scale: float) -> dict[str, float]:
        c = with_constants(consts, {k: v * scale for k, v in values.items() if k in numeric_fields()
                                    and k != "probe_seq_len"})
        bd = score(dataclasses.replace(req, activations=c), strategy).estimate.breakdown
        return {k: bd.get(k, 0) / scale for k in PRED_KEYS}

    one, two = at(SCALE), at(2 * SCALE)
    if any(abs(one[k] - two[k]) > 1e-6 * max(abs(one[k]), 1.0) for k in PRED_KEYS):
        raise ConfigError("the memory model's activation bytes are not proportional to its constants; "
                          "the least-squares fit does not apply")
    return one


def samples_from_run(run_dir: Path) -> list[Sample]:
    """One sample per rank that finished training; raises ConfigError naming what the run dir lacks."""
    from launcher.inputs.plan_inputs import model_stats, plan_request
    from launcher.planner.search import score

    run_dir = Path(run_dir)
    missing = [n for n in ("job.yaml", "plan.json") if not (run_dir / n).is_file()]
    if missing:
        raise ConfigError(f"{run_dir}: no {' or '.join(missing)}; give run dirs that `launch` wrote")
    plan = read_plan(run_dir)
    job = run_job(run_dir)
    job.cluster.hardware = plan.hardware
    stats = model_stats(job)
    req = plan_request(job, script=plan.script)  # a script's run is refit as the script it ran
    consts = req.activations
    current = constants_dict(consts)

    def group(values: dict[str, float]) -> float:
        return float(sum(activation_bytes(req, plan.strategy, consts, values).values()))

    def peak_of(values: dict[str, float]) -> float:
        r = dataclasses.replace(req, activations=with_constants(consts, values))
        return float(score(r, plan.strategy).estimate.peak_bytes)

    # probe_seq_len: where the constants were measured, not a term. reduce_bytes_per_token: the gradient reduce's own
    # term (launcher.planner.memory), never at the backward start the fit reads: it keeps the probe's value.
    names = [k for k in current if k not in ("probe_seq_len", "reduce_bytes_per_token")]
    base, coef, nonlinear = coefficients(group, names, current)
    if nonlinear > 1e-3:
        raise ConfigError(f"{run_dir}: the memory model is not linear in its activation constants "
                          f"({nonlinear:.1%} off); the least-squares fit does not apply")
    out = []
    for r in rank_records(run_dir):
        if r.status not in ("completed", "checkpointed") or not r.steps_done:
            continue
        measured = measured_activation_bytes(r)
        if measured <= 0:
            continue
        out.append(Sample(
            name=f"{run_dir.name}/rank-{r.rank}", measured_bytes=measured, base_bytes=base, coefficients=coef,
            current=current, measured_peak_bytes=float(r.measured_peak_bytes), peak_of=peak_of,
            group=(stats.model_type, plan.hardware),
            architecture=f"h{stats.hidden_size}-L{stats.num_blocks}-I{stats.intermediate_size}-V{stats.vocab_size}",
        ))
    return out
