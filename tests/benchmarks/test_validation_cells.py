"""The accuracy claim, judged in the suite where nothing was tuned: cells of the committed validation splits
(benchmarks/accuracy/cells.py, each named before it ran), run through the real `launch` CLI on 2 CPU ranks as the
accuracy benchmark runs them. The prediction may not sit under any rank's measured peak by more than the plan's
safety margin (under-prediction is what crashes a job), nor over it by more than OVER; the ranks' tracker agrees
with glibc's heap (tests/cli/test_run_cli.check_heap), an instrument the planner's fits never saw.

The development cells are judged in tests/planner/test_backward_end.py from committed measurements; these run."""

import json

import pytest
import yaml

from benchmarks.accuracy.cells import BUDGET, BWDEND_VALIDATION, BWDEND_VALIDATION_2, EXPORT_VALIDATION_2, Cell
from tests.cli.test_run_cli import check_heap, check_prediction, launch

CELLS: tuple[Cell, ...] = (
    BWDEND_VALIDATION_2[0],  # ZeRO-3, a GPT-2 smaller than its reduce bucket, 24 tokens: 12 MB a rank
    EXPORT_VALIDATION_2[0],  # FSDP2, the 6-block Llama (untied head), 32 tokens: 61 MB
    BWDEND_VALIDATION[1],  # ZeRO-2, the 16k-vocabulary GPT-2 at micro-batch 2, 48 tokens: 179 MB
)
"""The cheapest cells of three splits, one per sharding family: each runs in under a minute on 2 cores."""


@pytest.mark.parametrize("cell", CELLS, ids=lambda c: c.name)
def test_a_validation_cell_is_never_under_predicted_beyond_the_margin(cell, tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(cell.job(), sort_keys=False))
    run = tmp_path / "run"
    # As benchmarks/accuracy/run.py launches it: the cell's ranks, the split's budget (the plan is fully pinned).
    res = launch("--gpus", cell.ranks, "--budget", BUDGET, job, "--run-dir", run, "--quiet")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    plan = json.loads((run / "plan.json").read_text())
    margin = 1 - plan["usable_bytes"] / plan["budget_bytes"]
    report = json.loads((run / "report.json").read_text())
    assert sorted(r["rank"] for r in report["ranks"]) == list(range(cell.ranks))
    for r in report["ranks"]:
        check_prediction(r, margin)
        check_heap(run, r["rank"])
