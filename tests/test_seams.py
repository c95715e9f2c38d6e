"""The process-wide state the launcher touches, each at its named seam (docs/architecture.md, "the seams"): each
test here fails when the library a seam patches no longer has what the seam relies on, or when the seam stops
putting back what it changed."""

from __future__ import annotations

import ast
import importlib.util
import inspect
import os
from pathlib import Path

import pytest

from launcher.processes.environ import patched_environ


def source_of(module: str, qualname: str) -> str:
    """The source of ``module``'s ``Class.method`` or function, read from its file without importing it (DeepSpeed's
    import starts processes; the fast tier starts none)."""
    top, _, rest = module.partition(".")
    spec = importlib.util.find_spec(top)  # a top-level package is found without running its __init__
    root = Path(spec.origin).parent
    path = root.joinpath(*rest.split(".")).with_suffix(".py") if rest else Path(spec.origin)
    text = path.read_text()
    nodes: list[ast.AST] = ast.parse(text).body
    for part in qualname.split("."):
        node = next(n for n in nodes if isinstance(n, (ast.ClassDef, ast.FunctionDef)) and n.name == part)
        nodes = node.body
    return ast.get_source_segment(text, node)


def test_the_environment_patch_puts_back_what_it_set_and_what_a_library_set_inside(monkeypatch):
    monkeypatch.setenv("LAUNCHER_SEAM_OLD", "before")
    monkeypatch.delenv("LAUNCHER_SEAM_NEW", raising=False)
    monkeypatch.delenv("LAUNCHER_SEAM_LIB", raising=False)
    with pytest.raises(RuntimeError), patched_environ({"LAUNCHER_SEAM_OLD": "x", "LAUNCHER_SEAM_NEW": "y"},
                                                      also=["LAUNCHER_SEAM_LIB"]):
        assert os.environ["LAUNCHER_SEAM_OLD"] == "x" and os.environ["LAUNCHER_SEAM_NEW"] == "y"
        os.environ["LAUNCHER_SEAM_LIB"] = "torchrun's"  # as torchrun exports its signal list
        raise RuntimeError("the ranks failed")
    assert os.environ["LAUNCHER_SEAM_OLD"] == "before"
    assert "LAUNCHER_SEAM_NEW" not in os.environ and "LAUNCHER_SEAM_LIB" not in os.environ


def test_the_local_backend_patches_the_environment_only_through_the_helper():
    from launcher.backends import local

    src = inspect.getsource(local)
    assert "patched_environ(" in src and "os.environ.update" not in src and "os.environ[" not in src


def test_py_cpuinfo_is_still_asked_where_ask_cpu_info_once_reaches_it():
    """worker.engines.deepspeed.ask_cpu_info_once replaces cpuinfo.get_cpu_info by a cached one for the rank's life;
    that reaches DeepSpeed only while its call sites import the function at call time."""
    assert source_of("cpuinfo.cpuinfo", "get_cpu_info")
    for module, fn in (("deepspeed.ops.op_builder.builder", "OpBuilder.cpu_arch"),
                       ("deepspeed.ops.op_builder.builder", "OpBuilder.simd_width"),
                       ("deepspeed.ops.adam.cpu_adam", "DeepSpeedCPUAdam.__init__")):
        assert "from cpuinfo import get_cpu_info" in source_of(module, fn), fn


def test_zero3s_parameter_coordinator_still_has_the_methods_hide_zero3_fetches_wraps():
    zero = "deepspeed.runtime.zero"
    assert "self.parameter_offload =" in source_of(f"{zero}.stage3", "DeepSpeedZeroOptimizer_Stage3.__init__")
    assert source_of(f"{zero}.parameter_offload", "DeepSpeedZeRoOffload.get_param_coordinator")
    for name in ("fetch_sub_module", "release_sub_module"):
        assert source_of(f"{zero}.partitioned_param_coordinator", f"PartitionedParameterCoordinator.{name}")


def test_transformers_still_decides_zero3_from_the_global_zero3_off_clears():
    """worker.export.zero3_off nulls transformers' weak reference to the run's HfDeepSpeedConfig while rank 0
    builds the host copy alone; transformers must still read ZeRO-3 from it."""
    from transformers.integrations import deepspeed as hf_ds

    from launcher.worker.export import zero3_off

    assert hasattr(hf_ds, "_hf_deepspeed_config_weak_ref")
    assert "_hf_deepspeed_config_weak_ref" in inspect.getsource(hf_ds.is_deepspeed_zero3_enabled)
    sentinel = object()
    saved = hf_ds._hf_deepspeed_config_weak_ref
    hf_ds._hf_deepspeed_config_weak_ref = sentinel
    try:
        with zero3_off():
            assert hf_ds._hf_deepspeed_config_weak_ref is None and not hf_ds.is_deepspeed_zero3_enabled()
        assert hf_ds._hf_deepspeed_config_weak_ref is sentinel  # put back on leaving
    finally:
        hf_ds._hf_deepspeed_config_weak_ref = saved


def test_the_outer_probe_is_held_and_released_only_by_its_seam(tmp_path):
    from launcher.runtime import probe as probe_mod

    runner = probe_mod.memory_probe(device="cpu", run_dir=tmp_path)
    probe_mod.hold_outer(runner)
    assert probe_mod.outer_probe() is runner
    assert probe_mod.release_outer(runner) is False and probe_mod.outer_probe() is None
    probe_mod.hold_outer(runner)
    own = probe_mod.memory_probe(device="cpu", run_dir=tmp_path)
    own.start()  # a probe the script starts itself takes over from the runner's
    own.stop()
    assert probe_mod.outer_probe() is own and probe_mod.release_outer(runner) is True
    assert not hasattr(probe_mod, "OUTER")  # no public global another module could write
