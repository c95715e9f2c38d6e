"""What a CUDA rank holds outside PyTorch's caching allocator, stage by stage (the `cuda_context` term).

    python -m benchmarks.gpu.context [--out FILE]

The launcher's verdict counts reserved plus what lies outside the allocator (launcher/runtime/probe.py
sample_outside_allocator: device used - reserved). The first GPU check measured 1.40 GB outside on FSDP2 runs and
1.81 GB on DeepSpeed runs of one rank, against the profile's 629 MB context: this prints, after each stage a
training rank goes through, the device bytes in use outside the allocator, so the term can be built from them.
Run alone on the GPU: mem_get_info is device-wide.
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def main() -> int:
    """Run the stages, print one line per stage and write them as JSON."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    import torch
    import torch.nn.functional as F

    dev = torch.device("cuda", 0)
    rows: list[dict] = []

    def note(stage: str) -> None:
        torch.cuda.synchronize(dev)
        free, total = torch.cuda.mem_get_info(dev)
        row = {"stage": stage, "outside_bytes": total - free - torch.cuda.memory_reserved(dev),
               "reserved_bytes": torch.cuda.memory_reserved(dev), "device_used_bytes": total - free}
        rows.append(row)
        print(f"{stage:<40} outside {row['outside_bytes'] / 2**20:9.1f} MiB  reserved "
              f"{row['reserved_bytes'] / 2**20:9.1f} MiB", flush=True)

    torch.cuda.init()
    torch.zeros(1, device=dev)
    note("context (torch.zeros(1).cuda())")
    x = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16, requires_grad=True)
    (x @ x).sum().backward()
    note("bf16 matmul fwd+bwd (cuBLAS, cuBLASLt)")
    y = torch.randn(1024, 1024, device=dev)
    (y @ y).sum()
    note("fp32 matmul")
    q = torch.randn(4, 16, 512, 64, device=dev, dtype=torch.bfloat16, requires_grad=True)
    F.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
    note("sdpa flash fwd+bwd")
    logits = torch.randn(2048, 50257, device=dev, requires_grad=True)
    F.cross_entropy(logits, torch.randint(0, 50257, (2048,), device=dev)).backward()
    note("cross_entropy fwd+bwd")
    ln = torch.nn.LayerNorm(768).to(dev)
    ln(torch.randn(8, 768, device=dev)).sum().backward()
    p = [torch.nn.Parameter(torch.randn(1024, 1024, device=dev)) for _ in range(4)]
    for t in p:
        t.grad = torch.randn_like(t)
    torch.optim.AdamW(p, foreach=True).step()
    note("layernorm, AdamW foreach step")
    # One rank, as torchrun would describe it: deepspeed.init_distributed below asserts LOCAL_RANK is set.
    for name, value in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29533"), ("RANK", "0"), ("LOCAL_RANK", "0"),
                        ("WORLD_SIZE", "1")):
        os.environ.setdefault(name, value)
    import torch.distributed as dist

    dist.init_process_group("nccl", rank=0, world_size=1, device_id=dev)
    note("init_process_group nccl (1 rank)")
    t = torch.ones(1 << 20, device=dev)
    dist.all_reduce(t)
    note("all_reduce (communicator created)")
    out = torch.empty(1 << 20, device=dev)
    dist.all_gather_into_tensor(out, t)
    dist.reduce_scatter_tensor(out[: 1 << 20], t)
    note("all_gather / reduce_scatter")
    import deepspeed

    deepspeed.init_distributed(dist_backend="nccl")
    note("import deepspeed + init_distributed")
    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.Linear(1024, 1024)).to(dev)
    cfg = {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True}, "zero_optimization": {"stage": 0},
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}}}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    loss = engine(torch.randn(2, 1024, device=dev, dtype=torch.bfloat16)).float().sum()
    engine.backward(loss)
    engine.step()
    note("deepspeed.initialize ZeRO-0 bf16 + one step")
    f = torch.compile(lambda a: (a * 2).sin())
    f(torch.randn(1024, device=dev))
    note("torch.compile (triton kernel loaded)")
    if a.out:
        with open(a.out, "w") as fh:
            json.dump({"device": torch.cuda.get_device_name(dev), "torch": torch.__version__,
                       "cuda": torch.version.cuda, "stages": rows}, fh, indent=1)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
