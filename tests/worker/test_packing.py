"""Packing: several examples per max_seq_len sequence, labels never crossing, positions restarted per example."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from launcher.config.job import DataConfig
from launcher.errors import ConfigError
from launcher.model.loss import task_loss
from launcher.worker.chat import IGNORE, encode_rows
from launcher.worker.packing import pack
from launcher.worker.recipes import make_recipe
from launcher.worker.tokenizer import load_tokenizer

TINY_CHAT = Path(__file__).resolve().parents[2] / "examples" / "tiny-chat"
CHAT_ROWS = [json.loads(ln) for ln in (TINY_CHAT.parent / "data" / "chat.jsonl").read_text().splitlines()[:12]]


def test_pack_next_fit_token_by_token():
    a, b, c = ([11, 12, 13], [11, 12, 13]), ([21, 22, 23, 24], [IGNORE, IGNORE, 23, 24]), ([31, 32, 33, 34, 35],) * 2
    out = pack([a, b, c], 8, pad_id=0)
    assert out["input_ids"].tolist() == [[11, 12, 13, 21, 22, 23, 24, 0], [31, 32, 33, 34, 35, 0, 0, 0]]
    # The first token of every example is never a target: it is not predicted from the example before it.
    assert out["labels"].tolist() == [[IGNORE, 12, 13, IGNORE, IGNORE, 23, 24, IGNORE],
                                      [IGNORE, 32, 33, 34, 35, IGNORE, IGNORE, IGNORE]]
    assert out["position_ids"].tolist() == [[0, 1, 2, 0, 1, 2, 3, 0], [0, 1, 2, 3, 4, 0, 1, 2]]
    assert out["attention_mask"].tolist() == [[1] * 7 + [0], [1] * 5 + [0] * 3]


def test_packed_chat_keeps_each_examples_labels():
    tok = load_tokenizer(TINY_CHAT, 1024)
    recipe = make_recipe("causal_lm", DataConfig(path="chat.jsonl", packing=True))
    recipe.fit_labels(CHAT_ROWS)
    packed = recipe.encode(CHAT_ROWS, tok, 128)
    single = encode_rows(tok, CHAT_ROWS, ["messages"] * len(CHAT_ROWS), 128)
    assert packed["input_ids"].shape[0] < len(CHAT_ROWS) and packed["input_ids"].shape[1] == 128
    # Every example's tokens and trained labels appear, in order, and nothing else is trained.
    want_ids = [i for r in range(len(CHAT_ROWS)) for i in single["input_ids"][r][single["attention_mask"][r] == 1]]
    got_ids = [i for r in range(packed["input_ids"].shape[0])
               for i in packed["input_ids"][r][packed["attention_mask"][r] == 1]]
    assert got_ids == want_ids
    assert sorted(packed["labels"][packed["labels"] != IGNORE].tolist()) == \
        sorted(single["labels"][single["labels"] != IGNORE].tolist())
    starts = (packed["position_ids"] == 0) & (packed["attention_mask"] == 1)
    assert int(starts.sum()) == len(CHAT_ROWS)  # positions restart once per example


def test_packed_batches_reach_the_model_with_positions_and_no_mask():
    seen = {}

    def forward(**kw):
        seen.update(kw)
        return type("Out", (), {"loss": torch.tensor(0.0)})()

    batch = pack([([5, 6], [5, 6]), ([7, 8, 9], [7, 8, 9])], 6, pad_id=0)
    task_loss("causal_lm", forward, batch)
    assert "attention_mask" not in seen and seen["position_ids"].tolist() == [[0, 1, 0, 1, 2, 0]]
    assert seen["labels"].tolist() == [[IGNORE, 6, IGNORE, 8, 9, IGNORE]]


def test_packing_is_for_causal_lm_only():
    recipe = make_recipe("seq_cls", DataConfig(path="d.jsonl", packing=True))
    with pytest.raises(ConfigError, match="data.packing: true packs causal_lm examples only"):
        recipe.fit_labels([{"text": "a", "label": 0}])


def test_a_packed_run_steps_over_sequences_not_rows(make_run_dir, tmp_path, single_rank, monkeypatch):
    """The worker's stream counts packed sequences (fewer than rows); a 1-rank run completes on them."""
    from launcher.processes.rankenv import RUN_DIR_ENV
    from launcher.worker.main import main
    from tests.worker.run_dirs import plan_dict, tiny_gpt2_job

    plan = plan_dict(engine="fsdp", micro_batch_size=2, world_size=1, seq_len=64, precision="fp32")
    data = tmp_path / "short.jsonl"
    data.write_text("".join(json.dumps({"text": f"short text {i:03d}"}) + "\n" for i in range(100)))
    job = tiny_gpt2_job(str(data), max_steps=2)
    job["data"].update(max_seq_len=64, eval_fraction=0.02, packing=True)
    job["train"]["global_batch_size"] = 2
    run = make_run_dir(job, plan)
    monkeypatch.delenv(RUN_DIR_ENV, raising=False)
    assert main([str(run)]) == 0
    r = json.loads((run / "ranks" / "rank-0.json").read_text())
    # 98 training rows of 16 byte tokens (bos, 14 bytes, eos): 4 to a 64-token sequence.
    assert r["status"] == "completed" and r["train_examples"] == 25
