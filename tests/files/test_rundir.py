"""The run dir's marker, what --overwrite may delete, and the lock's wait (launcher/files/rundir.py)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from launcher.errors import ConfigError
from launcher.files.rundir import MARKER, RunDir, refuse_protected
from tests.conftest import REPO

TMP_SUFFIX = ".launcher-tmp"
"""What ends every temporary of the launcher's (launcher.files.fsutil.TMP_SUFFIX), spelled out: the contract."""


def test_a_new_run_dir_carries_the_marker(tmp_path):
    run = RunDir.create(tmp_path / "run")
    assert (run.path / MARKER).is_file()
    run.unlock()


def test_overwrite_deletes_only_what_the_launcher_wrote(tmp_path, capsys):
    """A run dir launch made, into which someone put notes and data: --overwrite replaces the run and keeps those,
    including names that only look like the launcher's (``.<entry>.<anything>``), and names every one it kept."""
    run = RunDir.create(tmp_path / "run")
    for name in ("plan.json", "job.yaml", "report.json", "state.json", "fsdp.yaml", "slurm-17.out",
                 ".plan.json.x1y2z3w4.launcher-tmp", f".write-test.123{TMP_SUFFIX}"):  # atomic_write's, the probe's
        (run.path / name).write_text("{}")
    (run.logs / "rank-0.log").write_text("old log")
    (run.path / "checkpoint").mkdir()
    (run.path / "checkpoint" / "latest").write_text("1")
    for export in ("model", f".model.0a1b2c3d{TMP_SUFFIX}"):  # the run's export and one cut short (its stage)
        (run.path / export).mkdir()
        (run.path / export / "model.safetensors").write_bytes(b"old")
    mine = ["notes.txt", ".report.json.notes", ".plan.json.x1y2.tmp", "model.partial", "slurm-17.out.bak",
            ".launcher-tmp"]
    for name in mine:
        (run.path / name).write_text("mine")
    for name in ("analysis", ".model.v1"):
        (run.path / name).mkdir()
        (run.path / name / "fig.png").write_bytes(b"png")
    run.unlock()

    again = RunDir.create(tmp_path / "run", overwrite=True)
    names = {p.name for p in again.path.iterdir()}
    assert names == {".lock", MARKER, "analysis", ".model.v1", "ranks", "steps", "logs", "control", *mine}
    assert all((again.path / n).read_text() == "mine" for n in mine)
    assert (again.path / ".model.v1" / "fig.png").read_bytes() == b"png"
    assert not list(again.logs.iterdir())
    again.unlock()
    kept = sorted(["analysis", ".model.v1", *mine])
    assert f"--overwrite kept what launch did not write in {str(again.path)!r}: {', '.join(kept)}\n" \
        in capsys.readouterr().err  # every one of them, not the first four


def test_a_marker_that_is_a_link_does_not_count(tmp_path):
    """A link named .launcher-run (to a real marker elsewhere) lends no dir the launcher's mark."""
    real = RunDir.create(tmp_path / "real")
    real.unlock()
    d = tmp_path / "mine"
    d.mkdir()
    (d / "notes.txt").write_text("notes")
    (d / MARKER).symlink_to(real.path / MARKER)
    for overwrite, resume in ((True, False), (False, True)):
        with pytest.raises(ConfigError, match="was not made by launch"):
            RunDir.create(d, overwrite=overwrite, resume=resume)
    assert sorted(p.name for p in d.iterdir()) == [MARKER, "notes.txt"]


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


def listing(d: Path) -> list:
    """Every path under ``d`` (itself included) with its mode and a file's bytes."""
    return sorted((str(p.relative_to(d)), p.stat().st_mode, p.read_bytes() if p.is_file() else b"")
                  for p in [d, *d.rglob("*")])


def deepspeed_save_dir(d: Path) -> list:
    """What DeepSpeed's own ``engine.save_checkpoint("checkpoint")`` leaves in someone's training dir, beside their
    job.yaml and logs; its listing."""
    (d / "checkpoint" / "global_step5").mkdir(parents=True)
    (d / "checkpoint" / "latest").write_text("global_step5")
    (d / "checkpoint" / "global_step5" / "mp_rank_00_model_states.pt").write_bytes(b"weights")
    (d / "logs").mkdir()
    (d / "logs" / "train.log").write_text("three days of training")
    (d / "job.yaml").write_text("my: own job\n")
    return listing(d)


def test_resume_refuses_a_dir_launch_did_not_make(tmp_path):
    """--resume takes only a marked dir: a DeepSpeed save_checkpoint's checkpoint/latest does not make one (it
    once rewrote the person's job.yaml, chmod'ed the dir and marked it, so --overwrite later deleted their work)."""
    from launcher.session.checks import check_resume
    from launcher.session.options import RunOptions

    d = tmp_path / "training"
    before = deepspeed_save_dir(d)
    message = (f"--resume: {str(d)!r} was not made by launch (no {MARKER} in it; DeepSpeed's own save_checkpoint "
               "leaves a checkpoint/latest too), and --resume continues only a run dir launch made")
    with pytest.raises(ConfigError) as e:
        RunDir.create(d, resume=True)
    assert message in str(e.value) and f"touch {str(d / MARKER)!r}" in str(e.value)
    with pytest.raises(ConfigError, match="was not made by launch"):
        check_resume(RunOptions(resume=True, run_dir=d))  # before planning, as the CLI runs it
    assert listing(d) == before  # not even a .lock or a chmod
    # An older launch's run dir, marked by hand as the message says: resumed.
    (d / MARKER).touch()
    RunDir.create(d, resume=True).unlock()
    assert (d / "checkpoint" / "latest").read_text() == "global_step5"


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
    from launcher.files.rundir import latest_checkpoint_tag

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


def test_a_secret_looking_name_holding_a_path_is_no_secret(tmp_path):
    """MY_API_KEY set to a directory, GOOGLE_APPLICATION_CREDENTIALS to a key file: where things are, not secrets
    (redacting them rewrote job.yaml's data path to '[redacted]/...' and every run failed). TOKENIZER_PATH names a
    setting. HF_TOKEN's value, which names nothing, stays a secret."""
    from launcher.files.redact import secret_values

    (tmp_path / "data").mkdir()
    (tmp_path / "key.json").write_text("{}")
    env = {"MY_API_KEY": str(tmp_path / "data"), "GOOGLE_APPLICATION_CREDENTIALS": str(tmp_path / "key.json"),
           "TOKENIZER_PATH": "gpt2-tokenizer-v2", "TOKENIZERS_PARALLELISM": "disabled-here",
           "HF_TOKEN": "hf_FAKE_SECRET_123", "GITHUB_TOKEN_RO": "ghp_FAKE_SECRET_4567"}
    assert secret_values(env) == ["ghp_FAKE_SECRET_4567", "hf_FAKE_SECRET_123"]


def test_a_path_the_run_reads_is_never_rewritten(tmp_path, monkeypatch):
    """A secret that happens to be part of an existing path: job.yaml keeps the path whole (the ranks read it),
    while the secret is still redacted wherever it is not a path."""
    import yaml

    secret = "s3cr3t-dir-name-77"
    data = tmp_path / secret / "data.jsonl"
    data.parent.mkdir()
    data.write_text("{}\n")
    monkeypatch.setenv("SERVICE_API_KEY", secret)
    run = RunDir.create(tmp_path / "run")
    run.write_yaml("job.yaml", {"data": {"path": str(data)}, "slurm": {"setup": [f"export KEY={secret}"]}})
    written = yaml.safe_load((run.path / "job.yaml").read_text())
    assert written == {"data": {"path": str(data)}, "slurm": {"setup": ["export KEY=[redacted]"]}}
    run.unlock()


def test_a_stored_plan_is_read_through_its_type_and_a_partial_one_is_refused(tmp_path):
    import json

    import pytest

    from launcher.planner.plan import read_plan

    (tmp_path / "plan.json").write_text(json.dumps({"world_size": 2}))
    with pytest.raises(ValueError, match="no plan this launcher wrote"):
        read_plan(tmp_path)
    with pytest.raises(OSError):
        read_plan(tmp_path / "missing")
