"""report.json as a type, the ladder's attempts included: it round-trips, an older file reads, a newer is refused."""

import json

import pytest

from launcher.planner.plan import Strategy
from launcher.records.runreport import (
    REPORT_SCHEMA,
    Attempt,
    AttemptOom,
    FallbackSummary,
    NextRung,
    RankFailure,
    RankRow,
    RunOutcome,
    RunReport,
    read_report,
)

STRATEGY = Strategy.from_json(dict(engine="deepspeed", zero_stage=2, fsdp_reshard_after_forward=None,
                                   offload_optimizer="none", offload_params="none", micro_batch_size=4,
                                   grad_accum_steps=2, activation_checkpointing=True, checkpoint_every=2,
                                   loss_chunks=4))


def attempts() -> list[Attempt]:
    first = Attempt(attempt=1, label=STRATEGY.label(), strategy=STRATEGY, outcome="oom", exit_code=1,
                    global_batch_size=16, predicted_peak_bytes=900, budget_bytes=1000, measured_peak_bytes=1001,
                    oom=AttemptOom(rank=0, phase="backward", step=1), seconds=3.5, dir="attempts/1",
                    next=NextRung(label="ZeRO-2, mb=2x4", rung="micro_batch", reason="halve the micro-batch",
                                  predicted_peak_bytes=600, corrected_peak_bytes=700, skipped=["offload: none"]))
    last = Attempt(attempt=2, label="ZeRO-2, mb=2x4", strategy=STRATEGY, outcome="over_budget", exit_code=3,
                   global_batch_size=16, predicted_peak_bytes=600, budget_bytes=1000, measured_peak_bytes=None,
                   stopped="auto_fallback: all 1 relaunch(es) used")
    return [first, last]


def full_report() -> RunReport:
    row = RankRow(rank=0, host="h", device="cpu", status="completed", verdict="OVER", measured=True,
                  measured_peak_bytes=1001, predicted_peak_bytes=600, budget_bytes=1000, headroom_bytes=-1,
                  relative_error=-0.4, largest_category="activations", grew_most="activations", grew_most_bytes=401,
                  measured_breakdown={"activations": 700}, phases={"backward": 1001}, peak_rss_bytes=5,
                  first_loss=2.0, final_loss=1.0, eval_loss=1.1, eval_accuracy=0.5, steps_done=2)
    return RunReport(verdict="over_budget", eval_loss=1.1, eval_accuracy=0.5, budget_bytes=1000,
                     predicted_peak_bytes=600, predicted_breakdown={"activations": 300}, plan=STRATEGY.label(),
                     math_notes=["note"], world_size=2, missing_ranks=[1], ranks=[row], plan_sha256="cd" * 32,
                     outcome=RunOutcome(ok=False, message="rank 1 died",
                                        failures=[RankFailure(rank=1, exitcode=9, host="h")]),
                     auto_fallback=FallbackSummary(tries=1, relaunches=1, ended_within_budget=False),
                     attempts=attempts())


def test_a_report_with_its_ladder_round_trips_through_its_file(tmp_path):
    rep = full_report()
    (tmp_path / "report.json").write_text(json.dumps(rep.to_json()))
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["schema"] == REPORT_SCHEMA
    assert data["attempts"][1]["stopped"] and "stopped" not in data["attempts"][0]  # written only when it stopped
    assert data["attempts"][0]["strategy"]["loss_chunks"] == 4 and data["ranks"][0]["verdict"] == "OVER"
    assert read_report(tmp_path) == rep


def test_an_attempt_round_trips_on_its_own():
    for a in attempts():
        assert Attempt.from_json(json.loads(json.dumps(a.to_json()))) == a


def test_keys_written_only_when_set_stay_out_of_a_plain_report():
    data = RunReport(verdict="within_budget", within_budget=True).to_json()
    assert not {"plan_sha256", "outcome", "auto_fallback", "attempts"} & set(data)
    assert RunReport.from_json(data) == RunReport(verdict="within_budget", within_budget=True)


def test_a_report_from_before_the_verdict_and_the_schema_still_reads():
    old = {"within_budget": False, "budget_bytes": 10,
           "ranks": [{"rank": 0, "measured_peak_bytes": 12, "budget_bytes": 10, "within_budget": False}],
           "attempts": [{**attempts()[0].to_json(), "strategy": {k: v for k, v in attempts()[0].to_json()["strategy"]
                                                               .items() if k not in ("loss_chunks", "qlora")}}]}
    rep = RunReport.from_json(old)
    assert rep.verdict == "over_budget" and rep.schema == REPORT_SCHEMA
    assert (rep.ranks[0].verdict, rep.ranks[0].measured) == ("OVER", True)
    assert rep.attempts[0].strategy.loss_chunks == 0  # a lever's off value where the strategy predates it


def test_a_newer_report_is_refused_and_a_missing_one_is_none(tmp_path):
    with pytest.raises(ValueError, match="upgrade launcher"):
        RunReport.from_json({"schema": REPORT_SCHEMA + 1})
    assert read_report(tmp_path) is None


def test_report_json_carries_the_data_summary_and_reads_older_reports_without_it(tmp_path):
    """Issue 36 §4: report.json's ``data`` is the launcher's count of the data (RUN/data.json, written before the
    launch); a report written before the field reads with None."""
    from launcher.files.rundir import RunDir
    from launcher.records.datasummary import DataSummary, DroppedExamples
    from launcher.records.report import build_report
    from tests.records.test_report import plan_of

    s = DataSummary(format="messages", task="causal_lm", rows=40, train_examples=35, eval_examples=4,
                    dropped=[DroppedExamples(reason="prompt_fills_max_seq_len", count=1, rows=[7])], tokens=900,
                    trained_tokens=300, sequences=35, chat_template="chatml", max_seq_len=64)
    run = RunDir(tmp_path)
    run.ranks.mkdir()
    run.write_json("data.json", s.to_json())
    rep = build_report(run, plan_of(10_000_000, 6_000_000, {"params": 6_000_000}), expected_ranks=1)
    assert rep.data == s and rep.data.masked_tokens == 600
    back = RunReport.from_json(json.loads(json.dumps(rep.to_json())))
    assert back.data == s
    assert "data" not in RunReport().to_json() and RunReport.from_json({"verdict": "failed"}).data is None


def test_the_backends_outcome_is_the_one_report_json_keeps():
    import launcher.backends.base as base
    import launcher.backends.local as local

    assert not hasattr(base, "Outcome") and local.RankFailure is RankFailure  # one type, not a copy per layer
    pending = RunOutcome(ok=True, pending=True)
    assert "pending" not in pending.to_json()  # a report has a verdict: never a pending outcome
    assert RunOutcome.from_json(pending.to_json()) == RunOutcome(ok=True)
