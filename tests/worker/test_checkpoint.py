"""Checkpoint round trips on a 1-rank gloo group (FSDP2 + DCP), and resume through the worker's entry point."""

import json
import random

import numpy as np
import torch
import torch.distributed as dist

from launcher.config.job import Job
from launcher.config.load import from_dict
from launcher.runtime import memory_probe, read_jsonl
from launcher.worker import checkpoint
from launcher.worker.engines.fsdp import FsdpEngine
from launcher.worker.main import main
from launcher.worker.model import build
from launcher.worker.recipes import make_recipe
from launcher.worker.testing import plan_dict, tiny_gpt2_job


def fsdp_engine(job: Job):
    torch.manual_seed(0)
    recipe = make_recipe(job.task, job.data)
    model = build(job, recipe, seq_len=32, hf_checkpointing=False)
    engine = FsdpEngine(reshard_after_forward=True, offload_params="none", offload_optimizer="none",
                        activation_checkpointing=True, precision="fp32", grad_accum_steps=1,
                        device=torch.device("cpu"))
    probe = memory_probe(device="cpu", track_categories=False)
    engine.setup(model, job.train, probe)
    return engine


def train_step(engine):
    ids = torch.randint(3, 1024, (2, 32))
    engine.backward(engine.forward(input_ids=ids, labels=ids).loss)
    assert engine.step()


def test_fsdp_checkpoint_round_trip(tmp_path, single_rank, examples_data):
    dist.init_process_group("gloo")
    job = from_dict(Job, tiny_gpt2_job(str(examples_data / "causal.jsonl")))
    a = fsdp_engine(job)
    for _ in range(2):
        train_step(a)
    state = checkpoint.TrainerState(global_step=2, micro_steps=2, samples_per_rank=4, world_size=1,
                                    samples_per_step_per_rank=2, engine="fsdp", first_loss=7.0)
    random.seed(11)
    np.random.seed(11)
    torch.manual_seed(11)
    tag = checkpoint.save(a, tmp_path, state)
    assert checkpoint.latest_tag(tmp_path) == tag == "step-00000002"
    expect_rng = (random.random(), np.random.rand(), torch.rand(1).item())

    b = fsdp_engine(job)
    loaded = checkpoint.load(b, tmp_path, tag, world_size=1, samples_per_step_per_rank=2)
    assert loaded == state
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expect_rng
    sa, sb = a.model.state_dict(), b.model.state_dict()
    assert all(torch.equal(sa[k].full_tensor(), sb[k].full_tensor()) for k in sa)
    oa, ob = a.optimizer.state_dict()["state"], b.optimizer.state_dict()["state"]
    assert all(torch.equal(oa[i]["exp_avg"].full_tensor(), ob[i]["exp_avg"].full_tensor()) for i in oa)
    assert b.scheduler.state_dict()["last_epoch"] == a.scheduler.state_dict()["last_epoch"] == 2
    # The next step is identical too.
    torch.manual_seed(5)
    train_step(a)
    torch.manual_seed(5)
    train_step(b)
    sa, sb = a.model.state_dict(), b.model.state_dict()
    assert all(torch.equal(sa[k].full_tensor(), sb[k].full_tensor()) for k in sa)


def test_incomplete_tag_is_ignored(tmp_path):
    (tmp_path / "step-00000003").mkdir()
    assert checkpoint.latest_tag(tmp_path) is None
    (tmp_path / "latest").write_text("step-00000003\n")
    assert checkpoint.latest_tag(tmp_path) is None  # no trainer_state.json: the save never finished
    (tmp_path / "step-00000003" / "trainer_state.json").write_text("{}")
    assert checkpoint.latest_tag(tmp_path) == "step-00000003"


def test_worker_resume_repeats_no_step_and_matches_a_straight_run(make_run_dir, single_rank, examples_data):
    plan = plan_dict(engine="fsdp", micro_batch_size=2, grad_accum_steps=2, world_size=1, seq_len=32,
                     precision="fp32", activation_checkpointing=True)
    job = tiny_gpt2_job(str(examples_data / "causal.jsonl"), max_steps=4)
    job["data"]["max_seq_len"] = 32
    job["data"]["eval_fraction"] = 0.02
    job["train"]["global_batch_size"] = 4
    straight = make_run_dir(job, plan, name="straight")
    assert main([str(straight)]) == 0

    run = make_run_dir(job, plan, name="resumed")
    (run / "control").mkdir()
    (run / "control" / "checkpoint").touch()  # ask for a checkpoint at the first step boundary
    assert main([str(run)]) == 0
    report = json.loads((run / "ranks" / "rank-0.json").read_text())
    assert report["status"] == "checkpointed" and report["steps_done"] == 1
    assert not (run / "control" / "checkpoint").exists()
    assert main([str(run)]) == 0
    report = json.loads((run / "ranks" / "rank-0.json").read_text())
    assert report["status"] == "completed" and report["resumed_from_step"] == 1 and report["steps_done"] == 4
    steps = read_jsonl(run / "steps" / "rank-0.jsonl")
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    assert [r["loss"] for r in steps] == [r["loss"] for r in read_jsonl(straight / "steps" / "rank-0.jsonl")]
    assert report["first_loss"] == steps[0]["loss"] and report["eval_loss"] is not None
