"""A real 2-rank run (gloo, CPU) whose environment names paths under secret-looking names (issue 35): the run reads
its data through them, and launch writes, renames or deletes only what it made.

MY_API_KEY set to the data's directory once made job.yaml's data.path '[redacted]/data.jsonl', and every run failed.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import yaml

from tests.conftest import own_leftovers
from tests.faults.test_fault_runs import LAUNCH
from tests.shared_runs import SECRET_TOKEN

TMP_SUFFIX = ".launcher-tmp"


def test_a_secret_named_path_is_read_and_only_secrets_are_redacted(terminal_run):
    # The job file's own paths are relative (a model dir and the data beside it) and launch starts in another dir:
    # relative paths start at the job file's directory in run too (the ranks read the run dir's job.yaml with the
    # run dir as their base, so it must carry them absolute). One run for this, test_run_cli's relative model dir
    # and the live table's terminal (tests/shared_runs.py terminal_run).
    job, run, env = terminal_run.job, terminal_run.run, terminal_run.env
    data_dir = job.parent / "data"
    assert env["MY_API_KEY"] == str(data_dir)
    written = yaml.safe_load((run / "job.yaml").read_text())
    assert written["model"] == str(job.parent / "models" / "tiny")
    assert written["data"]["path"] == str(data_dir / "d.jsonl")
    assert written["train"]["max_steps"] == 6  # the command line's override
    assert json.loads((run / "report.json").read_text())["within_budget"] is True
    for p in run.rglob("*"):  # the real secret is still nowhere
        assert not p.is_file() or SECRET_TOKEN.encode() not in p.read_bytes(), p
    assert SECRET_TOKEN not in terminal_run.out
    # The end-of-run export carries its marker; no temporary of the launcher's is left in the run dir.
    assert (run / "model" / ".launcher-export").is_file()
    assert not [p for p in run.rglob(f"*{TMP_SUFFIX}")]
    assert not [p for p in run.iterdir() if p.name.startswith(".torchelastic")]
    left = own_leftovers(Path(env["TMPDIR"]))
    assert not left, f"a finished run leaves nothing of its own in TMPDIR: {left}"
    # The finished run's files are what export and --resume read: `plan --out` into it is refused, untouched.
    before = {p: p.read_bytes() for p in run.iterdir() if p.is_file()}
    again = subprocess.run([LAUNCH, "plan", str(job), "--out", str(run)], capture_output=True, text=True,
                           timeout=300, env=env, cwd=job.parent.parent)
    assert again.returncode == 2 and f"--out: {str(run)!r} holds a run (state.json: completed)" in again.stderr
    assert {p: p.read_bytes() for p in run.iterdir() if p.is_file()} == before
