"""The hostile-input table as a whole (issue 20): the per-area tables in test_hostile_*.py, each case run through
`check_refused` (exit 2, one error block, no traceback, nothing on stdout, nothing written), add up to one table
of at least 60 distinct cases."""

from __future__ import annotations

import importlib
from pathlib import Path

AREAS = sorted(p.stem for p in Path(__file__).parent.glob("test_hostile_*.py") if p.stem != "test_hostile_table")


def test_the_hostile_table_holds_at_least_60_distinct_cases():
    cases = [c for area in AREAS for c in importlib.import_module(f"tests.faults.{area}").CASES]
    ids = [c.id for c in cases]
    assert len(AREAS) >= 5, AREAS  # run dir, Slurm, bounds, verdicts, exports (and data, where it landed)
    assert len(cases) >= 60, f"{len(cases)} cases in {AREAS}"
    assert len(set(ids)) == len(ids), sorted({i for i in ids if ids.count(i) > 1})
