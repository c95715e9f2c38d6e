"""The FSDP2 settings for a plan: what our worker applies, and the same as an ``accelerate launch`` config.

Pure: ``fsdp_config``, ``fsdp_yaml_text`` and ``accelerate_yaml_text`` read and write nothing.

``fsdp.yaml`` is one YAML document with two sections: ``fsdp2`` (the fully_shard settings: resharding, the
device mesh, MixedPrecisionPolicy and CPUOffloadPolicy, checkpointing, the wrapped units) and ``accelerate``
(a config file for ``accelerate launch``, whose loader rejects any other top-level key, so it gets the
``accelerate`` section alone: ``accelerate_yaml_text``, or ``plan --out``'s accelerate.yaml with its launch line).

The two sections agree on sharding, offload, checkpointing and the wrap unit. They differ in one place
accelerate does not let a config file control: accelerate's FSDP2 mixed precision reduces gradients in the
compute dtype (bf16), while our worker reduces them in fp32 (torchtitan's default; bf16 sums lose bits
across many ranks).
"""

from __future__ import annotations

import yaml

from launcher.config.job import InlineArch, Job
from launcher.emit.exports import ACCELERATE_PRECISION, accelerate_base
from launcher.engines.fsdp.layout import FsdpLayout
from launcher.errors import ConfigError
from launcher.levers import PURE_BF16
from launcher.planner.plan import Plan

BLOCK_CLASS_BY_FAMILY = {"gpt2": "GPT2Block", "llama": "LlamaDecoderLayer", "bert": "BertLayer"}
"""transformers block class for each inline family (the FSDP and checkpointing unit)."""

_PARAM_DTYPE = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}

MESH_DIM_NAMES_HYBRID = ("replicate", "shard")
"""Device mesh dimension names for hybrid sharding: nodes replicate, the ranks of a node shard."""
MESH_DIM_NAMES_FULL = ("shard",)

_YAML_HEADER = """\
# FSDP2 plan: `fsdp2` is what the launcher's worker applies (torch.distributed.fsdp.fully_shard);
# `accelerate` is the same as an `accelerate launch` config. accelerate reads only that section:
# `launch plan --out DIR` writes it alone as DIR/accelerate.yaml, whose header gives the launch line
# (the accumulation goes in ACCELERATE_GRADIENT_ACCUMULATION_STEPS; several nodes add --machine_rank and
# --main_process_ip).
"""


def fsdp_config(plan: Plan, job: Job, *, block_class: str | None = None) -> dict:
    """``{"fsdp2": ..., "accelerate": ...}`` for an FSDP plan.

    ``block_class`` is the transformer block's class name (``ModelStats.block_class``); None takes it from an
    inline model's family, else leaves it unset so the worker and accelerate fall back to the model's
    ``_no_split_modules``. Raises ConfigError listing every reason the plan has no FSDP2 form.
    """
    problems = _problems(plan)
    if problems:
        raise ConfigError(problems)
    s = plan.strategy
    block_class = block_class or plan.block_class
    if block_class is None and isinstance(job.model, InlineArch):
        block_class = BLOCK_CLASS_BY_FAMILY[job.model.family]
    # FSDP2's CPUOffloadPolicy moves parameters, gradients and the optimizer step together.
    cpu_offload = s.layout.offload_params == "cpu"
    hybrid = s.layout.hybrid
    if hybrid:
        # HSDP: fully_shard over a 2-D mesh shards on the last dimension and replicates on the first.
        mesh = {"shape": [plan.nodes, plan.gpus_per_node], "dim_names": list(MESH_DIM_NAMES_HYBRID)}
    else:
        mesh = {"shape": [plan.world_size], "dim_names": list(MESH_DIM_NAMES_FULL)}

    fsdp2 = {
        "reshard_after_forward": s.layout.fsdp_reshard_after_forward,
        "sharding": "hybrid" if hybrid else "full",
        "mesh": mesh,
        # torch dtype attribute names: getattr(torch, name) gives MixedPrecisionPolicy's arguments.
        "param_dtype": _PARAM_DTYPE[plan.precision],
        # Pure bf16: the parameters themselves are cast to bf16 before fully_shard and gradients reduce in bf16.
        "reduce_dtype": "bfloat16" if PURE_BF16.on(s) else "float32",
        "cpu_offload": cpu_offload,
        "activation_checkpointing": s.activation_checkpointing,
        # One FSDP unit per block_class module, then the root (the rest: embeddings, final norm, head).
        # None: the model's _no_split_modules decide.
        "block_class": block_class,
        "wrap": [block_class or "_no_split_modules", "root"],
    }
    if PURE_BF16.on(s):
        fsdp2[PURE_BF16.field] = True  # the parameters themselves bf16 before fully_shard: no fp32 master

    fsdp_section = {
        "fsdp_version": 2,
        "fsdp_reshard_after_forward": s.layout.fsdp_reshard_after_forward,
    }
    if hybrid:
        # FSDP1's name for it, which accelerate's FSDP2 path does not read; the mesh comes from
        # parallelism_config below.
        fsdp_section["fsdp_sharding_strategy"] = "HYBRID_SHARD"
    fsdp_section["fsdp_offload_params"] = cpu_offload
    fsdp_section["fsdp_auto_wrap_policy"] = "TRANSFORMER_BASED_WRAP"
    if block_class is not None:
        fsdp_section["fsdp_transformer_layer_cls_to_wrap"] = block_class
    fsdp_section.update({
        "fsdp_activation_checkpointing": s.activation_checkpointing,
        # Sharded saves: no rank gathers the whole model, which is what the plan's memory figure assumes.
        "fsdp_state_dict_type": "SHARDED_STATE_DICT",
        # Rank 0 alone reads pretrained weights into host RAM; the rest start on meta and get a broadcast.
        "fsdp_cpu_ram_efficient_loading": True,
    })
    # Keys as `accelerate config` writes them for FSDP2; on several nodes machine_rank and main_process_ip come
    # from the launch line (on Slurm they are only known once the job runs).
    accelerate = accelerate_base(plan, "FSDP", ACCELERATE_PRECISION[plan.precision])
    accelerate["fsdp_config"] = fsdp_section
    if hybrid:
        # accelerate builds FSDP2's HSDP mesh (dp_replicate x dp_shard) from this section (ParallelismConfig).
        accelerate["parallelism_config"] = {
            "parallelism_config_dp_replicate_size": plan.nodes,
            "parallelism_config_dp_shard_size": plan.gpus_per_node,
        }
    return {"fsdp2": fsdp2, "accelerate": accelerate}


def fsdp_yaml_text(plan: Plan, job: Job, *, block_class: str | None = None) -> str:
    """``fsdp.yaml``: both sections in one YAML document, under a header saying how accelerate reads it."""
    return _YAML_HEADER + yaml.safe_dump(fsdp_config(plan, job, block_class=block_class), sort_keys=False)


def accelerate_yaml_text(plan: Plan, job: Job, *, block_class: str | None = None) -> str:
    """The ``accelerate`` section alone, for ``accelerate launch --config_file``."""
    return yaml.safe_dump(fsdp_config(plan, job, block_class=block_class)["accelerate"], sort_keys=False)


def _problems(plan: Plan) -> list[str]:
    s = plan.strategy
    if not isinstance(s.layout, FsdpLayout):  # another engine's strategy (launcher.engines picks the emitter)
        return [f"strategy.engine: {s.engine!r} is not fsdp; emit a DeepSpeed config with ds_config(plan, job)"]
    problems = []
    if s.layout.hybrid and plan.nodes < 2:
        problems.append(
            f"strategy.fsdp_sharding: 'hybrid' needs nodes > 1 (it replicates across nodes), got nodes "
            f"{plan.nodes}; use fsdp_sharding: full or re-plan for more nodes"
        )
    if s.layout.hybrid and plan.world_size != plan.nodes * plan.gpus_per_node:
        problems.append(
            f"plan.world_size: {plan.world_size} != nodes {plan.nodes} * gpus_per_node {plan.gpus_per_node}, "
            "so the hybrid mesh has no shape; re-plan"
        )
    if s.layout.fsdp_reshard_after_forward is None:
        problems.append(
            "strategy.fsdp_reshard_after_forward: None must be true (FULL_SHARD) or false (SHARD_GRAD_OP) "
            "for FSDP; set it or let the planner choose"
        )
    for key, value in (("offload_optimizer", s.layout.offload_optimizer), ("offload_params", s.layout.offload_params)):
        if value == "nvme":
            problems.append(
                f"strategy.{key}: 'nvme' is not available under FSDP2 (it offloads to CPU only); "
                "use engine: deepspeed with zero_stage: 3 for NVMe, or offload to cpu"
            )
    if s.layout.offload_optimizer != s.layout.offload_params and "nvme" not in (s.layout.offload_optimizer,
                                                                                 s.layout.offload_params):
        problems.append(
            f"strategy.offload_optimizer: {s.layout.offload_optimizer!r} differs from offload_params "
            f"{s.layout.offload_params!r}, but FSDP2 offloads parameters, gradients and optimizer state together; "
            "set both to cpu or both to none"
        )
    if plan.global_batch_size != s.micro_batch_size * s.grad_accum_steps * plan.world_size:
        problems.append(
            f"plan.global_batch_size: {plan.global_batch_size} != micro_batch_size {s.micro_batch_size} "
            f"* grad_accum_steps {s.grad_accum_steps} * world_size {plan.world_size}; re-plan, or fix the "
            "plan's micro_batch_size/grad_accum_steps"
        )
    return problems
