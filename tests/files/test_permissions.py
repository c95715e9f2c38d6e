"""The run dir's permissions (launcher.files.fsutil) and rank logs redacted as written (launcher.files.ranklog).

Policy: the run dir and every directory the launcher makes in it are 0700; every file the launcher and its ranks
write there is 0600 from creation; a secret value never reaches a rank log, not even while the run goes on.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launcher.files.fsutil import DIR_MODE, FILE_MODE
from launcher.files.ranklog import copy_redacted, log_fd, wait_settled
from launcher.files.rundir import RunDir

SECRET = "hf_SeCrEt0123456789abcdef"


def mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def private_tree(root: Path) -> list[str]:
    """Everything under ``root`` (root included) whose mode lets another user in: directories not 0700, files
    with any group or other bit."""
    bad = [] if mode(root) == DIR_MODE else [f". {oct(mode(root))}"]
    for p in root.rglob("*"):
        m = mode(p)
        if (p.is_dir() and m != DIR_MODE) or (p.is_file() and m & 0o077):
            bad.append(f"{p.relative_to(root)} {oct(m)}")
    return bad


def test_every_file_the_launcher_writes_is_private_from_creation(tmp_path, monkeypatch):
    from launcher.records.report import plot_memory
    from launcher.records.runreport import RankRow, RunReport
    from launcher.runtime.files import JsonlLog

    os.umask(0o022)  # the usual umask: a file made with the default mode would be 0644
    run = RunDir.create(tmp_path / "run")
    run.write_json("report.json", {"ranks": []})
    run.write_yaml("job.yaml", {"name": "x"})
    log = JsonlLog(run.steps / "rank-0.jsonl")
    log.append({"step": 1})
    log.close()
    rows = [RankRow(rank=0, measured_peak_bytes=5, predicted_peak_bytes=6, measured_breakdown={"params": 5})]
    plot_memory(RunReport(ranks=rows, budget_bytes=10, predicted_breakdown={"params": 6}), run.path / "memory.png")
    run.archive_attempt(1)
    assert (run.path / "attempts" / "1" / "memory.png").is_file()
    assert private_tree(run.path) == []
    # An existing dir passed as --run-dir is made private too (its parents are left as they are).
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    RunDir.create(shared / "run").unlock()
    assert mode(shared / "run") == DIR_MODE and mode(shared) == 0o755


def test_copy_redacted_replaces_a_secret_split_across_reads():
    r, w = os.pipe()
    out_r, out_w = os.pipe()
    text = f"token={SECRET}; again {SECRET[:5]}".encode() + SECRET[5:].encode() + b" end hf_Se"
    for i in range(0, len(text), 3):  # three bytes at a time: every secret is split somewhere
        os.write(w, text[i:i + 3])
    os.close(w)
    copy_redacted(r, out_w, [SECRET])
    os.close(out_w)
    got = os.read(out_r, 1 << 16)
    assert got == b"token=[redacted]; again [redacted] end hf_Se"  # a held-back prefix is written at the end


def test_a_rank_log_never_holds_a_secret_even_mid_run(tmp_path, monkeypatch):
    """What a rank prints goes through the redactor before the file; read while the rank still runs."""
    monkeypatch.setenv("HF_TOKEN", SECRET)
    log = tmp_path / "logs" / "rank-0.log"
    code = ("import os, sys, time; from pathlib import Path\n"
            "from launcher.worker.rank_entry import redirect_output\n"
            f"redirect_output(Path({str(tmp_path)!r}), 0)\n"
            "print('token', os.environ['HF_TOKEN'], flush=True)\n"
            "os.write(2, os.environ['HF_TOKEN'].encode() + b' from C-level fd 2\\n')\n"
            "time.sleep(30)\n")
    rank = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and b"from C-level" not in (log.read_bytes() if log.exists() else b""):
            time.sleep(0.05)
        text = log.read_text()
        assert rank.poll() is None, "the rank should still be running"
        assert "token [redacted]" in text and "[redacted] from C-level fd 2" in text, text
        assert SECRET not in text
        assert mode(log) == FILE_MODE and mode(log.parent) == DIR_MODE
    finally:
        rank.kill()
        rank.wait()
    assert wait_settled(log, timeout_s=10)
    assert SECRET not in log.read_text()


def test_without_secrets_the_rank_writes_its_log_itself(tmp_path, monkeypatch):
    from launcher.files.redact import SECRET_NAME

    for name in [k for k in os.environ if SECRET_NAME.search(k)]:
        monkeypatch.delenv(name)
    fd = log_fd(tmp_path / "logs" / "rank-0.log")
    try:
        assert stat.S_ISREG(os.fstat(fd).st_mode)  # the file itself, no pipe and no extra process
    finally:
        os.close(fd)
    assert mode(tmp_path / "logs" / "rank-0.log") == FILE_MODE


@pytest.fixture(autouse=True)
def _restore_umask():
    old = os.umask(0o022)
    os.umask(old)
    yield
    os.umask(old)



def test_the_tokenized_data_cache_is_private_like_every_cache_file(tmp_path, monkeypatch):
    """The tokenized-data cache holds a dataset's tokens: its files were 0644 in 0755 directories while every
    other cache file was 0600. Now its files are 0600 and the directories the launcher makes for the cache 0700;
    a $LAUNCHER_CACHE that exists keeps its mode (it may be shared on purpose)."""
    from launcher.config.job import DataConfig
    from launcher.inputs.cache import write_cache
    from launcher.worker.recipes import make_recipe
    from launcher.worker.tokcache import tokenized
    from launcher.worker.tokenizer import ByteTokenizer

    os.umask(0o022)
    cache = tmp_path / "new" / "cache"
    monkeypatch.setenv("LAUNCHER_CACHE", str(cache))
    rows = [{"text": f"row {i}"} for i in range(8)]
    recipe = make_recipe("causal_lm", DataConfig(path="d.jsonl"))
    recipe.fit_labels(rows)
    tokenized(recipe, ByteTokenizer(300), rows, rows[:6], rows[6:], 16)
    (saved,) = (cache / "tokenized").glob("*.pt")
    assert mode(saved) == FILE_MODE and mode(saved.parent) == DIR_MODE and mode(cache) == DIR_MODE
    write_cache(cache / "introspect" / "x.json", {"a": 1})
    assert mode(cache / "introspect") == DIR_MODE and mode(cache / "introspect" / "x.json") == FILE_MODE
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    write_cache(shared / "data" / "y.json", {})
    assert mode(shared) == 0o755 and mode(shared / "data") == DIR_MODE
