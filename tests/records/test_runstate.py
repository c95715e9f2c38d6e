"""state.json as launcher.records.runstate.RunState: typed, with the processes that own the run, and kept on a full
disk."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import tempfile

import pytest

from launcher.files.fsutil import write_reserved
from launcher.files.rundir import RunDir
from launcher.processes.procs import ProcessRef
from launcher.records.runstate import RESERVE_BYTES, RunState


def test_state_json_round_trips_and_keeps_what_other_writers_added(tmp_path):
    run = RunDir.create(tmp_path / "run")
    me = ProcessRef.of(os.getpid())
    run.set_state("running", launch=me, ranks=[ProcessRef(pid=7, start_ticks=9)], requeues=2)
    on_disk = json.loads((run.path / "state.json").read_text())
    assert on_disk["pid"] == os.getpid() and on_disk["pid_start_ticks"] == me.start_ticks
    assert on_disk["ranks"] == [{"pid": 7, "start_ticks": 9}] and on_disk["requeues"] == 2
    run.set_state("completed", message="done")
    st = run.run_state()
    assert (st.state, st.message, st.launch, st.extra) == ("completed", "done", me, {"requeues": 2})
    assert RunState.from_json(st.to_json()) == st
    assert "message" not in RunState(state="running").to_json()  # unset fields stay out of the file


def test_a_state_json_from_before_the_type_reads_and_a_newer_one_is_refused():
    old = RunState.from_json({"state": "running", "pid": 4242, "updated": 1.0, "slurm_job_id": 17})
    assert old.launch == ProcessRef(pid=4242, start_ticks=None) and old.ranks == [] and old.slurm_job_id == "17"
    with pytest.raises(ValueError, match="newer than this launcher reads"):
        RunState.from_json({"state": "running", "schema": 99})


def test_a_run_marked_running_whose_launch_is_gone_was_abandoned():
    proc = subprocess.Popen(["sleep", "60"])
    st = RunState(state="running").update("running", launch=ProcessRef.of(proc.pid))
    try:
        assert not st.abandoned() and st.live_launch() == ProcessRef.of(proc.pid)
    finally:
        proc.kill()
        proc.wait()
    assert st.abandoned() and st.live_launch() is None
    assert not RunState(state="completed", pid=proc.pid).abandoned()  # it wrote its verdict
    assert not RunState(state="running", pid=proc.pid, slurm_job_id="5").abandoned()  # Slurm decides that one


def test_state_json_is_rewritten_in_its_own_room_when_no_file_can_be_made(tmp_path, monkeypatch):
    path = tmp_path / "state.json"
    write_reserved(path, json.dumps({"state": "running"}), RESERVE_BYTES)
    assert path.stat().st_size < 100  # the room is kept outside the file's size: nothing to see in it

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tempfile, "mkstemp", full)
    verdict = json.dumps({"state": "failed", "message": "x" * 3000})
    write_reserved(path, verdict, RESERVE_BYTES)
    assert path.read_text() == verdict
    with pytest.raises(OSError):  # more than the blocks the file holds: refused, the file untouched
        write_reserved(path, json.dumps({"state": "failed", "message": "x" * 10 * RESERVE_BYTES}), RESERVE_BYTES)
    assert path.read_text() == verdict
    with pytest.raises(OSError):  # no file to rewrite
        write_reserved(tmp_path / "other.json", "{}", RESERVE_BYTES)


def test_a_state_the_type_does_not_list_is_refused_before_it_is_written(tmp_path):
    run = RunDir.create(tmp_path / "run")
    with pytest.raises(ValueError, match="not a run state"):
        run.set_state("complted")
    assert not (run.path / "state.json").exists()
