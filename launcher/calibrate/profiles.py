"""The calibration files under ``cache_dir()/profiles`` and their shape.

``<profile>.json``                       {"hardware": {field: value}, "measured_at": ..., "host": ..., "details": ...}
                                         read by ``launcher.inputs.machine.hardware_profile`` (unknown fields ignored).
``activations-<type>-<profile>.json``    exactly the ActivationConstants fields (the planner passes them as
                                         keyword arguments), so the fit's provenance goes to a ``.fit.json`` beside it.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import socket
from pathlib import Path

from launcher.calibrate.timing import FIELD
from launcher.files.fsutil import atomic_write
from launcher.inputs.cache import cache_dir
from launcher.planner.hardware import HardwareProfile
from launcher.planner.memory import ActivationConstants


def profiles_dir() -> Path:
    """Where calibrated profiles are kept: <cache>/profiles."""
    return cache_dir() / "profiles"


def hardware_path(profile: str) -> Path:
    """The calibrated hardware file of a profile."""
    return profiles_dir() / f"{profile}.json"


def activations_path(model_type: str, profile: str) -> Path:
    """The fitted activation constants file of a model type on a profile."""
    return profiles_dir() / f"activations-{model_type}-{profile}.json"


def _write_json(path: Path, data: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def now_iso() -> str:
    """The current UTC time, ISO 8601 to the second: the files' timestamps."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def save_hardware(profile: str, values: dict[str, float], details: dict | None = None) -> Path:
    """Write the measured fields; only names HardwareProfile knows go under "hardware"."""
    known = {f.name for f in dataclasses.fields(HardwareProfile)} | set(FIELD.values())
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"not HardwareProfile fields: {unknown}")
    data = {"hardware": dict(values), "measured_at": now_iso(), "host": socket.gethostname(),
            "details": details or {}}
    return _write_json(hardware_path(profile), data)


def numeric_fields() -> list[str]:
    """The ActivationConstants fields that are numbers (the ones a fit can move), read from the annotations."""
    return [f.name for f in dataclasses.fields(ActivationConstants) if f.type in ("float", "int", float, int)]


def save_activations(model_type: str, profile: str, constants: dict[str, float], provenance: dict) -> Path:
    """Write fitted activation constants (numeric fields only) and, beside them, a .fit.json with when, where and
    from what; returns the constants file's path."""
    path = activations_path(model_type, profile)
    _write_json(path, {k: float(v) for k, v in constants.items() if k in numeric_fields()})
    _write_json(path.with_suffix(".fit.json"), {"fitted_at": now_iso(), "host": socket.gethostname(), **provenance})
    return path
