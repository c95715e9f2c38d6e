"""Plans and jobs built directly (no planner run) for the Slurm unit tests (backends, emit); conftest imports the
fixtures."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest

from launcher.config.job import Job
from launcher.config.jobfile import set_dotted
from launcher.config.load import from_dict
from launcher.planner.plan import Buckets, Estimate, Plan, Strategy

TINY = {"family": "gpt2", "hidden_size": 64, "num_layers": 2, "num_heads": 4, "vocab_size": 1024,
        "max_position_embeddings": 256}


def build_plan(*, nodes: int = 1, gpus_per_node: int = 2, engine: str = "fsdp") -> Plan:
    return Plan(
        strategy=Strategy.from_json(dict(engine=engine, zero_stage=2 if engine == "deepspeed" else None,
                                         fsdp_reshard_after_forward=True if engine == "fsdp" else None,
                                         offload_optimizer="none", offload_params="none", micro_batch_size=2,
                                         grad_accum_steps=1, activation_checkpointing=False)),
        estimate=Estimate(breakdown={"params": 1000}, peak_bytes=5_000_000, host_bytes_per_node=0,
                          nvme_bytes_per_node=0, step_time_s=0.01),
        buckets=Buckets(reduce_bucket_size=1000, allgather_bucket_size=1000, stage3_prefetch_bucket_size=1000,
                        stage3_max_live_parameters=1000, stage3_param_persistence_threshold=10),
        num_params=100_000, trainable_params=100_000, budget_bytes=10**9, usable_bytes=950_000_000,
        world_size=nodes * gpus_per_node, nodes=nodes, gpus_per_node=gpus_per_node,
        global_batch_size=2 * nodes * gpus_per_node, seq_len=64, precision="fp32", hardware="cpu",
    )


def build_job(**dotted) -> Job:
    d = {"name": "unit", "model": copy.deepcopy(TINY), "task": "causal_lm", "data": {"path": "/data/causal.jsonl"},
         "train": {"global_batch_size": 8, "max_steps": 4, "precision": "fp32"}, "gpus": 2, "budget": "1GB",
         "launcher": "slurm"}
    for key, value in dotted.items():
        set_dotted(d, key, value)
    return from_dict(Job, d)


@pytest.fixture
def make_plan():
    return build_plan


@pytest.fixture
def make_job():
    return build_job


def plan_text(*, nodes: int = 1, gpus_per_node: int = 2, **fields) -> str:
    """plan.json's text for build_plan(nodes, gpus_per_node), ``fields`` (world_size, budget_bytes) put in place."""
    return json.dumps(dataclasses.replace(build_plan(nodes=nodes, gpus_per_node=gpus_per_node), **fields).to_json())
