"""CPU seconds per test, the test's own process and every child it waited for (the `launch` CLI, its ranks, a
script): what a test costs on a shared machine, where --durations' wall time mostly measures the load.

    .venv/bin/python -m pytest -p tests.cpu_time --cpu-durations 25 tests/cli/test_run_cli.py

prints the 25 costliest tests and the total at the end (docs/testing.md "Where the time goes").
"""

from __future__ import annotations

import resource

import pytest

SPENT = pytest.StashKey[dict]()


def cpu_s() -> float:
    """User + system CPU seconds of this process and of its waited-for children (theirs include their own)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def pytest_addoption(parser):
    """--cpu-durations N: list the N tests that took the most CPU (0: all of them)."""
    parser.addoption("--cpu-durations", type=int, default=None, metavar="N",
                     help="list the N tests that took the most CPU seconds, children included (0: all)")


def pytest_configure(config):
    """Where the seconds per test are kept."""
    config.stash[SPENT] = {}


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Count the test's set-up, call and tear-down (a module fixture's run lands on the test that set it up)."""
    start = cpu_s()
    try:
        return (yield)
    finally:
        item.config.stash[SPENT][item.nodeid] = cpu_s() - start


def pytest_terminal_summary(terminalreporter, config):
    """The costliest tests, then the total (the session's collection and start-up not included)."""
    n = config.getoption("--cpu-durations")
    if n is None:
        return
    spent = sorted(config.stash[SPENT].items(), key=lambda kv: -kv[1])
    terminalreporter.write_sep("=", f"cpu seconds per test (children included), {len(spent)} tests")
    for nodeid, seconds in spent[:n or None]:
        terminalreporter.write_line(f"{seconds:8.1f}  {nodeid}")
    terminalreporter.write_line(f"{sum(s for _, s in spent):8.1f}  in all")
