"""Expand a job's ``sweep:`` section into variants: pure data in, (name, dotted overrides) out.

    sweep:
      grid: {train.lr: [1.0e-4, 3.0e-4], train.seed: [0, 1]}   # the product: 4 variants
      list: [{train.lr: 1.0e-3, strategy.engine: fsdp}]         # one variant per entry

Grid variants come first (in key order, the last key varying fastest), then the list entries. Each
variant is planned and run as its own job (one Slurm array task); the keys are the job file's dotted keys.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from launcher.config.bounds import SWEEP_VARIANTS
from launcher.errors import ConfigError

# An array's tasks share one allocation shape (one sbatch script), so these cannot differ per variant;
# `name` is the array's, and a nested sweep makes no sense.
FIXED_PREFIXES = ("slurm", "launcher", "sweep", "gpus", "nodes", "cluster.gpus_per_node", "name")


@dataclass(frozen=True, slots=True)
class Variant:
    """One job of a sweep: its position, its name and the overrides it applies to the base job."""

    index: int
    name: str
    """Short human name from the overrides, e.g. 'lr=0.0001,seed=0'."""
    overrides: dict[str, object]
    """Dotted job key to value."""


def _short(key: str, keys: list[str]) -> str:
    """The last part of a dotted key, unless two swept keys share it."""
    last = key.rsplit(".", 1)[-1]
    return last if sum(k.rsplit(".", 1)[-1] == last for k in keys) == 1 else key


def _fmt(value: object) -> str:
    return format(value, "g") if isinstance(value, float) else str(value)


def variant_name(overrides: dict[str, object]) -> str:
    """A short name from the overrides (last key parts where distinct), e.g. 'lr=0.0001,seed=0'; 'base' without any."""
    keys = list(overrides)
    return ",".join(f"{_short(k, keys)}={_fmt(v)}" for k, v in overrides.items()) or "base"


def _check_key(where: str, key: object, problems: list[str]) -> bool:
    if not isinstance(key, str) or not key or any(not part for part in key.split(".")):
        problems.append(f"{where}: {key!r} must be a dotted job key such as train.lr; fix the key")
        return False
    for prefix in FIXED_PREFIXES:
        if key == prefix or key.startswith(prefix + "."):
            problems.append(f"{where}: {key!r} cannot vary between array tasks (one allocation shape for all); "
                            "set it outside sweep:, or submit separate jobs")
            return False
    return True


def expand(sweep: dict | None) -> list[Variant]:
    """Every variant of ``sweep`` (the job file's plain ``sweep:`` mapping); ConfigError lists every problem."""
    if not sweep:
        return []
    problems: list[str] = []
    if not isinstance(sweep, dict):
        raise ConfigError(f"sweep: {sweep!r} must be a mapping with grid: and/or list:; see "
                          "launcher/inputs/variants.py")
    unknown = sorted(set(sweep) - {"grid", "list"})
    for key in unknown:
        problems.append(f"sweep.{key}: unknown key; use grid: (dotted key to a list of values) or list: "
                        "(a list of dotted-key mappings)")
    grid = sweep.get("grid") or {}
    entries = sweep.get("list") or []
    if not isinstance(grid, dict):
        problems.append(f"sweep.grid: {grid!r} must be a mapping of dotted keys to lists; e.g. {{train.lr: [1e-4, "
                        f"3e-4]}}")
        grid = {}
    if not isinstance(entries, list):
        problems.append(f"sweep.list: {entries!r} must be a list of mappings; e.g. [{{train.lr: 1e-3}}]")
        entries = []
    axes: list[tuple[str, list]] = []
    for key, values in grid.items():
        if not _check_key(f"sweep.grid.{key}", key, problems):
            continue
        if not isinstance(values, list) or not values:
            problems.append(f"sweep.grid.{key}: {values!r} must be a non-empty list of values; e.g. [1, 2]")
            continue
        axes.append((key, values))
    overrides_list: list[dict[str, object]] = []
    count = (math.prod(len(v) for _, v in axes) if axes else 0) + len(entries)
    if count > SWEEP_VARIANTS:  # counted before itertools.product makes them: ten 30-value axes are 30^10
        raise ConfigError(problems + [f"sweep: {count} variants, over the {SWEEP_VARIANTS} one sweep may hold "
                                      "(Slurm's default MaxArraySize); sweep fewer values, or split the sweep"])
    if axes:
        keys = [k for k, _ in axes]
        overrides_list += [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*(v for _, v in axes))]
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or not entry:
            problems.append(f"sweep.list[{i}]: {entry!r} must be a non-empty mapping of dotted keys to values")
            continue
        if all(_check_key(f"sweep.list[{i}].{k}", k, problems) for k in entry):
            overrides_list.append(dict(entry))
    seen: dict[str, int] = {}
    for i, ov in enumerate(overrides_list):
        key = repr(sorted(ov.items(), key=lambda kv: kv[0]))
        if key in seen:
            problems.append(f"sweep: variant {i} ({variant_name(ov)}) repeats variant {seen[key]}; remove the "
                            "duplicate")
        seen.setdefault(key, i)
    if not overrides_list and not problems:
        problems.append("sweep: no variants; give grid: {train.lr: [1e-4, 3e-4]} or list: [{train.lr: 1e-3}]")
    if problems:
        raise ConfigError(problems)
    return [Variant(index=i, name=variant_name(ov), overrides=ov) for i, ov in enumerate(overrides_list)]
