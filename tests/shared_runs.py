"""Launches that several test modules assert on, each run once per session (conftest imports the fixtures): a
launch costs its start-up, ~15 s of CPU on 2 cores (docs/testing.md), whatever it checks."""

from __future__ import annotations

from pathlib import Path

import pytest

CURVE_TRAIN = {"global_batch_size": 8, "precision": "fp32", "lr": 3e-3, "max_steps": 6, "seed": 7,
               "weight_decay": 0.01, "warmup_steps": 2, "max_grad_norm": 0.05}
"""The step contract's seeded job (tests/worker/test_step_contract.py): max_grad_norm far below the tiny GPT-2's
gradient norm (about 1 to 5 at these steps), so every step clips."""
CURVE_PINS = {"micro_batch_size": 2, "activation_checkpointing": False, "offload_optimizer": "none",
              "offload_params": "none"}
"""2 micro-batches of 2 per rank: accumulation is part of the math."""
CURVE_ENGINES = {"zero2": {"engine": "deepspeed", "zero_stage": 2, "loss_chunks": 0},
                 "fsdp2": {"engine": "fsdp", "fsdp_reshard_after_forward": True, "loss_chunks": 3},
                 "ddp": {"engine": "plain", "loss_chunks": 0}}
"""FSDP2 computes its loss in 3 chunks (launcher.model.chunked_loss, exact: the same curve as ZeRO-2's whole logits),
through its unsharded root unit."""


@pytest.fixture(scope="session")
def curve_runs(tmp_path_factory) -> Path:
    """The seeded job on ZeRO-2, FSDP2 and the plain engine's DDP replicas, one launch each: the step contract's loss
    curves, and the DDP run's memory against its prediction and its export (tests/cli/test_plain_cli.py), for which
    it runs under a budget near its prediction. RUN/<name> for each name of CURVE_ENGINES."""
    from tests.cli.test_run_cli import job_file, launch, near_budget

    root = tmp_path_factory.mktemp("curves")
    for name, strategy in CURVE_ENGINES.items():
        job = job_file(root, name, strategy={**strategy, **CURVE_PINS}, train=CURVE_TRAIN)
        if strategy["engine"] == "plain":
            near_budget(job)
        res = launch(job, "--run-dir", root / name, "--quiet")
        assert res.returncode == 0, res.stdout + res.stderr
    return root
