"""`launch export` refuses bad input with exit 2 and one line, and writes nothing (no ranks needed)."""

from __future__ import annotations

import json

import pytest

from launcher.cli.main import main
from tests.conftest import REPO
from tests.worker.run_dirs import ds_config_dict, plan_dict, tiny_gpt2_job, write_run_dir


@pytest.fixture
def run(tmp_path):
    plan = plan_dict(engine="deepspeed", zero_stage=2, micro_batch_size=2, grad_accum_steps=1, world_size=2)
    d = write_run_dir(tmp_path / "run", job=tiny_gpt2_job(str(REPO / "examples" / "data" / "causal.jsonl"), max_steps=4),
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
    assert (mine / "notes.txt").read_text() == "keep me" and files(mine) == [mine.joinpath("notes.txt").relative_to(mine)]
    assert "is a file" in refused(capsys, run, "--out", mine / "notes.txt")


def test_merge_needs_lora_and_a_run_dir_needs_its_files(run, tmp_path, capsys):
    complete_tag(run, 2)
    assert "drop --merge" in refused(capsys, run, "--merge")
    assert "no such run dir" in refused(capsys, tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    assert "job.yaml" in refused(capsys, tmp_path / "empty")
