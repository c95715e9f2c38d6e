"""launcher.inputs.cache is the one reader of LAUNCHER_CACHE and LAUNCHER_PROFILE_FILE (issue 18 §6)."""

import ast
import json
import shutil
from pathlib import Path

from launcher.config.jobfile import job_from_data
from launcher.inputs.cache import CACHE_ENV, PROFILE_FILE_ENV, cache_dir
from launcher.inputs.machine import hardware_profile

PACKAGE = Path(__file__).resolve().parents[2] / "launcher"
DATA = str(PACKAGE.parent / "examples" / "data" / "causal.jsonl")


def modules_naming(names: set[str], root: Path = PACKAGE) -> list[str]:
    """Modules holding one of ``names`` as a string of its own (an environment lookup's key), as path:line."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and node.value in names:
                found.append(f"{path.relative_to(root.parent).as_posix()}:{node.lineno}")
    return found


def test_only_launcher_cache_reads_its_variables():
    assert {f.split(":")[0] for f in modules_naming({CACHE_ENV, PROFILE_FILE_ENV})} == {"launcher/inputs/cache.py"}


def test_a_read_elsewhere_is_caught(tmp_path):
    root = tmp_path / "launcher"
    shutil.copytree(PACKAGE, root, ignore=shutil.ignore_patterns("__pycache__"))
    target = root / "inputs" / "plan_inputs.py"
    target.write_text(target.read_text() + '\n\nCACHE = os.environ.get("LAUNCHER_CACHE")\n')
    assert f"launcher/inputs/plan_inputs.py:{len(target.read_text().splitlines())}" in modules_naming({CACHE_ENV}, root)


def test_the_profile_file_named_replaces_the_cache_own(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv(PROFILE_FILE_ENV, raising=False)
    assert cache_dir() == tmp_path / "cache"
    own = cache_dir() / "profiles" / "cpu.json"
    own.parent.mkdir(parents=True)
    own.write_text(json.dumps({"hardware": {"flops_bf16": 1.0e11}}))
    named = tmp_path / "pinned.json"
    named.write_text(json.dumps({"hardware": {"flops_bf16": 2.0e11}}))
    job = job_from_data({"name": "t", "model": {"family": "gpt2", "hidden_size": 64, "num_layers": 2, "num_heads": 4},
                         "task": "causal_lm", "data": {"path": DATA}, "train": {"global_batch_size": 8, "max_steps": 1},
                         "cluster": {"hardware": "cpu"}, "gpus": 2, "budget": "4GB"}, ".")
    assert hardware_profile(job).flops_bf16 == 1.0e11
    monkeypatch.setenv(PROFILE_FILE_ENV, str(named))
    assert hardware_profile(job).flops_bf16 == 2.0e11
