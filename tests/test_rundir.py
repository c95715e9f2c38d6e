"""The run dir's marker, what --overwrite may delete, and the lock's wait (launcher/rundir.py)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from launcher.errors import ConfigError
from launcher.rundir import MARKER, RunDir, refuse_protected
from tests.conftest import REPO


def test_a_new_run_dir_carries_the_marker(tmp_path):
    run = RunDir.create(tmp_path / "run")
    assert (run.path / MARKER).is_file()
    run.unlock()


def test_overwrite_deletes_only_what_the_launcher_wrote(tmp_path):
    """A run dir launch made, into which someone put notes and data: --overwrite replaces the run and keeps those."""
    run = RunDir.create(tmp_path / "run")
    for name in ("plan.json", "job.yaml", "report.json", "state.json", "fsdp.yaml", ".plan.json.x1y2.tmp"):
        (run.path / name).write_text("{}")
    (run.logs / "rank-0.log").write_text("old log")
    (run.path / "checkpoint").mkdir()
    (run.path / "checkpoint" / "latest").write_text("1")
    for export in ("model", "model.partial"):  # the run's export (launcher.worker.export) and one cut short
        (run.path / export).mkdir()
        (run.path / export / "model.safetensors").write_bytes(b"old")
    (run.path / "notes.txt").write_text("mine")
    (run.path / "analysis").mkdir()
    (run.path / "analysis" / "fig.png").write_bytes(b"png")
    run.unlock()

    again = RunDir.create(tmp_path / "run", overwrite=True)
    names = {p.name for p in again.path.iterdir()}
    assert names == {".lock", MARKER, "notes.txt", "analysis", "ranks", "steps", "logs", "control"}
    assert (again.path / "notes.txt").read_text() == "mine"
    assert (again.path / "analysis" / "fig.png").read_bytes() == b"png"
    assert not list(again.logs.iterdir())
    again.unlock()


def test_overwrite_never_follows_a_link_out_of_the_run_dir(tmp_path):
    run = RunDir.create(tmp_path / "run")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("keep")
    (run.path / "checkpoint").symlink_to(elsewhere)  # a launcher name, pointing out of the dir
    run.unlock()
    RunDir.create(tmp_path / "run", overwrite=True).unlock()
    assert not (tmp_path / "run" / "checkpoint").exists()
    assert (elsewhere / "keep.txt").read_text() == "keep"


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_dir_without_the_marker_is_refused_before_anything_is_written(tmp_path, overwrite):
    d = tmp_path / "mine"
    (d / "sub").mkdir(parents=True)
    (d / "notes.txt").write_text("notes")
    (d / "sub" / "data.bin").write_bytes(b"1")
    (d / ".hidden").write_text("h")
    before = sorted(p.relative_to(d) for p in d.rglob("*"))
    with pytest.raises(ConfigError) as e:
        RunDir.create(d, overwrite=overwrite)
    assert f"--run-dir: {str(d)!r} is not empty and was not made by launch (it holds .hidden, notes.txt, sub)" \
        in str(e.value)
    assert sorted(p.relative_to(d) for p in d.rglob("*")) == before  # not even a .lock


def test_resume_continues_a_dir_from_before_the_marker(tmp_path):
    """--resume deletes nothing, so a run dir written by an older launcher (no marker) may still be resumed."""
    d = tmp_path / "old-run"
    (d / "checkpoint").mkdir(parents=True)
    (d / "checkpoint" / "latest").write_text("3")
    (d / "plan.json").write_text("{}")
    run = RunDir.create(d, resume=True)
    assert (d / "checkpoint" / "latest").read_text() == "3" and (d / MARKER).is_file()
    run.unlock()


def test_the_lock_waits_for_a_short_holder_and_refuses_a_long_one(tmp_path):
    holder = RunDir.create(tmp_path / "run")
    other = RunDir(holder.path)
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match="is in use by another launch"):
        other.lock(wait_s=0.3, flag="--out")
    assert 0.3 <= time.monotonic() - t0 < 5
    threading.Timer(0.2, holder.unlock).start()
    other.lock(wait_s=5)  # taken once the holder lets go
    other.unlock()


def test_root_and_home_are_never_overwritten(tmp_path, monkeypatch):
    """Checked on the rule alone: a test must never hand the real / to RunDir.create or the CLI, since a
    regression (or today's main) would delete the machine's files."""
    with pytest.raises(ConfigError, match="--run-dir: '/' is (the current directory or holds it|/; --overwrite never)"):
        refuse_protected(Path("/"))  # / holds the working directory here; either way it is refused
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(ConfigError, match="--overwrite never clears it"):
        refuse_protected(tmp_path)
    refuse_protected(tmp_path / "run")  # below them is fine


def test_one_reader_of_checkpoint_latest(tmp_path):
    """checkpoint/latest is read in one place (rundir.latest_checkpoint_tag) by the launcher, backends and ranks."""
    from launcher.rundir import latest_checkpoint_tag

    ck = tmp_path / "checkpoint"
    assert latest_checkpoint_tag(ck) is None  # no dir
    ck.mkdir()
    (ck / "latest").write_text("\n")
    assert latest_checkpoint_tag(ck) is None  # an empty marker names nothing to resume from
    (ck / "latest").write_text("step-00000007\n")
    assert latest_checkpoint_tag(ck) == "step-00000007"
    sources = [p for p in (REPO / "launcher").rglob("*.py") if p.name != "rundir.py"]
    readers = [str(p.relative_to(REPO)) for p in sources if '/ "latest"' in p.read_text()]
    assert readers == [], readers
