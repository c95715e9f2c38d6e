"""DeepSpeed's exports for other tools: the HF Trainer variant of ds_config.json (ds_config.hf.json), a --script
run's variant (ds_config.script.json) and the `accelerate launch` config that reads ds_config.json, with what a
script run through it must do.

Pure: nothing here reads or writes a file.

``hf_ds_config`` is our concrete ds_config with "auto" wherever HF Trainer fills a value from its
TrainingArguments (transformers.integrations.deepspeed.HfTrainerDeepSpeedConfig.trainer_config_process), so
the Trainer's own flags (batch, lr, precision, clipping) cannot disagree with the file; the planner's memory
decisions (stage, offload, bucket sizes) stay concrete, because they are what the budget rests on.
"""

from __future__ import annotations

import copy

from launcher.config.job import Job
from launcher.emit.exports import accelerate_base, ops_env
from launcher.engines.deepspeed.emit import ds_config
from launcher.planner.plan import Plan

HF_AUTO_TOP = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
               "gradient_clipping")
"""Top-level keys HF Trainer fills: world size x per_device_train_batch_size x gradient_accumulation_steps,
and max_grad_norm."""
HF_AUTO_OPTIMIZER = ("lr", "betas", "eps", "weight_decay")
"""Optimizer params HF Trainer fills: learning_rate, (adam_beta1, adam_beta2), adam_epsilon, weight_decay."""
HF_AUTO_SCHEDULER = ("warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "total_num_steps")
"""WarmupLR / WarmupDecayLR params HF Trainer fills from learning_rate, warmup and the step count."""


def hf_ds_config(plan: Plan, job: Job) -> dict:
    """The DeepSpeed config for ``Trainer(args=TrainingArguments(deepspeed="ds_config.hf.json"))``:
    ds_config(plan, job) with "auto" where the Trainer fills values. Not for a bare ``accelerate launch``, which
    fills "auto" with its own defaults (accelerate.yaml points at the concrete ds_config.json)."""
    cfg = copy.deepcopy(ds_config(plan, job))
    for key in HF_AUTO_TOP:
        cfg[key] = "auto"
    params = cfg.get("optimizer", {}).get("params", {})
    for key in HF_AUTO_OPTIMIZER:
        if key in params:
            params[key] = "auto"
    sched = cfg.get("scheduler", {}).get("params", {})
    for key in HF_AUTO_SCHEDULER:
        if key in sched:
            sched[key] = "auto"
    # The Trainer's --bf16 / --fp16 decide; our plan's precision is what `launch` runs and what plan.json says.
    # Pure bf16's master keys stay: without them DeepSpeed keeps fp32 masters and states, not the plan's memory.
    pure = {k: v for k, v in cfg["bf16"].items() if k != "enabled"}
    cfg["bf16"] = {"enabled": "auto", **pure}
    cfg["fp16"] = {"enabled": "auto"}
    return cfg


def script_ds_config(plan: Plan, job: Job) -> dict:
    """The DeepSpeed config of a ``launch --script`` run (ds_config.script.json): the plan's memory and speed
    settings concrete (stage, offload, buckets, micro-batch, accumulation, precision, the optimizer's kind), the
    math the script's own.

    No scheduler block: the script's schedule (TrainingArguments' lr_scheduler_type and warm-up, or the scheduler
    it passes to accelerate). The optimizer block keeps the plan's optimizer (its states and its step are what the
    plan counts; DeepSpeedCPUAdam under offload) with its learning rate and weight decay "auto": HF Trainer fills
    them from its arguments, accelerate from the script's DummyOptim (accelerate's rule for a config that names an
    optimizer). Clipping is "auto": the Trainer's max_grad_norm, accelerate's default."""
    cfg = copy.deepcopy(ds_config(plan, job))
    cfg.pop("scheduler", None)
    cfg["gradient_clipping"] = "auto"
    params = cfg.get("optimizer", {}).get("params", {})
    params.update({key: "auto" for key in ("lr", "weight_decay") if key in params})
    return cfg


def deepspeed_accelerate_config(plan: Plan, job: Job, *, ds_config_file: str) -> dict:
    """An `accelerate launch --config_file` config for a DeepSpeed plan, reading ``ds_config_file``. (An FSDP2
    plan's is the ``accelerate`` section of launcher.engines.fsdp.emit.fsdp_config; the engine's spec picks.)

    ``ds_config_file`` is the concrete ds_config.json (not the HF variant): accelerate fills an "auto" precision
    from its own mixed_precision, which its launcher sets to "no" when the config file has none, and an "auto"
    accumulation from its own default of 1; concrete values it keeps. With a DeepSpeed config file accelerate
    refuses precision, accumulation, clipping, stage and offload in its own config
    (DeepSpeedPlugin._deepspeed_config_checks), so mixed_precision is null and deepspeed_config holds only the
    file and how to start the model.
    """
    deepspeed = {
        "deepspeed_config_file": ds_config_file,
        # ZeRO-3 builds the model already partitioned (deepspeed.zero.Init), as the plan's memory figure assumes.
        "zero3_init_flag": plan.strategy.layout.zero_stage == 3,
    }
    if plan.nodes > 1:
        deepspeed["deepspeed_multinode_launcher"] = "standard"  # torchrun on every node, as launch does
    return {**accelerate_base(plan, "DEEPSPEED", None), "deepspeed_config": deepspeed}


def deepspeed_notes(ds_config_file: str, client_optimizer: str = "") -> list[str]:
    """What a script run with a DeepSpeed accelerate.yaml must do; ``client_optimizer``: the class the plan's
    low-memory optimizer is, which ds_config.json leaves out (the script builds it), '' for none."""
    if client_optimizer:
        return [
            f"Precision, micro-batch, accumulation and schedule are in {ds_config_file}; the optimizer is not:",
            f"  the plan assumes {client_optimizer} over the model's parameters: build it and pass it to",
            "  accelerator.prepare (not DummyOptim).",
            *_cpu_rank_notes(),
        ]
    return [
        f"Precision, micro-batch, accumulation, optimizer and schedule are in {ds_config_file}:",
        "  pass accelerate.utils.DummyOptim (and DummyScheduler, if you pass one) to accelerator.prepare.",
        *_cpu_rank_notes(),
    ]


def _cpu_rank_notes() -> list[str]:
    return [
        "CPU ranks: Accelerator(kwargs_handlers=[InitProcessGroupKwargs(backend='gloo')]); without it accelerate",
        "  counts each rank as the only one. Do not set ACCELERATE_USE_CPU: it turns DeepSpeed off.",
    ]


def hf_trainer_notes(plan: Plan, hf_file: str) -> list[str]:
    """How HF Trainer takes ``hf_file`` (ds_config.hf.json): its "auto" values are the Trainer's own arguments, so
    the script must pass the plan's."""
    s = plan.strategy
    precision = {"bf16": " --bf16", "fp16": " --fp16", "fp32": ""}[plan.precision]
    return [f"HF Trainer: torchrun ... train.py --deepspeed {hf_file} fills its \"auto\" values from the Trainer's",
            f"  own arguments; pass the plan's: --per_device_train_batch_size {s.micro_batch_size} "
            f"--gradient_accumulation_steps {s.grad_accum_steps}{precision}"
            + ("" if precision else " (fp32: neither --bf16 nor --fp16)") + f", and {ops_env()} before torchrun."]
