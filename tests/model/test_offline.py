"""launcher.model.offline is the one place a running process is switched offline (issue 18 §6)."""

import ast
import os
import shutil
from pathlib import Path

from huggingface_hub import constants

from launcher.model.offline import OFFLINE_VARS, hub_offline

PACKAGE = Path(__file__).resolve().parents[2] / "launcher"


def test_unset_means_offline_for_this_process_and_its_children(monkeypatch):
    for var in OFFLINE_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # as if the hub was imported before: read once
    hub_offline()
    assert [os.environ[v] for v in OFFLINE_VARS] == ["1", "1", "1"]
    assert constants.HF_HUB_OFFLINE is True


def test_an_explicit_zero_is_left_alone(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    hub_offline()
    assert constants.HF_HUB_OFFLINE is False and os.environ["HF_HUB_OFFLINE"] == "0"


def offline_patches(root: Path = PACKAGE) -> list[str]:
    """Where a module sets an offline switch in a running process: ``x.HF_HUB_OFFLINE = ...`` or
    ``os.environ.setdefault("HF_..._OFFLINE", ...)`` / ``os.environ["HF_..._OFFLINE"] = ...``, as path:line. (Dicts
    of variables for another process, such as the rank environment, are not patches.)"""
    names = {*OFFLINE_VARS, "TRANSFORMERS_OFFLINE"}
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            hit = False
            if isinstance(node, ast.Assign):
                for t in node.targets:
                    hit |= isinstance(t, ast.Attribute) and t.attr in names
                    hit |= (isinstance(t, ast.Subscript) and isinstance(t.slice, ast.Constant)
                            and t.slice.value in names)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                hit = (node.func.attr in ("setdefault", "update", "__setitem__", "putenv") and bool(node.args)
                       and isinstance(node.args[0], ast.Constant) and node.args[0].value in names)
            if hit:
                found.append(f"{path.relative_to(root.parent).as_posix()}:{node.lineno}")
    return found


def test_no_other_module_patches_the_offline_switches():
    assert {f.split(":")[0] for f in offline_patches()} == {"launcher/model/offline.py"}


def test_a_patch_elsewhere_is_caught(tmp_path):
    root = tmp_path / "launcher"
    shutil.copytree(PACKAGE, root, ignore=shutil.ignore_patterns("__pycache__"))
    target = root / "worker" / "sources.py"
    target.write_text(target.read_text() + '\n\nos.environ.setdefault("HF_DATASETS_OFFLINE", "1")\n')
    assert f"launcher/worker/sources.py:{len(target.read_text().splitlines())}" in offline_patches(root)
