import json

import pytest

from launcher.backends.slurm_state import (
    allocation_rows,
    current_state,
    is_active,
    parse_sacct,
    read_requeues,
    read_slurm_json,
    restarts,
    sacct_command,
    sacct_rows,
    step_rows,
    submitit_results,
)
from launcher.errors import ConfigError

# Real output of `sacct -D --parsable2 ...` on the dev cluster: a job requeued twice, then completed.
REQUEUED = """JobID|JobName|State|ExitCode|Elapsed|NodeList|Start|End
55|tq|REQUEUED|0:0|00:00:49|node1|2026-11-22T03:58:57|2026-11-22T03:59:46
55.batch|batch|CANCELLED|0:15|00:00:49|node1|2026-11-22T03:58:57|2026-11-22T03:59:46
55.0|python3|FAILED|127:0|00:00:51|node1|2026-11-22T03:58:57|2026-11-22T03:59:48
55|tq|REQUEUED|0:0|00:00:50|node1|2026-11-22T04:00:25|2026-11-22T04:01:15
55.batch|batch|CANCELLED|0:15|00:00:50|node1|2026-11-22T04:00:25|2026-11-22T04:01:15
55.0|python3|FAILED|127:0|00:00:53|node1|2026-11-22T04:00:25|2026-11-22T04:01:18
55|tq|COMPLETED|0:0|00:00:54|node1|2026-11-22T04:01:55|2026-11-22T04:02:49
55.batch|batch|COMPLETED|0:0|00:00:54|node1|2026-11-22T04:01:55|2026-11-22T04:02:49
55.0|python3|COMPLETED|0:0|00:00:54|node1|2026-11-22T04:01:55|2026-11-22T04:02:49
"""
# An array with a throttle: two tasks done, the rest listed as one pending record.
ARRAY = """JobID|JobName|State|ExitCode|Elapsed|NodeList|Start|End
60_0|wrap|COMPLETED|0:0|00:00:03|node1|2026-11-22T04:12:26|2026-11-22T04:12:29
60_0.batch|batch|COMPLETED|0:0|00:00:03|node1|2026-11-22T04:12:26|2026-11-22T04:12:29
60_1|wrap|CANCELLED by 0|0:0|00:00:03|node1|2026-11-22T04:12:30|2026-11-22T04:12:33
60_[2-3%1]|wrap|PENDING|0:0|00:00:00|None assigned|Unknown|Unknown
"""


def test_parse_keeps_every_record_in_order():
    rows = parse_sacct(REQUEUED)
    assert len(rows) == 9 and rows[0]["JobID"] == "55" and rows[2]["ExitCode"] == "127:0"
    assert parse_sacct("") == [] and parse_sacct("JobID|State\n") == []


def test_requeued_job_history():
    rows = parse_sacct(REQUEUED)
    assert [r["State"] for r in allocation_rows(rows, "55")] == ["REQUEUED", "REQUEUED", "COMPLETED"]
    assert current_state(rows, "55") == "COMPLETED" and restarts(rows, "55") == 2
    assert [r["JobID"] for r in step_rows(rows, "55")][:2] == ["55.batch", "55.0"]


def test_array_tasks_and_pending_ranges():
    rows = parse_sacct(ARRAY)
    assert current_state(rows, "60_0") == "COMPLETED"
    assert current_state(rows, "60_1") == "CANCELLED by 0"
    assert current_state(rows, "60_3") == "PENDING"
    assert [r["JobID"] for r in step_rows(rows, "60_0")] == ["60_0.batch"]


def test_unknown_job_is_still_active():
    # slurmdbd records a job a moment after sbatch returns: empty means "not yet", not "gone".
    assert current_state([], "99") == "" and is_active("")
    assert is_active("RUNNING") and is_active("REQUEUED") and is_active("PENDING")
    assert not is_active("CANCELLED by 0") and not is_active("COMPLETED") and not is_active("TIMEOUT")


def test_sacct_through_a_mocked_runner():
    seen = []

    def run(argv):
        seen.append(argv)
        return REQUEUED

    rows = sacct_rows(["55"], run=run)
    assert seen == [sacct_command(["55"])] and "-D" in seen[0] and "--parsable2" in seen[0]
    assert current_state(rows, "55") == "COMPLETED"
    assert sacct_rows([], run=run) == [] and len(seen) == 1


def test_missing_sacct_is_a_clear_error(monkeypatch):
    import launcher.backends.slurm_state as st

    def missing(*a, **k):
        raise FileNotFoundError

    monkeypatch.setattr(st.subprocess, "run", missing)
    with pytest.raises(ConfigError, match="sacct is not on PATH"):
        sacct_rows(["1"])


def test_slurm_json_missing_says_what_to_give(tmp_path):
    with pytest.raises(ConfigError,
                       match="holds no slurm.json; give the run dir of a job submitted with launch --slurm"):
        read_slurm_json(tmp_path)


def test_submitit_results_per_task(tmp_path):
    from submitit.core.utils import JobPaths, cloudpickle_dump

    folder = tmp_path / "submitit"
    folder.mkdir()
    cloudpickle_dump(("success", {"ok": True}), JobPaths(folder, job_id="7", task_id=0).result_pickle)
    cloudpickle_dump(("error", "Traceback ..."), JobPaths(folder, job_id="7", task_id=1).result_pickle)
    assert submitit_results(folder, "7", 3) == ["success", "error", "none"]


def test_requeue_lines_skip_a_torn_line(tmp_path):
    (tmp_path / "requeues.jsonl").write_text(json.dumps({"decision": "requeue"}) + "\n{\"decis")
    assert read_requeues(tmp_path) == [{"decision": "requeue"}]


def test_slurm_record_round_trips_and_refuses_a_newer_schema(tmp_path):
    from launcher.backends.slurm_state import SLURM_RECORD_SCHEMA, SlurmRecord, SweepRow, UnplannedVariant

    rec = SlurmRecord(kind="array", job_id="5", job_ids=["5_0", "5_1"], submitit_folder="/s", submitted_at=1.5,
                      nodes=1, gpus_per_node=2, timeout_min=90, signal_delay_s=90, max_requeues=3,
                      variants=[SweepRow(index=0, name="lr=1e-4", overrides={"train.lr": 1e-4}, run_dir="/r/0",
                                         job_id="5_0", plan="ZeRO-2 mb 4", predicted_peak_bytes=123)],
                      unplanned=[UnplannedVariant(index=1, name="mb=9", overrides={}, reason="no plan fits")])
    (tmp_path / "slurm.json").write_text(json.dumps(rec.to_json()))
    back = read_slurm_json(tmp_path)
    assert back == rec and back.variants[0].job_id == "5_0" and back.schema == SLURM_RECORD_SCHEMA
    (tmp_path / "slurm.json").write_text(json.dumps(rec.to_json() | {"schema": SLURM_RECORD_SCHEMA + 1}))
    with pytest.raises(ConfigError, match="newer than this launcher reads"):
        read_slurm_json(tmp_path)
