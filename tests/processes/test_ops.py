"""DeepSpeed's compiled ops: which a plan loads, what is built, and a run that cannot build one ends in a verdict."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from launcher.backends.base import LaunchSpec
from launcher.backends.local import LocalBackend
from launcher.files.rundir import RunDir
from launcher.processes import ops
from tests.emit.emit_helpers import make_plan


@pytest.mark.parametrize("strategy,expected", [
    ({"zero_stage": 2}, ()),
    ({"zero_stage": 2, "offload_optimizer": "cpu"}, ("cpu_adam",)),
    ({"zero_stage": 3, "offload_optimizer": "nvme", "offload_params": "nvme"}, ("cpu_adam", "async_io")),
    ({"zero_stage": 3, "offload_params": "nvme"}, ("async_io",)),
    ({"engine": "fsdp", "offload_optimizer": "cpu", "offload_params": "cpu"}, ()),  # torch's own CPU AdamW
])
def test_a_plan_loads_only_the_ops_its_engine_names(strategy, expected):
    assert ops.plan_ops(make_plan(**strategy)) == expected


def test_a_script_on_cpu_ranks_under_deepspeed_loads_shm_comm():
    """accelerate's and HF Trainer's DeepSpeed start loads it on CPU ranks; the launcher's own ranks skip it."""
    plan = dataclasses.replace(make_plan(zero_stage=2), hardware="cpu")
    assert ops.plan_ops(plan) == ()
    script = dataclasses.replace(plan, script=True, estimate=dataclasses.replace(plan.estimate,
                                                                                  basis="cpu_tensor_bytes"))
    assert ops.plan_ops(script) == ("deepspeed_shm_comm",)


def test_built_is_the_library_in_the_cache(tmp_path):
    (tmp_path / "cpu_adam").mkdir()
    assert ops.missing(["cpu_adam", "async_io"], tmp_path) == ["cpu_adam", "async_io"]
    (tmp_path / "cpu_adam" / "cpu_adam.so").write_bytes(b"")
    assert ops.missing(["cpu_adam", "async_io"], tmp_path) == ["async_io"]
    assert ops.build_seconds(["cpu_adam", "async_io"]) == ops.OPS["cpu_adam"].build_s + ops.OPS["async_io"].build_s


def _run_dir(tmp_path, **strategy) -> RunDir:
    run = RunDir.create(tmp_path / "run")
    (run.path / "plan.json").write_text(json.dumps(make_plan(world_size=2, **strategy).to_json()))
    return run


def test_a_plan_without_ops_starts_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("no op to build: no process"))
    assert ops.ensure_built(_run_dir(tmp_path).path / "plan.json") is None


def test_an_op_that_does_not_build_is_a_failed_run_before_any_rank(tmp_path, monkeypatch):
    """The build fails (here: a command that exits 1): no rank starts, and the outcome says which op and the fix."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    monkeypatch.setattr(ops, "command", lambda names: [sys.executable, "-c", "raise SystemExit(1)"])
    run = _run_dir(tmp_path, zero_stage=2, offload_optimizer="cpu")
    monkeypatch.setattr(LocalBackend, "_run", lambda *a: pytest.fail("a rank started without its op"))
    outcome = LocalBackend().run(run, LaunchSpec(gpus_per_node=2, nodes=1))
    assert not outcome.ok and not outcome.interrupted
    assert outcome.message.startswith("DeepSpeed's cpu_adam op(s), which this plan loads (ZeRO-Offload's CPU Adam")
    assert "install a C++ compiler (g++)" in outcome.message


def test_the_command_refuses_an_unknown_op(capsys):
    with pytest.raises(SystemExit) as e:
        ops.main(["cpu_adamm"])
    assert e.value.code == 2 and "'cpu_adamm': not an op the launcher builds" in capsys.readouterr().err
