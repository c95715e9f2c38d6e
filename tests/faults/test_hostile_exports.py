"""Hostile input to `launch plan --out DIR`: a plan whose exported files could not carry it out is refused before
anything is written (exit 2, one message naming the value, the rule and the fix; no DIR, no file anywhere)."""

from __future__ import annotations

import pytest

from tests.faults.harness import Case, check_refused


def _out(s, *flags, **over) -> list:
    return [s.job(**over), *flags, "--out", s.root / "export"]


CASES = [
    # accelerate and DeepSpeed read bf16, fp16 or fp32 (accelerate: bf16/fp16/no); nothing else maps.
    Case("precision-accelerate-cannot-read", lambda s: _out(s, **{"train.precision": "fp8"}),
         ["train.precision: 'fp8' is not one of 'auto', 'bf16', 'fp16', 'fp32'"], verb="plan"),
    # accelerate's HSDP mesh (dp_replicate x dp_shard) needs a replicate dimension: nodes.
    Case("fsdp-hybrid-on-one-node", lambda s: _out(s, **{"strategy.engine": "fsdp",
                                                         "strategy.fsdp_sharding": "hybrid"}),
         ["strategy.fsdp_sharding: 'hybrid'", "runs on 1 node", "--nodes 2 or more"], verb="plan"),
    # fsdp.yaml / accelerate.yaml have no NVMe tier (FSDP2's CPUOffloadPolicy is all there is).
    Case("fsdp-nvme-offload", lambda s: _out(s, **{"strategy.engine": "fsdp", "strategy.offload_optimizer": "nvme",
                                                   "strategy.offload_params": "nvme"}),
         ["admit no strategy", "FSDP offloads params and optimizer together", "unpin one of them"], verb="plan"),
    # ds_config.json cannot offload parameters below ZeRO-3 (DeepSpeed ignores the block there).
    Case("deepspeed-param-offload-zero2", lambda s: _out(s, **{"strategy.engine": "deepspeed", "strategy.zero_stage": 2,
                                                              "strategy.offload_params": "cpu"}),
         ["['engine', 'zero_stage', 'offload_params'] admit no strategy", "param offload and NVMe need zero_stage 3"],
         verb="plan"),
    # gpus is per node: 16 on 8-GPU nodes would export num_processes 16 on one machine and a job.yaml keeping 8.
    Case("gpus-beyond-gpus-per-node", lambda s: _out(s, "--gpus", "16", **{"cluster.gpus_per_node": 8,
                                                                          "train.global_batch_size": 16}),
         ["gpus: 16 per node is more than cluster.gpus_per_node 8", "--gpus 8 --nodes 2"], verb="plan"),
    # Nodes x GPUs must divide the batch, or accelerate's num_processes and DeepSpeed's train_batch_size disagree.
    Case("nodes-times-gpus-split-the-batch", lambda s: _out(s, "--nodes", "2", "--gpus", "3"),
         ["train.global_batch_size: 8 is not divisible by 6 GPUs", "use a multiple of 6"], verb="plan"),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_refused(case, sandbox):
    check_refused(case, sandbox)
