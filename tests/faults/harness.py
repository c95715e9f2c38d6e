"""The shared harness of the refused-input tables (test_bad_input.py, test_hostile_*.py).

A case runs `launcher.cli.main.main([...])` in-process inside a sandbox (see conftest.py): the working dir, HOME and
the launcher's cache are temporary. `check_refused` asserts what every refused input owes the user: exit 2, one
error block with the case's words and fix, no traceback, nothing on stdout, no run dir, no rank started and no new
file anywhere in the sandbox.
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from launcher.cli.main import main
from tests.conftest import base_job


@dataclass
class Sandbox:
    root: Path
    data: Path

    def job(self, name: str = "job", **over) -> Path:
        """A valid job (tiny GPT-2, 2 ranks, 1GB) with dotted overrides; None removes a key."""
        p = self.root / f"{name}.yaml"
        p.write_text(yaml.safe_dump(base_job(str(self.data), **over), sort_keys=False))
        return p

    def raw(self, text: str, name: str = "raw") -> Path:
        p = self.root / f"{name}.yaml"
        p.write_text(text)
        return p

    def file(self, name: str, text: str = "x") -> Path:
        p = self.root / name
        p.write_text(text)
        return p

    @property
    def run_dir(self) -> Path:
        return self.root / "run"



@dataclass
class Case:
    id: str
    argv: Callable[[Sandbox], list]
    """The CLI arguments (after `launch`); --run-dir <sandbox>/run is added for the run verb unless given."""
    expect: list[str]
    """Substrings of stderr: the field, the value, the rule and the fix."""
    verb: str = "run"
    setup: Callable[[Sandbox], None] | None = None
    keeps: list[str] = field(default_factory=list)
    """Sandbox entries the case made on purpose before the CLI ran (they must stay exactly as they were)."""


def read_only_dir(s: Sandbox) -> Path:
    """A directory this process may not write in. Tests run as root, where access(W_OK) on a 0o555 directory is
    still true; /proc/self is read-only for root too."""
    ro = s.root / "read-only"
    ro.mkdir(exist_ok=True)
    ro.chmod(0o555)
    if not os.access(ro, os.W_OK | os.X_OK):
        return ro
    if not os.access("/proc/self", os.W_OK | os.X_OK):
        return Path("/proc/self")
    pytest.skip("no read-only directory here: neither a 0o555 dir nor /proc/self refuses writes")


def entries(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}



def one_error_block(text: str) -> list[str]:
    """The error lines of stderr, checked to be one block: argparse's usage lines may come first, then only
    `error:` lines and their indented continuations; nothing else (no traceback, no progress, no second report)."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    first = next((i for i, ln in enumerate(lines) if " error: " in ln), None)
    assert first is not None, f"no error line in:\n{text}"
    assert all(ln.startswith(("usage:", " ")) for ln in lines[:first]), f"output before the error:\n{text}"
    assert all(" error: " in ln or ln.startswith("  ") for ln in lines[first:]), f"not one error block:\n{text}"
    return lines[first:]



def check_refused(case: Case, sandbox: Sandbox, fix: str = "") -> str:
    """Run the case through the CLI in-process and assert the refusal contract; returns stderr."""
    if case.setup:
        case.setup(sandbox)
    argv = [str(a) for a in case.argv(sandbox)]
    if case.verb == "run" and "--run-dir" not in argv:
        argv += ["--run-dir", str(sandbox.run_dir)]
    argv = [case.verb, *argv, "--quiet"] if case.verb == "run" else [case.verb, *argv]
    before = entries(sandbox.root)
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            code = main(argv)
        except SystemExit as e:  # argparse rejects a flag's value itself, with exit status 2
            code = e.code
    text = err.getvalue()
    assert code == 2, f"exit {code}; stderr:\n{text}"
    assert "Traceback" not in text, text
    one_error_block(text)
    assert out.getvalue() == "", f"bad input printed a plan or a run:\n{out.getvalue()}"
    for part in [*case.expect, *([fix] if fix else [])]:
        assert part in text, f"{part!r} not in:\n{text}"
    # Nothing started: no run dir (or the one the case made is untouched), no rank logs, no new files at all.
    if "run" not in case.keeps:
        assert not sandbox.run_dir.exists(), "a run dir was created for bad input"
    assert not list(sandbox.root.rglob("logs")), "rank logs exist: ranks were started"
    assert entries(sandbox.root) == before, f"new files: {entries(sandbox.root) - before}"
    return text
