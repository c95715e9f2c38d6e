"""The training loop reads no tensor on the host per micro-batch: losses are reduced only on log steps."""

import collections
import json
import sys

import pytest
import torch

from launcher.processes.rankenv import RUN_DIR_ENV
from launcher.runtime import read_jsonl
from launcher.worker.main import main
from tests.worker.run_dirs import plan_dict, tiny_gpt2_job

HOST_READS = ("item", "tolist", "__float__", "__int__", "__bool__")
"""Tensor methods that copy a value to the host: on a GPU each one waits for the device to finish."""


@pytest.fixture
def host_reads(monkeypatch):
    """Counts host reads made by launcher/worker/loop.py, by the loop function that made them."""
    reads = collections.Counter()

    def counting(name):
        orig = getattr(torch.Tensor, name)

        def read(self, *args, **kwargs):
            caller = sys._getframe(1).f_code
            if caller.co_filename.endswith("launcher/worker/loop.py"):
                reads[caller.co_name] += 1
            return orig(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, read)

    for name in HOST_READS:
        counting(name)
    return reads


def test_loss_is_read_on_log_steps_only(make_run_dir, examples_data, single_rank, monkeypatch, host_reads):
    monkeypatch.setenv(RUN_DIR_ENV, "")
    monkeypatch.setenv("LAUNCHER_PLAN", "")
    plan = plan_dict(engine="fsdp", micro_batch_size=2, grad_accum_steps=2, world_size=1, seq_len=32)
    job = tiny_gpt2_job(str(examples_data / "causal.jsonl"), max_steps=7, log_every_steps=3)
    job["data"]["max_seq_len"] = 32
    job["data"]["eval_fraction"] = 0.02  # one eval batch
    job["train"]["global_batch_size"] = 4
    run = make_run_dir(job, plan)
    assert main([str(run)]) == 0
    rows = read_jsonl(run / "steps" / "rank-0.jsonl")
    # Every step has its line; loss, tokens/s and the clip norm only the first, every 3rd and the last.
    assert [r["step"] for r in rows] == list(range(1, 8))
    logged = [r["step"] for r in rows if "loss" in r]
    assert logged == [1, 3, 6, 7]
    assert logged == [r["step"] for r in rows if "tokens_per_s" in r] == [r["step"] for r in rows if "grad_norm" in r]
    # 14 micro-batches and 2 evaluations, but the loop read values only at the 4 log steps: the clip norm in
    # _run, the reduced loss and tokens in _global_mean (once per log step and once per evaluation).
    assert host_reads["_run"] == 4, host_reads
    assert host_reads["_global_mean"] == 4 + 2, host_reads
    assert host_reads["evaluate"] == 0, host_reads
    report = json.loads((run / "ranks" / "rank-0.json").read_text())
    assert report["first_loss"] == rows[0]["loss"] and report["final_loss"] == rows[-1]["loss"]
