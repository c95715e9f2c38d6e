"""Bad training data through the real CLI: `launch run` reads every row before any rank starts and refuses a row
that lacks what the job reads (exit 2, the row number and the field), with nothing launched or written.
`launch plan` never reads the data, so the same jobs still plan."""

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


CASES = [
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


def test_plan_does_not_read_the_data(sandbox):
    """Planning needs no data file: the same job with a bad row 37 plans (exit 0)."""
    argv = missing_text_in_row_37(sandbox)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["plan", str(argv[0])])
    assert code == 0, err.getvalue()
