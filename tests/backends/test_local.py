"""LocalBackend's contract around the torchrun agent (the agent itself runs in tests/cli and tests/faults)."""

import os

import pytest

from launcher.backends.base import LaunchSpec
from launcher.backends.local import LocalBackend
from launcher.files.rundir import RunDir
from launcher.records.runreport import RunOutcome


def test_a_ranks_environment_is_taken_back_after_the_run(tmp_path, monkeypatch):
    """The ranks inherit spec.env through this process's environment; afterwards it is as before, so the next
    attempt of a fallback ladder (or anything else in this process) never sees the last attempt's values."""
    monkeypatch.setenv("LAUNCHER_ENFORCE_BYTES", "123")  # set before: must come back as it was
    monkeypatch.delenv("LAUNCHER_MEMORY_SNAPSHOT", raising=False)
    monkeypatch.delenv("TORCHELASTIC_SIGNALS_TO_HANDLE", raising=False)
    seen = {}

    def fake_agent(self, run, spec):
        seen.update({k: os.environ.get(k) for k in spec.env})
        os.environ["TORCHELASTIC_SIGNALS_TO_HANDLE"] = "SIGHUP"  # torchrun exports its list
        return RunOutcome(ok=True)

    monkeypatch.setattr(LocalBackend, "_run", fake_agent)
    spec = LaunchSpec(gpus_per_node=2, nodes=1, env={"LAUNCHER_ENFORCE_BYTES": "999", "LAUNCHER_MEMORY_SNAPSHOT": "1"})
    assert LocalBackend().run(RunDir(tmp_path), spec).ok
    assert seen == {"LAUNCHER_ENFORCE_BYTES": "999", "LAUNCHER_MEMORY_SNAPSHOT": "1"}
    assert os.environ["LAUNCHER_ENFORCE_BYTES"] == "123"
    assert "LAUNCHER_MEMORY_SNAPSHOT" not in os.environ and "TORCHELASTIC_SIGNALS_TO_HANDLE" not in os.environ


def test_the_environment_comes_back_when_the_agent_raises(tmp_path, monkeypatch):
    monkeypatch.delenv("LAUNCHER_PLAN", raising=False)

    def broken_agent(self, run, spec):
        raise RuntimeError("agent died")

    monkeypatch.setattr(LocalBackend, "_run", broken_agent)
    with pytest.raises(RuntimeError, match="agent died"):
        LocalBackend().run(RunDir(tmp_path), LaunchSpec(gpus_per_node=1, nodes=1, env={"LAUNCHER_PLAN": "x"}))
    assert "LAUNCHER_PLAN" not in os.environ
