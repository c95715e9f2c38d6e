"""The chat fine-tune example on 2 CPU ranks through the real `launch` CLI: TRL-style `messages` rows, the
tiny-chat BPE tokenizer with its ChatML template, loss on the assistant tokens only, a verdict and a lower eval
loss at the end than at the start."""

import json
import os

import yaml

from tests.cli.test_run_cli import check_report, launch, near_budget, step_losses
from tests.conftest import REPO


def test_chat_sft_example_runs_on_two_ranks(tmp_path):
    """With one conversation whose prompt fills max_seq_len added: it is dropped and counted (before, the rank that
    tokenized it failed the run), and report.json says what the data held (issue 36 §4)."""
    job = yaml.safe_load((REPO / "examples" / "chat-sft.yaml").read_text())
    job["model"] = str(REPO / "examples" / "tiny-chat")
    rows = (REPO / "examples" / "data" / "chat.jsonl").read_text().splitlines()
    long = {"messages": [{"role": "user", "content": "tell me everything " * 400},
                         {"role": "assistant", "content": "no"}]}
    (tmp_path / "chat.jsonl").write_text("\n".join([json.dumps(long), *rows]) + "\n")
    job["data"]["path"] = str(tmp_path / "chat.jsonl")
    job["train"]["max_steps"] = 12
    path = tmp_path / "chat-sft.yaml"
    path.write_text(yaml.safe_dump(job, sort_keys=False))
    near_budget(path)
    run_dir = tmp_path / "run"
    cache = tmp_path / "cache"
    res = launch("run", path, "--run-dir", run_dir, env=dict(os.environ, LAUNCHER_CACHE=str(cache)))
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    check_report(run_dir, world_size=2)
    data = json.loads((run_dir / "report.json").read_text())["data"]
    assert data["format"] == "messages" and data["chat_template"] == "tokenizer" and data["rows"] == len(rows) + 1
    assert data["dropped"] == [{"reason": "prompt_fills_max_seq_len", "count": 1, "rows": [1]}]
    assert data["train_examples"] + data["eval_examples"] == len(rows) and 0 < data["trained_tokens"] < data["tokens"]
    rank0 = json.loads((run_dir / "ranks" / "rank-0.json").read_text())
    assert rank0["eval_loss"] < rank0["eval_loss_initial"]
    assert len(step_losses(run_dir)) == 12
    # Rank 0 tokenized once (its progress bar is in its log) and cached the tensors rank 1 then loaded.
    assert len(list((cache / "tokenized").glob("*.pt"))) == 1
    assert "tokenizing train" in (run_dir / "logs" / "rank-0.log").read_text()
    assert "tokenizing train" not in (run_dir / "logs" / "rank-1.log").read_text()
