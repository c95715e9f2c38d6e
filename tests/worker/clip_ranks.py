"""Run by torchrun from test_step_contract.py: FSDP2's clip on two ranks, each with its own data, against the
same clip on one unsharded model given the gradient the ranks average.

argv: OUT_DIR OFFLOAD... (none | cpu: parameters and gradients on the host, CPUOffloadPolicy), each in turn in the
same ranks (one torchrun for all: its start-up is most of the cost); rank R writes OUT_DIR/rank-R-OFFLOAD.json.
"""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

from launcher.worker.engines.base import clip_grad_norm

MAX_NORM = 0.5


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.Linear(10, 3))


def clip_once(out: Path, offload: str) -> None:
    """One sharded clip against the unsharded one, written to OUT_DIR/rank-R-OFFLOAD.json."""
    rank, world = dist.get_rank(), dist.get_world_size()
    data = torch.randn(world, 4, 6, generator=torch.Generator().manual_seed(1))
    sharded = model()
    policy = CPUOffloadPolicy(pin_memory=False) if offload == "cpu" else OffloadPolicy()
    for layer in sharded:
        fully_shard(layer, offload_policy=policy)
    fully_shard(sharded, offload_policy=policy)
    sharded(data[rank]).square().sum().backward()  # FSDP2 averages the ranks' gradients
    norm = clip_grad_norm(list(sharded.parameters()), MAX_NORM, dist.group.WORLD, torch.device("cpu"))
    plain = model()
    sum(plain(data[r]).square().sum() for r in range(world)).div(world).backward()
    want = torch.nn.utils.clip_grad_norm_(plain.parameters(), MAX_NORM)
    grads_match = all(torch.allclose(p.grad.full_tensor(), q.grad, rtol=1e-5, atol=1e-7)
                      for p, q in zip(sharded.parameters(), plain.parameters(), strict=True))
    local = sum(p.grad.to_local().numel() for p in sharded.parameters())
    (out / f"rank-{rank}-{offload}.json").write_text(json.dumps(
        {"norm": float(norm), "want": float(want), "grads_match": grads_match, "local_elems": local,
         "total_elems": sum(q.numel() for q in plain.parameters())}))


def main() -> None:
    out, offloads = Path(sys.argv[1]), sys.argv[2:]
    dist.init_process_group("gloo")
    for offload in offloads:
        clip_once(out, offload)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # Leave as the launcher's ranks do (launcher.worker.rank_entry.exit_rank): a gloo rank's interpreter teardown after
    # destroy_process_group was seen to abort ("terminate called without an active exception").
    from launcher.worker.rank_entry import exit_rank

    exit_rank(0)
