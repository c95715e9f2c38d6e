"""report.json's verdict and memory.png's scale."""

import json
import struct

from launcher.planner.plan import Buckets, Estimate, Plan, Strategy
from launcher.records.report import BUDGET_OFF_CHART, over_budget_message, plot_memory, plot_unit
from launcher.records.runreport import RankRow, RunReport


def report(budget: int, measured: int = 8_340_000, predicted: int = 8_610_000) -> RunReport:
    rows = [RankRow(rank=r, host="h", measured=True, measured_peak_bytes=measured, predicted_peak_bytes=predicted,
                    budget_bytes=budget, headroom_bytes=budget - measured, within_budget=measured <= budget,
                    verdict="ok" if measured <= budget else "OVER", grew_most="activations", grew_most_bytes=10,
                    measured_breakdown={"params": 500_000, "activations": 7_000_000}) for r in range(2)]
    return RunReport(ranks=rows, budget_bytes=budget, within_budget=all(r.within_budget for r in rows),
                     predicted_breakdown={"params": 400_000, "activations": 7_000_000, "logits": 100})


def plan_of(budget: int, peak: int, breakdown: dict, *, basis: str = "cpu_tensor_bytes", overhead: dict | None = None,
            reasons: tuple[str, ...] = ()) -> Plan:
    """A plan with only what the report reads set to something that matters."""
    strategy = Strategy.from_json(dict(engine="deepspeed", zero_stage=2, fsdp_reshard_after_forward=None,
                                       offload_optimizer="none", offload_params="none", micro_batch_size=1,
                                       grad_accum_steps=1, activation_checkpointing=False))
    estimate = Estimate(breakdown=breakdown, peak_bytes=peak, host_bytes_per_node=0, nvme_bytes_per_node=0,
                        step_time_s=1.0, basis=basis, overhead=overhead or {})
    buckets = Buckets(reduce_bucket_size=1, allgather_bucket_size=1, stage3_prefetch_bucket_size=1,
                      stage3_max_live_parameters=1, stage3_param_persistence_threshold=1)
    return Plan(strategy=strategy, estimate=estimate, buckets=buckets, num_params=1, trainable_params=1,
                budget_bytes=budget, usable_bytes=budget, world_size=1, nodes=1, gpus_per_node=1, global_batch_size=1,
                seq_len=8, precision="fp32", hardware="cpu", reasons=list(reasons))


def png_size(path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", head[16:24])


def test_plot_unit_follows_the_peaks_in_decimal_units():
    assert plot_unit(8.6e6) == ("MB", 1e6)
    assert plot_unit(14e9) == ("GB", 1e9)
    assert plot_unit(999) == ("bytes", 1.0)


def test_memory_png_in_both_scales(tmp_path):
    near, far = tmp_path / "near.png", tmp_path / "far.png"
    assert plot_memory(report(budget=12_000_000), near) == near
    assert plot_memory(report(budget=int(BUDGET_OFF_CHART * 8_610_000) + 1), far) == far
    assert png_size(near) == png_size(far) == (990, 360)
    assert plot_memory(RunReport(ranks=[], budget_bytes=1), tmp_path / "none.png") is None


def test_over_budget_message_names_the_rank_peak_budget_and_category():
    msg = over_budget_message(report(budget=8_000_000))
    assert msg.startswith("rank 1 on h peaked at 8.34 MB, over the budget of 8.00 MB by 340.00 KB") or \
        msg.startswith("rank 0 on h peaked at 8.34 MB, over the budget of 8.00 MB by 340.00 KB")
    assert "activations grew most" in msg and "(1 more rank(s) over)" in msg
    assert over_budget_message(report(budget=9_000_000)) is None
    assert over_budget_message(report(budget=8_340_000)) is None  # a peak equal to the budget is within it


def test_a_rank_that_failed_before_measuring_is_failed_not_ok(tmp_path):
    from launcher.files.rundir import RunDir
    from launcher.records.report import build_report, render_report

    run = RunDir(tmp_path)
    (tmp_path / "ranks").mkdir()
    (tmp_path / "ranks" / "rank-0.json").write_text(json.dumps(
        {"rank": 0, "host": "h", "status": "completed", "measured_peak_bytes": 5_000_000,
         "peak_by_category": {"params": 5_000_000}}))
    (tmp_path / "ranks" / "rank-1.json").write_text(json.dumps(
        {"rank": 1, "host": "h", "status": "failed", "measured_peak_bytes": 0, "peak_by_category": None,
         "error": "ConfigError: model: './m' is a directory without config.json"}))
    plan = plan_of(10_000_000, 6_000_000, {"params": 6_000_000})
    rep = build_report(run, plan, expected_ranks=2)
    r0, r1 = rep.ranks
    assert (r0.verdict, r0.measured, r0.within_budget) == ("ok", True, True)
    assert (r1.verdict, r1.measured, r1.within_budget) == ("failed", False, False)
    assert rep.within_budget is False
    assert over_budget_message(rep) is None  # failed is not over budget
    row1 = next(ln for ln in render_report(rep).splitlines() if ln.split()[0] == "1")
    assert row1.split()[1:] == ["h", "6.00", "MB", "-", "10.00", "MB", "-", "failed", "-"]
    assert "NOT within budget" in render_report(rep)


def write_ranks(tmp_path, ranks: list[dict]):
    from launcher.files.rundir import RunDir

    run = RunDir(tmp_path)
    run.ranks.mkdir(parents=True)
    for r in ranks:  # a rank that finished, unless the case says otherwise (no status is no completion)
        (run.ranks / f"rank-{r['rank']}.json").write_text(json.dumps({"status": "completed", **r}))
    return run


CUDA_PLAN = plan_of(80_000_000_000, 50_000_000_000, basis="cuda_reserved_plus_context",
                    breakdown={"params": 30_000_000_000, "activations": 15_000_000_000, "reserve": 5_000_000_000},
                    overhead={"cublas_workspace": 64_000_000, "allocator_reserve": 3_600_000_000,
                              "cuda_context": 629_145_600, "nccl_buffers": 706_854_400})


def test_report_states_the_basis_cpu_ranks_measure_tensor_bytes(tmp_path):
    from launcher.records.report import build_report

    run = write_ranks(tmp_path, [{"rank": 0, "device": "cpu", "basis": "cpu_tensor_bytes", "measured_peak_bytes": 9}])
    plan = plan_of(10, 8, {"reserve": 0})
    rep = build_report(run, plan, expected_ranks=1)
    assert rep.basis == rep.predicted_basis == rep.ranks[0].basis == "cpu_tensor_bytes"
    assert rep.ranks[0].predicted_peak_bytes == 8 and rep.within_budget


def test_report_on_cuda_judges_reserved_plus_context_against_the_same_prediction(tmp_path):
    from launcher.records.report import build_report

    run = write_ranks(tmp_path, [{"rank": 0, "device": "cuda:0", "basis": "cuda_reserved_plus_context",
                                  "measured_peak_bytes": 81_000_000_000, "max_memory_allocated_bytes": 70_000_000_000,
                                  "max_memory_reserved_bytes": 80_000_000_000,
                                  "outside_allocator_bytes": 1_000_000_000}])
    rep = build_report(run, CUDA_PLAN, expected_ranks=1)
    row = rep.ranks[0]
    assert rep.basis == "cuda_reserved_plus_context" and row.predicted_peak_bytes == 50_000_000_000
    assert row.outside_allocator_bytes == 1_000_000_000
    # Allocated (70 GB) is under the budget, but reserved plus context is what OOMs: the verdict is over.
    assert not rep.within_budget and row.headroom_bytes == -1_000_000_000


def test_a_gpu_plan_run_on_cpu_ranks_is_compared_on_tensor_bytes(tmp_path):
    from launcher.records.report import build_report

    run = write_ranks(tmp_path, [{"rank": 0, "device": "cpu", "basis": "cpu_tensor_bytes",
                                  "measured_peak_bytes": 44_000_000_000}])
    rep = build_report(run, CUDA_PLAN, expected_ranks=1)
    assert rep.basis == "cpu_tensor_bytes" and rep.predicted_basis == "cuda_reserved_plus_context"
    assert rep.predicted_peak_bytes == rep.ranks[0].predicted_peak_bytes == 45_000_000_000


def test_report_carries_the_runs_eval_loss_and_accuracy(tmp_path):
    from launcher.files.rundir import RunDir
    from launcher.records.report import build_report, render_report

    (tmp_path / "ranks").mkdir()
    for r in (1, 0):  # reduced over ranks: every rank holds the run's values
        (tmp_path / "ranks" / f"rank-{r}.json").write_text(json.dumps(
            {"rank": r, "host": "h", "status": "completed", "measured_peak_bytes": 5_000_000,
             "peak_by_category": {"params": 5_000_000}, "eval_loss": 0.4321, "eval_accuracy": 0.875}))
    plan = plan_of(10_000_000, 6_000_000, {"params": 6_000_000})
    rep = build_report(RunDir(tmp_path), plan, expected_ranks=2)
    assert (rep.eval_loss, rep.eval_accuracy) == (0.4321, 0.875)
    assert [r.eval_accuracy for r in rep.ranks] == [0.875, 0.875]
    assert "eval: loss 0.4321, accuracy 87.5%" in render_report(rep)


def test_report_repeats_that_the_step_in_backward_turned_clipping_off(tmp_path):
    from launcher.records.report import build_report, render_report

    run = write_ranks(tmp_path, [{"rank": 0, "device": "cpu", "basis": "cpu_tensor_bytes", "measured_peak_bytes": 9}])
    note = "optimizer step in backward: gradient clipping is OFF -- train.max_grad_norm 1 is not applied"
    plan = plan_of(10, 8, {}, reasons=("fastest of 2", note))
    plan.math_notes = [note]
    rep = build_report(run, plan, expected_ranks=1)
    assert rep.math_notes == [note] and note in render_report(rep).splitlines()
    # The plan's typed field says it, not a reason's first words.
    plan.math_notes = []
    assert build_report(run, plan, expected_ranks=1).math_notes == []


def test_a_torn_rank_file_counts_as_missing_rather_than_ending_the_report(tmp_path):
    from launcher.records.report import build_report

    run = write_ranks(tmp_path, [{"rank": 0, "device": "cpu", "status": "completed", "measured_peak_bytes": 9}])
    (run.ranks / "rank-1.json").write_text('{"rank": 1, "status": "comp')  # a rank killed while writing it
    rep = build_report(run, plan_of(10, 8, {}), expected_ranks=2)
    assert [r.rank for r in rep.ranks] == [0] and rep.missing_ranks == [1] and rep.verdict == "incomplete"


def test_a_rank_that_completed_without_measuring_is_said_so_not_failed(tmp_path, capsys):
    """A --script that exits 0 at once: its ranks complete and measure nothing. The verdict stays not-within-budget
    (0 bytes is no evidence of fitting), but the words said "rank(s) [0, 1] failed" and "recorded a failure"."""
    from launcher.files.rundir import RunDir
    from launcher.records.report import build_report, render_report
    from launcher.records.runreport import RunOutcome
    from launcher.session.finish import describe_failure

    run = RunDir(tmp_path)
    (tmp_path / "ranks").mkdir()
    for rank in (0, 1):
        (tmp_path / "ranks" / f"rank-{rank}.json").write_text(json.dumps(
            {"rank": rank, "host": "h", "status": "completed", "measured_peak_bytes": 0}))
    rep = build_report(run, plan_of(10_000_000, 6_000_000, {"params": 6_000_000}), expected_ranks=2)
    assert rep.verdict == "failed" and not rep.within_budget
    last = render_report(rep).splitlines()[-1]
    assert "rank(s) [0, 1] completed without measuring any memory" in last and "failed" not in last.split(":", 2)[1]
    describe_failure(run, RunOutcome(ok=True), rep)
    err = capsys.readouterr().err
    assert "rank(s) [0, 1] completed without measuring any memory (peak 0 B)" in err
    assert "recorded a failure" not in err
