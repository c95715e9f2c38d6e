"""A real 2-rank run (gloo, CPU) whose environment names paths under secret-looking names (issue 35): the run reads
its data through them, and launch writes, renames or deletes only what it made.

MY_API_KEY set to the data's directory once made job.yaml's data.path '[redacted]/data.jsonl', and every run failed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import yaml

from tests.conftest import REPO
from tests.faults.test_fault_runs import LAUNCH, job_file

TOKEN = "hf_FAKE_SECRET_987654"
TMP_SUFFIX = ".launcher-tmp"


def test_a_secret_named_path_is_read_and_only_secrets_are_redacted(tmp_path):
    data_dir = tmp_path / "datasets"
    data_dir.mkdir()
    shutil.copy(REPO / "examples" / "data" / "causal.jsonl", data_dir / "data.jsonl")
    (tmp_path / "key.json").write_text("{}")
    env = {**os.environ, "MY_API_KEY": str(data_dir), "GOOGLE_APPLICATION_CREDENTIALS": str(tmp_path / "key.json"),
           "HF_TOKEN": TOKEN}
    job = job_file(tmp_path, "paths", data={"path": str(data_dir / "data.jsonl"), "max_seq_len": 64},
                   train={"global_batch_size": 8, "precision": "fp32", "lr": 3e-3, "max_steps": 2})
    run = tmp_path / "run"
    res = subprocess.run([LAUNCH, str(job), "--run-dir", str(run), "--quiet"], capture_output=True, text=True,
                         timeout=420, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert yaml.safe_load((run / "job.yaml").read_text())["data"]["path"] == str(data_dir / "data.jsonl")
    assert json.loads((run / "report.json").read_text())["within_budget"] is True
    for p in run.rglob("*"):  # the real secret is still nowhere
        assert not p.is_file() or TOKEN.encode() not in p.read_bytes(), p
    assert TOKEN not in res.stdout + res.stderr
    # The end-of-run export carries its marker; no temporary of the launcher's is left in the run dir.
    assert (run / "model" / ".launcher-export").is_file()
    assert not [p for p in run.rglob(f"*{TMP_SUFFIX}")]
    # The finished run's files are what export and --resume read: `plan --out` into it is refused, untouched.
    before = {p: p.read_bytes() for p in run.iterdir() if p.is_file()}
    again = subprocess.run([LAUNCH, "plan", str(job), "--out", str(run)], capture_output=True, text=True,
                           timeout=300, env=env)
    assert again.returncode == 2 and f"--out: {str(run)!r} holds a run (state.json: completed)" in again.stderr
    assert {p: p.read_bytes() for p in run.iterdir() if p.is_file()} == before
