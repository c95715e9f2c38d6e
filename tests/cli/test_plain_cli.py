"""The plain engine through the real `launch` CLI on gloo: one rank with no wrapper, two DDP replicas (the step
contract's run, shared: tests/shared_runs.py); each rank's peak against its prediction one-sidedly (check_report),
the offline export from the engine's checkpoint."""

import json

from tests.cli.test_run_cli import check_exported, check_report, job_file, launch, near_budget

TRAIN = {"global_batch_size": 8, "precision": "fp32", "lr": 3e-3, "max_steps": 4}


def test_plain_one_rank_no_wrapper_within_prediction_and_exports(tmp_path):
    # Every 2nd block checkpointed (transformers' every_n_layers): the lever the plain engine takes from the model.
    job = near_budget(job_file(tmp_path, "plain1", gpus=1, train=TRAIN, strategy={
        "engine": "plain", "micro_batch_size": 4, "activation_checkpointing": True, "checkpoint_every": 2}))
    res = launch(job, "--run-dir", tmp_path / "run", "--quiet")
    assert res.returncode == 0, res.stdout + res.stderr
    check_report(tmp_path / "run", 1)
    plan = json.loads((tmp_path / "run" / "plan.json").read_text())
    assert (plan["engine"], plan["ddp"], plan["grad_accum_steps"]) == ("plain", False, 2)
    assert plan["zero_stage"] is None and plan["fsdp_reshard_after_forward"] is None
    # No config file of its own: the ranks read plan.json.
    assert not (tmp_path / "run" / "fsdp.yaml").exists() and not (tmp_path / "run" / "ds_config.json").exists()
    check_exported(tmp_path / "run", tmp_path / "offline")


def test_plain_ddp_two_ranks_within_prediction_and_exports(curve_runs, tmp_path):
    # The step contract's DDP run (tests/shared_runs.py: its loss curve is checked in test_step_contract), launched
    # under a budget near its prediction.
    run = curve_runs / "ddp"
    report = check_report(run, 2)
    plan = json.loads((run / "plan.json").read_text())
    assert (plan["engine"], plan["ddp"]) == ("plain", True)
    # Whole replicas: every rank holds every fp32 parameter, and the same peak to within the data's lengths.
    for k in (0, 1):
        rank = json.loads((run / "ranks" / f"rank-{k}.json").read_text())
        assert rank["after_step_by_category"]["params"] == 4 * rank["total_params"]
    peaks = [r["measured_peak_bytes"] for r in report["ranks"]]
    assert min(peaks) > 0.8 * max(peaks)
    check_exported(run, tmp_path / "offline")
