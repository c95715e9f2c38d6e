import json

import pytest

from launcher.errors import ConfigError
from launcher.processes.rankenv import ENFORCE_ENV, PLAN_ENV, default_extensions_dir, enforce_bytes
from launcher.runtime import JsonlLog, atomic_write_json, load_plan, read_jsonl
from tests.worker.run_dirs import plan_dict


def test_load_plan_needs_the_env_var(monkeypatch):
    monkeypatch.delenv(PLAN_ENV, raising=False)
    with pytest.raises(ConfigError, match=PLAN_ENV):
        load_plan()


def test_load_plan_from_env(monkeypatch, tmp_path):
    p = tmp_path / "plan.json"
    p.write_text(json.dumps(plan_dict(engine="fsdp", micro_batch_size=3)))
    monkeypatch.setenv(PLAN_ENV, str(p))
    plan = load_plan()
    assert plan.strategy.engine == "fsdp" and plan.strategy.micro_batch_size == 3
    monkeypatch.setenv(PLAN_ENV, str(tmp_path / "nope.json"))
    with pytest.raises(ConfigError, match="no such file"):
        load_plan()


def test_enforce_bytes_parsing(monkeypatch):
    monkeypatch.delenv(ENFORCE_ENV, raising=False)
    assert enforce_bytes() is None
    monkeypatch.setenv(ENFORCE_ENV, "16000000000")
    assert enforce_bytes() == 16_000_000_000
    monkeypatch.setenv(ENFORCE_ENV, "16GB")
    with pytest.raises(ConfigError, match="integer"):
        enforce_bytes()


def test_extensions_dir_is_in_the_repo():
    d = default_extensions_dir()
    assert d.parts[-2:] == (".cache", "torch_extensions") and (d.parents[1] / "launcher").is_dir()


def test_atomic_write_and_jsonl_append(tmp_path):
    atomic_write_json(tmp_path / "a" / "x.json", {"k": 1})
    assert json.loads((tmp_path / "a" / "x.json").read_text()) == {"k": 1}
    assert [p.name for p in (tmp_path / "a").iterdir()] == ["x.json"]  # no temp file left
    log = JsonlLog(tmp_path / "s.jsonl")
    for step in range(1, 6):
        log.append({"step": step})
    log.close()
    log.append({"step": 6})  # reopened in append mode after close()
    log.close()
    assert [r["step"] for r in read_jsonl(tmp_path / "s.jsonl")] == [1, 2, 3, 4, 5, 6]
