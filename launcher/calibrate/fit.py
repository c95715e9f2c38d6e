"""Refit the activation constants from measured runs: least squares with a pull towards the current constants.

The memory model's activation group (CATEGORY_GROUPS["activations"]: activations + logits) is linear in the
ActivationConstants numbers, so each run gives one equation ``base + sum_j x_j * c_j = measured`` whose
coefficients ``x_j`` come from the planner itself (predict with c_j = 1 and every other constant 0). That keeps
the fit right whatever formula launcher/planner/memory.py uses, as long as it stays linear in the constants.

Some constants multiply the same quantity in every run (e.g. two per-token terms that only differ with
checkpointing, when no run checkpoints): the runs cannot tell them apart, so a small ridge term keeps each at
its current value unless the runs say otherwise, and constants stay >= 0.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

RIDGE = 1e-6
"""Weight of the pull towards the current constants, relative to one run's squared relative error."""


@dataclass(kw_only=True, slots=True)
class Sample:
    """One rank of one run: what the model predicts per unit of each constant, and what was measured."""

    name: str
    measured_bytes: float
    """Measured activation-group bytes (activations + temp) at the backward / forward peak."""
    base_bytes: float
    """Predicted activation-group bytes with every constant at 0."""
    coefficients: dict[str, float]
    """Predicted bytes per unit of each constant."""
    current: dict[str, float]
    """The constants the planner uses for this run now."""
    measured_peak_bytes: float = 0.0
    peak_of: Callable[[dict[str, float]], float] | None = field(default=None, repr=False)
    """Predicted peak per rank under given constants (the peak is not linear in them: a max of moments)."""
    group: tuple[str, str] = ("", "")
    """(model_type, hardware profile): which constants file the sample belongs to."""
    architecture: str = ""
    """The model's shape (width, blocks, MLP width, vocabulary): constants are bytes per token of one shape."""


@dataclass(kw_only=True, slots=True)
class FitResult:
    """The activation constants after a fit, which were fitted, the prior they were pulled to, and per-sample errors."""

    constants: dict[str, float]
    """All numeric constants after the fit (unfitted ones at the prior)."""
    fitted: list[str]
    prior: dict[str, float]
    """Where the ridge pulls: the median over samples of the current constants."""
    rows: list[dict] = field(default_factory=list)
    """Per sample: measured, predicted before and after, relative errors."""

    def summary(self) -> dict[str, float]:
        """Median, maximum and RMS absolute relative errors of the activation-group and peak predictions, before and
        after the fit."""
        out = {}
        for key in ("act_err_before", "act_err_after", "peak_err_before", "peak_err_after"):
            vals = [abs(r[key]) for r in self.rows if r[key] is not None]
            out[f"median_abs_{key}"] = float(np.median(vals)) if vals else float("nan")
            out[f"max_abs_{key}"] = float(max(vals)) if vals else float("nan")
            # What the least squares minimizes (relative errors): it can fall while the median rises.
            out[f"rms_{key}"] = float(np.sqrt(np.mean(np.square(vals)))) if vals else float("nan")
        return out


def predict(sample: Sample, constants: dict[str, float]) -> float:
    """The sample's predicted activation-group bytes under ``constants`` (linear: base plus coefficient x constant)."""
    return sample.base_bytes + sum(x * constants.get(k, 0.0) for k, x in sample.coefficients.items())


def solve(x: np.ndarray, y: np.ndarray, prior: np.ndarray, ridge: float = RIDGE) -> np.ndarray:
    """min |x c - y|^2 + ridge * n * |s * (c - prior)|^2 subject to c >= 0, s = column scales.

    Rows should already be weighted (divided by the measured value, so errors are relative). An active set
    loop: solve, pin the most negative constant at 0, repeat; at most one pass per constant.
    """
    n, k = x.shape
    scale = np.sqrt((x * x).mean(axis=0))
    scale = np.where(scale > 0, scale, 1.0)  # a constant no run depends on stays at its prior
    free = np.ones(k, dtype=bool)
    c = prior.astype(float).copy()
    for _ in range(k + 1):
        idx = np.flatnonzero(free)
        if idx.size == 0:
            break
        fixed = ~free
        rhs = y - x[:, fixed] @ c[fixed]
        reg = np.sqrt(ridge * max(n, 1)) * np.diag(scale[idx])
        a = np.vstack([x[:, idx], reg])
        b = np.concatenate([rhs, reg @ prior[idx]])
        sol, *_ = np.linalg.lstsq(a, b, rcond=None)
        c[idx] = sol
        if (sol >= 0).all():
            break
        worst = idx[np.argmin(sol)]
        c[worst], free[worst] = 0.0, False
    return np.maximum(c, 0.0)


def fit(samples: Sequence[Sample], terms: Sequence[str] | None = None, ridge: float = RIDGE) -> FitResult:
    """Fit ``terms`` (default: every constant some sample depends on) to the measured activation bytes."""
    if not samples:
        raise ValueError("no samples to fit")
    names = list(samples[0].current)
    prior = {k: float(np.median([s.current.get(k, 0.0) for s in samples])) for k in names}
    if terms is None:
        terms = [k for k in names if any(s.coefficients.get(k, 0.0) for s in samples)]
    terms = [t for t in terms if t in prior]
    fixed = {k: v for k, v in prior.items() if k not in terms}
    w = np.array([1.0 / max(s.measured_bytes, 1.0) for s in samples])
    x = np.array([[s.coefficients.get(t, 0.0) for t in terms] for s in samples]).reshape(len(samples), len(terms))
    y = np.array([s.measured_bytes - predict(s, fixed) for s in samples])
    c = solve(x * w[:, None], y * w, np.array([prior[t] for t in terms]), ridge)
    after = {**prior, **{t: float(v) for t, v in zip(terms, c, strict=True)}}
    rows = []
    for s in samples:
        before_b, after_b = predict(s, s.current), predict(s, after)
        peak = s.measured_peak_bytes or None
        pb = s.peak_of(s.current) if s.peak_of and peak else None
        pa = s.peak_of(after) if s.peak_of and peak else None
        rows.append({
            "name": s.name, "measured_bytes": s.measured_bytes, "predicted_before": before_b,
            "predicted_after": after_b, "act_err_before": rel_error(before_b, s.measured_bytes),
            "act_err_after": rel_error(after_b, s.measured_bytes),
            "measured_peak_bytes": peak, "peak_before": pb, "peak_after": pa,
            "peak_err_before": rel_error(pb, peak), "peak_err_after": rel_error(pa, peak),
        })
    return FitResult(constants=after, fitted=list(terms), prior=prior, rows=rows)


def rel_error(pred: float | None, measured: float | None) -> float | None:
    """(predicted - measured) / measured: negative means the prediction was too low."""
    return (pred - measured) / measured if measured and pred is not None else None


def coefficients(predict_group: Callable[[dict[str, float]], float], names: Sequence[str],
                 current: dict[str, float], unit: float = 1024.0) -> tuple[float, dict[str, float], float]:
    """(base, per-constant coefficients, linearity error) of a prediction function of the constants.

    The linearity error compares the prediction at ``current`` with base + sum of coefficient * value: a
    memory model that stopped being linear in its constants shows up here instead of as a silent misfit.
    ``unit`` is the probe value: large enough that the model's rounding to whole bytes does not matter.
    """
    zero = dict.fromkeys(names, 0.0)
    base = predict_group(zero)
    coef = {n: (predict_group({**zero, n: unit}) - base) / unit for n in names}
    direct = predict_group(dict(current))
    linear = base + sum(coef[n] * current[n] for n in names)
    return base, coef, (abs(direct - linear) / direct if direct else 0.0)


def fit_scales(samples: Sequence[Sample], terms: Sequence[str] | None = None, ridge: float = RIDGE) -> dict[str, float]:
    """One multiplier per constant, shared by every sample whatever its architecture: measured ≈ base +
    sum_j coefficient_j · current_j · scale_j, least squares on relative errors, pulled towards 1, >= 0.

    The constants themselves are bytes per token of one shape (the probe measures each architecture), so a
    refit across widths must move them by a factor, not to one absolute value. Only ``samples`` are read:
    give it the fit split alone and nothing else can leak in.
    """
    if not samples:
        raise ValueError("no samples to fit")
    names = list(samples[0].current)
    if terms is None:
        terms = [k for k in names if any(s.coefficients.get(k, 0.0) * s.current.get(k, 0.0) for s in samples)]
    w = np.array([1.0 / max(s.measured_bytes, 1.0) for s in samples])
    x = np.array([[s.coefficients.get(t, 0.0) * s.current.get(t, 0.0) for t in terms] for s in samples])
    x = x.reshape(len(samples), len(terms))
    y = np.array([s.measured_bytes - s.base_bytes for s in samples])
    k = solve(x * w[:, None], y * w, np.ones(len(terms)), ridge)
    return {**dict.fromkeys(names, 1.0), **{t: float(v) for t, v in zip(terms, k, strict=True)}}


def scaled(current: dict[str, float], scales: dict[str, float]) -> dict[str, float]:
    """The constants ``current`` moved by ``scales`` (constants without a scale stay)."""
    return {k: v * scales.get(k, 1.0) for k, v in current.items()}
