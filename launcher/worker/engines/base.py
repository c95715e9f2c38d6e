"""What every engine offers the training loop, and the optimizer/LR schedule they share."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import torch

from launcher.config.job import TrainConfig

WORK_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
"""The 16-bit working dtypes by plan precision (fp32 has none: nothing is cast)."""


class Engine(Protocol):
    name: str
    hf_checkpointing: bool
    """Activation checkpointing is left to transformers (True) or applied by the engine (False)."""
    broadcasts_weights: bool
    """The loop broadcasts rank 0's built weights before setup (True) or setup scatters them (False)."""
    builds_partitioned: bool
    """Every rank builds its own part of the model (ZeRO-3's zero.Init): no rank-0-only load."""
    model: torch.nn.Module
    """The module to call for forward passes (an engine wrapper or the sharded model)."""

    def setup(self, model: torch.nn.Module, train: TrainConfig, probe) -> None: ...

    def forward(self, **inputs): ...

    def backward(self, loss: torch.Tensor) -> None: ...

    def step(self) -> bool:
        """Finish one micro-batch; at an accumulation boundary step the optimizer and return True."""
        ...

    def lr(self) -> float: ...

    def save(self, root: Path, tag: str) -> None: ...

    def load(self, root: Path, tag: str) -> None: ...


def lr_lambda(warmup_steps: int):
    """Linear warm-up over ``warmup_steps`` optimizer steps, then constant at the peak lr.

    Constant (no decay) keeps the schedule a function of the step alone, so resumed runs
    and runs of any length see the same lr at the same step.
    """

    def factor(step: int) -> float:
        if warmup_steps <= 0:
            return 1.0
        return min(1.0, (step + 1) / (warmup_steps + 1))

    return factor


def build_optimizer(train: TrainConfig, params) -> torch.optim.Optimizer:
    """The job's optimizer over ``params``; foreach=False so no multi-tensor temporaries inflate the peak."""
    params = list(params)
    if train.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=train.lr, weight_decay=train.weight_decay, foreach=False)
    if train.optimizer == "adam":
        return torch.optim.Adam(params, lr=train.lr, weight_decay=train.weight_decay, foreach=False)
    return torch.optim.SGD(params, lr=train.lr, weight_decay=train.weight_decay, foreach=False)
