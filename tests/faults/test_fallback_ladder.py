"""The OOM ladder (launcher.planner.fallback) as a pure function: rung order, the global batch, host RAM and NVMe
skips."""

from __future__ import annotations

import dataclasses
import json

import pytest

from launcher.config.jobfile import job_from_data
from launcher.inputs.plan_inputs import plan_request
from launcher.planner.fallback import RUNGS, Measurement, correction_for, next_strategy
from launcher.planner.plan import Strategy
from launcher.planner.search import make_plan, score
from tests.conftest import TINY_GPT2

PINNED_MB8 = {"engine": "fsdp", "fsdp_reshard_after_forward": False, "offload_optimizer": "none",
              "offload_params": "none", "micro_batch_size": 8, "activation_checkpointing": False,
              # the exact levers off too: this is the micro-batch rung's test (chunked loss would fit mb 4)
              "loss_chunks": 0, "activation_offload": False, "optimizer_in_backward": False}


def request(data_file, tmp_path, strategy: dict, **cluster):
    doc = {"name": "ladder", "model": dict(TINY_GPT2), "task": "causal_lm",
           "data": {"path": str(data_file), "max_seq_len": 128},
           "train": {"global_batch_size": 16, "max_steps": 2, "precision": "bf16"}, "gpus": 2, "budget": "16MB",
           "strategy": strategy, "cluster": cluster}
    return plan_request(job_from_data(doc, tmp_path), force=True)


def oom(peak: int, **by_category) -> Measurement:
    return Measurement(kind="oom", peak_bytes=peak, by_category=by_category, rank=1, phase="forward", step=1)


def test_micro_batch_first_largest_that_fits_and_the_global_batch_stays(data_file, tmp_path):
    req = request(data_file, tmp_path, PINNED_MB8)
    plan = make_plan(req)
    fb = next_strategy(plan.strategy, plan.estimate, req, oom(16_600_000, activations=9_000_000))
    s = fb.strategy
    assert fb.rung == "micro_batch" and (s.micro_batch_size, s.grad_accum_steps) == (2, 4)
    assert s.micro_batch_size * s.grad_accum_steps * req.world_size == req.global_batch_size == 16
    assert (s.engine, s.activation_checkpointing) == ("fsdp", False)  # nothing else changed
    assert fb.corrected_peak_bytes <= req.usable_bytes
    assert "rank 1 ran out of memory in forward at step 1" in fb.reason and "micro-batch 8 -> 2" in fb.reason
    assert any("mb=4x2" in x and "over" in x for x in fb.skipped), fb.skipped  # 4 was predicted not to fit


def test_no_correction_when_the_prediction_was_not_low(data_file, tmp_path):
    req = request(data_file, tmp_path, PINNED_MB8)
    plan = make_plan(req)  # forced: predicted 36 MB, the OOM struck at 16.6 MB
    fix = correction_for(plan.estimate, oom(16_600_000, params=2 * plan.estimate.breakdown["params"]))
    assert set(fix.ratios.values()) == {1.0} and fix.uniform == 1.0


def test_correction_scales_the_category_that_grew(data_file, tmp_path):
    req = request(data_file, tmp_path, {**PINNED_MB8, "micro_batch_size": 2})
    plan = make_plan(req)
    acts = plan.estimate.breakdown["activations"] + plan.estimate.breakdown["logits"]
    m = Measurement(kind="over_budget", peak_bytes=plan.estimate.peak_bytes + 2 * acts,
                    by_category={"activations": 3 * acts})
    fix = correction_for(plan.estimate, m)
    assert fix.ratios["activations"] == pytest.approx(3.0) and fix.ratios["params"] == 1.0
    assert fix.apply(plan.estimate) >= m.peak_bytes
    fb = next_strategy(plan.strategy, plan.estimate, req, m)
    assert fb.strategy is not None and fb.strategy.micro_batch_size == 1
    assert "activations x3.00" in fb.reason


def test_the_rungs_come_in_order_and_end(data_file, tmp_path):
    """A DeepSpeed run that keeps failing walks micro-batch, checkpointing, ZeRO stage, offload, then stops."""
    req = request(data_file, tmp_path, {"engine": "deepspeed", "zero_stage": 0, "micro_batch_size": 8,
                                         "activation_checkpointing": False, "offload_optimizer": "none",
                                         "offload_params": "none"})
    s = make_plan(req).strategy
    est = score(req, s).estimate
    tried, rungs = [], []
    for _ in range(12):
        # The budget keeps being crossed right where the planner said it fits: every rung gets its chance.
        fb = next_strategy(s, est, req, oom(int(req.budget_bytes * 1.01)), tried)
        if fb.strategy is None:
            assert "no rung of the ladder is left" in fb.reason
            break
        assert fb.strategy.micro_batch_size * fb.strategy.grad_accum_steps * req.world_size == 16
        assert fb.strategy.engine == "deepspeed"
        assert fb.corrected_peak_bytes <= req.usable_bytes, fb.reason  # only what is predicted to fit is proposed
        rungs.append(fb.rung)
        tried.append(s)
        s, est = fb.strategy, score(req, fb.strategy).estimate
    else:
        raise AssertionError(f"the ladder did not end: {rungs}")
    order = [RUNGS.index(r) for r in rungs]
    assert order == sorted(order), rungs
    firsts = [r for i, r in enumerate(rungs) if r not in rungs[:i]]
    assert firsts[:2] == ["micro_batch", "activation_checkpointing"], rungs
    # Each OOM scales the correction up, until the most frugal strategy reachable (ZeRO-3 with both offloads: the
    # walk takes the ZeRO stage before offload) is itself predicted over the budget: it is named, not launched.
    if "so it is not launched" in fb.reason:
        assert fb.corrected_peak_bytes > req.usable_bytes
        assert "ZeRO stage 0 -> 3, optimizer state -> cpu, parameters -> cpu" in fb.reason, fb.reason
    else:
        lay = s.layout
        assert lay.zero_stage == 3 and lay.offload_optimizer == "cpu" and lay.offload_params == "cpu", s.label()


def gpu_request(tmp_path, strategy: dict, model: str = "gpt2-124m", budget: str = "4GB", **cluster):
    """gpt2-124m planned for an A100 (no run): offload there frees device memory and costs host RAM."""
    doc = {"name": "ladder", "model": model, "task": "causal_lm",
           "data": {"path": str(tmp_path / "d.jsonl"), "max_seq_len": 128},
           "train": {"global_batch_size": 16, "max_steps": 2, "precision": "bf16"}, "gpus": 2, "budget": budget,
           "strategy": strategy, "cluster": {"hardware": "a100-40gb", **cluster}}
    (tmp_path / "d.jsonl").write_text('{"text": "a"}\n')
    return plan_request(job_from_data(doc, tmp_path), force=True)


def test_offload_host_ram_cannot_hold_is_skipped_for_nvme(tmp_path):
    # Full recompute pinned: with every k-th block the checkpointing rung would have full recompute left to try.
    base = {"engine": "deepspeed", "zero_stage": 3, "micro_batch_size": 1, "activation_checkpointing": True,
            "checkpoint_every": 1, "offload_optimizer": "none", "offload_params": "none"}
    # NVMe offload holds DeepSpeed's 4 swap buffers of one sub-group in host RAM: less than CPU offload only where a
    # rank's partition spans several sub-groups (gpt2-124m's is one), so a 1B model.
    # 6 GB: DeepSpeed's ranks hold ~1.9 GB outside the allocator (context, kernels, two NCCL communicators), and
    # ZeRO-3's end of backward the final flush's copies beside the gathered 128k-vocabulary embedding.
    req = gpu_request(tmp_path, base, model="llama-1b", budget="6GB", nvme_path=str(tmp_path), nvme_free="1TB")
    s = make_plan(req).strategy
    est = score(req, s).estimate
    def host_with(opt: str) -> int:
        return score(req, Strategy.from_json(s.to_json() | dict(offload_optimizer=opt))).estimate.host_bytes_per_node

    host_cpu_offload, host_nvme_offload = host_with("cpu"), host_with("nvme")
    assert host_nvme_offload < host_cpu_offload
    tight = dataclasses.replace(req, host_ram_per_node_bytes=(host_cpu_offload + host_nvme_offload) // 2)
    fb = next_strategy(s, est, tight, oom(int(req.budget_bytes * 1.01)))
    assert fb.strategy is not None and fb.rung == "nvme", fb.reason
    assert fb.strategy.layout.offload_optimizer == "nvme"
    assert any(x.startswith("optimizer_offload") and "cluster.host_ram_per_node" in x for x in fb.skipped)
    # Without an NVMe path the same host RAM leaves nothing to try.
    no_nvme = dataclasses.replace(tight, nvme_free_bytes=None)
    last = next_strategy(s, est, no_nvme, oom(int(req.budget_bytes * 1.01)))
    assert last.strategy is None and "host RAM" in last.reason


def test_nvme_is_not_a_rung_for_device_memory(tmp_path):
    """NVMe frees host RAM, not device memory: with host RAM to spare the ladder never proposes it."""
    req = gpu_request(tmp_path, {"engine": "deepspeed", "zero_stage": 3, "micro_batch_size": 1,
                                 "activation_checkpointing": True, "offload_optimizer": "cpu", "offload_params": "cpu"},
                      nvme_path=str(tmp_path), nvme_free="1TB")
    plan = make_plan(req)
    fb = next_strategy(plan.strategy, plan.estimate, req, oom(int(req.budget_bytes * 1.01)))
    assert fb.strategy is None


# -- the launcher's loop around it (launcher.session.ladder.run_ladder), with the ranks faked ----------------------

def _fake_attempts(run, results):
    """A launch that writes what ranks would, per attempt: 'oom', 'over' or 'ok'; (attempt function, strategies)."""
    from launcher.errors import EXIT_OK, EXIT_OVER_BUDGET, EXIT_TRAINING_FAILED
    from launcher.records.runreport import RankFailure, RunOutcome

    seen = []

    def fake(job, plan, run_dir=run):
        kind = results[len(seen)]
        seen.append(plan.strategy)
        peak = {"oom": plan.budget_bytes + 1000, "over": plan.budget_bytes + 5000, "ok": plan.budget_bytes // 2,
                "oom-far-over": 20 * plan.budget_bytes}[kind]
        kind = "oom" if kind == "oom-far-over" else kind
        for r in range(plan.world_size):
            run_dir.write_json(f"ranks/rank-{r}.json", {
                "rank": r, "status": "oom" if kind == "oom" else "completed", "measured_peak_bytes": peak,
                "peak_by_category": {"activations": peak // 2},
                "oom": {"phase": "backward", "step": 1, "crossed_at_bytes": peak} if kind == "oom" else None})
        # A report.json as an older launcher wrote it (no verdict, a short row): it still reads back.
        run_dir.write_json("report.json", {"within_budget": kind == "ok",
                                           "ranks": [{"rank": 0, "measured_peak_bytes": peak}]})
        if kind == "oom":
            return EXIT_TRAINING_FAILED, RunOutcome(ok=False, failures=[RankFailure(rank=0, exitcode=75)])
        return (EXIT_OK if kind == "ok" else EXIT_OVER_BUDGET), RunOutcome(ok=True)

    return fake, seen


def _ladder_job(data_file, tmp_path, tries):
    doc = {"name": "ladder", "model": dict(TINY_GPT2), "task": "causal_lm",
           "data": {"path": str(data_file), "max_seq_len": 128},
           "train": {"global_batch_size": 16, "max_steps": 2, "precision": "bf16"}, "gpus": 2, "budget": "16MB",
           "strategy": {**PINNED_MB8, "engine": "deepspeed", "zero_stage": 0, "fsdp_reshard_after_forward": None},
           "auto_fallback": tries}
    return job_from_data(doc, tmp_path)


def test_run_ladder_archives_each_attempt_and_records_the_ladder(data_file, tmp_path, capsys):
    from launcher.files.rundir import RunDir
    from launcher.inputs.plan_inputs import plan_job
    from launcher.session.ladder import run_ladder
    from launcher.session.prepare import write_plan_outputs

    job = _ladder_job(data_file, tmp_path, tries=3)
    run = RunDir.create(tmp_path / "run")
    plan = plan_job(job, force=True)
    write_plan_outputs(run.path, plan, job)  # as prepare_run_dir does before attempt 1
    fake, seen = _fake_attempts(run, ["oom", "over", "ok"])
    code = run_ladder(job, plan, run, fake)
    assert code == 0
    report = json.loads((run.path / "report.json").read_text())
    assert [a["outcome"] for a in report["attempts"]] == ["oom", "over_budget", "ok"]
    assert [a["dir"] for a in report["attempts"]] == ["attempts/1", "attempts/2", "."]
    assert report["attempts"][0]["oom"] == {"rank": 0, "phase": "backward", "step": 1}
    assert all(a["global_batch_size"] == 16 for a in report["attempts"])
    assert len({s.label() for s in seen}) == 3  # a new strategy each time
    for k in (1, 2):
        assert (run.path / "attempts" / str(k) / "plan.json").is_file()
        assert (run.path / "attempts" / str(k) / "ranks" / "rank-0.json").is_file()
    assert json.loads((run.path / "plan.json").read_text())["label"] == seen[-1].label()
    assert "ended within budget on attempt 3" in capsys.readouterr().err


def test_a_scripts_relaunch_is_planned_for_the_script(data_file, tmp_path):
    # launch --script --auto-fallback: each rung is planned for the user's script, as attempt 1 was (the levers a
    # script receives, the adapters' dtype it computes in: PlanRequest.script), not for the launcher's recipe.
    from launcher.files.rundir import RunDir
    from launcher.inputs.plan_inputs import plan_job
    from launcher.session.ladder import run_ladder

    job = _ladder_job(data_file, tmp_path, tries=2)
    run = RunDir.create(tmp_path / "run")
    fake, seen = _fake_attempts(run, ["oom", "ok"])
    plans = []

    def attempt(job, plan):
        plans.append(plan)
        return fake(job, plan)

    assert run_ladder(job, plan_job(job, force=True, script=True), run, attempt) == 0
    assert [p.script for p in plans] == [True, True] and seen[0] != seen[1]
    assert json.loads((run.path / "plan.json").read_text())["script"] is True


def test_run_ladder_stops_after_n_relaunches_with_the_last_exit_code(data_file, tmp_path, capsys):
    from launcher.errors import EXIT_OVER_BUDGET
    from launcher.files.rundir import RunDir
    from launcher.inputs.plan_inputs import plan_job
    from launcher.session.ladder import run_ladder

    job = _ladder_job(data_file, tmp_path, tries=1)
    run = RunDir.create(tmp_path / "run")
    fake, seen = _fake_attempts(run, ["oom", "over", "ok"])
    code = run_ladder(job, plan_job(job, force=True), run, fake)
    assert code == EXIT_OVER_BUDGET and len(seen) == 2
    report = json.loads((run.path / "report.json").read_text())
    assert report["attempts"][-1]["stopped"] == "auto_fallback: all 1 relaunch(es) used"
    assert report["auto_fallback"] == {"tries": 1, "relaunches": 1, "ended_within_budget": False}
    assert "all 1 relaunch(es) used" in capsys.readouterr().err


@pytest.mark.parametrize("results, tries, attempts", [
    (["oom-far-over", "ok"], 3, 1),  # 20x the budget: the correction leaves no rung predicted to fit
    (["oom", "oom", "ok"], 1, 2),    # the relaunches run out on an OOM
])
def test_the_ladder_never_launches_a_rung_predicted_over_budget_and_ends_with_exit_3(
        data_file, tmp_path, capsys, results, tries, attempts):
    """README: exit 3 when the budget is not met. The ladder ends so whenever memory stopped it (an OOM, under
    --enforce the budget's own cap, or a peak over budget), and never relaunches what it predicts to be over."""
    from launcher.errors import EXIT_OVER_BUDGET
    from launcher.files.rundir import RunDir
    from launcher.inputs.plan_inputs import plan_job
    from launcher.session.ladder import run_ladder

    job = _ladder_job(data_file, tmp_path, tries=tries)
    run = RunDir.create(tmp_path / "run")
    fake, seen = _fake_attempts(run, results)
    code = run_ladder(job, plan_job(job, force=True), run, fake)
    err = capsys.readouterr().err
    assert code == EXIT_OVER_BUDGET, err
    assert len(seen) == attempts, [s.label() for s in seen]
    report = json.loads((run.path / "report.json").read_text())
    last = report["attempts"][-1]
    assert last["outcome"] == "oom" and last["next"] is None
    if attempts == 1:
        assert "no rung of the ladder is left that is predicted to fit" in last["stopped"]
        assert "so it is not launched" in err and "usable" in last["stopped"]
    assert report["auto_fallback"]["ended_within_budget"] is False
    assert json.loads((run.path / "state.json").read_text())["state"] == "over_budget"
    assert f"(exit {EXIT_OVER_BUDGET})" in err or attempts == 1


def test_checkpointing_rung_goes_from_every_kth_block_to_every_block(data_file, tmp_path):
    from launcher.planner.fallback import describe_change, rung_options

    req = request(data_file, tmp_path, {**PINNED_MB8, "activation_checkpointing": True})
    s = dataclasses.replace(make_plan(req).strategy, checkpoint_every=2)
    (full,) = rung_options("activation_checkpointing", s, req)
    assert (full.activation_checkpointing, full.checkpoint_every) == (True, 1)
    assert "every 2 -> every 1 block" in describe_change(s, full)
    assert rung_options("activation_checkpointing", full, req) == []
