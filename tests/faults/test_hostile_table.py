"""The hostile-input table as a whole (issues 20 and 35): the per-area tables in test_hostile_*.py, each case run
through `check_refused` (exit 2, one error block, no traceback, nothing on stdout, nothing written), add up to one
table of at least 60 distinct cases; with benchmarks/hostile's own cases (config.json key by bad value, files that
are no config or no data, flags, damaged checkpoints) the table benchmarks/results/hostile.md holds at least 300.
A representative sample of benchmarks/hostile's cases runs here too."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from benchmarks.hostile.cases import export_cases, table_cases
from tests.faults.harness import check_refused

AREAS = sorted(p.stem for p in Path(__file__).parent.glob("test_hostile_*.py") if p.stem != "test_hostile_table")
GENERATED = table_cases()
SAMPLE = GENERATED[::9]
"""Every ninth generated case: each family (config keys by value, config texts, data files, flags) is reached."""


def suite() -> list:
    return [c for area in ["test_bad_input", *AREAS] for c in importlib.import_module(f"tests.faults.{area}").CASES]


def test_the_hostile_table_holds_at_least_60_distinct_cases():
    cases = [c for area in AREAS for c in importlib.import_module(f"tests.faults.{area}").CASES]
    ids = [c.id for c in cases]
    assert len(AREAS) >= 5, AREAS  # run dir, Slurm, bounds, verdicts, exports (and data, where it landed)
    assert len(cases) >= 60, f"{len(cases)} cases in {AREAS}"
    assert len(set(ids)) == len(ids), sorted({i for i in ids if ids.count(i) > 1})


def test_the_benchmark_table_holds_at_least_300_distinct_cases():
    ids = [c.id for c in suite()] + [c.id for c in GENERATED] + [c.id for c in export_cases()]
    assert len(ids) >= 300, len(ids)
    assert len(set(ids)) == len(ids), sorted({i for i in ids if ids.count(i) > 1})
    assert {c.id.split("-")[0] for c in SAMPLE} >= {"config", "data", "flag"}


@pytest.mark.parametrize("case", SAMPLE, ids=[c.id for c in SAMPLE])
def test_a_sample_of_the_generated_cases_is_refused(case, sandbox):
    check_refused(case, sandbox)
