"""ranks/rank-K.json as a type: it round-trips, an older file still reads, a newer one is refused."""

import json

import pytest

from launcher.records.rankreport import RANK_REPORT_SCHEMA, OomDetails, RankReport


def full_report() -> RankReport:
    return RankReport(
        rank=1, local_rank=1, host="n1", device="cuda", world_size=2, status="oom",
        basis="cuda_reserved_plus_context", phases={"forward": 7, "backward": 9}, measured_peak_bytes=9,
        training_peak_bytes=9, peak_phase="backward", peak_by_category={"params": 4, "activations": 5},
        peak_by_category_raw={"Parameter": 4}, phase_breakdown={"backward": {"params": 4}},
        after_step_by_category={"params": 4}, peak_rss_bytes=100, enforce_bytes=8, first_loss=2.5, final_loss=2.0,
        steps_done=3, error="OutOfMemoryError", max_memory_allocated_bytes=6, max_memory_reserved_bytes=8,
        outside_allocator_bytes=1, phases_allocated={"forward": 5}, engine="fsdp", label="FSDP2 full-shard",
        total_steps=10, plan_sha256="ab" * 32, eval_loss=1.5, eval_accuracy=0.75,
        oom=OomDetails(phase="backward", step=4, current_bytes=9, current_by_category={"activations": 5},
                       crossed_at_bytes=9),
        extra={"mine": True},
    )


def test_a_rank_report_round_trips_through_its_file():
    rep = full_report()
    data = json.loads(json.dumps(rep.to_json()))
    assert data["schema"] == RANK_REPORT_SCHEMA
    assert data["mine"] is True and "extra" not in data  # a script's own field stays at the top level
    assert data["oom"] == {"phase": "backward", "step": 4, "current_bytes": 9,
                           "current_by_category": {"activations": 5},
                           "crossed_at_bytes": 9}
    assert RankReport.from_json(data) == rep


def test_fields_written_only_when_known_stay_out_of_a_cpu_ranks_file():
    data = RankReport(rank=0, status="completed").to_json()
    assert "max_memory_allocated_bytes" not in data and "oom" not in data and "plan_sha256" not in data
    assert data["first_loss"] is None and data["error"] is None  # written always, as before the type
    assert RankReport.from_json(data) == RankReport(rank=0, status="completed")


def test_a_rank_file_from_before_the_schema_and_the_basis_still_reads():
    old = {"rank": 0, "device": "cuda", "status": "completed", "measured_peak_bytes": None, "steps_done": 2,
           "oom": {"phase": "forward", "step": 1}, "total_steps": 5}
    rep = RankReport.from_json(old)
    assert rep.basis == "cuda_allocated"  # CUDA ranks then measured allocated bytes
    assert (rep.measured_peak_bytes, rep.steps_done, rep.total_steps) == (0, 2, 5)
    assert rep.oom == OomDetails(phase="forward", step=1) and rep.schema == RANK_REPORT_SCHEMA
    assert RankReport.from_json({"rank": 3}).basis == "cpu_tensor_bytes"


def test_a_newer_rank_file_is_refused_rather_than_misread():
    with pytest.raises(ValueError, match="upgrade launcher"):
        RankReport.from_json({"rank": 0, "schema": RANK_REPORT_SCHEMA + 1})


def test_record_sets_listed_fields_and_keeps_the_rest_in_extra():
    rep = RankReport(rank=0)
    rep.record({"eval_loss": 0.5, "oom": {"phase": "backward", "step": 2}, "mine": 1})
    assert rep.eval_loss == 0.5 and rep.oom == OomDetails(phase="backward", step=2) and rep.extra == {"mine": 1}
