"""Configs for other tools to run the plan with: an HF Trainer DeepSpeed file and an `accelerate launch` file.

Pure: ``hf_ds_config`` and ``deepspeed_accelerate_config`` read and write nothing.

``hf_ds_config`` is our concrete ds_config with "auto" wherever HF Trainer fills a value from its
TrainingArguments (transformers.integrations.deepspeed.HfTrainerDeepSpeedConfig.trainer_config_process), so
the Trainer's own flags (batch, lr, precision, clipping) cannot disagree with the file; the planner's memory
decisions (stage, offload, bucket sizes) stay concrete, because they are what the budget rests on.
"""

from __future__ import annotations

import copy

from launcher.config.job import Job
from launcher.emit.deepspeed import ds_config
from launcher.emit.fsdp import accelerate_base
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
    """The DeepSpeed config for ``Trainer(args=TrainingArguments(deepspeed="ds_config.hf.json"))`` or
    ``accelerate launch``: ds_config(plan, job) with "auto" where the Trainer fills values."""
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
    cfg["bf16"] = {"enabled": "auto"}
    cfg["fp16"] = {"enabled": "auto"}
    return cfg


def deepspeed_accelerate_config(plan: Plan, job: Job, *, ds_config_file: str) -> dict:
    """An `accelerate launch --config_file` config for a DeepSpeed plan, reading ``ds_config_file``.

    With a DeepSpeed config file accelerate takes precision, accumulation, clipping, stage and offload from that
    file and refuses them in its own config (DeepSpeedPlugin._deepspeed_config_checks), so mixed_precision is
    null and deepspeed_config holds only the file and how to start the model. (An FSDP2 plan's is the
    ``accelerate`` section of launcher.emit.fsdp.fsdp_config; launcher.engines picks.)
    """
    deepspeed = {
        "deepspeed_config_file": ds_config_file,
        # ZeRO-3 builds the model already partitioned (deepspeed.zero.Init), as the plan's memory figure assumes.
        "zero3_init_flag": plan.strategy.zero_stage == 3,
    }
    if plan.nodes > 1:
        deepspeed["deepspeed_multinode_launcher"] = "standard"  # torchrun on every node, as launch does
    return {**accelerate_base(plan, "DEEPSPEED", None), "deepspeed_config": deepspeed}
