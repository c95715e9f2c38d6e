import json

import pytest

from launcher.errors import ConfigError
from launcher.worker.data import Stream, eval_batches, read_records, shard_order, split, total_steps


def test_read_jsonl_and_csv(tmp_path):
    j = tmp_path / "d.jsonl"
    j.write_text('{"text": "a", "label": 1}\n\n{"text": "b", "label": 0}\n')
    assert read_records(j) == [{"text": "a", "label": 1}, {"text": "b", "label": 0}]
    c = tmp_path / "d.csv"
    c.write_text("text,label\nhello,pos\n\"a, b\",neg\n")
    assert read_records(c) == [{"text": "hello", "label": "pos"}, {"text": "a, b", "label": "neg"}]


def test_read_errors_name_the_line_and_fix(tmp_path):
    bad = tmp_path / "d.jsonl"
    bad.write_text('{"text": "a"}\n{oops\n')
    with pytest.raises(ConfigError, match=r"d.jsonl:2"):
        read_records(bad)
    other = tmp_path / "x.xlsx"
    other.write_text("")
    with pytest.raises(ConfigError, match=r"use .jsonl, .json, .csv, .parquet or .arrow"):
        read_records(other)
    with pytest.raises(ConfigError, match="does not exist"):
        read_records(tmp_path / "missing.jsonl")


def test_split_is_fixed_and_sized():
    rows = list(range(100))
    train, ev = split(rows, 0.1)
    assert len(ev) == 10 and len(train) == 90
    assert sorted(train + ev) == rows
    assert split(rows, 0.1) == (train, ev)
    assert split(rows, 0.0)[1] == []
    assert len(split(list(range(5)), 0.01)[1]) == 1


def test_shard_order_covers_everything_once_per_epoch():
    n, world = 10, 3
    shards = [shard_order(n, epoch=0, seed=5, world_size=world, rank=r) for r in range(world)]
    assert len({len(s) for s in shards}) == 1  # equal sizes (padded by wrapping)
    assert set().union(*map(set, shards)) == set(range(n))
    assert shard_order(n, epoch=1, seed=5, world_size=world, rank=0) != shards[0]


def test_stream_micro_batches_are_disjoint_across_ranks_and_pure():
    kw = dict(num_examples=40, micro_batch_size=2, grad_accum_steps=2, world_size=2, seed=0)
    r0, r1 = Stream(rank=0, **kw), Stream(rank=1, **kw)
    assert r0.steps_per_epoch == 5
    seen0 = [i for s in range(5) for m in range(2) for i in r0.micro_batch(s, m)]
    seen1 = [i for s in range(5) for m in range(2) for i in r1.micro_batch(s, m)]
    assert len(set(seen0)) == 20 and not set(seen0) & set(seen1)
    # A fresh stream (a resumed run) yields the same micro-batch for the same step.
    assert Stream(rank=0, **kw).micro_batch(7, 1) == r0.micro_batch(7, 1)
    assert r0.micro_batch(5, 0) != r0.micro_batch(0, 0)  # next epoch reshuffles


def test_stream_too_small_says_what_to_change():
    with pytest.raises(ConfigError, match="global_batch_size"):
        Stream(num_examples=3, micro_batch_size=2, grad_accum_steps=2, world_size=2, rank=0, seed=0)


def test_eval_batches_same_count_on_every_rank():
    counts = {len(eval_batches(7, micro_batch_size=2, world_size=3, rank=r)) for r in range(3)}
    assert counts == {2}
    assert all(len(b) == 2 for b in eval_batches(7, micro_batch_size=2, world_size=3, rank=2))
    assert eval_batches(0, micro_batch_size=2, world_size=1, rank=0) == []


def test_total_steps():
    assert total_steps(max_steps=7, epochs=None, steps_per_epoch=3) == 7
    assert total_steps(max_steps=None, epochs=1.5, steps_per_epoch=3) == 5
    with pytest.raises(ConfigError, match="max_steps or epochs"):
        total_steps(max_steps=None, epochs=None, steps_per_epoch=3)


def test_example_datasets_are_small_and_well_formed(examples_data):
    for name, fields in {"causal.jsonl": {"text"}, "sentiment.jsonl": {"text", "label"},
                         "pairs.jsonl": {"text", "positive"}}.items():
        p = examples_data / name
        assert p.stat().st_size < 100_000
        rows = [json.loads(line) for line in p.read_text().splitlines()]
        assert len(rows) >= 150 and all(fields <= set(r) for r in rows)


ROWS = [{"text": "a", "label": 1}, {"text": "b", "label": 0}, {"text": "c", "label": 1}]


def test_read_through_datasets_parquet_arrow_json_and_save_to_disk(tmp_path):
    from datasets import Dataset, DatasetDict

    ds = Dataset.from_list(ROWS)
    ds.to_parquet(str(tmp_path / "d.parquet"))
    assert read_records(tmp_path / "d.parquet") == ROWS
    ds.save_to_disk(str(tmp_path / "saved"))
    assert read_records(tmp_path / "saved") == ROWS
    arrow = next((tmp_path / "saved").glob("data-*.arrow"))
    assert read_records(arrow) == ROWS
    DatasetDict({"test": Dataset.from_list(ROWS[:1]), "train": ds}).save_to_disk(str(tmp_path / "dict"))
    assert read_records(tmp_path / "dict") == ROWS  # the train split of a DatasetDict
    (tmp_path / "doc.json").write_text(json.dumps(ROWS))
    assert read_records(tmp_path / "doc.json") == ROWS  # a JSON document (a list), not JSON Lines
    (tmp_path / "lines.json").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    assert read_records(tmp_path / "lines.json") == ROWS  # .json holding JSON Lines, as datasets reads it


def test_read_refuses_a_dir_that_is_no_saved_dataset_and_an_uncached_hub_id(tmp_path, monkeypatch):
    (tmp_path / "plain").mkdir()
    with pytest.raises(ConfigError, match="without state.json or dataset_dict.json"):
        read_records(tmp_path / "plain")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="huggingface-cli download --repo-type dataset someone/not-cached"):
        read_records("someone/not-cached")


def test_read_a_hub_dataset_from_the_local_cache_offline(tmp_path, monkeypatch):
    """The layout `huggingface-cli download --repo-type dataset someone/tiny` leaves in HF_HOME/hub."""
    repo = tmp_path / "hf" / "hub" / "datasets--someone--tiny"
    (repo / "snapshots" / "abc123" / "data").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    (repo / "snapshots" / "abc123" / "data" / "train.jsonl").write_text('{"text": "a"}\n{"text": "b"}\n')
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    assert read_records("someone/tiny") == [{"text": "a"}, {"text": "b"}]


@pytest.mark.parametrize("n,mbs,world", [(7, 2, 3), (36, 8, 2), (5, 4, 4), (2, 3, 4), (16, 4, 2)])
def test_eval_counted_counts_every_eval_example_once_over_all_ranks(n, mbs, world):
    """Padding (shards evened out) and the wrap of the last batch repeat examples; accuracy counts each once."""
    from launcher.worker.data import eval_counted

    seen = []
    for rank in range(world):
        batches = eval_batches(n, micro_batch_size=mbs, world_size=world, rank=rank)
        flags = eval_counted(n, micro_batch_size=mbs, world_size=world, rank=rank)
        assert [len(b) for b in batches] == [len(f) for f in flags]
        seen += [i for b, f in zip(batches, flags, strict=True) for i, keep in zip(b, f, strict=True) if keep]
    assert sorted(seen) == list(range(n))


def test_jsonl_and_csv_are_checked_without_importing_datasets(tmp_path):
    """The launch-time data check and example count (launcher.session.checks) and the launcher's own readers keep
    `datasets` (about 1 s of import per process) out of a JSONL or CSV job; the parquet reader brings it in."""
    import subprocess
    import sys

    (tmp_path / "d.jsonl").write_text('{"text": "a line"}\n' * 8)
    (tmp_path / "d.csv").write_text("text\n" + "a line\n" * 8)
    code = ("import sys\n"
            "from launcher.config.job import Job\n"
            "from launcher.config.load import from_dict\n"
            "from launcher.session.checks import check_data, count_train_examples\n"
            f"for path in ({str(tmp_path / 'd.jsonl')!r}, {str(tmp_path / 'd.csv')!r}):\n"
            "    job = from_dict(Job, {'name': 't', 'model': 'gpt2-124m', 'task': 'causal_lm', 'data': {'path': "
            "path},\n"
            "                          'train': {'global_batch_size': 2, 'max_steps': 1}})\n"
            "    check_data(job)\n"
            "    assert count_train_examples(job)[0] > 0\n"
            "print('datasets' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
