"""Fixtures of the refused-input tables: a sandbox per case, one planner cache for the session."""

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
    monkeypatch.setenv("MPLCONFIGDIR", str(tmp_path / "mpl"))
    data = root / "data.jsonl"
    data.write_text("".join(f'{{"text": "sentence number {i} about memory"}}\n' for i in range(64)))
    return Sandbox(root=root, data=data)


