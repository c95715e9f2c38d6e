"""The accuracy matrix covers every axis value, its jobs are valid, and the error arithmetic is right."""

import itertools

import pytest

from benchmarks.accuracy.cells import MICRO_BATCHES, QUICK, SEQ_LENS, SHARDINGS, full_matrix, select
from benchmarks.accuracy.compare import category_bias, compare_categories, rel, summary, wrong_terms
from launcher.config.jobfile import job_from_data


def test_matrix_covers_every_axis_value():
    cells = full_matrix()
    assert len(cells) >= 16 and len({c.name for c in cells}) == len(cells)
    assert {c.sharding for c in cells} == set(SHARDINGS)
    assert {c.checkpointing for c in cells} == {False, True}
    assert {c.model == "minilm" for c in cells} == {False, True}
    assert {c.micro_batch for c in cells} == set(MICRO_BATCHES)
    assert {c.seq_len for c in cells} == set(SEQ_LENS)
    for sharding in SHARDINGS:  # each engine is seen on both models, with and without recompute
        mine = [c for c in cells if c.sharding == sharding]
        assert {(c.model == "minilm", c.checkpointing) for c in mine} == set(itertools.product([False, True], repeat=2))
        assert {c.micro_batch for c in mine} == set(MICRO_BATCHES) and {c.seq_len for c in mine} == set(SEQ_LENS)


def test_quick_cells_exist_and_selection_works():
    cells = full_matrix()
    assert len(select(cells, list(QUICK))) == len(QUICK) == 4
    z3 = select(cells, ["z3-,minilm"])
    assert z3 and all(c.sharding == "z3" and c.model == "minilm" for c in z3)
    assert select(cells, ["nothing-like-this"]) == []
    assert select(cells, None) == cells


@pytest.mark.parametrize("cell", full_matrix(), ids=lambda c: c.name)
def test_every_cell_is_a_valid_fully_pinned_job(cell):
    job = job_from_data({**cell.job(), "gpus": 2, "budget": "4GB"}, ".")
    s = job.strategy
    assert s.engine and s.micro_batch_size == cell.micro_batch
    assert s.activation_checkpointing is cell.checkpointing
    assert s.offload_optimizer is not None and s.offload_params is not None
    assert job.train.global_batch_size == 2 * cell.micro_batch  # no accumulation: one micro-batch per step
    assert job.data.eval_fraction == 0.0


def row(name, measured, planner, ds, acc, cats):
    return {"cell": name, "sharding": name.split("-")[0], "measured_peak_bytes": measured,
            "predicted": {"planner": planner, "deepspeed": ds, "accelerate": acc},
            "errors": {"planner": rel(planner, measured), "deepspeed": rel(ds, measured),
                       "accelerate": rel(acc, measured)},
            "categories_at_peak": cats}


def test_errors_summary_and_category_diagnosis():
    cats = compare_categories({"params": 10, "grads": 0, "optimizer": 40, "activations": 30, "logits": 20},
                              {"params": 10, "grads": 25, "optimizer": 40, "activations": 20, "temp": 10})
    assert cats["activations"] == {"predicted": 50, "measured": 30, "diff": 20}
    assert cats["grads"]["diff"] == -25
    rows = [row("z2-a", 100, 90, 50, 40, cats), row("z3-b", 200, 230, 100, 60, cats)]
    s = summary(rows)
    assert s["planner"]["median_abs"] == pytest.approx(0.125)
    assert s["planner"]["max_abs"] == pytest.approx(0.15)
    assert s["planner"]["under"] == 1 and s["deepspeed"]["under"] == 2
    assert s["planner"]["within_goal"] == 1
    text = wrong_terms(rows[0])
    assert text.startswith("grads -0.00 MB") and "activations +0.00 MB" in text
    bias = category_bias(rows)
    assert bias["all"]["grads"]["median_ratio"] == 0.0
    assert set(bias) == {"all", "ZeRO-2", "ZeRO-3"}
