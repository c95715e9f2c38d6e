"""launcher.processes.procs: a process named by its pid and start time, and the switches that end a rank with its
parent."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time

from launcher.processes.procs import ProcessRef, exit_words, process_alive, start_ticks, stopped_by_request
from tests.conftest import REPO

ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def test_a_process_is_its_pid_and_start_time():
    proc = subprocess.Popen(["sleep", "60"])
    try:
        ref = ProcessRef.of(proc.pid)
        assert ref.start_ticks == start_ticks(proc.pid) and ref.start_ticks >= start_ticks(os.getpid())
        assert ref.alive() and ProcessRef.from_json(ref.to_json()) == ref
        # The same pid with another start time is another process (the number was reused): not alive.
        assert not ProcessRef(pid=proc.pid, start_ticks=ref.start_ticks + 1).alive()
        assert process_alive(proc.pid, None)  # a file from before start times were kept: the pid decides
    finally:
        proc.kill()
        proc.wait()
    assert not ref.alive() and start_ticks(proc.pid) is None


def test_a_zombie_is_not_alive():
    proc = subprocess.Popen(["true"])
    ref = ProcessRef.of(proc.pid)
    deadline = time.monotonic() + 10
    while open(f"/proc/{proc.pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":  # exited, not yet reaped
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert not ref.alive()
    proc.wait()


def test_a_command_name_with_spaces_and_parentheses_does_not_shift_the_fields(tmp_path):
    exe = tmp_path / "a b) (c"
    exe.symlink_to("/bin/sleep")
    proc = subprocess.Popen([str(exe), "60"])
    try:
        assert start_ticks(proc.pid) == ProcessRef.of(proc.pid).start_ticks > 0
        assert process_alive(proc.pid, start_ticks(proc.pid))
    finally:
        proc.kill()
        proc.wait()


# A "launcher" that starts a "rank" as launch does (the rank arms its parent-death signal and adopts its orphans),
# then prints both pids and waits to be killed.
PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", '''
import os, subprocess, sys, time
from launcher.processes.procs import become_subreaper, die_with_parent
assert die_with_parent(expected_parent=int(sys.argv[1])) and become_subreaper()
grand = subprocess.Popen(["sleep", "60"])
print(os.getpid(), grand.pid, flush=True)
time.sleep(60)
''', str(__import__("os").getpid())], stdout=subprocess.PIPE, text=True)
print(child.stdout.readline().strip(), flush=True)
time.sleep(60)
"""


def test_a_rank_dies_with_the_process_that_started_it_even_by_sigkill(tmp_path):
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True,
                              env=ENV)
    rank_pid, grand_pid = map(int, parent.stdout.readline().split())
    rank = ProcessRef.of(rank_pid)
    assert rank.alive()
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 5
    while rank.alive():
        assert time.monotonic() < deadline, "the rank outlived its launcher"
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):  # a child of a SIGKILLed rank is not covered (the docs' limits)
        os.kill(grand_pid, 9)


def test_a_rank_started_after_its_launcher_died_leaves_at_once():
    out = subprocess.run([sys.executable, "-c", "from launcher.processes.procs import die_with_parent\n"
                          "die_with_parent(expected_parent=1)\nprint('still here')"],
                         capture_output=True, text=True, timeout=60, env=ENV)
    assert out.returncode == -9 and "still here" not in out.stdout


# A rank that forks a child and a daemonized grandchild (its parent exits at once), then leaves through
# exit_rank: neither may outlive it.
LEAVER = """
import os, subprocess, sys
from launcher.processes.procs import become_subreaper
from launcher.worker.rank_entry import exit_rank
become_subreaper()
child = subprocess.Popen(["sleep", "60"])
daemon = subprocess.Popen(["sh", "-c", "sleep 60 & echo $!"], stdout=subprocess.PIPE, text=True)
print(child.pid, daemon.stdout.readline().strip(), flush=True)
daemon.wait()
exit_rank(0)
"""


def test_a_finished_rank_leaves_no_process_behind():
    out = subprocess.run([sys.executable, "-c", LEAVER], capture_output=True, text=True, timeout=60,
                         env=ENV)
    assert out.returncode == 0, out.stderr
    pids = [int(p) for p in out.stdout.split()]
    assert len(pids) == 2 and not any(process_alive(p, None) for p in pids), pids


def test_exit_words_name_the_signal():
    assert exit_words(-9) == "killed by SIGKILL" and exit_words(-15) == "killed by SIGTERM"
    assert exit_words(1) == "exit code 1" and exit_words(-99) == "killed by signal 99"
    assert stopped_by_request(-15) and stopped_by_request(-2) and not stopped_by_request(-9)
    assert not stopped_by_request(143)
