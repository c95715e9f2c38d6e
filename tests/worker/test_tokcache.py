"""Tokenization runs once per dataset and settings: the second time the tensors come from the launcher's cache."""

from __future__ import annotations

import pytest
import torch

from launcher.config.job import DataConfig
from launcher.worker.recipes import make_recipe
from launcher.worker.tokcache import tokenized
from launcher.worker.tokenizer import ByteTokenizer

ROWS = [{"text": f"row number {i}"} for i in range(40)]


def recipe(**data):
    r = make_recipe("causal_lm", DataConfig(path="d.jsonl", **data))
    r.fit_labels(ROWS)
    return r


def test_second_encode_is_read_from_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LAUNCHER_CACHE", str(tmp_path))
    tok = ByteTokenizer(300)
    train, ev = tokenized(recipe(), tok, ROWS, ROWS[:30], ROWS[30:], 32)
    files = list((tmp_path / "tokenized").glob("*.pt"))
    assert len(files) == 1
    again = recipe()
    monkeypatch.setattr(type(again), "encode", lambda *a, **k: pytest.fail("tokenized twice"))
    train2, ev2 = tokenized(again, tok, ROWS, ROWS[:30], ROWS[30:], 32)
    assert train2.keys() == train.keys() and all(torch.equal(train[k], train2[k]) for k in train)
    assert all(torch.equal(ev[k], ev2[k]) for k in ev)


@pytest.mark.parametrize("change", ["seq_len", "tokenizer", "packing", "rows"])
def test_any_change_that_alters_the_tensors_misses_the_cache(tmp_path, monkeypatch, change):
    monkeypatch.setenv("LAUNCHER_CACHE", str(tmp_path))
    tokenized(recipe(), ByteTokenizer(300), ROWS, ROWS[:30], ROWS[30:], 32)
    rows = ROWS[:-1] + [{"text": "changed"}] if change == "rows" else ROWS
    tokenized(recipe(packing=change == "packing"), ByteTokenizer(400 if change == "tokenizer" else 300), rows,
              rows[:30], rows[30:], 64 if change == "seq_len" else 32)
    assert len(list((tmp_path / "tokenized").glob("*.pt"))) == 2


def test_a_save_cut_short_leaves_only_a_temporary_the_cleanup_rules_know(tmp_path, monkeypatch):
    # A crash mid-save (a SIGKILL: nothing unlinks) leaves whatever the save was writing into: it must be named as
    # every launcher temporary is (launcher.files.fsutil.is_temporary), never a bare `.tmp`.
    import launcher.worker.tokcache as tokcache
    from launcher.files.fsutil import is_temporary

    monkeypatch.setenv("LAUNCHER_CACHE", str(tmp_path))
    seen: list[list[str]] = []

    def save_cut_short(data, f):
        seen.append([p.name for p in (tmp_path / "tokenized").iterdir()])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tokcache.torch, "save", save_cut_short)
    train, _ = tokenized(recipe(), ByteTokenizer(300), ROWS, ROWS[:30], ROWS[30:], 32)
    assert len(train["input_ids"]) == 30  # the run goes on without its cache
    (names,) = seen
    assert len(names) == 1 and is_temporary(names[0]), names
    assert not list((tmp_path / "tokenized").iterdir())  # and a failure the save sees removes it
