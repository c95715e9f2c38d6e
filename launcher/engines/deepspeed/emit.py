"""The DeepSpeed config for a plan: a template from ``templates/`` (beside this module) with the plan's numbers
filled in.

Pure but for reading the templates: package data (so an installed wheel has them), read once, on first use;
they double as HF Trainer ``--deepspeed`` files (templates/README.md).
Every ``"auto"`` a template holds is replaced here; what comes out is concrete, because our worker hands it
to ``deepspeed.initialize`` directly and DeepSpeed's own models silently drop ``"auto"`` (so a missed one
would quietly become DeepSpeed's default, not an error).
"""

from __future__ import annotations

import copy
import functools
import importlib.resources
import json

from launcher.config.job import Job
from launcher.engines.deepspeed.layout import ZeroLayout
from launcher.errors import ConfigError
from launcher.levers import LOW_MEMORY_OPTIMIZER, PURE_BF16, RELEASE_FROZEN_WEIGHTS
from launcher.planner.plan import Plan
from launcher.planner.terms import NVME_PARAM_BUFFER_COUNT, nvme_param_buffer_elems


@functools.cache
def templates() -> dict[str, dict]:
    """Template name (file stem) to its parsed JSON; read once, on first use."""
    root = importlib.resources.files("launcher.engines.deepspeed") / "templates"
    files = sorted((p for p in root.iterdir() if p.name.endswith(".json")), key=lambda p: p.name)
    return {p.name.removesuffix(".json"): json.loads(p.read_text()) for p in files}

DS_CONFIG_FILE = "ds_config.json"
"""The run dir's DeepSpeed config: written by the spec (config_files), read by the ranks (DeepSpeedEngine.from_plan)."""

_OFFLOAD_TIER = {"none": 0, "cpu": 1, "nvme": 2}

# (ZeRO stage, furthest offload tier of optimizer and params) -> template. The emitter then sets each
# offload block to exactly what the plan says, so one template covers e.g. params->cpu with opt->nvme.
# Missing pairs are rejected in _strategy_problems, with the reason.
TEMPLATE_FOR: dict[tuple[int, str], str] = {
    (0, "none"): "zero0",
    (1, "none"): "zero1",
    (2, "none"): "zero2",
    (2, "cpu"): "zero2_offload_cpu",
    (3, "none"): "zero3",
    (3, "cpu"): "zero3_offload_cpu",
    (3, "nvme"): "zero3_offload_nvme",
}

# The job has no knobs for these; they are torch's AdamW defaults, so a run moved between our launcher,
# HF Trainer and plain torch trains the same way.
ADAM_BETAS = [0.9, 0.999]
ADAM_EPS = 1e-8

# DeepSpeed prints loss and lr every steps_per_print steps; the worker logs those itself.
STEPS_PER_PRINT = 1_000_000_000

# Offload keys that only mean something for device "nvme"; dropped when a block ends up on "cpu".
_NVME_ONLY_KEYS = ("nvme_path", "buffer_count", "buffer_size", "max_in_cpu", "fast_init", "pipeline_read",
                   "pipeline_write")


def template_name(plan: Plan) -> str:
    """The ``templates/`` template (file stem) the plan's strategy starts from; ConfigError if none fits."""
    problems = _strategy_problems(plan)
    if problems:
        raise ConfigError(problems)
    s = plan.strategy
    return TEMPLATE_FOR[(s.layout.zero_stage, _tier(s.layout.offload_optimizer, s.layout.offload_params))]


def ds_config(plan: Plan, job: Job, *, largest_layer_params: int | None = None) -> dict:
    """The concrete DeepSpeed config dict for ``plan``, ready for ``deepspeed.initialize(config=...)``.

    ``largest_layer_params`` (``ModelStats.largest_layer_params``, elements) bounds the largest single
    parameter; it sizes the NVMe parameter swap buffers, which must each hold one parameter's shard, and is
    required when parameters go to NVMe.
    Raises ConfigError listing every reason the plan and job cannot make a DeepSpeed config.
    """
    problems = _strategy_problems(plan) + _job_problems(plan, job)
    if problems:
        raise ConfigError(problems)
    s = plan.strategy
    largest_layer_params = largest_layer_params or plan.largest_layer_params or None
    if s.layout.offload_params == "nvme" and not largest_layer_params:
        raise ValueError(
            "ds_config: offload_params 'nvme' needs largest_layer_params (ModelStats.largest_layer_params) to "
            f"size the parameter swap buffers, got {largest_layer_params!r}; pass it"
        )
    name = TEMPLATE_FOR[(s.layout.zero_stage, _tier(s.layout.offload_optimizer, s.layout.offload_params))]
    cfg = copy.deepcopy(templates()[name])

    # DeepSpeed asserts train_batch_size == micro * accum * world_size at initialize; _job_problems
    # checked the plan agrees, so all three are given and DeepSpeed derives nothing.
    cfg["train_batch_size"] = plan.global_batch_size
    cfg["train_micro_batch_size_per_gpu"] = s.micro_batch_size
    cfg["gradient_accumulation_steps"] = s.grad_accum_steps
    cfg["gradient_clipping"] = float(job.train.max_grad_norm or 0.0)  # DeepSpeed: 0 turns clipping off

    _fill_precision(cfg, plan)
    _fill_optimizer(cfg, plan, job)
    _fill_scheduler(cfg, job)
    _fill_zero(cfg, plan, job, largest_layer_params)
    if _tier(s.layout.offload_optimizer, s.layout.offload_params) != "nvme":
        # The async-I/O settings only drive NVMe swapping.
        cfg.pop("aio", None)
    cfg["steps_per_print"] = STEPS_PER_PRINT
    cfg["wall_clock_breakdown"] = False

    left = _auto_paths(cfg)
    if left:
        raise RuntimeError(
            f"launcher/engines/deepspeed/templates/{name}.json: {', '.join(left)} still 'auto' after filling; "
            "fill it in launcher/engines/deepspeed/emit.py or give it a concrete value in the template"
        )
    return cfg


def _tier(*offloads: str) -> str:
    return max(offloads, key=_OFFLOAD_TIER.__getitem__)


def _strategy_problems(plan: Plan) -> list[str]:
    s = plan.strategy
    if not isinstance(s.layout, ZeroLayout):  # another engine's (launcher.engines picks the emitter by the engine)
        return [f"strategy.engine: {s.engine!r} is not deepspeed; emit an FSDP config with fsdp_config(plan, job)"]
    if s.layout.zero_stage not in (0, 1, 2, 3):
        return [f"strategy.zero_stage: {s.layout.zero_stage!r} is not 0, 1, 2 or 3; set strategy.zero_stage"]
    problems = []
    if s.layout.offload_params != "none" and s.layout.zero_stage != 3:
        problems.append(
            f"strategy.offload_params: {s.layout.offload_params!r} needs ZeRO-3 (DeepSpeed offloads parameters only "
            f"when it partitions them), got zero_stage {s.layout.zero_stage}; set zero_stage: 3 or offload_params: none"
        )
    if s.layout.offload_optimizer == "nvme" and s.layout.zero_stage != 3:
        problems.append(
            f"strategy.offload_optimizer: 'nvme' needs ZeRO-3 (ZeRO-Infinity), got zero_stage {s.layout.zero_stage}; "
            "set zero_stage: 3 or offload_optimizer: cpu"
        )
    if PURE_BF16.on(s) and (s.layout.zero_stage == 0 or s.layout.offload_optimizer != "none"):
        problems.append(
            f"strategy.pure_bf16: true is emitted for ZeRO-1/2/3 without optimizer offload, got zero_stage "
            f"{s.layout.zero_stage} with offload_optimizer {s.layout.offload_optimizer!r} (launcher.engines.deepspeed "
            "PURE_BF16_REFUSED); re-plan with pure_bf16 left to the planner"
        )
    if s.layout.offload_optimizer == "cpu" and s.layout.zero_stage in (0, 1):
        problems.append(
            f"strategy.offload_optimizer: 'cpu' with zero_stage {s.layout.zero_stage} is not emitted: ZeRO-2 offload "
            "keeps the same host state and also partitions gradients; set zero_stage: 2 (or 3)"
        )
    return problems


def _job_problems(plan: Plan, job: Job) -> list[str]:
    s = plan.strategy
    problems = []
    product = s.micro_batch_size * s.grad_accum_steps * plan.world_size
    if plan.global_batch_size != product:
        problems.append(
            f"plan.global_batch_size: {plan.global_batch_size} != micro_batch_size {s.micro_batch_size} "
            f"* grad_accum_steps {s.grad_accum_steps} * world_size {plan.world_size} = {product}, which DeepSpeed "
            "requires; re-plan, or fix the plan's micro_batch_size/grad_accum_steps"
        )
    if "nvme" in (s.layout.offload_optimizer, s.layout.offload_params) and not job.cluster.nvme_path:
        problems.append(
            f"cluster.nvme_path: {job.cluster.nvme_path!r} must name a local NVMe directory when offloading to "
            "nvme; add cluster.nvme_path: /local_nvme (or offload to cpu)"
        )
    return problems


def _fill_precision(cfg: dict, plan: Plan) -> None:
    # Both blocks stay, explicitly on or off: DeepSpeed's default mode is not fp32 in every code path,
    # and a reader should not have to know that. fp32 enables neither.
    cfg.setdefault("bf16", {})["enabled"] = plan.precision == "bf16"
    cfg.setdefault("fp16", {})["enabled"] = plan.precision == "fp16"
    if PURE_BF16.on(plan.strategy):
        # Pure bf16: the ZeRO optimizer's master partition, its gradient and the optimizer states take bf16
        # (runtime/base_optimizer.py _configure_master_weights: master dtype bf16; the states follow the bf16
        # master partition they are built on). No fp32 copy anywhere.
        cfg["bf16"]["bf16_master_weights_and_grads"] = True
        cfg["bf16"]["bf16_optimizer_states"] = True


def _fill_optimizer(cfg: dict, plan: Plan, job: Job) -> None:
    s = plan.strategy
    t = job.train
    if LOW_MEMORY_OPTIMIZER.of(s) != "none" or (PURE_BF16.on(s) and t.optimizer in ("adam", "adamw")):
        # The rank side passes the low-memory optimizer to deepspeed.initialize as a client optimizer
        # (launcher.worker.engines.deepspeed builds one only when the config names none). An "optimizer" block
        # here would claim AdamW: DeepSpeed 0.19 would quietly prefer the client's (engine.py
        # _configure_optimizer), HF Trainer and accelerate would build the block's. ZeRO wraps only the
        # optimizers it tested (is_zero_supported_optimizer) unless allowed. Pure bf16's Adam/AdamW is a client
        # optimizer too: torchao's stochastically rounding AdamW (launcher.worker.engines.optimizers), since
        # DeepSpeed's own steps a bf16 master by rounding to nearest, which drops updates under half a bf16 ulp.
        cfg.pop("optimizer", None)
        if s.layout.zero_stage > 0:
            cfg["zero_allow_untested_optimizer"] = True
        return
    offloaded = s.layout.offload_optimizer != "none"
    if t.optimizer == "sgd":
        # SGD goes through DeepSpeed's torch.optim fallback (getattr(torch.optim, type)), so the name is
        # case-sensitive. Momentum 0 matches the planner's "sgd keeps no optimizer state".
        cfg["optimizer"] = {"type": "SGD", "params": {"lr": t.lr, "momentum": 0.0, "weight_decay": t.weight_decay}}
        if s.layout.zero_stage > 0:
            # ZeRO refuses optimizers outside its tested list (Adam/AdamW/Adagrad/Lion...) without this.
            cfg["zero_allow_untested_optimizer"] = True
        return
    params: dict[str, object] = {"lr": t.lr, "betas": list(ADAM_BETAS), "eps": ADAM_EPS, "weight_decay": t.weight_decay}
    if t.optimizer == "adam":
        # DeepSpeed treats type "Adam" as AdamW unless adam_w_mode is false.
        params["adam_w_mode"] = False
    if not offloaded:
        # torch.optim.AdamW instead of DeepSpeed's FusedAdam, which JIT-compiles a CUDA op (needs nvcc).
        # Not with offload: there DeepSpeed would accept torch_adam and run torch's AdamW on the CPU
        # partitions, several times slower than the DeepSpeedCPUAdam it builds without the flag.
        params["torch_adam"] = True
    cfg["optimizer"] = {"type": "AdamW" if t.optimizer == "adamw" else "Adam", "params": params}


def _fill_scheduler(cfg: dict, job: Job) -> None:
    t = job.train
    if t.warmup_steps <= 0:
        # No scheduler: the lr stays at the optimizer's. DeepSpeed rejects warmup_num_steps <= 0.
        cfg.pop("scheduler", None)
        return
    # The worker's own schedule (FSDP, and DeepSpeed without this block) is lr * min(1, (i + 1) / (w + 1))
    # at scheduler iteration i. WarmupLR linear gives min + (max - min) * i / w, so min = lr / (w + 1) makes
    # the two the same function of i, and no step runs at lr 0 (HF's min of 0 would waste the first two).
    # What stays: WarmupLR serves iteration 0 twice (once from its constructor), so the ramp lags the
    # worker's by one step; and DeepSpeed raises w = 1 to 2. "linear" because DeepSpeed's default is log.
    w = t.warmup_steps
    cfg["scheduler"] = {
        "type": "WarmupLR",
        "params": {"warmup_min_lr": t.lr / (w + 1), "warmup_max_lr": t.lr, "warmup_num_steps": w,
                   "warmup_type": "linear"},
    }


def _fill_zero(cfg: dict, plan: Plan, job: Job, largest_layer_params: int | None) -> None:
    s = plan.strategy
    b = plan.buckets
    z = cfg.setdefault("zero_optimization", {})
    z["stage"] = s.layout.zero_stage
    if s.layout.zero_stage in (1, 2):
        z["reduce_bucket_size"] = b.reduce_bucket_size
        z["allgather_bucket_size"] = b.allgather_bucket_size
        # In ZeRO-1/2 overlap_comm double-buffers the reduce bucket; the planner counts one buffer.
        z["overlap_comm"] = False
        z["contiguous_gradients"] = True
    elif s.layout.zero_stage == 3:
        z["reduce_bucket_size"] = b.reduce_bucket_size
        z["stage3_prefetch_bucket_size"] = b.stage3_prefetch_bucket_size
        z["stage3_max_live_parameters"] = b.stage3_max_live_parameters
        # Parameters kept for reuse count against the live set; a reuse distance beyond the live cap
        # could only be honoured by breaking the plan's cap, so the two move together (as in DeepSpeed's docs).
        z["stage3_max_reuse_distance"] = b.stage3_max_live_parameters
        z["stage3_param_persistence_threshold"] = b.stage3_param_persistence_threshold
        # ZeRO-3 keeps a single reduce buffer either way, so overlapping costs no memory.
        z["overlap_comm"] = True
        z["contiguous_gradients"] = True
        # The optimizer steps one sub-group of the partition at a time (stage3.py step), holding that sub-group's
        # fp32 gradient and the optimizer's temporaries: the planner sizes it (Buckets.sub_group_size). With
        # optimizer NVMe offload it also sizes the pinned swap buffers (buffer_count x the largest sub-group, fp32).
        z["sub_group_size"] = b.sub_group_size
        # torch's linear saves weight.t() for the input's gradient, a view that keeps DeepSpeed's gathered storage
        # alive past free_param until the layer's backward; DeepSpeed's LinearFunctionForZeroStage3 (zero/linear.py,
        # "to allow for parameter memory release after the module execution during forward") saves the Parameter
        # instead, but saves every input, frozen weights' too. A full fine-tune saves those inputs anyway: DeepSpeed's
        # linear. Under LoRA the planner chooses (Strategy.release_frozen_weights): DeepSpeed's, whose frozen
        # linears' inputs it counts as activations, or torch's, whose pinned weights it counts
        # (launcher.engines.deepspeed.pinned_linear_elems).
        z["memory_efficient_linear"] = job.train.lora is None or RELEASE_FROZEN_WEIGHTS.on(s)

    for key, device in (("offload_optimizer", s.layout.offload_optimizer), ("offload_param", s.layout.offload_params)):
        if device == "none":
            z.pop(key, None)
            continue
        block = z.setdefault(key, {"pin_memory": True})
        block["device"] = device
        if device == "nvme":
            block["nvme_path"] = job.cluster.nvme_path
        else:
            for k in _NVME_ONLY_KEYS:
                block.pop(k, None)

    # NVMe parameter swapping pins host buffers; these sizes are the ones the planner's host figure assumes.
    if s.layout.offload_params == "nvme":
        # Parameter swap buffers: the same size and count the planner's host figure counts.
        z["offload_param"]["buffer_size"] = nvme_param_buffer_elems(b.stage3_prefetch_bucket_size,
                                                                    largest_layer_params, plan.world_size)
        z["offload_param"]["buffer_count"] = NVME_PARAM_BUFFER_COUNT
        # DeepSpeed keeps the first max_in_cpu shard elements in host RAM and only the rest on NVMe; its
        # default (1e9) keeps a whole 7B shard in RAM. Params go to NVMe because RAM is short, and the
        # planner's host figure holds only the swap buffers, so all of them go.
        z["offload_param"]["max_in_cpu"] = 0


def _auto_paths(node: object, prefix: str = "") -> list[str]:
    if node == "auto":
        return [prefix or "<root>"]
    if isinstance(node, dict):
        return [p for k, v in node.items() for p in _auto_paths(v, f"{prefix}.{k}" if prefix else str(k))]
    if isinstance(node, list):
        return [p for i, v in enumerate(node) for p in _auto_paths(v, f"{prefix}[{i}]")]
    return []
