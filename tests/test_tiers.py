"""The fast tier stays process-free and the slow tables stay true (tests/tiers.py)."""

import ast
import multiprocessing
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.tiers import ALL, GUARD, PROCESS_FIXTURES, STARTS_PROCESSES, TAKES_SECONDS


def _fork_and_leave() -> None:
    pid = os.fork()
    if pid == 0:  # only if the guard let it through: the child must not run the rest of the session
        os._exit(0)
    os.waitpid(pid, 0)


STARTS = {
    "subprocess": lambda: subprocess.run(["true"], check=False),
    "os.system": lambda: os.system("true"),
    "os.fork": _fork_and_leave,
    "os.posix_spawn": lambda: os.waitpid(os.posix_spawn("/bin/true", ["true"], dict(os.environ)), 0),
    "multiprocessing": lambda: multiprocessing.get_context("spawn").Process(target=print).start(),
}


@pytest.mark.parametrize("how", list(STARTS))
def test_a_fast_test_that_starts_a_process_fails_naming_it(how, request):
    with pytest.raises(pytest.fail.Exception, match=r"started a process \(.+\) but is not marked slow: mark it"):
        STARTS[how]()
    # Recorded too, so that a test which swallows the failure (a broad except, a thread) still fails: taken back
    # here, since this test expected it.
    assert GUARD.started.pop(request.node.nodeid)


@pytest.mark.slow
def test_a_slow_test_may_start_a_process():
    assert subprocess.run(["true"], check=False).returncode == 0


def _functions(path: Path) -> set[str]:
    return {n.name for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.FunctionDef)}


def test_every_test_the_tables_name_exists():
    """A renamed or deleted test leaves no stale entry behind (its new name, if it starts a process, is caught by
    the guard)."""
    stale = []
    for table in (STARTS_PROCESSES, TAKES_SECONDS):
        for path, names in table.items():
            file = REPO / path
            if not file.is_file():
                stale.append(path)
            elif names != ALL:
                stale += [f"{path}::{n}" for n in sorted(set(names) - _functions(file))]
    defined = set().union(*(_functions(p) for p in (REPO / "tests").rglob("*.py")))
    stale += [f"fixture {f}" for f in PROCESS_FIXTURES if f not in defined]
    assert stale == []
