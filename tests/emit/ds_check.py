"""Run emitted DeepSpeed configs through DeepSpeed itself, in a fresh process (run as a script).

stdin: {"mode": "parse" | "initialize", "world_size": N, "width": W, "configs": {name: config},
        "lora": {name: fp32_adapters}}
stdout (last line): {name: {"ok": true, ...} | {"ok": false, "error": "..."}}

parse: ``DeepSpeedConfig(config)`` with DeepSpeed's comm initialized on a fake process group of N ranks,
so DeepSpeed reads the real world size from ``dist.get_world_size()`` exactly as under torchrun and
applies its own batch assertion (train_batch_size == micro * accum * world_size) and pydantic checks.

initialize: ``deepspeed.initialize`` on a 1-rank gloo group with a two-layer MLP of width W, then two optimizer
steps: DeepSpeed builds the optimizer, scheduler and offload machinery from the config blocks, which
DeepSpeedConfig never checks. Reports the swap files written under the configs' NVMe paths, and how many
collectives ran on the world group and on any other (DeepSpeed's clone of it: on one GPU a group holds an NCCL
communicator only once a collective runs on it, launcher.engines.deepspeed nccl_communicators). The configs named
in "lora" train LoRA adapters on the first layer, added by peft after the model is built (after zero.Init), as
peft's default makes them (fp32_adapters true, a user's script) or in the base's dtype (false, the launcher's ranks:
launcher.model.lora.apply_lora): reported is the dtype they compute in (DeepSpeedSpec.fp32_adapters).

A fresh process because a process group is process-wide state, and so the test process stays clean.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import traceback
from pathlib import Path


def _quiet_deepspeed() -> None:
    import deepspeed.ops

    # On the CPU accelerator DeepSpeed JIT-compiles a shared-memory allreduce kernel (about a minute)
    # whenever comm starts; nothing here reduces through it, so skip the build.
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def parse(world_size: int, configs: dict) -> dict:
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    _quiet_deepspeed()
    import deepspeed.comm
    from deepspeed.runtime.config import DeepSpeedConfig

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    deepspeed.comm.init_distributed(dist_backend="fake", verbose=False)
    assert deepspeed.comm.get_world_size() == world_size
    out = {}
    for name, cfg in configs.items():
        try:
            parsed = DeepSpeedConfig(cfg)
            out[name] = {
                "ok": True,
                "world_size": parsed.world_size,
                "train_batch_size": parsed.train_batch_size,
                "zero_stage": int(parsed.zero_optimization_stage),
                "offload_optimizer": _device(parsed.zero_config.offload_optimizer),
                "offload_param": _device(parsed.zero_config.offload_param),
                "reduce_bucket_size": parsed.zero_config.reduce_bucket_size,
                "allgather_bucket_size": parsed.zero_config.allgather_bucket_size,
                "prefetch_bucket_size": parsed.zero_config.prefetch_bucket_size,
                "max_live_parameters": parsed.zero_config.max_live_parameters,
                "param_persistence_threshold": parsed.zero_config.param_persistence_threshold,
                "sub_group_size": parsed.zero_config.sub_group_size,
                "memory_efficient_linear": parsed.zero_config.memory_efficient_linear,
                "bf16": parsed.bfloat16_config.enabled,
                "fp16": parsed.float16_config.enabled,
                "optimizer_name": parsed.optimizer_name,
                "scheduler_name": parsed.scheduler_name,
                "aio": parsed.aio_config,
            }
        except Exception as e:  # DeepSpeed reports bad configs with AssertionError as well as ValueError
            out[name] = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    return out


def _device(block) -> str:
    return "none" if block is None else str(getattr(block.device, "value", block.device))


COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor", "reduce_scatter",
               "broadcast", "barrier", "reduce", "all_to_all_single", "gather", "scatter")


def _count_collectives(counts: dict) -> None:
    """Count every torch.distributed collective into ``counts`` by group: "world" (the default group, or none
    named) or "other". Before DeepSpeed's comm starts: its backend keeps some of these functions at start."""
    import torch.distributed as dist

    for name in COLLECTIVES:
        def counted(*args, _real=getattr(dist, name), **kwargs):
            group = kwargs.get("group", next((a for a in args if isinstance(a, dist.ProcessGroup)), None))
            counts["world" if group is None or group is dist.group.WORLD else "other"] += 1
            return _real(*args, **kwargs)

        setattr(dist, name, counted)


def _with_lora(model, fp32_adapters: bool):
    """peft LoRA on the first Linear; returns the model and the set of dtypes lora_A's input had."""
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(model, LoraConfig(r=4, target_modules=["0"]), autocast_adapter_dtype=fp32_adapters)
    seen: set[str] = set()
    for name, mod in model.named_modules():
        if name.endswith("lora_A.default"):
            mod.register_forward_pre_hook(lambda _m, args: seen.add(str(args[0].dtype).removeprefix("torch.")))
    return model, seen


def initialize(configs: dict, width: int, lora: dict[str, bool]) -> dict:
    import torch
    import torch.distributed as dist

    counts = {"world": 0, "other": 0}
    _count_collectives(counts)
    _quiet_deepspeed()
    import deepspeed

    # What torchrun sets for a 1-rank job; the engine insists on LOCAL_RANK.
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    deepspeed.init_distributed(dist_backend="gloo", verbose=False)
    out = {}
    for name, cfg in configs.items():
        counts.update(world=0, other=0)
        try:
            torch.manual_seed(0)
            # ZeRO-3 models are built inside zero.Init, as the launcher's ranks and HF's and accelerate's (its
            # zero3_init_flag) build them from these configs.
            stage3 = cfg.get("zero_optimization", {}).get("stage") == 3
            with deepspeed.zero.Init(config_dict_or_path=cfg) if stage3 else contextlib.nullcontext():
                model = torch.nn.Sequential(torch.nn.Linear(width, 2 * width), torch.nn.GELU(),
                                            torch.nn.Linear(2 * width, 1))
            adapter_dtypes: set[str] = set()
            if name in lora:
                model, adapter_dtypes = _with_lora(model, lora[name])
            engine, _, _, scheduler = deepspeed.initialize(
                model=model, model_parameters=[p for p in model.parameters() if p.requires_grad], config=cfg)
            dtype = torch.bfloat16 if engine.bfloat16_enabled() else torch.float32
            accum = cfg["gradient_accumulation_steps"]
            micro = cfg["train_micro_batch_size_per_gpu"]
            for _ in range(2 * accum):
                x = torch.randn(micro, width, dtype=dtype)
                loss = engine(x).float().pow(2).mean()
                engine.backward(loss)
                engine.step()
            out[name] = {
                "ok": True,
                "global_steps": engine.global_steps,
                "basic_optimizer": type(engine.basic_optimizer).__name__,
                "scheduler": None if scheduler is None else type(scheduler).__name__,
                "lr": engine.get_lr()[0],
                "loss_finite": bool(torch.isfinite(loss).item()),
                "swap_files": _swap_files(cfg),
                "collectives": dict(counts),
                "adapter_dtypes": sorted(adapter_dtypes),
            }
            engine.destroy()
        except Exception as e:
            out[name] = {"ok": False, "error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-2000:]}
    return out


def _swap_files(cfg: dict) -> list[str]:
    """Swap files DeepSpeed wrote under the config's NVMe paths, relative to them."""
    z = cfg.get("zero_optimization", {})
    roots = {z[k]["nvme_path"] for k in ("offload_optimizer", "offload_param") if "nvme_path" in z.get(k, {})}
    return sorted(str(p.relative_to(root)) for root in roots for p in Path(root).rglob("*.swp"))


def main() -> None:
    req = json.load(sys.stdin)
    if req["mode"] == "parse":
        out = parse(req["world_size"], req["configs"])
    else:
        out = initialize(req["configs"], req.get("width", 32), req.get("lora", {}))
    # DeepSpeed prints to stdout too; the answer is the last line.
    sys.stdout.write("\n" + json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
