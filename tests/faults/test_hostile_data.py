"""Bad training data through the real CLI: `launch run` (and `launch plan`, when the data is on this machine) reads
every row before any rank starts and refuses a row that lacks what the job reads, holds no text (a lone surrogate,
bytes that are not UTF-8), is past the row bound, or data no rank could train on (nothing left after the drops,
fewer examples than one step takes): exit 2, the row number and the field, nothing launched or written. Data not
on this machine is planned without."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from launcher.cli.main import main
from tests.faults.harness import Case, Sandbox, check_refused


def jsonl(s: Sandbox, name: str, rows: list) -> str:
    return str(s.file(name, "".join(json.dumps(r) + "\n" for r in rows)))


def text_rows(n: int = 64) -> list[dict]:
    return [{"text": f"sentence {i}"} for i in range(n)]


def chat(i: int, role: str = "assistant") -> dict:
    return {"messages": [{"role": "user", "content": f"q{i}"}, {"role": role, "content": f"a{i}"}]}


def missing_text_in_row_37(s: Sandbox) -> list:
    rows = text_rows()
    rows[36] = {"body": "the text is under another name"}
    return [s.job(**{"data.path": jsonl(s, "rows.jsonl", rows)})]


def messages_file(s: Sandbox, bad_row: int, bad: dict) -> list:
    rows = [chat(i) for i in range(64)]
    rows[bad_row - 1] = bad
    return [s.job(**{"data.path": jsonl(s, "chat.jsonl", rows)})]


def prompt_completion_file(s: Sandbox, bad_row: int, bad: dict) -> list:
    rows = [{"prompt": f"p{i}", "completion": f" c{i}"} for i in range(64)]
    rows[bad_row - 1] = bad
    return [s.job(**{"data.path": jsonl(s, "pc.jsonl", rows)})]


def parquet_without_text(s: Sandbox) -> list:
    from datasets import Dataset

    path = s.root / "d.parquet"
    Dataset.from_list([{"body": f"x{i}"} for i in range(64)]).to_parquet(str(path))
    return [s.job(**{"data.path": str(path)})]


def saved_without_state(s: Sandbox) -> list:
    from datasets import Dataset

    path = s.root / "saved"
    Dataset.from_list(text_rows()).save_to_disk(str(path))
    (path / "state.json").unlink()
    return [s.job(**{"data.path": str(path)})]


def seq_cls_missing_label(s: Sandbox) -> list:
    rows = [{"text": f"t{i}", "label": i % 2} for i in range(64)]
    del rows[2]["label"]
    return [s.job(task="seq_cls", **{"data.path": jsonl(s, "cls.jsonl", rows)})]


def raw_file(s: Sandbox, name: str, data: bytes) -> list:
    p = s.root / name
    p.write_bytes(data)
    return [s.job(**{"data.path": str(p)})]


def long_prompts(s: Sandbox, n: int, long: int) -> list:
    """``n`` conversations of which the first ``long`` have a prompt that fills max_seq_len 64."""
    rows = [{"messages": [{"role": "user", "content": ("x" * 300 if i < long else f"q{i}")},
                          {"role": "assistant", "content": f"a{i}"}]} for i in range(n)]
    return [s.job(**{"data.path": jsonl(s, "chat.jsonl", rows)})]


def fifo_data(s: Sandbox) -> list:
    import os

    p = s.root / "pipe.jsonl"
    os.mkfifo(p)
    return [s.job(**{"data.path": str(p)})]


def zero_link(s: Sandbox) -> list:
    p = s.root / "zeros.jsonl"
    p.symlink_to("/dev/zero")
    return [s.job(**{"data.path": str(p)})]


CASES = [
    # -- text that is not text, and rows past the bound (issue 35 §3) ------------------------------------------------
    Case("lone-surrogate-in-a-message", lambda s: messages_file(s, 7, {"messages": [
        {"role": "user", "content": "q\ud83d"}, {"role": "assistant", "content": "a"}]}),
         ["row 7 of", "messages[0].content holds a lone surrogate '\\ud83d' at character 1, which is no text",
          "fix the escape or drop the character"]),
    Case("lone-surrogate-in-a-completion", lambda s: prompt_completion_file(s, 3, {"prompt": "p",
                                                                                  "completion": "\udfff"}),
         ["row 3 of", "completion holds a lone surrogate"]),
    Case("jsonl-line-not-utf8", lambda s: raw_file(s, "bad.jsonl", b'{"text": "ok"}\n{"text": "\xff\xfe"}\n'),
         ["bad.jsonl:2: not UTF-8 text (byte", "save the file as UTF-8"]),
    Case("csv-not-utf8", lambda s: raw_file(s, "bad.csv", b"text\nok\n\xff\xfe\n"),
         ["bad.csv' is not UTF-8 text", "save it as UTF-8"]),
    Case("row-over-16mb", lambda s: raw_file(s, "big.jsonl", b'{"text": "ok"}\n{"text": "' + b"x" * (17 * 10**6)
                                             + b'"}\n'),
         ["big.jsonl:2: the row is over the 16.00 MB one row may hold", "split the document into several rows"]),
    Case("json-nesting-bomb", lambda s: raw_file(s, "deep.jsonl", b'{"text": ' + b"[" * 100_000 + b"]" * 100_000
                                                 + b"}\n"),
         ["deep.jsonl:1: nests too deeply to be a row"]),
    Case("data-path-a-fifo", fifo_data, ["pipe.jsonl' is a FIFO (named pipe), not a data file"]),
    Case("data-path-a-link-to-dev-zero", zero_link,
         ["zeros.jsonl' is a character device (/dev/zero), not a data file"]),
    # -- data no rank could train on ----------------------------------------------------------------------------------
    Case("every-prompt-fills-max-seq-len", lambda s: long_prompts(s, 40, 40),
         ["data.max_seq_len: 64 tokens leave nothing to train on in any of the 40 example(s)",
          "raise data.max_seq_len or shorten the prompts"]),
    Case("too-few-rows-for-the-ranks", lambda s: [s.job(**{"data.path": jsonl(s, "few.jsonl", text_rows(5))})],
         ["data.path: 4 training examples over 2 rank(s) give 2 per rank, fewer than one step takes (4: "
          "train.global_batch_size 8 over 2 ranks)", "add data, lower train.global_batch_size"]),
    Case("too-few-after-the-drops", lambda s: long_prompts(s, 12, 8),
         ["training examples over 2 rank(s) give", "fewer than one step takes"]),
    # -- rows that lack what the job reads -----------------------------------------------------------------------------
    Case("text-field-missing-in-row-37", missing_text_in_row_37,
         ["data.path: row 37 of", "rows.jsonl: no field 'text' (data.text_field; fields: body)",
          "set data.text_field to the field holding it"]),
    Case("messages-bad-role", lambda s: messages_file(s, 12, chat(11, role="bot")),
         ["row 12 of", "messages[1].role 'bot' is not one of system, user, assistant, tool"]),
    Case("messages-not-a-list", lambda s: messages_file(s, 5, {"messages": "hello there"}),
         ["row 5 of", "messages is a str, not a list of {role, content} messages"]),
    Case("messages-without-assistant", lambda s: messages_file(s, 64, {"messages": [{"role": "user", "content": "q"}]}),
         ["row 64 of", "messages has no assistant message, so nothing to train on"]),
    Case("messages-missing-content", lambda s: messages_file(s, 2, {"messages": [{"role": "user"}]}),
         ["row 2 of", "messages[0] is not a {role, content} object"]),
    Case("completion-empty", lambda s: prompt_completion_file(s, 9, {"prompt": "p", "completion": "  "}),
         ["row 9 of", "completion is empty, so nothing to train on"]),
    Case("completion-missing", lambda s: prompt_completion_file(s, 3, {"prompt": "p"}),
         ["row 3 of", "no field 'completion'", "needs both 'prompt' and 'completion'"]),
    Case("prompt-list-completion-string",
         lambda s: prompt_completion_file(s, 4, {"prompt": [{"role": "user", "content": "q"}], "completion": "a"}),
         ["row 4 of", "prompt and completion must both be strings or both be message lists"]),
    Case("parquet-without-the-column", parquet_without_text,
         ["data.path: row 1 of", "d.parquet has neither 'text' (data.text_field) nor 'messages' nor "
          "'prompt'/'completion' (fields: body)"]),
    Case("unknown-extension", lambda s: [s.job(**{"data.path": str(s.file("rows.xlsx"))})],
         ["rows.xlsx' must end in .jsonl, .json, .csv, .parquet or .arrow"]),
    Case("hub-id-not-cached", lambda s: [s.job(**{"data.path": "someone/not-cached-anywhere"})],
         ["data.path: 'someone/not-cached-anywhere' is no local path and no dataset in the local Hugging Face cache",
          "download it first: huggingface-cli download --repo-type dataset someone/not-cached-anywhere"]),
    Case("save-to-disk-dir-missing-state", saved_without_state,
         ["saved' is a directory without state.json or dataset_dict.json", "save it again"]),
    Case("seq-cls-label-missing", seq_cls_missing_label,
         ["row 3 of", "no field 'label' (data.label_field; fields: text)"]),
    Case("format-messages-on-text-rows",
         lambda s: [s.job(**{"data.format": "messages"})],
         ["data.path: row 1 of", "no field 'messages'; every row of a conversational dataset needs one"]),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_data_is_refused_before_any_rank_starts(case, sandbox):
    check_refused(case, sandbox)


def plan(argv: list) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["plan", *map(str, argv)])
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("case", [c for c in CASES if c.id in (
    "text-field-missing-in-row-37", "lone-surrogate-in-a-message", "too-few-rows-for-the-ranks",
    "every-prompt-fills-max-seq-len")], ids=lambda c: c.id)
def test_plan_refuses_the_data_a_run_would_refuse(case, sandbox):
    """`launch plan` reads the data when it is here, so bad data is found by the plan, not at the launch."""
    check_refused(Case(case.id, case.argv, case.expect, verb="plan"), sandbox)


def test_plan_without_the_data_plans_and_says_it_did_not_read_it(sandbox):
    code, out, err = plan([sandbox.job(**{"data.path": str(sandbox.root / "elsewhere.jsonl")})])
    assert code == 0, err
    assert "data: not read (not on this machine: data.path:" in out and "elsewhere.jsonl' does not exist" in out


def test_plan_says_what_the_data_holds(sandbox):
    """Issue 36 §4: the format, examples kept and dropped (and why, by row), tokens trained and masked, and the
    chat template, at plan time; the same numbers in --json."""
    argv = long_prompts(sandbox, 40, 1)
    code, out, err = plan(argv)
    assert code == 0, err
    lines = out[out.index("data: "):].splitlines()
    assert lines[0] == ("data: 40 row(s) of messages (chat template: ChatML, the launcher's default: the tokenizer "
                        "has none); 35 training and 4 eval example(s), 1 dropped"), lines
    assert lines[1].startswith("  tokens: ") and " trained, " in lines[1]
    assert "masked (system and user turns" in lines[1]
    assert lines[2] == ("  dropped 1 example(s): the prompt (or the conversation before the reply) fills "
                        "data.max_seq_len 64 (row 1)")
    code, out, _ = plan([*argv, "--json"])
    data = json.loads(out)["data"]
    assert data["format"] == "messages" and data["chat_template"] == "chatml"
    assert data["train_examples"] == 35 and data["eval_examples"] == 4 and data["rows"] == 40
    assert data["dropped"] == [{"reason": "prompt_fills_max_seq_len", "count": 1, "rows": [1]}]
    assert 0 < data["trained_tokens"] < data["tokens"]
