"""The published step-time set: its entries and their fit / validation split.

Each YAML in entries/ is one public step-time or throughput figure of a training run: its source, the quoted figure,
the unit it counts, and the run's configuration, written as the memory entries' (benchmarks/published/entries) or
taken from the memory entry of the same run (``config_from``, with ``config`` as the keys that differ).

The split is a hash of each entry's id with a salt: the smallest salt for which both halves hold every axis value
two or more entries share (source, GPU profile, precision, activation checkpointing) and neither half holds more
than 60 % (benchmarks/accuracy/cells.py's rule). split.yaml records it as it was chosen, before any comparison ran;
tests/benchmarks/test_published_steptime.py holds the rule to that record, so adding an entry cannot move another
across unnoticed. Constants are fitted on the "fit" half only; the "validation" half judges them.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
ENTRIES = HERE / "entries"
MEMORY_ENTRIES = HERE.parent / "entries"
SPLIT_FILE = HERE / "split.yaml"
SIDES = ("fit", "validation")


def load_entries(prefix: str | None = None) -> list[dict]:
    """Every step-time entry (or those whose id starts with ``prefix``), each with its full ``config``: a
    ``config_from`` entry's configuration from the memory entry of that id, updated by the entry's own keys."""
    out = []
    for path in sorted(ENTRIES.glob("*.yaml")):
        entry = yaml.safe_load(path.read_text())
        if prefix is not None and not entry["id"].startswith(prefix):
            continue
        if entry.get("config_from"):
            base = yaml.safe_load((MEMORY_ENTRIES / f"{entry['config_from']}.yaml").read_text())["config"]
            entry["config"] = {**base, **(entry.get("config") or {})}
        out.append(entry)
    return out


def axes(entry: dict) -> dict[str, str]:
    """The axis values an entry stands for, which the split must put on both sides."""
    c = entry["config"]
    return {"source": entry["source"]["repo"], "hardware": c["hardware"], "precision": c["precision"],
            "activation_checkpointing": str(bool(c["activation_checkpointing"]))}


def _side(entry_id: str, salt: int) -> str:
    digest = hashlib.sha256(f"{salt}:{entry_id}".encode()).digest()
    return SIDES[digest[0] % 2]


def balanced(entries: list[dict], sides: dict[str, str]) -> bool:
    """Both sides hold every axis value two or more entries share, and neither side holds over 60 %."""
    if max(Counter(sides.values()).values(), default=0) > 0.6 * len(entries) or len(set(sides.values())) < 2:
        return False
    shared = Counter((k, v) for e in entries for k, v in axes(e).items())
    for (key, value), n in shared.items():
        if n < 2:
            continue
        held = {sides[e["id"]] for e in entries if axes(e)[key] == value}
        if held != set(SIDES):
            return False
    return True


def split_salt(entries: list[dict]) -> int:
    """The smallest salt that balances the split."""
    for salt in range(10_000):
        if balanced(entries, {e["id"]: _side(e["id"], salt) for e in entries}):
            return salt
    raise ValueError("no salt balances the step-time split; add entries")


def split(entries: list[dict]) -> dict[str, str]:
    """Entry id -> "fit" or "validation"."""
    salt = split_salt(entries)
    return {e["id"]: _side(e["id"], salt) for e in entries}


def recorded_split() -> dict:
    """split.yaml: the salt and the two sides as chosen before any comparison."""
    return yaml.safe_load(SPLIT_FILE.read_text())


if __name__ == "__main__":
    # Writes split.yaml from the entries; run once when the set is first committed.
    es = load_entries()
    sides = split(es)
    record = {"salt": split_salt(es), "rule": "sha256(f'{salt}:{id}')[0] % 2, the smallest salt balancing source, "
              "hardware, precision and activation checkpointing (benchmarks/published/steptime/entries.py)",
              **{side: sorted(i for i, s in sides.items() if s == side) for side in SIDES}}
    SPLIT_FILE.write_text(yaml.safe_dump(record, sort_keys=False, width=120))
    for side in SIDES:
        print(side, len(record[side]))
