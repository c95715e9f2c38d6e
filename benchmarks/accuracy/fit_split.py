"""The one refit the accuracy matrix does, on its fit split only: a multiplier per activation constant.

The planner's activation constants are measured per architecture by the fake-tensor probe; what measurement
can still correct is a factor on each (the same for every width), fitted by launcher.calibrate.fit.fit_scales
on the fit cells' ranks. Held-out cells are then predicted with those factors and never read by the fit.
"""

from __future__ import annotations

from pathlib import Path

from launcher.calibrate.fit import Sample, fit_scales, scaled

RECOMPUTE_TERMS = ("ckpt_bytes_per_token", "head_ckpt_bytes_per_token")
"""What is refit: only the checkpointed (recompute) path. On the fit split the probe's constants without
checkpointing predict the measured activations within about 1 %; with checkpointing real ranks hold more than
the fake-tensor probe sees (recompute under dropout, the checkpoint's gradient temporaries)."""


def fit_on_split(samples_by_cell: dict[str, list[Sample]], sides: dict[str, str],
                 terms: tuple[str, ...] = RECOMPUTE_TERMS) -> dict[str, float]:
    """Scales fitted on the cells ``sides`` marks "fit"; the others' samples are not looked at."""
    fit_samples = [s for cell, samples in samples_by_cell.items() if sides.get(cell) == "fit" for s in samples]
    return fit_scales(fit_samples, terms)


def cell_samples(run_dir: Path) -> list[Sample]:
    """A finished cell's fit samples (one per rank); none when the run dir cannot give any."""
    from launcher.calibrate.runs import samples_from_run
    from launcher.errors import ConfigError

    try:
        return samples_from_run(run_dir)
    except (ConfigError, OSError, ValueError):
        return []


def refit_peak_bytes(samples: list[Sample], scales: dict[str, float]) -> int | None:
    """The planner's peak per rank for the cell with its activation constants moved by ``scales``."""
    if not samples or samples[0].peak_of is None:
        return None
    s = samples[0]
    return int(s.peak_of(scaled(s.current, scales)))
