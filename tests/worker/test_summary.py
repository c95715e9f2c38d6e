"""The launcher's data summary (launcher.worker.summary, token lists, no tensors) counts what the ranks' encode
(launcher.worker.recipes through tokcache.encode_chunked) makes: the same examples kept and dropped, the same
tokens trained and masked, the same packed sequences. And a long string is clipped before it is tokenized
without changing the tokens a sequence keeps."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from launcher.config.job import DataConfig
from launcher.worker.chat import IGNORE
from launcher.worker.data import split
from launcher.worker.examples import CHARS_PER_TOKEN, clip_row, example_ids
from launcher.worker.recipes import make_recipe
from launcher.worker.summary import summarize
from launcher.worker.tokcache import encode_chunked
from launcher.worker.tokenizer import ByteTokenizer, load_tokenizer

TINY_CHAT = Path(__file__).resolve().parents[2] / "examples" / "tiny-chat"
SEQ = 48


def chats(n: int) -> list[dict]:
    """Conversations, every fifth with a prompt that fills SEQ tokens (dropped), some with a system turn."""
    rows = []
    for i in range(n):
        user = "long question " * 40 if i % 5 == 0 else f"question {i}?"
        msgs = [{"role": "system", "content": "Be brief."}] if i % 3 == 0 else []
        rows.append({"messages": [*msgs, {"role": "user", "content": user},
                                  {"role": "assistant", "content": f"answer {i}"}]})
    return rows


def prompt_completions(n: int) -> list[dict]:
    return [{"prompt": ("p " * 60 if i % 4 == 0 else f"prompt {i} "), "completion": f"completion {i}"}
            for i in range(n)]


def texts(n: int) -> list[dict]:
    return [{"text": "" if i % 7 == 0 else f"text number {i} " * (1 + i % 5)} for i in range(n)]


def tensor_counts(task: str, data: DataConfig, tok, rows: list[dict]) -> dict:
    """What the ranks' tensors hold (examples or sequences, tokens, trained tokens), train and eval."""
    recipe = make_recipe(task, data)
    recipe.fit_labels(rows)
    train_rows, eval_rows = split(rows, data.eval_fraction)
    train = encode_chunked(recipe, tok, train_rows, SEQ, progress=False, desc="train")
    ev = encode_chunked(recipe, tok, eval_rows, SEQ, progress=False, desc="eval")
    mask = train["attention_mask"]
    if "labels" in train and task == "causal_lm":
        trained = int((train["labels"][:, 1:] != IGNORE).sum())
    else:
        trained = int(mask[:, 1:].sum()) if task == "causal_lm" else 0
    return {"rows": len(mask), "tokens": int(mask.sum()) + (int(train["pair_attention_mask"].sum())
                                                            if "pair_attention_mask" in train else 0),
            "trained": trained, "eval": len(ev["input_ids"]) if ev else 0, "format": recipe.format}


CASES = {
    "text-byte": ("causal_lm", {}, lambda: ByteTokenizer(300), texts),
    "text-packed-byte": ("causal_lm", {"packing": True}, lambda: ByteTokenizer(300), texts),
    "messages-byte": ("causal_lm", {}, lambda: ByteTokenizer(300), chats),
    "messages-hf": ("causal_lm", {}, lambda: load_tokenizer(TINY_CHAT, 1024), chats),
    "messages-packed-hf": ("causal_lm", {"packing": True}, lambda: load_tokenizer(TINY_CHAT, 1024), chats),
    "prompt-completion-hf": ("causal_lm", {}, lambda: load_tokenizer(TINY_CHAT, 1024), prompt_completions),
    "text-hf": ("causal_lm", {}, lambda: load_tokenizer(TINY_CHAT, 1024), texts),
    "seq-cls-byte": ("seq_cls", {}, lambda: ByteTokenizer(300),
                     lambda n: [{"text": "t " * (i % 40), "label": i % 3} for i in range(n)]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_summary_counts_what_the_ranks_encode(case):
    task, over, make_tok, make_rows = CASES[case]
    data = DataConfig(path="d.jsonl", eval_fraction=0.1, max_seq_len=SEQ, **over)
    rows = make_rows(60)
    tok = make_tok()
    want = tensor_counts(task, data, tok, rows)
    s = summarize(task, data, want["format"], tok, rows, SEQ)
    assert (s.sequences, s.tokens, s.trained_tokens) == (want["rows"], want["tokens"], want["trained"]), (s, want)
    if not data.packing:  # packed, the eval tensors hold sequences too; the summary counts examples
        assert (s.train_examples, s.eval_examples) == (want["rows"], want["eval"])
    assert s.rows == 60 and s.train_examples + s.eval_examples + s.dropped_count == 60
    if case.startswith(("messages", "prompt")):
        assert s.dropped and s.dropped[0].reason == "prompt_fills_max_seq_len" and s.dropped[0].rows[0] == 1
    if case.startswith("text"):  # an empty text: no token from the BPE, bos and eos from the byte tokenizer
        assert [d.reason for d in s.dropped] == ([] if isinstance(tok, ByteTokenizer) else ["too_short"])


@pytest.mark.parametrize("tok_name", ["byte", "hf"])
def test_a_long_string_is_clipped_before_tokenizing_and_keeps_its_tokens(tok_name):
    """A 2 MB row at max_seq_len 64 was tokenized whole (a 100 MB row: 2.8 GB on rank 0); it is cut to
    CHARS_PER_TOKEN characters a token first, and the 64 tokens the sequence keeps are the same."""
    tok = ByteTokenizer(300) if tok_name == "byte" else load_tokenizer(TINY_CHAT, 1024)
    data = DataConfig(path="d.jsonl")
    text = "a long document about memory budgets " * 55_000  # about 2 MB
    row = {"text": text}
    clipped = clip_row(row, "text", data, 64)
    assert len(clipped["text"]) == 64 * CHARS_PER_TOKEN
    t = time.monotonic()
    ids, _ = example_ids(tok, clipped, "text", "text", 64)
    assert time.monotonic() - t < 2
    assert ids == example_ids(tok, row, "text", "text", 64)[0]
    chat = {"messages": [{"role": "user", "content": text}, {"role": "assistant", "content": "ok"}]}
    assert len(clip_row(chat, "messages", data, 64)["messages"][0]["content"]) == 64 * CHARS_PER_TOKEN
