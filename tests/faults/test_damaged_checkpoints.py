"""`launch export` on damaged checkpoints: a real one-rank checkpoint of each engine (FSDP2's DCP dir, DeepSpeed
ZeRO-2's partitions), then cut short or overwritten the way a copy or a disk fails. Each is refused with exit 2 and
one line naming the step, what is wrong and what can be exported, nothing written; the undamaged one exports."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.faults.harness import entries
from tests.worker.export_checks import export_in_process as export


def cut(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def shard(run: Path, pattern: str) -> Path:
    return next((run / "checkpoint" / "step-00000002").rglob(pattern))


DAMAGE = {
    # engine, damage, words the line must hold
    "dcp-shard-cut-short": ("fsdp", lambda r: cut(shard(r, "*.distcp")), ["fewer than the", "(cut short)"]),
    "dcp-shard-missing": ("fsdp", lambda r: shard(r, "*.distcp").unlink(), [".distcp is missing"]),
    "dcp-metadata-garbage": ("fsdp", lambda r: shard(r, ".metadata").write_bytes(b"\x00garbage" * 64),
                             [".metadata cannot be read"]),
    "dcp-metadata-empty": ("fsdp", lambda r: shard(r, ".metadata").write_bytes(b""), [".metadata cannot be read"]),
    "deepspeed-optim-cut-short": ("deepspeed", lambda r: cut(shard(r, "*optim_states.pt")),
                                  ["optim_states.pt is damaged"]),
    "deepspeed-model-states-garbage": ("deepspeed", lambda r: shard(r, "*model_states.pt").write_bytes(b"garbage!"),
                                       ["model_states.pt is no torch.save file"]),
    "deepspeed-optim-missing": ("deepspeed", lambda r: shard(r, "*optim_states.pt").unlink(),
                                ["0 optimizer partition(s)", "for the 1 rank(s) that saved it"]),
    "trainer-state-garbage": ("fsdp", lambda r: shard(r, "trainer_state.json").write_text("{not json"),
                              ["trainer_state.json cannot be read"]),
}


@pytest.mark.parametrize("case", list(DAMAGE))
def test_a_damaged_checkpoint_is_one_line_naming_the_step(case, trained_runs, tmp_path):
    engine, damage, words = DAMAGE[case]
    run = Path(shutil.copytree(trained_runs[engine], tmp_path / "run"))
    damage(run)
    before = entries(tmp_path)
    code, out, err = export(run)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2, err
    assert "Traceback" not in err and not out
    assert len(lines) == 1 and lines[0].startswith("launch: error: checkpoint step-00000002 in "), err
    assert "cannot be read" in lines[0] and "no other checkpoint here is readable" in lines[0], err
    for w in words:
        assert w in lines[0], lines[0]
    assert entries(tmp_path) == before  # nothing written: no model/, no partial export


def test_an_earlier_readable_step_is_offered(trained_runs, tmp_path):
    """With a readable earlier tag beside the damaged latest one, the line names it as the fix, and it exports."""
    run = Path(shutil.copytree(trained_runs["fsdp"], tmp_path / "run"))
    ckpt = run / "checkpoint"
    shutil.copytree(ckpt / "step-00000002", ckpt / "step-00000001")
    state = (ckpt / "step-00000001" / "trainer_state.json")
    state.write_text(state.read_text().replace('"global_step": 2', '"global_step": 1'))
    cut(shard(run, "*.distcp"))
    code, _, err = export(run)
    assert code == 2 and "export a readable step instead (--step 1; readable: 1)" in err, err
    code, out, err = export(run, "--step", "1")
    assert code == 0, err
    assert "exported the model of step 1" in out


@pytest.mark.parametrize("engine", ["fsdp", "deepspeed"])
def test_the_undamaged_checkpoint_exports(engine, trained_runs, tmp_path):
    run = Path(shutil.copytree(trained_runs[engine], tmp_path / "run"))
    code, out, err = export(run)
    assert code == 0, err
    assert (run / "model" / "config.json").is_file()
