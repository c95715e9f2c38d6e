"""Ranks train only the plan the launcher wrote for the attempt: $LAUNCHER_PLAN_SHA256 against plan.json."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.cli.main import main
from launcher.errors import ConfigError
from launcher.files.rundir import RunDir
from launcher.planner.plan import Plan
from launcher.processes.rankenv import PLAN_DIGEST_ENV
from launcher.records.runreport import RunOutcome
from launcher.runtime import load_plan


@pytest.fixture
def planned(write_job, tmp_path, capsys):
    """A dir holding a plan --out set (job.yaml, plan.json, fsdp.yaml), as a run dir holds it."""
    d = tmp_path / "run"
    assert main(["plan", str(write_job(strategy={"engine": "fsdp"})), "--out", str(d)]) == 0
    capsys.readouterr()
    return d


def test_the_rank_env_names_the_digest_of_the_plan_json_written(planned, tmp_path, monkeypatch):
    from launcher.config.jobfile import load_job
    from launcher.session.prepare import plan_text, rank_env, write_plan_outputs

    plan = Plan.from_json(json.loads((planned / "plan.json").read_text()))
    job = load_job(planned / "job.yaml")
    run = RunDir.create(tmp_path / "fresh")
    write_plan_outputs(run.path, plan, job)
    env = rank_env(run, plan, job, enforce=False)
    assert env[PLAN_DIGEST_ENV] == hashlib.sha256((run.path / "plan.json").read_bytes()).hexdigest()
    assert (run.path / "plan.json").read_text() == plan_text(plan)
    # Every rank the launcher starts (a --script's too) gets expandable segments unless the user set the allocator.
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:512")
    assert rank_env(run, plan, job, enforce=False)["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:512"
    run.unlock()


def test_the_extensions_dir_rule_lives_in_one_place(planned, tmp_path, monkeypatch):
    """The ranks' TORCH_EXTENSIONS_DIR and a process that builds ops itself both come from rankenv.extensions_dir:
    the user's choice, else the default (changed here, both follow)."""
    import launcher.processes.rankenv
    from launcher.config.jobfile import load_job
    from launcher.processes.rankenv import set_extensions_dir
    from launcher.session.prepare import rank_env

    monkeypatch.setattr(launcher.processes.rankenv, "default_extensions_dir", lambda: tmp_path / "ops")
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    monkeypatch.setenv("PATH", os.environ["PATH"])  # set_extensions_dir puts this interpreter's bin first
    plan = Plan.from_json(json.loads((planned / "plan.json").read_text()))
    run = RunDir.create(tmp_path / "fresh")
    assert rank_env(run, plan, load_job(planned / "job.yaml"), enforce=False)["TORCH_EXTENSIONS_DIR"] == \
        str(tmp_path / "ops") == set_extensions_dir()
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "mine"))
    assert set_extensions_dir() == str(tmp_path / "mine")
    run.unlock()


def test_ranks_build_ops_with_the_ninja_the_cache_was_built_with(monkeypatch):
    """Every rank (the worker's and a script's, launcher.worker.rank_entry) and set-up find the ninja beside this
    interpreter first, whatever PATH the node gave them: a different ninja hashes commands differently in .ninja_log
    and rebuilds every op it loads (apt's 1.11 against pip's 1.13: ~30 s per run, each undoing the other's). Checked
    on the op cache the suite itself uses: the rank's ninja finds set-up's build of DeepSpeed's shm op up to date."""
    from launcher.processes.rankenv import extensions_dir, use_local_tools

    here = str(Path(sys.executable).parent)
    monkeypatch.setenv("PATH", os.pathsep.join(["/usr/bin", "/bin", here, "/usr/local/bin"]))
    use_local_tools()
    path = os.environ["PATH"]
    assert path.split(os.pathsep) == [here, "/usr/bin", "/bin", "/usr/local/bin"]  # the node's own PATH kept after
    ninja = shutil.which("ninja", path=path)
    assert ninja and Path(ninja).parent == Path(here), ninja  # pip's ninja, a dependency of deepspeed
    op = Path(extensions_dir()) / "deepspeed_shm_comm"
    assert (op / "build.ninja").is_file(), f"{op}: scripts/test.sh builds it (python -m launcher.processes.ops --all)"
    out = subprocess.run([ninja, "-C", str(op), "-n", "-d", "explain"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "no work to do" in out.stdout, out.stdout + out.stderr


def test_load_plan_refuses_a_plan_json_replaced_after_the_launch(planned, monkeypatch):
    path = planned / "plan.json"
    monkeypatch.setenv(PLAN_DIGEST_ENV, hashlib.sha256(path.read_bytes()).hexdigest())
    assert load_plan(path).strategy.engine == "fsdp"
    data = json.loads(path.read_text())
    data["micro_batch_size"] = data["micro_batch_size"] * 2  # what another `plan --out` would have written
    path.write_text(json.dumps(data, indent=2) + "\n")
    with pytest.raises(ConfigError) as e:
        load_plan(path)
    assert f"{path}: this plan.json is not the one the launcher wrote for this run" in str(e.value)
    assert "nothing was trained" in str(e.value)
    monkeypatch.delenv(PLAN_DIGEST_ENV)  # started by hand, outside the launcher: nothing to compare with
    assert load_plan(path).strategy.micro_batch_size == data["micro_batch_size"]


def test_the_worker_refuses_it_before_building_anything(planned, monkeypatch):
    from launcher.worker.main import load_run_dir

    digest = hashlib.sha256((planned / "plan.json").read_bytes()).hexdigest()
    monkeypatch.setenv(PLAN_DIGEST_ENV, digest)
    assert load_run_dir(planned)[2] == digest
    monkeypatch.setenv(PLAN_DIGEST_ENV, "0" * 64)
    with pytest.raises(ConfigError, match="is not the one the launcher wrote for this run"):
        load_run_dir(planned)


def test_a_report_of_ranks_that_trained_another_plan_is_a_failure(planned, tmp_path):
    """Ranks started without the digest (by hand) that record another plan: the run is not judged against a
    prediction that does not describe it."""
    from launcher.session.finish import other_plan

    plan = Plan.from_json(json.loads((planned / "plan.json").read_text()))
    run = RunDir.create(tmp_path / "fresh")
    (run.ranks / "rank-0.json").write_text(json.dumps({"rank": 0, "plan_sha256": "f" * 64}))
    out = other_plan(run, plan, RunOutcome(ok=True))
    assert not out.ok and "rank(s) [0] trained a plan.json other than the one the launcher planned" in out.message
    (run.ranks / "rank-0.json").write_text(json.dumps({"rank": 0, "plan_sha256": hashlib.sha256(
        (planned / "plan.json").read_bytes()).hexdigest()}))
    assert other_plan(run, plan, RunOutcome(ok=True)).ok
    run.unlock()
