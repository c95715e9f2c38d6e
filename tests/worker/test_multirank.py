"""Two CPU ranks under torchrun: DeepSpeed ZeRO-2 fp32 on a tiny GPT-2, stopped by the control file, resumed.

The launcher's CLI tests own multi-rank runs in general; this one checks the worker alone, end to end.
"""

import json
import os
import shutil
import subprocess
import sys

import torch

from launcher.runtime import read_jsonl
from tests.worker.export_checks import (
    check_export,
    eval_loss_of,
    export_in_process,
    load_export,
    safetensors_of,
    same_tensors,
)
from tests.worker.run_dirs import ds_config_dict, plan_dict, tiny_gpt2_job


def torchrun(run_dir, timeout_s=120):
    """The ranks as the launcher starts them (launcher.worker.rank_entry); their output is in logs/, so a failed run's
    stderr carries rank 0's log tail."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "launcher.worker.rank_entry", str(run_dir)]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
    log = run_dir / "logs" / "rank-0.log"
    if res.returncode and log.is_file():
        res.stderr += "\n--- logs/rank-0.log ---\n" + log.read_text()[-3000:]
    return res


def test_zero2_two_ranks_checkpoint_and_resume(make_run_dir, examples_data):
    plan = plan_dict(engine="deepspeed", zero_stage=2, micro_batch_size=2, grad_accum_steps=2, world_size=2,
                     seq_len=32)
    job = tiny_gpt2_job(str(examples_data / "causal.jsonl"), max_steps=3)
    job["data"]["max_seq_len"] = 32
    job["data"]["eval_fraction"] = 0.02  # 8 rows: 2 eval batches per rank keep the test short
    run = make_run_dir(job, plan, ds_config_dict(plan, lr=2e-3))
    (run / "control").mkdir()
    (run / "control" / "checkpoint").touch()

    first = torchrun(run)
    assert first.returncode == 0, first.stderr[-3000:]
    reports = [json.loads((run / "ranks" / f"rank-{k}.json").read_text()) for k in (0, 1)]
    assert [r["status"] for r in reports] == ["checkpointed", "checkpointed"]
    assert (run / "checkpoint" / "latest").read_text().strip() == "step-00000001"
    assert not (run / "model").exists()  # a stopped run exports nothing: `launch export` does, from its checkpoint
    step1 = run.parent / "step1"
    code, out, err = export_in_process(run, "--out", step1)
    assert code == 0, err[-3000:]
    assert "exported the model of step 1" in out
    assert json.loads((step1 / "export.json").read_text())["source"] == "checkpoint step-00000001"

    second = torchrun(run)
    assert second.returncode == 0, second.stderr[-3000:]
    for k in (0, 1):
        r = json.loads((run / "ranks" / f"rank-{k}.json").read_text())
        assert r["status"] == "completed" and r["resumed_from_step"] == 1 and r["steps_done"] == 3
        assert r["world_size"] == 2 and r["device"] == "cpu" and r["engine"] == "deepspeed"
        cats = r["peak_by_category"]
        assert r["measured_peak_bytes"] == max(r["phases"].values()) and sum(cats.values()) > 0
        assert r["after_step_by_category"]["params"] == 4 * r["total_params"]  # fp32 weights on every rank
        steps = read_jsonl(run / "steps" / f"rank-{k}.jsonl")
        assert [s["step"] for s in steps] == [1, 2, 3]
        assert steps[-1]["loss"] < steps[0]["loss"]
    assert (run / "checkpoint" / "latest").read_text().strip() == "step-00000003"

    # The finished run's own export reloads with from_pretrained and gives the eval loss the run reported.
    assert {"config.json", "generation_config.json", "model.safetensors", "export.json"} <= \
        {p.name for p in (run / "model").iterdir()}
    final = check_export(run)
    # `launch export` of the same (latest) checkpoint, offline from the ZeRO-2 files: the same tensors; the
    # stopped run's step-1 export is another model (its eval loss lies between).
    code, _, err = export_in_process(run, "--out", run.parent / "again")
    assert code == 0, err[-3000:]
    same_tensors(run / "model", run.parent / "again")
    a, b = safetensors_of(step1), safetensors_of(run / "model")
    assert any(not torch.equal(a[k], b[k]) for k in a)
    assert abs(eval_loss_of(run, load_export(run, step1)) - final) > 1e-4


def test_plain_ddp_two_ranks_checkpoint_and_resume_match_a_straight_run(curve_runs, tmp_path):
    # DDP replicas with accumulation (no_sync on the first micro-batch): stopped at step 1 by the control file,
    # resumed from rank 0's plain.pt on both ranks, the losses those of an uninterrupted run. The uninterrupted
    # run is the step contract's DDP launch (tests/shared_runs.py curve_runs: 2 micro-batches of 2 per rank, 6
    # steps); this run dir holds its job.yaml and plan.json.
    straight = curve_runs / "ddp"
    run = tmp_path / "run"
    run.mkdir()
    for name in ("job.yaml", "plan.json"):
        shutil.copy(straight / name, run / name)
    assert json.loads((run / "plan.json").read_text())["grad_accum_steps"] == 2
    (run / "control").mkdir()
    (run / "control" / "checkpoint").touch()
    first = torchrun(run)
    assert first.returncode == 0, first.stderr[-3000:]
    assert (run / "checkpoint" / "latest").read_text().strip() == "step-00000001"
    assert [p.name for p in (run / "checkpoint" / "step-00000001").glob("*.pt")] == ["plain.pt"]  # rank 0's
    second = torchrun(run)
    assert second.returncode == 0, second.stderr[-3000:]
    for k in (0, 1):
        r = json.loads((run / "ranks" / f"rank-{k}.json").read_text())
        assert r["status"] == "completed" and r["resumed_from_step"] == 1 and r["engine"] == "plain"
        assert [s["loss"] for s in read_jsonl(run / "steps" / f"rank-{k}.jsonl")] == \
            [s["loss"] for s in read_jsonl(straight / "steps" / f"rank-{k}.jsonl")]
    check_export(run)
