"""Configs for other tools to run the plan with: an HF Trainer DeepSpeed file and an `accelerate launch` file.

Pure: ``hf_ds_config``, ``deepspeed_accelerate_config`` and ``accelerate_yaml_text`` read and write nothing.

``hf_ds_config`` is our concrete ds_config with "auto" wherever HF Trainer fills a value from its
TrainingArguments (transformers.integrations.deepspeed.HfTrainerDeepSpeedConfig.trainer_config_process), so
the Trainer's own flags (batch, lr, precision, clipping) cannot disagree with the file; the planner's memory
decisions (stage, offload, bucket sizes) stay concrete, because they are what the budget rests on.
"""

from __future__ import annotations

import copy
import shlex
import sys

import yaml

from launcher.config.job import Job
from launcher.emit.deepspeed import ds_config
from launcher.emit.fsdp import accelerate_base
from launcher.planner.levers import SCRIPT_LEVERS
from launcher.planner.plan import LEVER_FIELDS, LEVERS_OFF, Plan

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


def trainer_ds_config(script_config: dict) -> dict:
    """``script_config`` (ds_config.script.json) as HF TrainingArguments(deepspeed=...) takes it: the
    optimizer's betas and eps "auto" too, which the Trainer fills from adam_beta1/2 and adam_epsilon (accelerate
    has no source for them, so the file keeps torch's defaults)."""
    cfg = copy.deepcopy(script_config)
    params = cfg.get("optimizer", {}).get("params", {})
    params.update({key: "auto" for key in ("betas", "eps") if key in params})
    return cfg


def deepspeed_accelerate_config(plan: Plan, job: Job, *, ds_config_file: str) -> dict:
    """An `accelerate launch --config_file` config for a DeepSpeed plan, reading ``ds_config_file``. (An FSDP2
    plan's is the ``accelerate`` section of launcher.emit.fsdp.fsdp_config; the engine's spec picks.)

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
        "zero3_init_flag": plan.strategy.zero_stage == 3,
    }
    if plan.nodes > 1:
        deepspeed["deepspeed_multinode_launcher"] = "standard"  # torchrun on every node, as launch does
    return {**accelerate_base(plan, "DEEPSPEED", None), "deepspeed_config": deepspeed}


def accelerate_launch_line(plan: Plan, config_file: str, script: str = "train.py", *, env: str = "") -> str:
    """The command that runs the plan through accelerate with ``config_file``: what the file cannot say goes
    on the line (``env``: what the engine reads only from its environment, e.g. FSDP's accumulation; several
    nodes: this node's rank and the head node)."""
    parts = [env] if env else []
    parts += ["accelerate", "launch", "--config_file", shlex.quote(config_file)]
    if plan.nodes > 1:
        parts += ["--machine_rank", "$NODE_RANK", "--main_process_ip", "$HEAD_NODE"]
    return " ".join([*parts, script])


PURE_BF16_CLIENT = {
    "adamw": "torchao.optim._AdamW(params, lr, weight_decay=..., bf16_stochastic_round=True)",
    "adam": "torchao.optim.adam._AdamBase(params, lr, (0.9, 0.999), 1e-8, weight_decay, False, "
            "block_size=float('inf'), bf16_stochastic_round=True, is_adamw=False)",
}
"""The stochastically rounding optimizer a script builds for a pure-bf16 plan, by the job's train.optimizer
(launcher.worker.engines.optimizers.stochastic_round_adam; torchao exports no such Adam: _AdamW is _AdamBase with
is_adamw=True). SGD has none: the ranks step torch's SGD, which rounds to nearest."""
ADAM_TITLES = {"adam": "Adam", "adamw": "AdamW"}
"""How the notes name a train.optimizer that pure bf16 steps with PURE_BF16_CLIENT (its keys)."""


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


FSDP_NOTES = [
    "GPUs only: accelerate applies FSDP2 (fully_shard) on GPUs; on CPU ranks it ignores the FSDP settings",
    "  (with ACCELERATE_USE_CPU=1 it runs unsharded DDP over gloo), so the plan's memory does not hold there.",
]
"""What a script run with an FSDP2 accelerate.yaml must know."""


def accelerate_yaml_text(plan: Plan, *, title: str, config: dict, config_file: str, env: str = "",
                         notes: list[str]) -> str:
    """``accelerate.yaml``: the engine's accelerate ``config`` under a header with the launch line and what the
    script must do (``notes``, the engine's)."""
    s = plan.strategy
    lines = [
        f"{title}, {_count(plan.nodes, 'node')} x {_count(plan.gpus_per_node, 'rank')}, {plan.precision}, micro-batch "
        f"{s.micro_batch_size}, accumulation {s.grad_accum_steps}. Launch (on every node):",
        f"  {accelerate_launch_line(plan, config_file, env=env)}",
    ]
    if plan.nodes > 1:
        lines += ["  NODE_RANK: 0 on the head node, 1..N-1 on the others; HEAD_NODE: the head node's address.",
                  "  Without --machine_rank accelerate stops; without --main_process_ip it retries the marker name."]
    lines.append(f"train.py's DataLoader: batch_size={s.micro_batch_size} per process (accelerate has no key for it).")
    lines += notes
    recipe_only = [f"{name}: {getattr(s, name)}" for name in LEVER_FIELDS
                   if name not in SCRIPT_LEVERS and getattr(s, name) != LEVERS_OFF[name]]
    if recipe_only:
        # A script launched with this file applies none of them, so the plan's memory would not hold for it.
        lines += [f"The plan counts on levers the launcher's recipes apply and this file does not carry ({', '.join(recipe_only)}):",
                  "  for your own script, plan with `launch plan JOB --script train.py --out DIR`, which leaves them off."]
    header = "".join(f"# {line}\n" for line in lines)
    return header + yaml.safe_dump(config, sort_keys=False)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _env_flag(value: object) -> str:
    # accelerate's launcher writes booleans as str(value).lower() and reads them with str_to_bool.
    return str(value).lower() if isinstance(value, bool) else str(value)


_FSDP_ENV_NAME = {"fsdp_transformer_layer_cls_to_wrap": "FSDP_TRANSFORMER_CLS_TO_WRAP"}
"""accelerate's environment names for the fsdp_config keys that are not the key upper-cased
(accelerate.utils.launch.prepare_multi_gpu_env)."""


def accelerate_env(plan: Plan, config: dict) -> dict[str, str]:
    """What ``accelerate launch --config_file accelerate.yaml`` would put in a rank's environment for ``config``
    (an engine's accelerate_config for this plan), under accelerate's own names
    (accelerate.utils.launch.prepare_deepspeed_cmd_env / prepare_multi_gpu_env), so that a plain
    ``Accelerator()`` or HF ``Trainer`` started by ``launch --script`` reads the plan by itself.

    DeepSpeed: ACCELERATE_USE_DEEPSPEED, the concrete ds_config.json (precision, micro-batch, accumulation, stage,
    offload are in it) and the zero.Init flag. FSDP2: ACCELERATE_USE_FSDP and every fsdp_config key as FSDP_<KEY>
    (FSDP_VERSION=2 among them). Both: ACCELERATE_MIXED_PRECISION and ACCELERATE_GRADIENT_ACCUMULATION_STEPS (HF
    TrainingArguments reads the precision from it; beside a DeepSpeed file accelerate takes both from the file,
    which holds the same values). Hybrid sharding's mesh (parallelism_config) is not carried.
    """
    env = {
        "ACCELERATE_MIXED_PRECISION": ACCELERATE_PRECISION[plan.precision],
        "ACCELERATE_GRADIENT_ACCUMULATION_STEPS": str(plan.strategy.grad_accum_steps),
    }
    if config["distributed_type"] == "DEEPSPEED":
        ds = config["deepspeed_config"]
        env.update({
            "ACCELERATE_USE_DEEPSPEED": "true",
            "ACCELERATE_DEEPSPEED_CONFIG_FILE": ds["deepspeed_config_file"],
            "ACCELERATE_DEEPSPEED_ZERO3_INIT": _env_flag(ds["zero3_init_flag"]),
        })
    elif config["distributed_type"] == "FSDP":
        env["ACCELERATE_USE_FSDP"] = "true"
        for key, value in config["fsdp_config"].items():
            env[_FSDP_ENV_NAME.get(key, key.upper())] = _env_flag(value)
    return env


ACCELERATE_PRECISION = {"bf16": "bf16", "fp16": "fp16", "fp32": "no"}
"""The plan's precision in accelerate's words (as accelerate.yaml's mixed_precision for FSDP)."""


def ops_env() -> str:
    """The launch line's TORCH_EXTENSIONS_DIR=...: the DeepSpeed ops cache `launch` builds into, so accelerate's
    DeepSpeed loads those builds instead of compiling its own (deepspeed_shm_comm on CPU ranks took two minutes)."""
    from launcher.rankenv import EXTENSIONS_ENV, extensions_dir

    return f"{EXTENSIONS_ENV}={shlex.quote(extensions_dir())}"


def ops_notes(names: tuple[str, ...]) -> list[str]:
    """The DeepSpeed ops a script run loads (``names``: its engine's EngineSpec.native_ops) and the one command
    that builds them into the cache the launch line names (launcher.ops, run with this interpreter); none for none."""
    if not names:
        return []
    build = f"{ops_env()} {shlex.quote(sys.executable)} -m launcher.ops {' '.join(names)}"
    return [f"DeepSpeed compiles {' and '.join(names)} (minutes, silently) when a process first loads "
            f"{'it' if len(names) == 1 else 'them'}, unless built in",
            f"  the cache the line names; build once: {build}"]


def hf_trainer_notes(plan: Plan, hf_file: str) -> list[str]:
    """How HF Trainer takes ``hf_file`` (ds_config.hf.json): its "auto" values are the Trainer's own arguments, so
    the script must pass the plan's."""
    s = plan.strategy
    precision = {"bf16": " --bf16", "fp16": " --fp16", "fp32": ""}[plan.precision]
    return [f"HF Trainer: torchrun ... train.py --deepspeed {hf_file} fills its \"auto\" values from the Trainer's",
            f"  own arguments; pass the plan's: --per_device_train_batch_size {s.micro_batch_size} "
            f"--gradient_accumulation_steps {s.grad_accum_steps}{precision}"
            + ("" if precision else " (fp32: neither --bf16 nor --fp16)") + f", and {ops_env()} before torchrun."]
