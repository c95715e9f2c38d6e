"""Helpers for the emitter tests: plans and jobs built directly (no planner run), golden files, DeepSpeed checks."""

from __future__ import annotations

import copy
import difflib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.config.job import Job
from launcher.config.jobfile import set_dotted
from launcher.config.load import from_dict
from launcher.planner.plan import Buckets, Estimate, Plan, Strategy

HERE = Path(__file__).parent
GOLDEN_DIR = HERE / "golden"
DS_CHECK = HERE / "ds_check.py"

TINY_GPT2 = {"family": "gpt2", "hidden_size": 64, "num_layers": 2, "num_heads": 4, "vocab_size": 1024}

# Distinct values per bucket, so a test can tell which plan field reached which config key.
BUCKETS = dict(
    reduce_bucket_size=200_000_000,
    allgather_bucket_size=150_000_000,
    stage3_prefetch_bucket_size=3_686,
    stage3_max_live_parameters=250_000_000,
    stage3_param_persistence_threshold=640,
    sub_group_size=300_000_000,
)
LARGEST_LAYER_PARAMS = 65_536  # tiny gpt2's embedding, 1024 x 64


def make_plan(*, world_size: int = 8, nodes: int = 1, precision: str = "bf16", buckets: dict | None = None,
              global_batch_size: int | None = None, **strategy) -> Plan:
    """A Plan with every required field; ``strategy`` overrides Strategy fields (ZeRO-2, mb 2 x 4 by default)."""
    s = dict(engine="deepspeed", zero_stage=2, fsdp_reshard_after_forward=None, offload_optimizer="none",
             offload_params="none", micro_batch_size=2, grad_accum_steps=4, activation_checkpointing=False)
    s.update(strategy)
    if s["engine"] == "fsdp":  # FSDP plans carry no ZeRO stage; full shard over all ranks unless told otherwise
        s["zero_stage"] = strategy.get("zero_stage")
        s["fsdp_reshard_after_forward"] = strategy.get("fsdp_reshard_after_forward", True)
        s["fsdp_sharding"] = strategy.get("fsdp_sharding", "full")
    if s["engine"] == "plain":  # no stage; one rank has no wrapper, more are DDP replicas
        s["zero_stage"] = None
        s["ddp"] = world_size > 1
    gbs = (global_batch_size if global_batch_size is not None
           else s["micro_batch_size"] * s["grad_accum_steps"] * world_size)
    return Plan(
        strategy=Strategy.from_json(s),
        estimate=Estimate(breakdown={"params": 1}, peak_bytes=1 << 30, host_bytes_per_node=0, nvme_bytes_per_node=0,
                          step_time_s=1.0),
        buckets=Buckets(**(buckets or BUCKETS)),
        num_params=200_000, trainable_params=200_000, budget_bytes=16 << 30, usable_bytes=15 << 30,
        world_size=world_size, nodes=nodes, gpus_per_node=world_size // nodes, global_batch_size=gbs, seq_len=128,
        precision=precision, hardware="a100-80gb",
    )


def make_job(**over) -> Job:
    """A Job with the tiny inline gpt2; ``over`` maps dotted keys ("train.lr") to values."""
    d = {
        "name": "emit",
        "model": copy.deepcopy(TINY_GPT2),
        "task": "causal_lm",
        "data": {"path": "data.jsonl"},
        "train": {"global_batch_size": 64, "lr": 3e-4, "weight_decay": 0.01, "warmup_steps": 10, "max_steps": 100},
        "cluster": {"nvme_path": "/local_nvme/ds"},
    }
    for dotted, value in over.items():
        set_dotted(d, dotted, value)
    return from_dict(Job, d)


def check_golden(name: str, text: str) -> None:
    """Compare ``text`` with golden/<name>; a missing golden is written and the test fails (so never passes unseen)."""
    path = GOLDEN_DIR / name
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        pytest.fail(f"golden written, rerun: {path} (review it before committing)")
    golden = path.read_text()
    if text != golden:
        diff = "".join(difflib.unified_diff(golden.splitlines(True), text.splitlines(True), str(path), "emitted"))
        pytest.fail(f"{name} differs from its golden; if the change is intended, delete {path} and rerun\n{diff}")


def json_text(d: dict) -> str:
    return json.dumps(d, indent=2) + "\n"


def run_ds_check(mode: str, configs: dict[str, dict], *, world_size: int = 1, width: int = 32,
                 timeout_s: int = 900, lora: dict[str, bool] | None = None) -> dict:
    """Run tests/emit/ds_check.py in a fresh interpreter; name -> {"ok": ..., ...}; ``lora``: the configs whose
    model trains peft adapters, each with peft's default fp32 adapters (True) or in the base's dtype (False)."""
    req = json.dumps({"mode": mode, "world_size": world_size, "width": width, "configs": configs,
                      "lora": lora or {}})
    proc = subprocess.run([sys.executable, str(DS_CHECK)], input=req, capture_output=True, text=True,
                          timeout=timeout_s)
    last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    if proc.returncode != 0 or not last.startswith("{"):
        raise AssertionError(f"ds_check.py {mode} failed (rc {proc.returncode}):\n{proc.stdout[-3000:]}\n"
                             f"{proc.stderr[-3000:]}")
    return json.loads(last)
