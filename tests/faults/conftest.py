"""Fixtures of the refused-input tables: a sandbox per case, one planner cache for the session; real one-rank
checkpoints for the damaged-checkpoint cases and their fuzzing."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.faults.harness import Sandbox


@pytest.fixture(scope="session")
def planner_cache(tmp_path_factory) -> Path:
    """One introspection cache for every case (a temporary dir, shared so each case does not re-probe)."""
    return tmp_path_factory.mktemp("launcher-cache")


@pytest.fixture
def sandbox(tmp_path, monkeypatch, planner_cache) -> Sandbox:
    root = tmp_path / "box"
    root.mkdir()
    monkeypatch.chdir(root)  # the default run dir (runs/...) would land here
    monkeypatch.setenv("LAUNCHER_CACHE", str(planner_cache))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    data = root / "data.jsonl"
    data.write_text("".join(f'{{"text": "sentence number {i} about memory"}}\n' for i in range(64)))
    return Sandbox(root=root, data=data)


@pytest.fixture(scope="session")
def trained_runs(single_rank_runs) -> dict[str, Path]:
    """A one-rank checkpoint of each engine (fsdp: a DCP dir; deepspeed: ZeRO-2 partitions), made once
    (tests/shared_runs.py single_rank_runs): 2 steps, ending with step-00000002."""
    for engine in ("fsdp", "deepspeed"):
        run = single_rank_runs[engine]["run"]
        assert single_rank_runs[engine]["code"] == 0, (run / "ranks" / "rank-0.json").read_text()
        assert (run / "checkpoint" / "step-00000002" / "trainer_state.json").is_file()
    return {engine: single_rank_runs[engine]["run"] for engine in ("fsdp", "deepspeed")}
