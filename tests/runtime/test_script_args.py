"""The --script seam (launcher.runtime.script_args, script_accelerate): the plan's values replace a script's where
TrainingArguments, the Trainer's callbacks and accelerate are built, each replacement recorded; everything is undone
when the script ends. These fail when transformers or accelerate change what the seam patches."""

import dataclasses
import inspect
import json
import sys

import pytest

from launcher.records.rankreport import RankReport, ScriptOverride
from launcher.runtime.script_args import CHECKPOINTING, ScriptPlan, Seam, training_args_values

pytest.importorskip("transformers")


def plan(**kw) -> ScriptPlan:
    return ScriptPlan(**{"micro_batch_size": 2, "grad_accum_steps": 3, "precision": "bf16",
                         "activation_checkpointing": True, "world_size": 1, "cpu_ranks": True, "seq_len": 48, **kw})


@pytest.fixture
def fresh_accelerate():
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


def test_what_the_seam_patches_is_still_there():
    """The fields, hooks and signatures the seam relies on, by name: a transformers or accelerate release that
    renames one fails here, not in a user's run."""
    from accelerate.accelerator import Accelerator
    from accelerate.state import AcceleratorState, PartialState
    from transformers import TrainingArguments, trainer
    from trl import SFTConfig

    names = {f.name for f in dataclasses.fields(TrainingArguments)}
    assert set(training_args_values(TrainingArguments(output_dir="x"), plan())) - names == set()
    assert {"per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps",
            "bf16", "fp16", CHECKPOINTING, "deepspeed",
            "fsdp", "fsdp_config", "use_cpu", "ddp_backend", "auto_find_batch_size",
            "include_num_input_tokens_seen"} <= names
    assert "__post_init__" in TrainingArguments.__dict__ and issubclass(SFTConfig, TrainingArguments)
    assert "max_length" in {f.name for f in dataclasses.fields(SFTConfig)}
    assert isinstance(trainer.DEFAULT_CALLBACKS, list)
    assert "DEFAULT_CALLBACKS +" in inspect.getsource(trainer.Trainer.__init__)
    assert "fsdp_plugin" in inspect.signature(AcceleratorState.__init__).parameters
    assert list(inspect.signature(PartialState.__init__).parameters)[:2] == ["self", "cpu"]
    assert {"mixed_precision", "gradient_accumulation_steps"} <= set(inspect.signature(Accelerator.__init__).parameters)
    assert "prepare_data_loader(obj" in inspect.getsource(Accelerator._prepare_one)


def test_training_args_take_the_plan_and_each_replacement_is_recorded(tmp_path, capsys, fresh_accelerate):
    from transformers import TrainingArguments
    from trl import SFTConfig

    ds = tmp_path / "ds_config.script.json"
    ds.write_text(json.dumps({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 3,
                              "train_batch_size": 6, "gradient_clipping": "auto", "bf16": {"enabled": True},
                              "zero_optimization": {"stage": 2}}))
    original = TrainingArguments.__post_init__
    seam = Seam(plan=plan(ds_config_file=str(ds))).install()
    try:
        args = SFTConfig(output_dir=str(tmp_path / "o"), per_device_train_batch_size=8, learning_rate=5e-5,
                         max_length=1024, report_to=[])
        small_eval = TrainingArguments(output_dir=str(tmp_path / "o2"), per_device_eval_batch_size=1, report_to=[])
    finally:
        seam.remove()
    # The evaluation batch (HF's default 8) is capped at the planned micro-batch; a smaller one stays the script's.
    assert (args.per_device_eval_batch_size, small_eval.per_device_eval_batch_size) == (2, 1)
    assert TrainingArguments.__post_init__ is original
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps) == (2, 3)
    assert (args.bf16, args.mixed_precision, args.activation_checkpointing, args.use_cpu) == (True, "bf16", True, True)
    assert args.max_length == 48 and args.learning_rate == 5e-5  # the script's math stays its own
    # The Trainer's DeepSpeed config is the run's file, its math filled from the script's own arguments.
    assert args.hf_deepspeed_config.config["zero_optimization"]["stage"] == 2
    assert args.hf_deepspeed_config.config["gradient_clipping"] == args.max_grad_norm
    assert args.include_num_input_tokens_seen == "non_padding"
    got = {o.setting: (o.script, o.plan) for o in seam.overrides}
    assert got["SFTConfig.per_device_train_batch_size"] == ("8", "2")
    assert got["SFTConfig.gradient_accumulation_steps"] == ("1", "3")
    assert got["SFTConfig.per_device_eval_batch_size"] == ("8", "2")
    assert "TrainingArguments.per_device_eval_batch_size" not in got
    assert got["SFTConfig.max_length"] == ("1024", "48")
    assert got["SFTConfig.deepspeed"] == ("None", repr(str(ds)))
    assert "SFTConfig.bf16" not in got  # SFTConfig's own default is bf16, as the plan
    assert "SFTConfig.learning_rate" not in got and "SFTConfig.include_num_input_tokens_seen" not in got
    log = capsys.readouterr().err
    assert "[launcher] the plan sets SFTConfig.per_device_train_batch_size: 8 -> 2" in log
    # The rank report keeps them, and reads them back typed.
    r = RankReport(rank=0, script_overrides=list(seam.overrides))
    back = RankReport.from_json(json.loads(json.dumps(r.to_json())))
    assert back.script_overrides == list(seam.overrides) and isinstance(back.script_overrides[0], ScriptOverride)


def test_under_fsdp_accelerates_own_checkpointing_is_the_plans(tmp_path, fresh_accelerate):
    """Under an FSDP2 plan TrainingArguments' checkpointing is off (FSDP_ACTIVATION_CHECKPOINTING carries the
    plan's; the Trainer refuses both at once) and a script's own fsdp settings give way to accelerate's variables."""
    from transformers import TrainingArguments

    seam = Seam(plan=plan(fsdp=True, precision="fp32")).install()
    try:
        args = TrainingArguments(output_dir=str(tmp_path / "o"), gradient_checkpointing=True, bf16=True,
                                 fsdp="full_shard", report_to=[])
    finally:
        seam.remove()
    assert (args.activation_checkpointing, args.bf16, args.fsdp, args.deepspeed) == (False, False, None, None)
    got = {o.setting: (o.script, o.plan) for o in seam.overrides}
    assert got["TrainingArguments.bf16"] == ("True", "False")
    assert got["TrainingArguments.fsdp"] == ("'full_shard'", "None")
    assert "TrainingArguments.activation_checkpointing" not in got  # asked True, the plan's FSDP checkpointing on


def test_a_module_imported_later_is_patched_when_the_script_imports_it(tmp_path, monkeypatch):
    """The seam patches at the script's own import (a one-shot import hook), never before: a module it waits for is
    left alone until imported, and a hook not yet fired is dropped by remove()."""
    mod = tmp_path / "later_mod.py"
    mod.write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seam = Seam(plan=plan())
    seen = []
    seam.after_import("later_mod", lambda m: seen.append(m.VALUE))
    assert seen == [] and "later_mod" not in sys.modules
    import later_mod  # noqa: F401

    assert seen == [1]
    seam.after_import("never_imported_mod", lambda m: seen.append(m))
    seam.remove()
    assert not any(getattr(h, "name", None) == "never_imported_mod" for h in sys.meta_path)


def test_an_accelerate_loader_gets_the_plans_micro_batch():
    import torch

    from launcher.runtime.script_accelerate import rebatched

    seam = Seam(plan=plan())
    data = torch.arange(20)
    loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True, drop_last=True)
    again = rebatched(seam, loader, 2)
    assert again.batch_size == 2 and again.drop_last and isinstance(again.sampler, torch.utils.data.RandomSampler)
    assert sorted(torch.cat(list(again)).tolist()) == list(range(20))
    assert [(o.setting, o.script, o.plan) for o in seam.overrides] == [("DataLoader.batch_size", "8", "2")]
    assert rebatched(seam, again, 2) is again
