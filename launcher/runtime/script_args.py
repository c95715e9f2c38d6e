"""Where a ``launch --script`` run's plan reaches an unchanged HF Trainer, TRL or accelerate script.

The script runs inside the rank's probe (launcher.runtime.script), so the launcher can set the plan's values where
those libraries build their arguments, and the script needs no launcher knowledge:

- ``transformers.TrainingArguments.__post_init__`` (TRL's configs subclass it): before it runs, the plan's
  micro-batch (the evaluation batch at most that), accumulation, precision, activation checkpointing, TRL's
  max_length (the plan's sequence length) and engine (the run's ds_config.script.json as
  ``deepspeed``; no ``fsdp`` of the script's own, accelerate's FSDP variables then decide) replace the script's;
  on CPU ranks ``use_cpu`` and gloo; ``auto_find_batch_size`` off (it would change the planned batch);
  ``include_num_input_tokens_seen`` "non_padding" where the script left it off (the step lines' tokens/s);
- ``transformers.trainer.DEFAULT_CALLBACKS``: one callback that reports each optimizer step and logged loss to the
  rank's step lines;
- accelerate's state and Accelerator (launcher.runtime.script_accelerate).

Each value the plan replaced is a ScriptOverride: printed in the rank's log and kept for its rank report. Installed
when the module is imported by the script (a post-import hook), never at the launcher's own import, and removed
when the script ends; tests/runtime/test_script_args.py fails if transformers changes what is patched.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.abc
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from launcher.processes import rankenv
from launcher.processes.environ import restore_environ
from launcher.records.rankreport import ScriptOverride


@dataclass(kw_only=True, slots=True, frozen=True)
class ScriptPlan:
    """What the seam sets in a script: the plan's values, as the rank's environment gives them."""

    micro_batch_size: int
    """Sequences per rank per forward."""
    grad_accum_steps: int
    """Micro-batches per optimizer step."""
    precision: str
    """bf16, fp16 or fp32."""
    activation_checkpointing: bool
    """Whether the plan counts on checkpointing every block."""
    seq_len: int
    """Tokens per sequence the plan was made for (TRL's max_length)."""
    world_size: int
    """Ranks in the plan."""
    cpu_ranks: bool
    """The ranks have no GPU: gloo, and accelerate's CPU paths."""
    ds_config_file: str | None = None
    """DeepSpeed plans: the run's ds_config.script.json (ACCELERATE_DEEPSPEED_CONFIG_FILE)."""
    fsdp: bool = False
    """FSDP2 plans: accelerate's FSDP variables are set (ACCELERATE_USE_FSDP)."""


def script_plan() -> ScriptPlan | None:
    """The plan of this rank's run from $LAUNCHER_PLAN and accelerate's variables; None outside a launched run."""
    if not os.environ.get(rankenv.PLAN_ENV):
        return None
    import torch

    plan = rankenv.load_plan()
    s = plan.strategy
    deepspeed = os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true"
    return ScriptPlan(micro_batch_size=s.micro_batch_size, grad_accum_steps=s.grad_accum_steps,
                      precision=plan.precision, activation_checkpointing=s.activation_checkpointing,
                      seq_len=plan.seq_len, world_size=plan.world_size, cpu_ranks=not torch.cuda.is_available(),
                      ds_config_file=os.environ.get("ACCELERATE_DEEPSPEED_CONFIG_FILE") if deepspeed else None,
                      fsdp=os.environ.get("ACCELERATE_USE_FSDP", "").lower() == "true")


def shown(value: object) -> str:
    """A value as an override shows it: a dict as its size, anything else as Python writes it."""
    return f"a dict of {len(value)} keys" if isinstance(value, dict) else repr(value)


@dataclass(kw_only=True, slots=True)
class Seam:
    """The patches one script run installs, the values they replaced, and where the Trainer's steps go."""

    plan: ScriptPlan
    """The values to set."""
    steps: object | None = None
    """Receives the Trainer's steps (launcher.runtime.script.ScriptSteps): trainer_begin(max_steps), trainer_step(step,
    tokens_seen), trainer_log(step, logs), trainer_end()."""
    overrides: dict[ScriptOverride, None] = field(default_factory=dict)
    """Each replaced value once, in the order first seen."""
    trainer_args_seen: bool = False
    """A TrainingArguments was built: the Trainer makes the DataLoaders, from the plan's batch size."""
    _undo: list[tuple[object, str, object]] = field(default_factory=list)
    _hooks: list[object] = field(default_factory=list)

    def note(self, setting: str, script: object, plan: object) -> None:
        """Record that the plan's value replaced the script's, and say so in the rank's log (once per value)."""
        o = ScriptOverride(setting=setting, script=shown(script), plan=shown(plan))
        if o not in self.overrides:
            self.overrides[o] = None
            print(f"[launcher] the plan sets {o.setting}: {o.script} -> {o.plan}", file=sys.stderr, flush=True)

    def patch(self, owner: object, name: str, new: object) -> None:
        """Set ``owner.name`` to ``new``, the old value kept for remove()."""
        self._undo.append((owner, name, owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name)))
        setattr(owner, name, new)

    def set_env(self, name: str, value: str) -> None:
        """Set an environment variable of this rank process, the old value restored by remove()."""
        self._undo.append((os.environ, name, os.environ.get(name)))
        os.environ[name] = value

    def after_import(self, module: str, fn) -> None:
        """Call ``fn(module)`` once ``module`` is imported: now if it is, else when the script imports it."""
        if module in sys.modules:
            fn(sys.modules[module])
            return
        hook = AfterImport(module, fn)
        self._hooks.append(hook)
        sys.meta_path.insert(0, hook)

    def install(self) -> Seam:
        """Hook TrainingArguments, the Trainer's callbacks and accelerate, each when the script imports it."""
        from launcher.runtime.script_accelerate import patch_accelerator, patch_state, set_cpu_env

        set_cpu_env(self)
        self.after_import("transformers.training_args", self._patch_training_args)
        self.after_import("transformers.trainer", self._patch_trainer)
        self.after_import("accelerate.state", functools.partial(patch_state, self))
        self.after_import("accelerate.accelerator", functools.partial(patch_accelerator, self))
        return self

    def remove(self) -> None:
        """Undo every patch and drop the hooks not yet fired."""
        for hook in self._hooks:
            if hook in sys.meta_path:
                sys.meta_path.remove(hook)
        for owner, name, old in reversed(self._undo):
            if owner is os.environ:
                restore_environ({name: old})
            elif old is None and isinstance(owner, type):
                delattr(owner, name)
            else:
                setattr(owner, name, old)
        self._undo.clear()

    # -- transformers ------------------------------------------------------------------------------------------
    def _patch_training_args(self, module) -> None:
        cls = module.TrainingArguments
        original = cls.__post_init__
        seam = self

        @functools.wraps(original)
        def __post_init__(args):
            seam.apply(args)
            original(args)
            seam.after(args)

        self.patch(cls, "__post_init__", __post_init__)

    def apply(self, args) -> None:
        """Set the plan's values on a TrainingArguments before its own __post_init__ reads them; note each that
        differs from the script's (what the run will do, not the field: under FSDP2 checkpointing is accelerate's)."""
        self.trainer_args_seen = True
        for name, value in training_args_values(args, self.plan).items():
            asked, meant = getattr(args, name), value
            if name == CHECKPOINTING:
                asked, meant = bool(checkpointing(args)), self.plan.activation_checkpointing
            elif name == DS_CONFIG_FIELD:
                asked, meant = (self.plan.ds_config_file if asked == value else asked), self.plan.ds_config_file
            if name not in UNNOTED and asked != meant and not (asked is None and meant in (False, "")):
                self.note(f"{type(args).__name__}.{name}", asked, meant)
            setattr(args, name, value)

    def after(self, args) -> None:
        """After TrainingArguments' own __post_init__: on CPU ranks under DeepSpeed, start DeepSpeed's comm over
        the process group, which accelerate does only on GPUs (zero.Init in from_pretrained needs the world)."""
        if self.plan.ds_config_file and self.plan.cpu_ranks and self.plan.world_size > 1:
            import deepspeed

            if not deepspeed.comm.is_initialized():
                deepspeed.init_distributed(dist_backend="gloo")

    def _patch_trainer(self, module) -> None:
        if self.steps is None:
            return
        callback = trainer_callback(self.steps)
        self.patch(module, "DEFAULT_CALLBACKS", [*module.DEFAULT_CALLBACKS, callback])


DS_CONFIG_FIELD = "deepspeed"
"""TrainingArguments' field for a DeepSpeed config (a path or a dict)."""
FSDP_FIELDS = ("fsdp", "fsdp_config")
"""TrainingArguments' own FSDP settings, which would replace the plan's (the Trainer builds its plugin from them)."""
UNNOTED = ("include_num_input_tokens_seen",)
"""Fields the seam sets that are no plan value (the step lines' tokens/s), so not overrides."""
CHECKPOINTING = "activation_checkpointing"
"""TrainingArguments' checkpointing switch (transformers 5; gradient_checkpointing is its deprecated alias)."""


def checkpointing(args) -> bool | None:
    """What a TrainingArguments asks for before its __post_init__: the new name, else the deprecated alias."""
    new = getattr(args, CHECKPOINTING, None)
    return new if new is not None else getattr(args, "gradient_checkpointing", None)


def training_args_values(args, plan: ScriptPlan) -> dict[str, object]:
    """The TrainingArguments fields the plan sets, by name: batch shape, sequence length, precision, checkpointing,
    engine, device (those the class has)."""
    defaults = {f.name: f.default for f in dataclasses.fields(args)}
    values: dict[str, object] = {
        "per_device_train_batch_size": plan.micro_batch_size,
        # The plan prices training's forward and backward at the micro-batch; an evaluation's no-grad forward at
        # the same batch holds less, a larger one (HF's default is 8) is priced nowhere. A smaller one stays.
        "per_device_eval_batch_size": min(getattr(args, "per_device_eval_batch_size", None) or plan.micro_batch_size,
                                          plan.micro_batch_size),
        "gradient_accumulation_steps": plan.grad_accum_steps,
        "bf16": plan.precision == "bf16",
        "fp16": plan.precision == "fp16",
        # Under FSDP2 off here: accelerate's FSDP checkpointing is on where the plan says (both at once refused).
        CHECKPOINTING: plan.activation_checkpointing and not plan.fsdp,
        "auto_find_batch_size": False,
        "max_length": plan.seq_len,  # TRL's configs: the sequence length the plan's memory is for
        DS_CONFIG_FIELD: trainer_deepspeed(plan),
        # No FSDP of the script's own: accelerate's FSDP variables (an FSDP2 plan's) decide, or nothing does.
        **{name: defaults.get(name) for name in FSDP_FIELDS},
    }
    if plan.cpu_ranks:
        values["use_cpu"] = True
        if plan.world_size > 1:  # a backend without a world fails accelerate's start
            values["ddp_backend"] = "gloo"
    if getattr(args, "include_num_input_tokens_seen", None) in ("no", False):
        values["include_num_input_tokens_seen"] = "non_padding"
    return {k: v for k, v in values.items() if k in defaults}


def trainer_deepspeed(plan: ScriptPlan) -> dict | None:
    """The DeepSpeed config dict TrainingArguments gets: ds_config.script.json as the Trainer takes it."""
    if not plan.ds_config_file:
        return None
    from launcher.emit.exports import trainer_ds_config

    return trainer_ds_config(json.loads(Path(plan.ds_config_file).read_text()))


def trainer_callback(steps):
    """A transformers TrainerCallback instance that passes each optimizer step and each log to ``steps``."""
    from transformers.trainer_callback import TrainerCallback

    class LauncherSteps(TrainerCallback):
        """Reports the Trainer's optimizer steps and logged loss to the launcher's step lines."""

        def on_train_begin(self, args, state, control, **kwargs):
            steps.trainer_begin(state.max_steps)

        def on_step_end(self, args, state, control, **kwargs):
            steps.trainer_step(state.global_step, state.num_input_tokens_seen)

        def on_log(self, args, state, control, logs=None, **kwargs):
            steps.trainer_log(state.global_step, logs or {})

        def on_train_end(self, args, state, control, **kwargs):
            steps.trainer_end()

    return LauncherSteps()


class AfterImport(importlib.abc.MetaPathFinder):
    """A one-shot import hook: finds ``name`` with the other finders, then runs ``fn(module)`` after it executes."""

    def __init__(self, name: str, fn):
        self.name, self.fn = name, fn

    def find_spec(self, fullname, path, target=None):
        """The module's own spec with its loader wrapped; None for any other module."""
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        for finder in sys.meta_path:
            spec = finder.find_spec(fullname, path, target) if hasattr(finder, "find_spec") else None
            if spec is not None and spec.loader is not None:
                spec.loader = _ThenCall(spec.loader, self.fn)
                return spec
        return None


class _ThenCall(importlib.abc.Loader):
    """A loader that runs the real one, then ``fn(module)``; anything else goes to the real loader."""

    def __init__(self, loader, fn):
        self._loader, self._fn = loader, fn

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        self._fn(module)

    def __getattr__(self, name):
        return getattr(self._loader, name)
