"""What every engine's exports for other tools share: an `accelerate launch` file's common keys, its header and
launch line, the environment accelerate would give a rank, HF Trainer's form of a script's DeepSpeed config and the
DeepSpeed ops a script run loads. Each engine's own exports are its package's
(launcher.engines.deepspeed.exports: ds_config.hf.json and DeepSpeed's accelerate config; launcher.engines.fsdp.emit:
FSDP2's).

Pure: nothing here reads or writes a file.
"""

from __future__ import annotations

import copy
import shlex
import sys

import yaml

from launcher.levers import LEVER_FIELDS, LEVERS_OFF, SCRIPT_LEVERS
from launcher.planner.plan import Plan

MACHINE_RANK_UNSET = "SET_BY_--machine_rank"
"""machine_rank of a multi-node accelerate config: each node passes its own with `--machine_rank`. accelerate
takes the flag over the file; without the flag it stops at once (int() of this text names the flag)."""
MAIN_PROCESS_IP_UNSET = "SET_BY_--main_process_ip"
"""main_process_ip of a multi-node accelerate config: the head node is known only when the job runs. Without
`--main_process_ip` torchrun retries this name, and its warning names the flag (never a wrong host: leaving the key
out would rendezvous at `None:29500`)."""


def accelerate_base(plan: Plan, distributed_type: str, mixed_precision: str | None) -> dict:
    """The keys every accelerate config file needs, for one machine's view of the plan's world.

    On one node the file is complete. On several, the node's rank and the head node's address are not in the
    plan, so they hold a marker that accelerate refuses unless `--machine_rank` / `--main_process_ip` are given.
    """
    multinode = plan.nodes > 1
    return {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": distributed_type,
        # Required by accelerate's loader; None for DeepSpeed, whose config file holds the precision.
        "mixed_precision": mixed_precision,
        "num_machines": plan.nodes,
        "num_processes": plan.world_size,
        "machine_rank": MACHINE_RANK_UNSET if multinode else 0,
        **({"main_process_ip": MAIN_PROCESS_IP_UNSET} if multinode else {}),
        "main_training_function": "main",
        "rdzv_backend": "static",
        "same_network": True,
        "use_cpu": False,
        "debug": False,
    }


def trainer_ds_config(script_config: dict) -> dict:
    """``script_config`` (ds_config.script.json) as HF TrainingArguments(deepspeed=...) takes it: the
    optimizer's betas and eps "auto" too, which the Trainer fills from adam_beta1/2 and adam_epsilon (accelerate
    has no source for them, so the file keeps torch's defaults)."""
    cfg = copy.deepcopy(script_config)
    params = cfg.get("optimizer", {}).get("params", {})
    params.update({key: "auto" for key in ("betas", "eps") if key in params})
    return cfg


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
        lines += ["The plan counts on levers the launcher's recipes apply and this file does not carry "
                  f"({', '.join(recipe_only)}):",
                  "  for your own script, plan with `launch plan JOB --script train.py --out DIR`, which leaves them "
                  "off."]
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
    which holds the same values). Hybrid sharding's mesh: ACCELERATE_USE_PARALLELISM_CONFIG and PARALLELISM_CONFIG_*
    (accelerate.utils.launch.prepare_extend_env_parallelism_config; ParallelismConfig reads them).
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
    if config.get("parallelism_config"):
        env["ACCELERATE_USE_PARALLELISM_CONFIG"] = "true"
        for key, value in config["parallelism_config"].items():  # parallelism_config_dp_shard_size -> PARALLELISM_...
            env[key.upper()] = str(value)
    return env


ACCELERATE_PRECISION = {"bf16": "bf16", "fp16": "fp16", "fp32": "no"}
"""The plan's precision in accelerate's words (as accelerate.yaml's mixed_precision for FSDP)."""


def ops_env() -> str:
    """The launch line's TORCH_EXTENSIONS_DIR=...: the DeepSpeed ops cache `launch` builds into, so accelerate's
    DeepSpeed loads those builds instead of compiling its own (deepspeed_shm_comm on CPU ranks took two minutes)."""
    from launcher.processes.rankenv import EXTENSIONS_ENV, extensions_dir

    return f"{EXTENSIONS_ENV}={shlex.quote(extensions_dir())}"


def ops_notes(names: tuple[str, ...]) -> list[str]:
    """The DeepSpeed ops a script run loads (``names``: its engine's EngineSpec.native_ops) and the one command
    that builds them into the cache the launch line names (launcher.processes.ops, run with this interpreter); none
    for none."""
    if not names:
        return []
    build = f"{ops_env()} {shlex.quote(sys.executable)} -m launcher.processes.ops {' '.join(names)}"
    return [f"DeepSpeed compiles {' and '.join(names)} (minutes, silently) when a process first loads "
            f"{'it' if len(names) == 1 else 'them'}, unless built in",
            f"  the cache the line names; build once: {build}"]
