"""Checkpoint round trips on a 1-rank gloo group (FSDP2 + DCP), and resume through the worker's entry point."""

import dataclasses
import json
import random

import numpy as np
import pytest
import torch
import torch.distributed as dist

from launcher.config.job import Job
from launcher.config.load import from_dict
from launcher.errors import ConfigError
from launcher.planner.plan import Plan
from launcher.runtime import memory_probe, read_jsonl
from launcher.worker import checkpoint
from launcher.worker.engines.fsdp import FsdpEngine
from launcher.worker.loop import check_world
from launcher.worker.main import main
from launcher.worker.model import build
from launcher.worker.recipes import make_recipe
from tests.worker.run_dirs import plan_dict, tiny_gpt2_job


def fsdp_engine(job: Job, optimizer_in_backward: bool = False):
    torch.manual_seed(0)
    recipe = make_recipe(job.task, job.data)
    model = build(job, recipe, seq_len=32, hf_checkpointing=False)
    engine = FsdpEngine(reshard_after_forward=True, offload_params="none", offload_optimizer="none",
                        activation_checkpointing=True, precision="fp32", grad_accum_steps=1,
                        device=torch.device("cpu"), optimizer_in_backward=optimizer_in_backward)
    probe = memory_probe(device="cpu", track_categories=False)
    engine.setup(model, job.train, probe)
    return engine


def train_step(engine):
    ids = torch.randint(3, 1024, (2, 32))
    engine.backward(engine.forward(input_ids=ids, labels=ids).loss)
    assert engine.step()


@pytest.mark.parametrize("in_backward", [False, True], ids=["one-optimizer", "optimizer-in-backward"])
def test_fsdp_checkpoint_round_trip(tmp_path, single_rank, examples_data, in_backward):
    dist.init_process_group("gloo")
    job = from_dict(Job, tiny_gpt2_job(str(examples_data / "causal.jsonl")))
    a = fsdp_engine(job, in_backward)
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

    b = fsdp_engine(job, in_backward)
    loaded = checkpoint.load(b, tmp_path, tag, world_size=1, samples_per_step_per_rank=2)
    assert loaded == state
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expect_rng
    sa, sb = a.model.state_dict(), b.model.state_dict()
    assert all(torch.equal(sa[k].full_tensor(), sb[k].full_tensor()) for k in sa)
    # Per-parameter optimizers too: every one's state comes back (get_state_dict keys them by parameter name).
    assert len(a.optimizers) == (len(a.optimizer_params()) if in_backward else 1) == len(b.optimizers)
    for opt_a, opt_b in zip(a.optimizers, b.optimizers, strict=True):
        oa, ob = opt_a.state_dict()["state"], opt_b.state_dict()["state"]
        assert oa and oa.keys() == ob.keys()
        assert all(torch.equal(oa[i]["exp_avg"].full_tensor(), ob[i]["exp_avg"].full_tensor()) for i in oa)
    assert all(s.state_dict()["last_epoch"] == 2 for s in a.schedulers + b.schedulers)
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


@pytest.mark.parametrize("engine", ["fsdp", "plain"])
def test_worker_resume_repeats_no_step_and_matches_a_straight_run(make_run_dir, single_rank, examples_data, engine):
    plan = plan_dict(engine=engine, micro_batch_size=2, grad_accum_steps=2, world_size=1, seq_len=32,
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
    assert report["engine"] == engine
    steps = read_jsonl(run / "steps" / "rank-0.jsonl")
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    assert [r["loss"] for r in steps] == [r["loss"] for r in read_jsonl(straight / "steps" / "rank-0.jsonl")]
    assert report["first_loss"] == steps[0]["loss"] and report["eval_loss"] is not None


def _small_job(examples_data, max_steps: int = 4) -> tuple[dict, dict]:
    plan = plan_dict(engine="fsdp", micro_batch_size=2, grad_accum_steps=1, world_size=1, seq_len=32,
                     precision="fp32")
    job = tiny_gpt2_job(str(examples_data / "causal.jsonl"), max_steps=max_steps)
    job["data"]["max_seq_len"] = 32
    job["train"]["global_batch_size"] = 2
    return job, plan


def test_resume_moves_steps_past_the_checkpoint_aside_and_stamps_the_attempt(make_run_dir, single_rank,
                                                                           examples_data, monkeypatch):
    monkeypatch.delenv("LAUNCHER_ATTEMPT", raising=False)
    job, plan = _small_job(examples_data)
    straight = make_run_dir(job, plan, name="straight")
    assert main([str(straight)]) == 0
    straight_rows = read_jsonl(straight / "steps" / "rank-0.jsonl")
    assert [(r["step"], r["attempt"]) for r in straight_rows] == [(1, 0), (2, 0), (3, 0), (4, 0)]

    run = make_run_dir(job, plan, name="crashed")
    (run / "control").mkdir()
    (run / "control" / "checkpoint").touch()
    assert main([str(run)]) == 0  # saved step 1
    # Then the same attempt went on to log steps 2 and 3 and was killed before its next checkpoint.
    with (run / "steps" / "rank-0.jsonl").open("a") as f:
        for r in straight_rows[1:3]:
            f.write(json.dumps(r) + "\n")
        f.write('{"step": 4, "lo')  # the line the kill cut short
    assert main([str(run)]) == 0
    rows = read_jsonl(run / "steps" / "rank-0.jsonl")
    assert [(r["step"], r["attempt"]) for r in rows] == [(1, 0), (2, 1), (3, 1), (4, 1)]
    assert [r["loss"] for r in rows] == [r["loss"] for r in straight_rows]  # redone exactly
    discarded = read_jsonl(run / "steps" / "rank-0.discarded.jsonl")
    assert [(r.get("step"), r.get("attempt")) for r in discarded] == [(2, 0), (3, 0), (None, None)]
    assert discarded[2]["unparsable_line"] == '{"step": 4, "lo'
    assert all(r["discarded_by_attempt"] == 1 and r["resumed_from_step"] == 1 for r in discarded)
    assert discarded[0]["resumed_from"] == "step-00000001" and discarded[0]["loss"] == straight_rows[1]["loss"]


def test_a_requeue_before_the_first_checkpoint_sets_every_earlier_step_aside(make_run_dir, single_rank,
                                                                            examples_data, monkeypatch):
    job, plan = _small_job(examples_data, max_steps=3)
    run = make_run_dir(job, plan)
    (run / "steps").mkdir(exist_ok=True)
    (run / "steps" / "rank-0.jsonl").write_text("".join(json.dumps({"step": s, "loss": 7.0, "attempt": 0}) + "\n"
                                                        for s in (1, 2)))
    monkeypatch.setenv("LAUNCHER_ATTEMPT", "1")  # what SlurmTask passes: SLURM_RESTART_COUNT
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    assert main([str(run)]) == 0
    rows = read_jsonl(run / "steps" / "rank-0.jsonl")
    assert [(r["step"], r["attempt"], r["slurm_job_id"]) for r in rows] == [(s, 1, "4242") for s in (1, 2, 3)]
    discarded = read_jsonl(run / "steps" / "rank-0.discarded.jsonl")
    assert [(r["step"], r["attempt"], r["resumed_from_step"]) for r in discarded] == [(1, 0, 0), (2, 0, 0)]


def _plan(**kw) -> Plan:
    return Plan.from_json(plan_dict(engine="fsdp", **kw))


def test_torchruns_world_must_be_the_plans_nodes_times_gpus():
    plan = _plan(world_size=2)  # 1 node x 2
    check_world({"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}, plan, 2)
    with pytest.raises(ConfigError) as e:
        check_world({"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"}, plan, 4)
    assert "WORLD_SIZE: torchrun started 4 rank(s) but the plan is 1 node(s) x 2 GPU(s), so WORLD_SIZE must be 2" \
        in str(e.value)
    assert "launch --nodes 1 --gpus 2" in str(e.value)
    with pytest.raises(ConfigError, match="LOCAL_WORLD_SIZE: torchrun started 1 rank.s. .* must be 2"):
        check_world({"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1"}, plan, 2)
    with pytest.raises(ConfigError, match="process group: 3 rank.s. joined but the plan is 1 x 2 = 2"):
        check_world({}, plan, 3)
    inconsistent = dataclasses.replace(plan, world_size=3)
    with pytest.raises(ConfigError, match="plan.json: world_size 3 but nodes x gpus_per_node = 1 x 2 = 2"):
        check_world({"WORLD_SIZE": "2"}, inconsistent, 2)


def test_a_rank_in_a_world_of_the_wrong_size_fails_at_start(make_run_dir, single_rank, examples_data):
    job, _ = _small_job(examples_data)
    job["train"]["global_batch_size"] = 4
    plan = plan_dict(engine="fsdp", micro_batch_size=2, world_size=2, seq_len=32, precision="fp32")
    run = make_run_dir(job, plan)  # planned for 2 ranks; single_rank starts a world of 1
    assert main([str(run)]) == 2
    error = json.loads((run / "ranks" / "rank-0.json").read_text())["error"]
    assert "WORLD_SIZE: torchrun started 1 rank(s) but the plan is 1 node(s) x 2 GPU(s), so WORLD_SIZE must be 2" \
        in error
    assert not (run / "steps" / "rank-0.jsonl").exists() or read_jsonl(run / "steps" / "rank-0.jsonl") == []
