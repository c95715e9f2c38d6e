"""A training script for `accelerate launch --config_file EXPORT/accelerate.yaml`: what the engine really got.

Usage (what tests/emit/test_accelerate_launch.py runs, with the launch line the export documents):
    accelerate launch --config_file EXPORT/accelerate.yaml tests/emit/accelerate_check.py EXPORT OUT

It is written as a user's script would be: the model from the exported job.yaml (tiny inline GPT-2), a DataLoader
with the plan's micro-batch (accelerate has no config key for it), DummyOptim for a DeepSpeed plan (the optimizer
lives in ds_config.json), and the accumulation accelerate was given. It then records, on every rank, what the
prepared engine holds (not what the config said): precision, ZeRO stage or FSDP wrapping and resharding,
micro-batch, accumulation, world size; trains a few steps; and writes OUT/rank-K.json.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import torch
import yaml


def build_model(job: dict) -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    m = job["model"]
    config = GPT2Config(n_embd=m["hidden_size"], n_layer=m["num_layers"], n_head=m["num_heads"],
                        vocab_size=m["vocab_size"], n_positions=m.get("max_position_embeddings", 1024))
    return GPT2LMHeadModel(config)


def fsdp_facts(accelerator, model) -> dict:
    """What the FSDP settings became: accelerate's plugin from the launch env, and whether the model is sharded."""
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    env_plugin = FullyShardedDataParallelPlugin()  # what `accelerate launch` put in the env from accelerate.yaml
    # Unset (not even None) when accelerate did not take the FSDP path.
    fsdp = accelerator.distributed_type == DistributedType.FSDP
    applied = getattr(accelerator.state, "fsdp_plugin", None) if fsdp else None
    blocks = [m for m in model.modules() if type(m).__name__ == "GPT2Block"]
    facts = {
        "env_fsdp_version": env_plugin.fsdp_version,
        "env_reshard_after_forward": env_plugin.reshard_after_forward,
        "env_wrap_classes": env_plugin.transformer_cls_names_to_wrap,
        "plugin_applied": applied is not None,
        "root_is_fsdp2": isinstance(model, FSDPModule),
        "blocks_fsdp2": sum(isinstance(b, FSDPModule) for b in blocks),
        "blocks": len(blocks),
        "dtensor_params": sum(isinstance(p, DTensor) for p in model.parameters()),
        "params": sum(1 for _ in model.parameters()),
    }
    if applied is not None:
        policy = applied.mixed_precision_policy
        facts["fsdp_version"] = applied.fsdp_version
        facts["reshard_after_forward"] = applied.reshard_after_forward
        facts["param_dtype"] = str(getattr(policy, "param_dtype", None)).removeprefix("torch.")
    if blocks and isinstance(blocks[0], FSDPModule):
        # FSDP2 reshards a unit after forward when its param group keeps a post-forward mesh (None: keeps it).
        group = blocks[0]._get_fsdp_state()._fsdp_param_group
        facts["block_reshards_after_forward"] = group.post_forward_mesh_info is not None
    return facts


def main(export: Path, out: Path) -> None:
    from accelerate import Accelerator
    from accelerate.utils import DistributedType, DummyOptim, InitProcessGroupKwargs

    job = yaml.safe_load((export / "job.yaml").read_text())
    plan = json.loads((export / "plan.json").read_text())
    micro = plan["micro_batch_size"]
    torch.manual_seed(0)
    model = build_model(job)
    seq = plan["seq_len"]
    data = torch.randint(0, job["model"]["vocab_size"], (micro * 8, seq))
    loader = torch.utils.data.DataLoader(data, batch_size=micro)

    # Without a GPU accelerate picks no process-group backend and counts every rank as the only one (DeepSpeed
    # still spans them all); gloo makes it see the world. A user's CPU script needs the same line.
    handlers = [] if torch.cuda.is_available() else [InitProcessGroupKwargs(backend="gloo")]
    accelerator = Accelerator(kwargs_handlers=handlers)
    deepspeed = accelerator.distributed_type == DistributedType.DEEPSPEED
    if deepspeed:
        # The optimizer and the schedule are in ds_config.json: DeepSpeed builds them.
        optimizer = DummyOptim(model.parameters())
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=job["train"]["lr"])
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    facts: dict = {
        "rank": accelerator.process_index,
        "world_size": accelerator.num_processes,
        "process_group_size": torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1,
        "distributed_type": str(accelerator.distributed_type).split(".")[-1],
        "mixed_precision": accelerator.mixed_precision,
        "accumulation": accelerator.gradient_accumulation_steps,
        "loader_batch_size": loader.total_batch_size // accelerator.num_processes,
    }
    if deepspeed:
        facts.update({
            "bf16": model.bfloat16_enabled(),
            "fp16": model.fp16_enabled(),
            "zero_stage": model.zero_optimization_stage(),
            "engine_dp_world_size": model.dp_world_size,
            "engine_micro_batch": model.train_micro_batch_size_per_gpu(),
            "engine_accumulation": model.gradient_accumulation_steps(),
            "param_dtype": str(next(model.module.parameters()).dtype).removeprefix("torch."),
        })
    else:
        facts.update(fsdp_facts(accelerator, model))

    model.train()
    losses, steps = [], 0
    for batch in loader:
        with accelerator.accumulate(model):
            loss = model(input_ids=batch, labels=batch).loss
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        losses.append(loss.item())
        steps += accelerator.sync_gradients
        if steps == 2:
            break
    facts["optimizer_steps"] = steps
    facts["losses_finite"] = all(math.isfinite(x) for x in losses)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank-{accelerator.process_index}.json").write_text(json.dumps(facts, indent=2))
    accelerator.wait_for_everyone()  # both ranks' facts are written before either leaves
    # Leave without interpreter teardown: a gloo process group's destructor can block on a peer that already left
    # (seen here: rank 0 waited on a futex for 10 minutes after both facts were written). The launcher's own ranks
    # leave the same way (launcher.worker.rank_entry.exit_rank).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
