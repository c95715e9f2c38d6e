"""glibc's heap beside the tensor tracker (launcher.runtime.heap, LAUNCHER_HEAP_CHECK=1): it counts what the
tracker counts, and what the tracker cannot see (tests/cli/test_run_cli.check_heap runs it on real ranks)."""

import threading

import pytest
import torch

from launcher.processes.rankenv import HEAP_ENV
from launcher.runtime.heap import heap_in_use_bytes
from launcher.runtime.probe import MemoryProbe

MB = 10**6


def test_the_heap_counts_a_tensors_bytes_and_their_release():
    before = heap_in_use_bytes()
    t = torch.ones(10_000_000)  # 40 MB
    assert 40 * MB <= heap_in_use_bytes() - before <= 41 * MB
    del t
    assert heap_in_use_bytes() - before < MB


def heap_check(monkeypatch, work, *, env: str | None = "1") -> dict | None:
    """Run ``work`` as a CPU rank's forward phase under the probe; the rank report's heap_check."""
    if env is None:
        monkeypatch.delenv(HEAP_ENV, raising=False)
    else:
        monkeypatch.setenv(HEAP_ENV, env)
    probe = MemoryProbe(device="cpu")
    with probe:
        with probe.phase("forward"):
            work()
    return probe.report(status="completed").heap_check


def test_the_heap_agrees_with_the_tracker_on_the_tensors_it_tracks(monkeypatch):
    def work():
        a = torch.ones(5_000_000)
        b = a * 2  # the peak: a and b, 40 MB
        del a
        b.add_(1)

    heap = heap_check(monkeypatch, work)
    assert heap["tracked_peak_bytes"] == 40 * MB
    assert abs(heap["heap_at_tracked_peak_bytes"] - heap["tracked_peak_bytes"]) < MB
    assert abs(heap["heap_peak_bytes"] - heap["tracked_peak_bytes"]) < MB


def test_a_tensor_the_tracker_cannot_see_shows_in_the_heap(monkeypatch):
    """The tracker is a dispatch mode, and modes are per thread: a tensor made in another thread (as gloo's and
    DeepSpeed's worker threads make theirs) is not counted, and the heap shows it at the next tracked op."""
    held = []

    def work():
        x = torch.ones(1000)
        thread = threading.Thread(target=lambda: held.append(torch.ones(5_000_000)))  # 20 MB, untracked
        thread.start()
        thread.join()
        x.add_(1)

    heap = heap_check(monkeypatch, work)
    assert heap["tracked_peak_bytes"] < MB
    assert heap["heap_peak_bytes"] - heap["tracked_peak_bytes"] >= 19 * MB


@pytest.mark.parametrize("env", [None, "0"])
def test_the_heap_is_sampled_only_when_asked(monkeypatch, env):
    assert heap_check(monkeypatch, lambda: torch.ones(1000).add_(1), env=env) is None
