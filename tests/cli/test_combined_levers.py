"""Levers combined as practitioners combine them, on real gloo ranks through the `launch` CLI (issue 37 §3)."""

import json

import pytest

from tests.cli.test_run_cli import check_report, job_file, launch, near_budget
from tests.conftest import REPO, TINY_GPT2

pytestmark = pytest.mark.slow


def test_fsdp_single_device_stack_steps_low_bit_adamw_in_backward_under_pure_bf16(tmp_path):
    """torchtune's low-memory recipe's levers at once (pure bf16, full checkpointing, chunked loss, the step in
    backward, activation offload, 8-bit AdamW): one torchao AdamW8bit per parameter, stepped stochastically rounded
    in its gradient hook; within the one-sided memory check (check_report)."""
    # Big enough that the first eager torchao step's one-time heap growth (7.1 MB of torch.compile's machinery,
    # now inside the first backward) stays within check_heap's allowance for what is no tensor.
    job = near_budget(job_file(
        tmp_path, "stack", model={**TINY_GPT2, "hidden_size": 256, "vocab_size": 8192},
        data={"path": str(REPO / "examples" / "data" / "causal.jsonl"), "max_seq_len": 64},
        train={"global_batch_size": 4, "precision": "bf16", "lr": 1e-2, "max_steps": 4, "max_grad_norm": 0,
               "allow_levers": ["pure_bf16", "adamw8bit"]},
        strategy={"engine": "fsdp", "micro_batch_size": 2, "pure_bf16": True, "activation_checkpointing": True,
                  "loss_chunks": 8, "optimizer_in_backward": True, "activation_offload": True,
                  "low_memory_optimizer": "adamw8bit"}))
    res = launch(job, "--run-dir", tmp_path / "run", "--quiet")
    assert res.returncode == 0, res.stdout + res.stderr
    plan = json.loads((tmp_path / "run" / "plan.json").read_text())
    assert (plan["optimizer_in_backward"], plan["low_memory_optimizer"], plan["pure_bf16"], plan["loss_chunks"],
            plan["activation_offload"], plan["grad_accum_steps"]) == (True, "adamw8bit", True, 8, True, 1)
    # The plan counts 8-bit moments (1 byte each, an fp32 scale per 256) for the shards torchao quantizes, far below
    # pure bf16's own AdamW's 2 + 2 bytes per parameter (the ranks' tracker follows no optimizer with the step in
    # backward: tests/worker/test_low_memory_optimizers.py checks the optimizers the hooks step).
    assert 0 < plan["breakdown"]["optimizer"] < 0.75 * 4 * plan["trainable_params"] / 2
    check_report(tmp_path / "run", 2)
