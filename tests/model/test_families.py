"""Any decoder-only or encoder architecture transformers builds from a config plans and trains through the three
recipes; encoder-decoders and causal LM on an encoder are refused as bad input, never swapped for another model."""

import json

import pytest
import torch

from launcher.config.job import Job
from launcher.config.load import from_dict
from launcher.errors import ConfigError
from launcher.model.introspect import introspect
from launcher.worker.model import build, count_params, tokenizer_for
from launcher.worker.recipes import make_recipe
from tests.model.families import DECODERS, ENCODER_DECODERS, ENCODERS, save_model_dir

ROWS = [{"text": "the scheduler waits for free nodes", "label": "a", "positive": "a scheduler waits"},
        {"text": "bread rests after baking", "label": "b", "positive": "bread is resting"}] * 2
CASES = [(f, t) for f in DECODERS for t in ("causal_lm", "seq_cls", "sentence_embedding")]
CASES += [(f, t) for f in ENCODERS for t in ("seq_cls", "sentence_embedding")]


def make_job(tmp_path, family, task, lora=None, **over) -> Job:
    tmp_path.mkdir(parents=True, exist_ok=True)
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    train = {"global_batch_size": 4, "max_steps": 1, "precision": "fp32"}
    if lora:
        train["lora"] = lora
    return from_dict(Job, {"name": "t", "model": str(save_model_dir(family, tmp_path, **over)), "task": task,
                           "data": {"path": str(data), "max_seq_len": 16}, "train": train})


def one_step(job: Job) -> tuple[torch.nn.Module, float]:
    torch.manual_seed(0)
    recipe = make_recipe(job.task, job.data)
    recipe.fit_labels(ROWS)
    model = build(job, recipe, seq_len=16, hf_checkpointing=True)
    model.train()
    loss, tokens = recipe.loss(model, recipe.encode(ROWS, tokenizer_for(job), 16))
    loss.backward()
    assert tokens > 0
    return model, loss.item()


@pytest.mark.parametrize(("family", "task"), CASES)
def test_family_plans_and_trains_through_the_recipe(tmp_path, family, task):
    job = make_job(tmp_path, family, task)
    stats = introspect(job, num_labels=2)
    model, loss = one_step(job)
    total, trainable = count_params(model)
    assert (stats.num_params, stats.trainable_params) == (total, trainable)
    assert torch.isfinite(torch.tensor(loss))
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert grads and all(g is not None for g in grads[:-1])


@pytest.mark.parametrize("family", list(DECODERS) + list(ENCODERS))
def test_lora_targets_each_family_by_its_own_names(tmp_path, family):
    targets = {**DECODERS, **ENCODERS}[family][2]
    task = "causal_lm" if family in DECODERS else "seq_cls"
    job = make_job(tmp_path, family, task, lora={"r": 4, "target_modules": targets})
    stats = introspect(job, num_labels=2)
    model, _ = one_step(job)
    adapters = [n for n, p in model.named_parameters() if "lora_" in n and p.requires_grad]
    assert adapters and all(p.grad is not None for n, p in model.named_parameters() if "lora_" in n)
    assert stats.trainable_params == count_params(model)[1]
    assert stats.lora_params == sum(p.numel() for n, p in model.named_parameters() if "lora_" in n)


@pytest.mark.parametrize("family", list(ENCODER_DECODERS))
@pytest.mark.parametrize("task", ["causal_lm", "seq_cls", "sentence_embedding"])
def test_encoder_decoders_are_refused_for_every_task(tmp_path, family, task):
    job = make_job(tmp_path, family, task)
    with pytest.raises(ConfigError, match=f"model: {family} is an encoder-decoder .* point model at one of those"):
        introspect(job, num_labels=2)
    with pytest.raises(ConfigError, match="encoder-decoder"):
        one_step(job)


@pytest.mark.parametrize("family", list(ENCODERS))
def test_causal_lm_on_an_encoder_is_refused(tmp_path, family):
    with pytest.raises(ConfigError, match=f"task: causal_lm needs a decoder, but {family} is an encoder"):
        introspect(make_job(tmp_path, family, "causal_lm"))


@pytest.mark.parametrize("family", list(DECODERS) + list(ENCODERS))
def test_the_no_fit_lora_suggestion_names_this_familys_modules(tmp_path, family):
    """What the advice offers (launcher.planner.search.lora_suggestion) is a LoRA peft accepts on this model, and
    its adapter count is what peft adds."""
    from launcher.model.lora import LORA_RANK, lora_suggestion

    task = "causal_lm" if family in DECODERS else "seq_cls"
    targets, adapters = lora_suggestion(introspect(make_job(tmp_path / "a", family, task), num_labels=2))
    stats = introspect(make_job(tmp_path / "b", family, task, lora={"r": LORA_RANK, "target_modules": targets}),
                       num_labels=2)
    assert stats.lora_params == adapters


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    """One model dir, data and launcher cache for both engines' runs: the Mixtral's probes (introspection and
    activations, keyed by the model's path and config: seconds of CPU in the launch process) are the same for
    both, so the second run reads the first's."""
    return tmp_path_factory.mktemp("moe")


@pytest.mark.parametrize("engine", ["fsdp", "deepspeed"])
def test_a_mixture_of_experts_runs_on_two_ranks_through_the_launcher(tmp_path, engine, monkeypatch, moe_dir):
    """Mixtral's fused 3-D expert weights through the real launcher: planned, loaded on rank 0 and sent to rank 1,
    trained, every rank within its budget."""
    import os
    import subprocess

    import yaml

    from tests.conftest import REPO

    job = make_job(moe_dir, "mixtral", "causal_lm")
    doc = {"name": "moe", "model": job.model, "task": "causal_lm",
           "data": {"path": job.data.path, "max_seq_len": 16, "eval_fraction": 0.0},
           "train": {"global_batch_size": 4, "max_steps": 2, "precision": "fp32", "lr": 1e-3},
           "strategy": {"engine": engine}, "cluster": {"hardware": "cpu"}}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    env = {**os.environ, "LAUNCHER_CACHE": str(moe_dir / "cache"), "OMP_NUM_THREADS": "1"}
    res = subprocess.run([str(REPO / ".venv" / "bin" / "launch"), str(path), "--gpus", "2", "--budget", "2GB",
                          "--run-dir", str(tmp_path / "run"), "--quiet"], capture_output=True, text=True, timeout=400,
                         env=env)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    for k in (0, 1):
        steps = (tmp_path / "run" / "steps" / f"rank-{k}.jsonl").read_text().splitlines()
        assert len(steps) == 2
