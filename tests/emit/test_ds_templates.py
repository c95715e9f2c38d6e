"""The DeepSpeed templates (launcher/engines/deepspeed/templates/): loadable, "auto" only where HF Trainer fills it,
valid once filled."""

import copy
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from emit_helpers import run_ds_check

from launcher.engines.deepspeed.emit import TEMPLATE_FOR, templates

TEMPLATES_DIR = Path(__file__).resolve().parents[2] / "launcher" / "engines" / "deepspeed" / "templates"

EXPECTED = {"zero0", "zero1", "zero2", "zero2_offload_cpu", "zero3", "zero3_offload_cpu", "zero3_offload_nvme"}


def hf_fill(template: dict, **args_over) -> dict:
    """Fill a template's "auto" values with HF Trainer's own code, as `Trainer(..., deepspeed=file)` would, from
    TrainingArguments-like values (``args_over`` replaces some)."""
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig, unset_hf_deepspeed_config

    args = SimpleNamespace(
        world_size=1, per_device_train_batch_size=2, gradient_accumulation_steps=4, max_grad_norm=1.0,
        learning_rate=3e-4, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, weight_decay=0.0,
        save_on_each_node=False, fp16=False, fp16_full_eval=False, bf16=True, bf16_full_eval=False,
        get_warmup_steps=lambda total: 10,
    )
    vars(args).update(args_over)
    model = SimpleNamespace(config=SimpleNamespace(hidden_size=64))
    hf = HfTrainerDeepSpeedConfig(copy.deepcopy(template))
    try:
        hf.trainer_config_process(args)
        hf.trainer_config_finalize(args, model, num_training_steps=100)
        return hf.config
    finally:
        # HF keeps a module-global weakref that flips is_deepspeed_zero3_enabled() for later tests.
        unset_hf_deepspeed_config()


def test_every_template_file_is_loaded_and_used():
    assert set(templates()) == EXPECTED == {p.stem for p in TEMPLATES_DIR.glob("*.json")}
    assert set(TEMPLATE_FOR.values()) == EXPECTED
    for name in EXPECTED:
        # Real JSON with no duplicate keys: DeepSpeed's own file loader rejects those.
        json.loads((TEMPLATES_DIR / f"{name}.json").read_text(), object_pairs_hook=_no_duplicates)


def _no_duplicates(pairs: list) -> dict:
    keys = [k for k, _ in pairs]
    dupes = {k for k in keys if keys.count(k) > 1}
    if dupes:
        raise ValueError(f"duplicate keys {sorted(dupes)}")
    return dict(pairs)


def test_readme_describes_every_template():
    readme = (TEMPLATES_DIR / "README.md").read_text()
    for name in EXPECTED:
        assert f"`{name}.json`" in readme


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_template_stage_matches_its_name(name):
    stage = templates()[name]["zero_optimization"]["stage"]
    assert name.startswith(f"zero{stage}")
    z = templates()[name]["zero_optimization"]
    if "offload" in name:
        device = name.rsplit("_", 1)[1]
        assert z["offload_optimizer"]["device"] == device
        assert ("aio" in templates()[name]) == (device == "nvme")


@pytest.fixture(scope="module")
def hf_filled_parsed() -> dict:
    filled = {name: hf_fill(t) for name, t in templates().items()}
    return {"filled": filled, "parsed": run_ds_check("parse", filled, world_size=1)}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_hf_trainer_fills_every_auto(hf_filled_parsed, name):
    # "auto" only where HF Trainer fills it, so each template also works as
    # `--deepspeed launcher/engines/deepspeed/templates/<name>.json`.
    assert '"auto"' not in json.dumps(hf_filled_parsed["filled"][name])


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_filled_template_passes_deepspeed_parser(hf_filled_parsed, name):
    r = hf_filled_parsed["parsed"][name]
    assert r["ok"], r["error"]
    assert r["train_batch_size"] == 8 and r["zero_stage"] == templates()[name]["zero_optimization"]["stage"]


def test_templates_ship_in_the_wheel(tmp_path):
    """Package data, not repository files: a built wheel carries every template, and the emitter reads them there."""
    import shutil
    import subprocess
    import sys
    import zipfile

    repo, src = TEMPLATES_DIR.parents[3], tmp_path / "src"  # built from a copy: setuptools writes build/ beside it
    shutil.copytree(repo / "launcher", src / "launcher", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(repo / name, src / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path)], check=True, capture_output=True, timeout=300)
    (wheel,) = tmp_path.glob("launcher-*.whl")
    zipfile.ZipFile(wheel).extractall(tmp_path / "site")
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import launcher.engines.deepspeed.emit as d; "
            "print(d.__file__.startswith(sys.argv[1]), sorted(d.templates()))")
    out = subprocess.run([sys.executable, "-I", "-c", code, str(tmp_path / "site")], capture_output=True, text=True,
                         check=True, cwd=tmp_path).stdout
    assert out.strip() == f"True {sorted(EXPECTED)}"
