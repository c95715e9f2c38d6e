"""Static and unit-level safety: YAML only through safe loaders, no shell, secrets redacted, one launch per run dir."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from launcher.errors import ConfigError
from launcher.files.redact import REDACTED, redact, redact_data, secret_values
from launcher.files.rundir import RunDir
from launcher.processes.procs import ProcessRef, start_ticks
from tests.conftest import REPO

SOURCES = [p for d in ("launcher", "benchmarks", "examples", "tests") for p in (REPO / d).rglob("*.py")
           if p.resolve() != Path(__file__).resolve()]
UNSAFE_YAML = re.compile(r"yaml\.load\(|yaml\.load_all\(|unsafe_load|full_load|FullLoader|UnsafeLoader|"
                         r"Loader=yaml\.Loader|yaml\.Loader\b")


# The job loader is a SafeLoader subclass (it reads 1e-4 as a float); a yaml.load through it is safe, and
# test_the_job_loader_refuses_python_tags below proves it behaves so.
SAFE_LOADER_CALL = re.compile(r"yaml\.load\([^)]*Loader=JobLoader\)")


def test_yaml_is_only_ever_safe_loaded():
    """yaml.load without SafeLoader builds arbitrary Python objects (!!python/object/apply:os.system)."""
    hits = [f"{p.relative_to(REPO)}:{n}: {line.strip()}" for p in SOURCES
            for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
            if UNSAFE_YAML.search(SAFE_LOADER_CALL.sub("", line))]
    assert not hits, "\n".join(hits)
    assert any("safe_load" in p.read_text() for p in SOURCES)  # the scan sees real code


def test_the_job_loader_refuses_python_tags(tmp_path):
    import yaml

    from launcher.config.load import JobLoader, load_yaml, parse_yaml_value

    assert issubclass(JobLoader, yaml.SafeLoader)
    bad = tmp_path / "evil.yaml"
    marker = tmp_path / "pwned"
    bad.write_text(f'name: !!python/object/apply:os.system ["touch {marker}"]\n')
    with pytest.raises(ConfigError, match="YAML"):
        load_yaml(bad)
    with pytest.raises(ValueError):
        parse_yaml_value(f'!!python/object/apply:os.system ["touch {marker}"]')
    assert not marker.exists()


def test_the_launcher_never_goes_through_a_shell():
    """Local runs pass argv lists (torchrun's own parser); the only shell text is the sbatch emitter's, which
    shlex-quotes every value (tests/emit/test_sbatch.py runs it with a weird run dir)."""
    shell = re.compile(r"shell\s*=\s*True|os\.system\(|os\.popen\(|subprocess\.getoutput\(|commands\.getoutput")
    hits = [f"{p.relative_to(REPO)}:{n}" for p in (REPO / "launcher").rglob("*.py")
            for n, line in enumerate(p.read_text().splitlines(), 1) if shell.search(line)]
    assert not hits, hits


def test_secret_values_come_from_secret_looking_names():
    env = {"HF_TOKEN": "hf_FAKE_SECRET_123", "MY_API_KEY": "sk-fake-api-key-456", "DB_PASSWORD": "hunter2hunter2",
           "AWS_SECRET_ACCESS_KEY": "AKIAFAKEFAKEFAKE", "SSH_KEY": "short", "KEYBOARD": "us-international",
           "HOME": "/root/somewhere", "PATH": "/usr/bin:/bin"}
    values = secret_values(env)
    assert set(values) == {"hf_FAKE_SECRET_123", "sk-fake-api-key-456", "hunter2hunter2", "AKIAFAKEFAKEFAKE"}
    assert redact("token=hf_FAKE_SECRET_123 home=/root/somewhere", values) == f"token={REDACTED} home=/root/somewhere"


def test_run_dir_files_never_hold_a_secret(tmp_path, monkeypatch):
    """Even a secret with a quote and a backslash (escaped in JSON text, so a replace on the text misses it)."""
    secret = 'p"a\\ss-word-1234'
    monkeypatch.setenv("SERVICE_PASSWORD", secret)
    run = RunDir.create(tmp_path / "run")
    run.write_json("report.json", {"message": f"failed with {secret}", secret: [secret]})
    run.write_yaml("job.yaml", {"slurm": {"setup": [f"export SERVICE_PASSWORD={secret}"]}})
    run.set_state("failed", message=f"error: {secret}")
    (run.logs / "rank-0.log").write_text(f"env: {{'SERVICE_PASSWORD': {secret!r}}}\nraw {secret}\n")
    assert run.redact_logs() == [run.logs / "rank-0.log"]
    for p in run.path.rglob("*"):
        if p.is_file():
            text = p.read_text()
            assert secret not in text and json.dumps(secret)[1:-1] not in text, p
    assert json.loads((run.path / "report.json").read_text())["message"] == f"failed with {REDACTED}"
    assert redact_data({"a": [secret]}, [secret]) == {"a": [REDACTED]}


def test_a_second_launch_on_a_locked_run_dir_is_refused(tmp_path):
    """The lock is per open file: a second RunDir.create (another launch) fails before touching anything."""
    first = RunDir.create(tmp_path / "run")
    (first.path / "report.json").write_text("{}")
    with pytest.raises(ConfigError, match="is in use by another launch"):
        RunDir.create(tmp_path / "run", overwrite=True)
    assert (first.path / "report.json").read_text() == "{}"  # --overwrite did not clear a live run


def test_overwrite_refuses_a_run_dir_whose_launch_still_lives(tmp_path):
    """The lock dies with its process; a launch that state.json names (pid and start time) and that still runs
    keeps its dir, whatever its command line says (a launch through a wrapper is a launch too)."""
    first = RunDir.create(tmp_path / "run")
    first.unlock()  # as seen from another mount: the lock says nothing, the pid does
    (first.path / "report.json").write_text("{}")
    proc = subprocess.Popen(["sleep", "60"])  # no "launch" in its command line
    try:
        first.set_state("running", launch=ProcessRef.of(proc.pid))
        with pytest.raises(ConfigError) as e:
            RunDir.create(tmp_path / "run", overwrite=True)
        assert (f"is in use by launch process {proc.pid}, which is still running; --overwrite would delete"
                in str(e.value))
        assert "another --run-dir" in str(e.value)
        assert (first.path / "report.json").read_text() == "{}"
    finally:
        proc.kill()
        proc.wait()
    # The process is gone: the dir may be replaced now.
    RunDir.create(tmp_path / "run", overwrite=True).unlock()
    assert not (tmp_path / "run" / "report.json").exists()


def test_a_reused_pid_does_not_hold_the_dir(tmp_path):
    """A live process with the recorded pid but another start time is not the launch that wrote state.json."""
    first = RunDir.create(tmp_path / "run")
    first.unlock()
    proc = subprocess.Popen(["sleep", "60"])  # the pid was reused by something else
    try:
        first.set_state("running", launch=ProcessRef(pid=proc.pid, start_ticks=start_ticks(proc.pid) - 1))
        RunDir.create(tmp_path / "run", overwrite=True).unlock()
    finally:
        proc.kill()
        proc.wait()


def test_ranks_that_outlive_their_launch_hold_the_dir(tmp_path):
    """Recorded rank processes still alive (their launch gone) keep the dir from a second launch: orphans would
    write into the new run's rank files."""
    first = RunDir.create(tmp_path / "run")
    first.unlock()
    rank = subprocess.Popen(["sleep", "60"])
    try:
        gone = ProcessRef(pid=rank.pid, start_ticks=start_ticks(rank.pid) - 1)  # the launch: not this process
        first.set_state("running", launch=gone, ranks=[ProcessRef.of(rank.pid)])
        for overwrite, resume in ((True, False), (False, True)):
            with pytest.raises(ConfigError) as e:
                RunDir.create(tmp_path / "run", overwrite=overwrite, resume=resume)
            assert f"has rank processes still running ({rank.pid}) though their launch is gone" in str(e.value)
            assert f"kill {rank.pid}" in str(e.value)
    finally:
        rank.kill()
        rank.wait()
    RunDir.create(tmp_path / "run", overwrite=True).unlock()
