"""Turn a finished cell's run dir into the numbers the tables show: errors per estimator, per category."""

from __future__ import annotations

import statistics
from dataclasses import asdict
from pathlib import Path

from benchmarks.accuracy.cells import Cell
from benchmarks.accuracy.estimators import external
from benchmarks.accuracy.harness import rank_files, read_json
from benchmarks.accuracy.moments import predicted_moments, total
from launcher.records.rankreport import RankReport
from launcher.records.report import CATEGORY_GROUPS
from launcher.records.runreport import read_report

ESTIMATORS = ("planner", "refit", "deepspeed", "accelerate")
TRAINING_PHASES = ("forward", "backward", "optimizer_step")
GOAL = 0.10
"""Relative error above which a cell's categories are explained in the results."""


def rel(pred: float | None, meas: float | None) -> float | None:
    """(predicted - measured) / measured; negative = the estimator said less than the run used."""
    return (pred - meas) / meas if pred is not None and meas else None


GROUPS = {**CATEGORY_GROUPS, "offloaded": (("offloaded",), ())}
"""report.CATEGORY_GROUPS plus what the planner counts as moved to the host: on CPU ranks that state is still
in the rank's memory, where the tracker files it under optimizer and grads."""


def grouped(breakdown: dict, side: int) -> dict[str, int]:
    """Bytes per group; side 0 reads predicted keys, 1 measured keys."""
    return {g: int(sum(breakdown.get(k, 0) for k in keys[side])) for g, keys in GROUPS.items()}


def predicted_moment(breakdown: dict) -> str:
    """The planner's peak moment: backward start (activations counted) or the optimizer step (none)."""
    return "backward" if breakdown.get("activations", 0) or breakdown.get("logits", 0) else "optimizer_step"


def analyze(cell: Cell, run_dir: Path, plan: dict | None = None) -> dict | None:
    """One row of the matrix; ``plan`` replaces the run's plan.json (a replan with the current planner)."""
    report = read_report(run_dir)
    plan = plan or read_json(run_dir / "plan.json")
    if report is None or plan is None or not report.ranks:
        return None
    # The budget is per rank: the row reports the rank that used the most.
    worst = max(report.ranks, key=lambda r: r.measured_peak_bytes)
    rank = rank_files(run_dir).get(worst.rank)
    measured = worst.measured_peak_bytes
    pred_bd = {k: int(v) for k, v in plan["breakdown"].items()}
    ext = external(cell, plan.get("precision", "bf16"))
    figures = {"planner": int(plan["predicted_peak_bytes"]), "deepspeed": ext.deepspeed_bytes,
               "accelerate": ext.accelerate_bytes}
    moment = predicted_moment(pred_bd)
    phase_bd = (rank and rank.phase_breakdown) or {}
    moments = moment_rows(predicted_moments(run_dir), rank)
    return {
        "cell": cell.name, **asdict(cell), "label": plan.get("label"), "run_dir": str(run_dir),
        "status": [r.status for r in report.ranks],
        "worst_rank": worst.rank,
        "measured_peak_bytes": measured,
        "measured_per_rank": {r.rank: r.measured_peak_bytes for r in report.ranks},
        "training_peak_bytes": rank and rank.training_peak_bytes,
        "peak_phase": rank and rank.peak_phase,
        "cuda_max_allocated_bytes": worst.max_memory_allocated_bytes,
        "cuda_max_reserved_bytes": worst.max_memory_reserved_bytes,
        "predicted": figures,
        "errors": {k: rel(v, measured) for k, v in figures.items()},
        "planner_breakdown": pred_bd,
        "planner_moment": moment,
        "measured_breakdown": worst.measured_breakdown,
        "measured_phase_breakdown": phase_bd,
        "categories_at_peak": compare_categories(pred_bd, worst.measured_breakdown),
        "moments": moments,
        "moment_totals": moment_totals(plan.get("moment_bytes") or {}, rank.phases if rank else {}),
        "deepspeed_row": ext.deepspeed_row,
        "accelerate_fp32_bytes": ext.accelerate_fp32_bytes,
        "total_params": ext.total_params,
        "activation_constants_source": (plan.get("constants", {}).get("activations") or {}).get("source"),
        "step_time_s": None,
    }


def measured_moment(rank: RankReport | None, moment: str) -> tuple[str | None, int | None, dict]:
    """(phase, peak, categories) measured for a planner moment: the backward start is the larger of the
    forward and backward phase peaks (the loss's temporaries are made in forward), the step its own phase."""
    phases = rank.phases if rank else {}
    names = ("forward", "backward") if moment == "backward" else ("optimizer_step",)
    seen = [(phases[p], p) for p in names if p in phases]
    if not seen:
        return None, None, {}
    peak, phase = max(seen)
    return phase, int(peak), (rank.phase_breakdown or {}).get(phase) or {}


MOMENT_PHASES = {"backward": ("forward", "backward"), "backward_end": ("backward",), "step": ("optimizer_step",),
                 "init": ("init",), "export": ("export",)}
"""Which measured phase peaks each planner moment is judged against: the backward start (loss temporaries are
made in forward) against the larger of forward and backward, the gradient reduce / end of backward against the
backward phase, the optimizer step against its own phase, rank 0's weight load against the init phase, rank 0's
end-of-run export (CPU ranks only) against the export phase."""


def moment_totals(moment_bytes: dict[str, int], phases: dict[str, int]) -> dict[str, dict]:
    """Every moment the planner predicts (plan.json moment_bytes) beside the matching measured phase peak (a rank
    report's phases)."""
    out = {}
    for moment, names in MOMENT_PHASES.items():
        if moment not in moment_bytes:
            continue
        seen = [(phases[p], p) for p in names if p in phases]
        peak, phase = max(seen) if seen else (None, None)
        out[moment] = {"predicted_bytes": int(moment_bytes[moment]), "measured_phase": phase,
                       "measured_bytes": None if peak is None else int(peak),
                       "error": rel(moment_bytes[moment], peak)}
    return out


def moment_rows(predicted: dict | None, rank: RankReport | None) -> dict | None:
    if predicted is None:
        return None
    out = {}
    for moment, bd in predicted.items():
        phase, peak, cats = measured_moment(rank, moment)
        pred = total(bd)
        out[moment] = {"predicted_bytes": pred, "predicted_offloaded_bytes": int(bd.get("offloaded", 0)),
                       "measured_phase": phase, "measured_bytes": peak, "error": rel(pred, peak),
                       "categories": compare_categories(bd, cats)}
    return out


def compare_categories(pred_bd: dict, meas_bd: dict) -> dict[str, dict[str, int]]:
    p, m = grouped(pred_bd, 0), grouped(meas_bd, 1)
    return {g: {"predicted": p[g], "measured": m[g], "diff": p[g] - m[g]} for g in GROUPS}


def peak_moment(row: dict) -> str:
    """The planner moment the run actually peaked at."""
    return "optimizer_step" if row.get("peak_phase") == "optimizer_step" else "backward"


def wrong_terms(row: dict, limit: int = 3) -> str:
    """The categories that make up most of a cell's error at the moment the run peaked, largest first, signed
    (+ = predicted too much); at the measured peak's categories when the moments are not available."""
    m = (row.get("moments") or {}).get(peak_moment(row))
    source = m["categories"] if m else row["categories_at_peak"]
    cats = sorted(source.items(), key=lambda kv: -abs(kv[1]["diff"]))
    parts = [f"{g} {_mb(c['diff'], signed=True)} (pred {_mb(c['predicted'])} / meas {_mb(c['measured'])})"
             for g, c in cats[:limit] if c["diff"]]
    return "; ".join(parts) or "-"


def summary(rows: list[dict]) -> dict[str, dict[str, float]]:
    """Per estimator: median and max |error|, median signed, how many under, within GOAL, the worst under."""
    out = {}
    for est in ESTIMATORS:
        errs = [r["errors"][est] for r in rows if r["errors"].get(est) is not None]
        if not errs:
            continue
        absd = [abs(e) for e in errs]
        out[est] = {"median_abs": statistics.median(absd), "max_abs": max(absd),
                    "median_signed": statistics.median(errs),
                    "under": sum(e < 0 for e in errs), "within_goal": sum(a <= GOAL for a in absd), "cells": len(errs),
                    "within_5": sum(a <= 0.05 for a in absd), "worst_under": min(0.0, min(errs))}
    return out


def category_bias(rows: list[dict], moment: str | None = None) -> dict[str, dict[str, dict[str, float]]]:
    """Per engine family and category: median predicted/measured ratio and median signed byte difference,
    at the measured peak (moment None) or at one planner moment (backward, optimizer_step)."""
    def cats(r):
        if moment is None:
            return r["categories_at_peak"]
        m = (r.get("moments") or {}).get(moment)
        return m["categories"] if m else None

    fams: dict[str, list[dict]] = {}
    for r in rows:
        if cats(r) is None:
            continue
        fams.setdefault(family(r["sharding"]), []).append(r)
    fams["all"] = [r for rs in fams.values() for r in rs]
    out = {}
    for fam, rs in fams.items():
        if not rs:
            continue
        out[fam] = {}
        for g in GROUPS:
            diffs = [cats(r)[g]["diff"] for r in rs]
            meas = [cats(r)[g]["measured"] for r in rs]
            # A ratio to a few stray bytes (a 8 kB buffer against a 19 MB bucket) says nothing: 1 % of the peak.
            ratios = [cats(r)[g]["predicted"] / cats(r)[g]["measured"] for r in rs
                      if cats(r)[g]["measured"] > 0.01 * r["measured_peak_bytes"]]
            out[fam][g] = {"median_diff_bytes": statistics.median(diffs),
                           "median_measured_bytes": statistics.median(meas),
                           "median_ratio": statistics.median(ratios) if ratios else None}
    return out


def family(sharding: str) -> str:
    return {"z1": "ZeRO-1", "z2": "ZeRO-2", "z3": "ZeRO-3", "z3off": "ZeRO-3+off"}.get(sharding, "FSDP2")


def _mb(n: float, signed: bool = False) -> str:
    return f"{n / 1e6:+.2f} MB" if signed else f"{n / 1e6:.2f} MB"


def moment_summary(rows: list[dict]) -> dict[str, dict[str, float]]:
    """Per planner moment: cells, median and max |error|, worst under-prediction, against the matching phase."""
    out = {}
    for moment in MOMENT_PHASES:
        errs = [r["moment_totals"][moment]["error"] for r in rows
                if (r.get("moment_totals") or {}).get(moment, {}).get("error") is not None]
        if errs:
            absd = [abs(e) for e in errs]
            out[moment] = {"cells": len(errs), "median_abs": statistics.median(absd), "max_abs": max(absd),
                           "median_signed": statistics.median(errs), "worst_under": min(0.0, min(errs))}
    return out
