"""steps/rank-K.jsonl as launcher.records.steprow.StepRow: written by the probe, read back by every reader through the
type."""

from __future__ import annotations

import json

import pytest

from launcher.records.live import last_line
from launcher.records.steprow import StepRow, read_rows
from launcher.runtime.probe import memory_probe


def test_a_step_line_round_trips_and_keeps_a_scripts_own_fields():
    row = StepRow(step=3, loss=1.5, tokens_per_s=90.0, step_time_s=0.2, mem_current_bytes=10, mem_peak_bytes=20,
                  time=1.0, lr=1e-4, attempt=1, extra={"my_metric": 7})
    assert StepRow.from_line(row.to_line()) == row
    assert json.loads(row.to_line())["my_metric"] == 7  # a script's field at the top level, as it gave it


def test_a_step_that_is_not_a_log_step_leaves_loss_and_throughput_out():
    line = StepRow(step=2, step_time_s=0.1, mem_current_bytes=1, mem_peak_bytes=2, time=5.0).to_json()
    assert "loss" not in line and "tokens_per_s" not in line and "grad_norm" not in line
    assert not StepRow.from_json(line).log_step


def test_lines_from_before_the_attempt_stamp_read_and_broken_lines_are_skipped():
    rows = read_rows(['{"step": 1, "time": 1.0, "loss": 2.0}', '{"step": 2, "ti', '[1, 2]', '{"step": "x"}'])
    assert rows == [StepRow(step=1, time=1.0, loss=2.0)] and rows[0].attempt is None


def test_the_probe_writes_step_rows_and_the_live_view_reads_them(tmp_path):
    probe = memory_probe(device="cpu", run_dir=tmp_path)
    with probe:
        first = probe.step_done(1, 2.5, 100, lr=0.1, attempt=0)
        probe.step_done(2, None, None, lr=0.1, attempt=0, my_metric="x")
    probe.step_log.close()
    lines = (tmp_path / "steps" / "rank-0.jsonl").read_text().splitlines()
    assert StepRow.from_line(lines[0]) == first and first.loss == 2.5 and first.lr == 0.1
    last = last_line(tmp_path / "steps" / "rank-0.jsonl")
    # The latest line, its loss and tokens/s carried from the log step before it (the live view shows the latest).
    assert (last.step, last.loss, last.tokens_per_s, last.extra) == (2, 2.5, first.tokens_per_s, {"my_metric": "x"})


def test_a_misspelled_report_field_fails_where_the_launcher_notes_it(tmp_path):
    probe = memory_probe(device="cpu", run_dir=tmp_path)
    probe.note(eval_loss=0.5)
    with pytest.raises(TypeError, match="eval_los not a field"):
        probe.note(eval_los=0.5)
    probe.record(my_own=1)  # a user's script may still record a field of its own
    report = probe.report(status="completed")
    assert report.eval_loss == 0.5 and report.extra == {"my_own": 1}
    with pytest.raises(ValueError, match="not a rank status"):
        probe.report(status="complete")
