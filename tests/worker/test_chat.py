"""Chat and prompt-completion rows: token ids and labels checked token by token, with the real tiny-chat tokenizer
(examples/tiny-chat, a BPE trained on the example data) and with the byte tokenizer; the loss skips -100."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from launcher.config.job import Job
from launcher.config.load import from_dict
from launcher.errors import ConfigError
from launcher.model.loss import task_loss
from launcher.worker.chat import IGNORE, encode_rows, render
from launcher.worker.formats import CHATML_TEMPLATE
from launcher.worker.model import build, tokenizer_for
from launcher.worker.recipes import make_recipe
from launcher.worker.tokenizer import ByteTokenizer, load_tokenizer

TINY_CHAT = Path(__file__).resolve().parents[2] / "examples" / "tiny-chat"
CHAT = {"messages": [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 2 plus 3?"},
    {"role": "assistant", "content": "Five."},
    {"role": "user", "content": "And 1 plus 1?"},
    {"role": "assistant", "content": "Two."},
]}


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(TINY_CHAT, 1024)


def ids(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def test_the_example_tokenizer_is_a_real_bpe_with_a_chat_template(tok):
    assert tok.is_fast and len(tok) == 1024 and tok.chat_template == CHATML_TEMPLATE
    assert tok.convert_ids_to_tokens(ids(tok, "<|im_start|>assistant\n")) == ["<|im_start|>", "assistant", "Ċ"]


def test_messages_train_on_the_assistant_turns_only_token_by_token(tok):
    # The ChatML text written out by hand, split where the trained spans start and end.
    parts = [("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2 plus 3?<|im_end|>\n"
              "<|im_start|>assistant\n", False), ("Five.<|im_end|>\n", True),
             ("<|im_start|>user\nAnd 1 plus 1?<|im_end|>\n<|im_start|>assistant\n", False), ("Two.<|im_end|>\n", True)]
    want_ids = [i for text, _ in parts for i in ids(tok, text)]
    assert want_ids == ids(tok, "".join(t for t, _ in parts))  # the split points are token boundaries here
    want_labels = [i if train else IGNORE for text, train in parts for i in ids(tok, text)]
    enc = encode_rows(tok, [CHAT], ["messages"], 64)
    n = len(want_ids)
    assert enc["input_ids"][0, :n].tolist() == want_ids
    assert enc["labels"][0].tolist() == want_labels + [IGNORE] * (64 - n)
    assert enc["attention_mask"][0].tolist() == [1] * n + [0] * (64 - n)
    assert enc["input_ids"][0, n:].eq(tok.pad_token_id).all()


def test_a_tokenizer_without_a_template_gets_chatml(tok):
    import copy

    bare = copy.deepcopy(tok)
    bare.chat_template = None
    text = render(bare, CHAT["messages"][1:3], add_generation_prompt=False)
    assert text == "<|im_start|>user\nWhat is 2 plus 3?<|im_end|>\n<|im_start|>assistant\nFive.<|im_end|>\n"


def test_prompt_completion_trains_on_the_completion_and_eos(tok):
    row = {"prompt": "The soup", "completion": " is served warm with crusty bread"}
    enc = encode_rows(tok, [row], ["prompt_completion"], 32)
    p, c = ids(tok, "The soup"), ids(tok, " is served warm with crusty bread<|im_end|>")
    assert enc["input_ids"][0, : len(p) + len(c)].tolist() == p + c
    assert enc["labels"][0].tolist() == [IGNORE] * len(p) + c + [IGNORE] * (32 - len(p) - len(c))
    assert c[-1] == tok.eos_token_id


def test_conversational_prompt_completion(tok):
    row = {"prompt": [{"role": "user", "content": "What is 2 plus 3?"}],
           "completion": [{"role": "assistant", "content": "Five."}]}
    enc = encode_rows(tok, [row], ["prompt_completion"], 32)
    p = ids(tok, "<|im_start|>user\nWhat is 2 plus 3?<|im_end|>\n<|im_start|>assistant\n")
    c = ids(tok, "Five.<|im_end|>\n")
    assert enc["labels"][0, : len(p) + len(c)].tolist() == [IGNORE] * len(p) + c


def test_byte_tokenizer_chat_labels():
    tok = ByteTokenizer(300)
    row = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]}
    enc = encode_rows(tok, [row], ["messages"], 80)
    prompt = b"<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    reply = b"Yo<|im_end|>\n"
    want = [1] + [3 + b for b in prompt + reply] + [2]
    assert enc["input_ids"][0, : len(want)].tolist() == want
    assert enc["labels"][0, : len(want)].tolist() == [IGNORE] * (1 + len(prompt)) + [3 + b for b in reply] + [IGNORE]


def test_an_example_whose_trained_tokens_truncation_cuts_is_dropped_not_refused(tok):
    """TRL truncates; an example with no trained token left cannot train and is dropped (the launcher counted
    it before the launch), the others are kept: one over-long example no longer stops a run."""
    short = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]}
    enc = encode_rows(tok, [CHAT, short, CHAT], ["messages"] * 3, 12)
    assert enc["input_ids"].shape[0] == 1  # the short one alone
    assert (enc["labels"][0] != IGNORE).any()
    none = encode_rows(tok, [CHAT], ["messages"], 8)
    assert none["input_ids"].shape == (0, 8)


def test_a_template_that_is_not_prefix_stable_is_refused(tok):
    import copy

    odd = copy.deepcopy(tok)
    odd.chat_template = "{{ messages | length }}{% for m in messages %}{{ m['content'] }}{% endfor %}"
    with pytest.raises(ConfigError, match="does not render a conversation as the prefix"):
        encode_rows(odd, [CHAT], ["messages"], 64)


def test_causal_loss_is_on_the_labelled_tokens_only(tmp_path, tok):
    """task_loss with labels equals cross-entropy over the assistant tokens alone (not every real token)."""
    rows = [CHAT, {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]}]
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    job = from_dict(Job, {"name": "t", "model": str(TINY_CHAT), "task": "causal_lm",
                          "data": {"path": str(data), "max_seq_len": 48},
                          "train": {"global_batch_size": 2, "max_steps": 1}})
    recipe = make_recipe(job.task, job.data)
    recipe.fit_labels(rows)
    assert recipe.format == "messages"
    torch.manual_seed(0)
    model = build(job, recipe, seq_len=48, hf_checkpointing=False).eval()
    batch = recipe.encode(rows, tokenizer_for(job), 48)
    with torch.no_grad():
        got = task_loss("causal_lm", model, batch)
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    target = batch["labels"][:, 1:]
    want = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=IGNORE)
    every = batch["input_ids"][:, 1:].masked_fill(batch["attention_mask"][:, 1:] == 0, IGNORE)
    all_tokens = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), every.reshape(-1), ignore_index=IGNORE)
    assert got.item() == pytest.approx(want.item(), rel=1e-5)
    assert abs(got.item() - all_tokens.item()) > 1e-3
