"""Hand-made run dirs for the worker tests, before (or without) the planner and emitters (fixtures: not package code).

    from tests.worker.run_dirs import plan_dict, ds_config_dict, write_run_dir
    plan = plan_dict(engine="deepspeed", zero_stage=2, micro_batch_size=2, world_size=2, seq_len=64)
    write_run_dir("/tmp/run", job=job_dict, plan=plan, ds_config=ds_config_dict(plan, lr=1e-3))
    # torchrun --nproc-per-node 2 -m launcher.worker.rank_entry /tmp/run

The plan goes through the real Plan dataclasses, so a field the schema lacks fails here, not in the worker.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import yaml

from launcher.planner.plan import Buckets, Estimate, Plan, Strategy
from launcher.units import GB

SMALL_BUCKET_ELEMENTS = 5_000_000
"""DeepSpeed's default buckets (5e8 elements) allocate ~2 GB; tests and CPU runs use this instead."""


def plan_dict(
    *,
    engine: str = "deepspeed",
    zero_stage: int | None = 2,
    fsdp_reshard_after_forward: bool | None = None,
    offload_optimizer: str = "none",
    offload_params: str = "none",
    micro_batch_size: int = 2,
    grad_accum_steps: int = 1,
    activation_checkpointing: bool = False,
    world_size: int = 2,
    seq_len: int = 64,
    precision: str = "fp32",
    budget_bytes: int = 8 * GB,
    predicted_peak_bytes: int = 0,
    num_params: int = 0,
) -> dict:
    """A plan.json body with the given strategy; estimates are zeros unless given."""
    if engine == "fsdp":
        zero_stage = None
        fsdp_reshard_after_forward = True if fsdp_reshard_after_forward is None else fsdp_reshard_after_forward
    if engine == "plain":
        zero_stage = None
    strategy = Strategy.from_json(dict(
        engine=engine,
        ddp=world_size > 1,
        zero_stage=zero_stage,
        fsdp_reshard_after_forward=fsdp_reshard_after_forward,
        offload_optimizer=offload_optimizer,
        offload_params=offload_params,
        micro_batch_size=micro_batch_size,
        grad_accum_steps=grad_accum_steps,
        activation_checkpointing=activation_checkpointing,
    ))
    plan = Plan(
        strategy=strategy,
        estimate=Estimate(breakdown={}, peak_bytes=predicted_peak_bytes, host_bytes_per_node=0,
                          nvme_bytes_per_node=0, step_time_s=0.0),
        buckets=Buckets(
            reduce_bucket_size=SMALL_BUCKET_ELEMENTS,
            allgather_bucket_size=SMALL_BUCKET_ELEMENTS,
            stage3_prefetch_bucket_size=SMALL_BUCKET_ELEMENTS,
            stage3_max_live_parameters=2 * SMALL_BUCKET_ELEMENTS,
            stage3_param_persistence_threshold=10_000,
        ),
        num_params=num_params,
        trainable_params=num_params,
        budget_bytes=budget_bytes,
        usable_bytes=int(budget_bytes * 0.95),
        world_size=world_size,
        nodes=1,
        gpus_per_node=world_size,
        global_batch_size=micro_batch_size * grad_accum_steps * world_size,
        seq_len=seq_len,
        precision=precision,
        hardware="cpu",
    )
    return plan.to_json()


def ds_config_dict(plan: dict, *, lr: float = 1e-3, weight_decay: float = 0.0, gradient_clipping: float = 1.0) -> dict:
    """A ds_config.json for ``plan`` (what the emitter is expected to write), with small buckets.

    ``gradient_clipping`` must be the job's train.max_grad_norm (default 1.0), or the worker refuses the run dir."""
    b = plan["buckets"]
    zero: dict = {
        "stage": plan["zero_stage"] or 0,
        "reduce_bucket_size": b["reduce_bucket_size"],
        "allgather_bucket_size": b["allgather_bucket_size"],
        "overlap_comm": False,
        "contiguous_gradients": True,
    }
    if plan["zero_stage"] == 3:
        zero.update(
            stage3_prefetch_bucket_size=b["stage3_prefetch_bucket_size"],
            stage3_max_live_parameters=b["stage3_max_live_parameters"],
            stage3_param_persistence_threshold=b["stage3_param_persistence_threshold"],
        )
    if plan["offload_optimizer"] != "none":
        zero["offload_optimizer"] = {"device": plan["offload_optimizer"]}
    if plan["offload_params"] != "none":
        zero["offload_param"] = {"device": plan["offload_params"]}
    params = {"lr": lr, "weight_decay": weight_decay}
    if plan["offload_optimizer"] == "none":
        # torch's AdamW instead of FusedAdam, which would need a CUDA/C++ build.
        params["torch_adam"] = True
    return {
        "train_micro_batch_size_per_gpu": plan["micro_batch_size"],
        "gradient_accumulation_steps": plan["grad_accum_steps"],
        "train_batch_size": plan["global_batch_size"],
        "gradient_clipping": gradient_clipping,
        "bf16": {"enabled": plan["precision"] == "bf16"},
        "fp16": {"enabled": plan["precision"] == "fp16"},
        "zero_optimization": zero,
        "optimizer": {"type": "AdamW", "params": params},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def write_run_dir(path: str | os.PathLike, *, job: dict, plan: dict, ds_config: dict | None = None) -> Path:
    """Write job.yaml, plan.json and (DeepSpeed) ds_config.json into ``path``; returns it."""
    d = Path(path)
    d.mkdir(parents=True, exist_ok=True)
    (d / "job.yaml").write_text(yaml.safe_dump(job, sort_keys=False))
    (d / "plan.json").write_text(json.dumps(plan, indent=2) + "\n")
    if ds_config is not None:
        (d / "ds_config.json").write_text(json.dumps(ds_config, indent=2) + "\n")
    return d


def tiny_gpt2_job(data_path: str, **train) -> dict:
    """A 2-layer GPT-2 (hidden 64, 4 heads, vocab 1024) causal-LM job on ``data_path``."""
    return {
        "name": "tiny-gpt2",
        "model": {"family": "gpt2", "hidden_size": 64, "num_layers": 2, "num_heads": 4, "vocab_size": 1024,
                  "max_position_embeddings": 128},
        "task": "causal_lm",
        "data": {"path": data_path, "max_seq_len": 64, "eval_fraction": 0.1},
        "train": {"global_batch_size": 8, "lr": 1e-3, "max_steps": 6, "seed": 0, "precision": "fp32", **train},
    }
