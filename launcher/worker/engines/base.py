"""What every engine offers the training loop, the step contract they all follow, and what they share.

The step contract, the same for every engine, so one job trains the same math whichever engine the plan picked:

  forward     ``forward(**batch)``: the model's output; the recipe takes the mean loss of the micro-batch.
  backward    ``backward(loss)``: gradients of loss / grad_accum_steps (times the loss scale under fp16), so the
              accumulated gradient is the mean over micro-batches; ranks average theirs (data parallel).
  step        ``step()`` after every micro-batch; at the accumulation boundary, in this order: unscale (fp16),
              clip to ``train.max_grad_norm`` (the global L2 norm over every rank and shard; 0 or None: off),
              the optimizer step (skipped on fp16 overflow), the scheduler step, zero-grad. Returns True there.
  grad_norm   ``grad_norm()``: the norm clipping measured at the last boundary, before clipping (a tensor or a
              float, read by the loop only on log steps); None while clipping is off.

The model build is the engine's decision too: ``before_build`` sets ``rank0_load`` (rank 0 builds the real model
and the others a meta one, launcher.worker.loading) and ``hf_checkpointing`` says whether transformers' own
gradient checkpointing is switched on at build; ``setup`` then receives the built model.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Protocol

import torch
import torch.distributed as dist

from launcher.config.job import TrainConfig
from launcher.errors import ConfigError
from launcher.levers.optimizer_in_backward import IN_BACKWARD_REFUSED

WORK_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
"""The 16-bit working dtypes by plan precision (fp32 has none: nothing is cast)."""

ADAM_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8
"""torch's AdamW defaults, written out so the worker's optimizer and DeepSpeed's (launcher.engines.deepspeed.emit, which
writes the same numbers into ds_config.json) cannot drift apart; tests/worker/test_step_contract.py checks both."""

CLIP_EPS = 1e-6
"""Added to the norm in the clip coefficient max_norm / (norm + eps): torch's clip_grad_norm_ and DeepSpeed's
ZeRO use the same 1e-6."""


class Engine(Protocol):
    """The interface the training loop drives every engine through (the step contract above); DeepSpeedEngine and
    FsdpEngine implement it."""

    name: str
    model: torch.nn.Module
    """The module to call for forward passes (an engine wrapper or the sharded model)."""
    rank0_load: bool
    """Set by ``before_build``: rank 0 builds the real model, the others a meta one that ``setup`` fills."""
    hf_checkpointing: bool
    """Switch on transformers' gradient checkpointing at build (engines that wrap blocks themselves say False)."""
    checkpoint_every: int
    """With checkpointing: every k-th block is checkpointed, from the first (launcher.planner.memory.checkpointed)."""
    checkpoint_policy: str
    """With transformers' checkpointing: "full" or "ops" (launcher.model.sac's op policy)."""

    @classmethod
    def from_plan(cls, plan, run_dir: Path, device: torch.device) -> Engine:
        """The engine for ``plan``, reading its own config files from ``run_dir`` (launcher.worker.engines
        .engine_class finds the class by the plan's engine)."""
        ...

    @staticmethod
    def checkpoint_problem(tag_dir: Path, plan, world_size: int) -> str | None:
        """Why the files ``save`` wrote into ``tag_dir`` (by ``world_size`` ranks) would not load, or None: checked
        before `launch export` reads anything whole (launcher.worker.ckpt_check)."""
        ...

    @staticmethod
    def read_checkpoint(root: Path, tag: str, plan) -> dict[str, torch.Tensor]:
        """`launch export`'s reader (launcher.worker.export_offline): the full state dict of the checkpoint this
        engine's ``save`` wrote under root/tag, on the host, in one process without a process group."""
        ...

    @staticmethod
    def init_process_group(backend: str) -> None:
        """Form the process group the way this engine needs it."""
        ...

    def before_build(self) -> None:
        """Called in a formed process group, before the model is built: settles ``rank0_load``."""
        ...

    def setup(self, model: torch.nn.Module, train: TrainConfig, probe) -> None:
        """Take the built model: fill the other ranks where rank 0 alone loaded, wrap or shard it, and build the
        optimizer and schedule from ``train``."""
        ...

    def forward(self, **inputs):
        """The model's output for one micro-batch."""
        ...

    def backward(self, loss: torch.Tensor) -> None:
        """Gradients of loss / grad_accum_steps (loss-scaled under fp16)."""
        ...

    def step(self) -> bool:
        """Finish one micro-batch; at an accumulation boundary clip, step, schedule, zero-grad and return True."""
        ...

    def grad_norm(self) -> torch.Tensor | float | None:
        """The pre-clip global gradient norm of the last optimizer step; None when clipping is off."""
        ...

    def train(self, mode: bool = True) -> None:
        """Switch the model to training (True) or evaluation (False) mode."""
        ...

    def lr(self) -> float:
        """The current learning rate."""
        ...

    def gather_weights(self, dtype: torch.dtype, adapter_only: bool) -> dict[str, torch.Tensor] | None:
        """The trained weights in ``dtype`` on rank 0's host, None on the other ranks (collective: every rank
        calls it); ``adapter_only``: the trainable tensors alone. The export (launcher.worker.export) writes them."""
        ...

    def save(self, root: Path, tag: str) -> None:
        """Save this rank's part of the engine's state (model, optimizer, schedule) under root/tag."""
        ...

    def load(self, root: Path, tag: str) -> None:
        """Load what save wrote under root/tag."""
        ...


def clip_grad_norm(params, max_norm: float, group, comm_device: torch.device) -> torch.Tensor:
    """Clip the gradients of ``params`` (FSDP2's DTensor shards, or plain tensors) to a global L2 norm of
    ``max_norm``; returns the norm before.

    Under FSDP2 each rank holds a shard of every gradient (on the host under CPU offload): the squared norms of the
    local shards are summed over ``group``, the ranks one shard each of the whole (under HSDP the shard group: the
    replicas hold the same reduced gradients); ``group`` None: the local gradients are the whole (one rank, or DDP's
    all-reduced replicas). The coefficient is torch's and DeepSpeed's:
    min(1, max_norm / (norm + 1e-6)). The all-reduce runs on ``comm_device`` (the device under NCCL, the host under
    gloo), so host-resident shards work with either backend.
    """
    from torch.distributed.tensor import DTensor

    grads = [p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad for p in params if p.grad is not None]
    sq = torch.zeros((), dtype=torch.float32, device=comm_device)
    for g in grads:
        sq += torch.linalg.vector_norm(g, dtype=torch.float32).square().to(comm_device)
    if group is not None and dist.get_world_size(group) > 1:
        dist.all_reduce(sq, group=group)
    norm = sq.sqrt()
    coef = torch.clamp(max_norm / (norm + CLIP_EPS), max=1.0)
    on = {}  # one copy of the coefficient per device: host shards under offload must not copy it once per tensor
    for g in grads:
        if g.device not in on:
            on[g.device] = coef.to(g.device)
        g.mul_(on[g.device])
    return norm


def step_lever_problem(*, precision: str, grad_accum_steps: int, optimizer_in_backward: bool,
                       pure_bf16: bool) -> None:
    """Raise ConfigError where the plan's step levers cannot run as planned: the step in backward with accumulation
    or fp16, pure bf16 without bf16 (the engines that step their own optimizer check this in their __init__)."""
    from launcher.errors import ConfigError

    if optimizer_in_backward and grad_accum_steps != 1:
        raise ConfigError(
            f"strategy.optimizer_in_backward: the step in backward needs grad_accum_steps 1 (it steps as each "
            f"gradient is made), but this plan accumulates {grad_accum_steps}; re-plan, or leave "
            "optimizer_in_backward out"
        )
    if optimizer_in_backward and precision == "fp16":
        raise ConfigError(
            "strategy.optimizer_in_backward: fp16 needs loss scaling, which checks every gradient for overflow "
            "before any step; use precision bf16 or fp32, or leave optimizer_in_backward out"
        )
    if pure_bf16 and precision != "bf16":
        raise ConfigError(f"strategy.pure_bf16: needs train.precision 'bf16', not {precision!r}; set "
                          "train.precision: bf16 or pure_bf16: false")


def clip_setting(max_grad_norm: float | None) -> float:
    """The job's ``train.max_grad_norm`` as one number: 0.0 means clipping is off."""
    return float(max_grad_norm or 0.0)


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


def build_optimizer(train: TrainConfig, params, low_memory: str = "none", *,
                    pure_bf16: bool = False, salt: int = 0) -> torch.optim.Optimizer:
    """The job's optimizer over ``params``; foreach=False so no multi-tensor temporaries inflate the peak.

    ``low_memory``: the plan's Strategy.low_memory_optimizer, in place of train.optimizer when not "none"
    (launcher.worker.engines.optimizers). ``pure_bf16``: the plan's Strategy.pure_bf16, whose Adam and AdamW
    round the bf16 weights stochastically (optimizers.stochastic_round_adam; ``salt``: this optimizer's index
    among one-parameter optimizers, so theirs draw different rounding bits), as do the low-bit AdamWs
    (optimizers.low_memory_optimizer with ``stochastic_round``)."""
    params = list(params)
    if low_memory != "none":
        from launcher.worker.engines.optimizers import low_memory_optimizer

        return low_memory_optimizer(low_memory, train, params, betas=ADAM_BETAS, eps=ADAM_EPS,
                                    stochastic_round=pure_bf16, salt=salt)
    if pure_bf16 and train.optimizer in ("adam", "adamw"):
        from launcher.worker.engines.optimizers import stochastic_round_adam

        return stochastic_round_adam(train, params, betas=ADAM_BETAS, eps=ADAM_EPS, salt=salt)
    if train.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=train.lr, betas=ADAM_BETAS, eps=ADAM_EPS, weight_decay=train.weight_decay,
                                 foreach=False)
    if train.optimizer == "adam":
        return torch.optim.Adam(params, lr=train.lr, betas=ADAM_BETAS, eps=ADAM_EPS, weight_decay=train.weight_decay,
                                foreach=False)
    return torch.optim.SGD(params, lr=train.lr, weight_decay=train.weight_decay, foreach=False)


class OwnOptimizer:
    """What the engines that build and step their own optimizers share (FsdpEngine, PlainEngine; DeepSpeed steps
    its own): the process group, the pre-clip norm, train mode, the lr, and the step in backward's optimizers."""

    max_grad_norm: float = 0.0
    _grad_norm: torch.Tensor | None = None
    model: torch.nn.Module
    optimizers: list[torch.optim.Optimizer]
    schedulers: list[torch.optim.lr_scheduler.LRScheduler]

    micro: int = 0
    grad_accum_steps: int = 1
    optimizer_in_backward: bool = False
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler | None = None

    @staticmethod
    def init_process_group(backend: str) -> None:
        """Form the default process group with ``backend`` unless one exists."""
        if not dist.is_initialized():
            dist.init_process_group(backend=backend)

    def forward(self, **inputs):
        """The (wrapped) model's forward on one micro-batch."""
        return self.model(**inputs)

    def scaled(self, loss: torch.Tensor) -> torch.Tensor:
        """loss / grad_accum_steps, loss-scaled under fp16: what backward differentiates."""
        loss = loss / self.grad_accum_steps
        return self.scaler.scale(loss) if self.scaler is not None else loss

    def step(self) -> bool:
        """Count the micro-batch; at the accumulation boundary the engine's optimizer_step (none with the step in
        backward, which stepped every parameter already), then the schedules; True there."""
        self.micro += 1
        if self.micro % self.grad_accum_steps:
            return False
        if not self.optimizer_in_backward:
            self.optimizer_step()
        for sched in self.schedulers:
            sched.step()
        return True

    def optimizer_step(self) -> None:
        """The accumulation boundary's step (the engine's)."""
        raise NotImplementedError

    def clip_and_step(self, params: list[torch.Tensor], group, comm_device: torch.device) -> None:
        """Unscale (fp16), clip ``params``' gradients to train.max_grad_norm over ``group`` (clip_grad_norm), step
        the optimizer (skipped on fp16 overflow) and zero-grad."""
        if self.max_grad_norm > 0:
            if self.scaler is not None:
                self.scaler.unscale_(self.optimizer)  # clip the true gradients, not the scaled ones
            self._grad_norm = clip_grad_norm(params, self.max_grad_norm, group, comm_device)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def grad_norm(self) -> torch.Tensor | None:
        """The pre-clip global norm of the last step; None while clipping is off."""
        return self._grad_norm if self.max_grad_norm > 0 else None

    def train(self, mode: bool = True) -> None:
        """Switch the model to training (True) or evaluation (False) mode."""
        self.model.train(mode)

    def lr(self) -> float:
        """The current learning rate."""
        return float(self.schedulers[0].get_last_lr()[0])

    def optimizers_in_backward(self, params: list[torch.nn.Parameter], stepped: list[torch.Tensor],
                               train: TrainConfig, *, pure_bf16: bool) -> None:
        """One optimizer (and lr schedule) per parameter, stepped and zeroed in the parameter's gradient hook.

        torchtune's optimizer_in_bwd and torch's "fusing the optimizer step into the backward pass" recipe. Each
        optimizer is the plan's (the job's, or its 8-/4-bit AdamW, stochastically rounded under pure bf16, as
        torchtune's low-memory recipe pairs them), built by build_optimizer, over ``stepped``: the parameter itself, or
        its fp32 master, which gets the gradient in fp32 and whose update is copied back. Each schedule is the same
        warm-up: the per-parameter math is the one-optimizer math, less the global-norm clip, which needs every gradient
        before any step.
        """
        low_memory = getattr(self, "low_memory_optimizer", "none")
        if low_memory in IN_BACKWARD_REFUSED:
            raise ConfigError(f"strategy.optimizer_in_backward: {low_memory} is not stepped in backward (its sharded "
                              "step all-reduces); re-plan, or pin low_memory_optimizer: adamw8bit or adamw4bit")
        if self.max_grad_norm > 0 and (not dist.is_initialized() or dist.get_rank() == 0):
            print(f"[rank 0] train.max_grad_norm {self.max_grad_norm:g} is not applied: the optimizer steps in "
                  "backward (strategy.optimizer_in_backward), one parameter at a time, so no global norm exists "
                  "to clip to", file=sys.stderr, flush=True)
        self.max_grad_norm = 0.0
        by_param = {}
        for i, (p, target) in enumerate(zip(params, stepped, strict=True)):
            opt = build_optimizer(train, [target], low_memory, pure_bf16=pure_bf16, salt=i)
            by_param[p] = (opt, target)
            self.optimizers.append(opt)
            self.schedulers.append(torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(train.warmup_steps)))

        def step_in_backward(param: torch.Tensor) -> None:
            opt, target = by_param[param]
            if target is not param:
                target.grad = param.grad.float()
                param.grad = None
            opt.step()
            opt.zero_grad(set_to_none=True)  # the gradient goes as soon as it has been used
            if target is not param:
                with torch.no_grad():
                    param.copy_(target)

        for p in params:
            p.register_post_accumulate_grad_hook(step_in_backward)
