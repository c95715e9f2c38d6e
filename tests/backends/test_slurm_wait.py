"""--wait returns once the results are written AND Slurm's accounting records the end (bounded)."""

from __future__ import annotations

import time

import pytest
from submitit.slurm.slurm import SlurmJob

from launcher.backends import slurm


class FakeWatcher:
    """States sacct would report, one per refresh: the accounting lags the result pickles."""

    def __init__(self, states: list[str]):
        self.states, self.refreshes = list(states), 0

    def update_if_long_enough(self, mode: str) -> None:
        self.refreshes += 1

    def get_state(self, job_id: str, mode: str) -> str:
        return self.states[min(self.refreshes, len(self.states)) - 1] if self.refreshes else "UNKNOWN"


class FakeJob:
    def __init__(self, watcher: FakeWatcher):
        self.job_id, self.watcher = "42", watcher

    def done(self) -> bool:
        return True  # the result pickle is already there


@pytest.fixture
def fast(monkeypatch):
    monkeypatch.setattr(slurm, "POLL_S", 0.0)
    monkeypatch.setattr(slurm, "SACCT_REFRESH_S", 0.0)


def test_wait_returns_only_after_sacct_records_the_end(monkeypatch, fast):
    watcher = FakeWatcher(["RUNNING", "COMPLETING", "COMPLETING", "COMPLETED"])
    monkeypatch.setattr(SlurmJob, "watcher", watcher)
    seen = []
    slurm.wait_jobs([FakeJob(watcher)], lambda j, s: seen.append(s))
    assert seen == ["RUNNING", "COMPLETING", "COMPLETED"]
    assert watcher.refreshes == 4


def test_wait_gives_up_on_lagging_accounting_after_the_settle_time(monkeypatch, fast):
    watcher = FakeWatcher(["RUNNING"])  # accounting never catches up
    monkeypatch.setattr(SlurmJob, "watcher", watcher)
    monkeypatch.setattr(slurm, "SETTLE_S", 0.3)
    t0 = time.monotonic()
    slurm.wait_jobs([FakeJob(watcher)])
    assert 0.3 <= time.monotonic() - t0 < 5
