"""`launch export` refuses bad input with exit 2 and one line, and writes nothing (no ranks needed)."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import subprocess

import pytest

from launcher.cli.main import main
from tests.conftest import REPO
from tests.worker.run_dirs import ds_config_dict, plan_dict, tiny_gpt2_job, write_run_dir


@pytest.fixture
def run(tmp_path):
    plan = plan_dict(engine="deepspeed", zero_stage=2, micro_batch_size=2, grad_accum_steps=1, world_size=2)
    d = write_run_dir(tmp_path / "run", job=tiny_gpt2_job(str(REPO / "examples" / "data" / "causal.jsonl"),
                                                          max_steps=4),
                      plan=plan, ds_config=ds_config_dict(plan))
    return d


def complete_tag(run, step: int) -> None:
    tag = run / "checkpoint" / f"step-{step:08d}"
    tag.mkdir(parents=True)
    (tag / "trainer_state.json").write_text(json.dumps({"global_step": step, "engine": "deepspeed"}))
    (run / "checkpoint" / "latest").write_text(tag.name + "\n")


def refused(capsys, *argv) -> str:
    code = main(["export", *map(str, argv)])
    out, err = capsys.readouterr()
    assert code == 2, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("launch: error: "), err
    assert "Traceback" not in err and not out
    return lines[0]


def files(root):
    return sorted(p.relative_to(root) for p in root.rglob("*"))


def test_no_checkpoint(run, capsys):
    before = files(run)
    assert "no complete checkpoint" in refused(capsys, run)
    assert files(run) == before


def test_step_not_found_names_the_steps_there_are(run, capsys):
    complete_tag(run, 2)
    (run / "checkpoint" / "step-00000003").mkdir()  # a save cut short: no trainer_state.json, not complete
    line = refused(capsys, run, "--step", "3")
    assert "--step 3" in line and "steps available: 2" in line
    assert "steps count from 1" in refused(capsys, run, "--step", "0")


def test_out_must_be_new_empty_or_an_export(run, tmp_path, capsys):
    complete_tag(run, 2)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    line = refused(capsys, run, "--out", mine)
    assert "not made by launch export" in line
    assert (mine / "notes.txt").read_text() == "keep me"
    assert files(mine) == [mine.joinpath("notes.txt").relative_to(mine)]
    assert "is a file" in refused(capsys, run, "--out", mine / "notes.txt")


def test_merge_needs_lora_and_a_run_dir_needs_its_files(run, tmp_path, capsys):
    complete_tag(run, 2)
    assert "drop --merge" in refused(capsys, run, "--merge")
    assert "no such run dir" in refused(capsys, tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    assert "job.yaml" in refused(capsys, tmp_path / "empty")


# -- issue 35: launch export writes, renames or deletes only what it made -------------------------------------------

def test_out_holding_someones_export_json_is_refused(run, tmp_path, capsys):
    """export.json is a common name: a dir holding one (a file, a link to one, or reached through a link) is not
    an export the launcher made, and is refused whole; only its own marker (.launcher-export) counts."""
    complete_tag(run, 2)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "export.json").write_text('{"my": "records"}')
    (mine / "weights.bin").write_bytes(b"1")
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "export.json").symlink_to(mine / "export.json")
    (linked / ".launcher-export").symlink_to(mine / "export.json")  # a link named as the marker: not the marker
    (tmp_path / "via-link").symlink_to(mine)
    before = files(tmp_path)
    for out in (mine, linked, tmp_path / "via-link"):
        line = refused(capsys, run, "--out", out)
        assert "not made by launch export (no .launcher-export in it; it holds " in line, line
        assert "give a new or empty directory" in line
    assert files(tmp_path) == before and (mine / "export.json").read_text() == '{"my": "records"}'


def test_export_never_replaces_the_working_dir_or_home_even_marked(run, tmp_path, capsys, monkeypatch):
    """launch export replaces its --out whole: never the working dir, a dir above it or $HOME, whatever marker a
    careless tool left there."""
    complete_tag(run, 2)
    home = tmp_path / "home"
    (home / "work").mkdir(parents=True)
    (home / ".launcher-export").write_text("{}")
    (home / ".bashrc").write_text("alias ll='ls -l'")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(home / "work")
    before = files(home)
    assert "is the current directory or holds it" in refused(capsys, run, "--out", home)  # cwd is below it
    monkeypatch.chdir(tmp_path)
    line = refused(capsys, run, "--out", home)
    assert f"--out: {str(home)!r} is {home}; launch export never clears it; choose another --out" in line
    assert files(home) == before


@pytest.fixture
def exportable(tmp_path):
    """A run dir launch made with a real ZeRO-0 checkpoint of tiny GPT-2 at step 2 (what `launch export` reads)."""
    import torch

    from launcher.files.rundir import mark
    from launcher.worker.main import load_run_dir
    from launcher.worker.model import build
    from launcher.worker.recipes import make_recipe

    plan = plan_dict(engine="deepspeed", zero_stage=0, world_size=1)
    d = write_run_dir(tmp_path / "run", job=tiny_gpt2_job(str(REPO / "examples" / "data" / "causal.jsonl")),
                      plan=plan, ds_config=ds_config_dict(plan))
    mark(d)
    job = load_run_dir(d)[0]
    model = build(job, make_recipe(job.task, job.data), seq_len=1, hf_checkpointing=False)
    complete_tag(d, 2)
    torch.save({"module": model.state_dict()}, d / "checkpoint" / "step-00000002" / "mp_rank_00_model_states.pt")
    return d


def exported(capsys, *argv) -> str:
    code = main(["export", *map(str, argv)])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def test_export_replaces_only_the_dir_it_made(exportable, tmp_path, capsys):
    """The export dir carries its marker; a sibling X.partial/ of someone's is never touched (it was deleted
    before the export was staged under its own exclusive temporary name), and no temporary is left."""
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "tiny.partial").mkdir()
    (hf / "tiny.partial" / "notes.txt").write_text("mine")
    out = hf / "tiny"
    exported(capsys, exportable, "--out", out)
    marker = out / ".launcher-export"
    assert marker.is_file() and not marker.is_symlink()
    assert json.loads(marker.read_text())["made_by"] == "launch export"
    first = json.loads((out / "export.json").read_text())
    assert first["step"] == 2 and (out / "model.safetensors").is_file()
    exported(capsys, exportable, "--out", out)  # its own dir: replaced
    assert json.loads((out / "export.json").read_text())["exported_at"] > first["exported_at"]
    assert sorted(p.name for p in hf.iterdir()) == ["tiny", "tiny.partial"]  # no temporary left beside it
    assert (hf / "tiny.partial" / "notes.txt").read_text() == "mine"
    exported(capsys, exportable)  # the default: RUN/model, marked too
    assert (exportable / "model" / ".launcher-export").is_file()


@contextlib.contextmanager
def full_disk(where):
    """A 256 KiB tmpfs at ``where`` (tiny GPT-2's weights are 0.7 MB); skipped where mounting is not allowed (the
    injected variant of the test runs everywhere)."""
    where.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(where)],
                      capture_output=True).returncode != 0:
        pytest.skip("mounting a tmpfs needs root (CAP_SYS_ADMIN); the injected ENOSPC case covers the rest")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=True)


@pytest.mark.parametrize("how", [pytest.param("tmpfs", marks=pytest.mark.slow), "injected"])  # tmpfs: mount(8)
def test_a_full_disk_leaves_the_old_export_and_nothing_beside_it(exportable, tmp_path, capsys, monkeypatch, how):
    """No space left while the export is written (a real full tmpfs: safetensors' own error; or ENOSPC injected at
    the last write, export.json): exit 1, one line, the earlier export as it was, no staged dir left, and no
    parent dir the export made for a new --out."""
    with contextlib.ExitStack() as stack:
        disk = stack.enter_context(full_disk(tmp_path / "disk")) if how == "tmpfs" else tmp_path / "disk"
        if how == "injected":
            from launcher.worker import export

            real = export.atomic_write

            def no_space(path, data, **kw):
                if path.name == "export.json":  # the last file written
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
                return real(path, data, **kw)

            monkeypatch.setattr(export, "atomic_write", no_space)
        old = disk / "old"
        old.mkdir(parents=True)
        (old / ".launcher-export").write_text("{}")
        (old / "model.safetensors").write_bytes(b"the earlier export")
        before = files(disk)
        why = ("No space left on device" if how == "injected" else
               "Error while serializing: I/O error: No space left on device (os error 28)")
        for out in (old, disk / "new" / "deeper"):
            code = main(["export", str(exportable), "--out", str(out)])
            printed, err = capsys.readouterr()
            lines = [ln for ln in err.splitlines() if ln.startswith("launch")]
            assert code == 1 and lines == [
                f"launch: error: export: writing {str(out)!r} failed ({why}); it is as it was and nothing was left "
                "beside it; free space there (or give another --out) and run launch export again"], err
            assert "Traceback" not in err and "exported" not in printed
            assert files(disk) == before
        assert (old / "model.safetensors").read_bytes() == b"the earlier export"
