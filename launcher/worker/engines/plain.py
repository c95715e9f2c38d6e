"""The plain engine: the model as it is on one rank, whole replicas under torch DDP on several.

Precision: at bf16/fp16 every parameter is cast to the working dtype and the optimizer steps fp32 master copies of
the trainable ones (taken from the fp32 build before the cast), whose updates are copied back after each step:
the arithmetic of FSDP2's MixedPrecisionPolicy (compute in the working dtype, an fp32 optimizer) without its
sharding. Pure bf16 steps the bf16 parameters themselves (Adam/AdamW rounding stochastically with the same bits on
every replica, so replicas stay equal); fp32 steps the parameters.

DDP (several ranks): gradient_as_bucket_view=True, so the gradients are views of its 25 MiB all-reduce buckets
(torch/nn/parallel/distributed.py: "the saved memory size will be equal to the total gradients size"); the
micro-steps before an accumulation boundary run under no_sync (the gradients accumulate in the buckets, one
all-reduce per optimizer step). Rank 0 builds the model and the others receive it (launcher.worker.loading), so
DDP's own start-up broadcast is skipped (init_sync=False). After the all-reduce every replica holds the same
gradients: the local norm is the global one.

Levers: activation checkpointing is transformers' (every k-th block, the op policy); the chunked loss and
activation offload are the model's and the loop's; QLoRA's NF4 base (one rank: launcher.worker.qlora); the
optimizer step in backward (one rank) steps each parameter from its post-accumulate-grad hook.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from launcher.config.job import TrainConfig
from launcher.errors import ConfigError
from launcher.planner.plan import Plan
from launcher.worker.engines.base import (
    WORK_DTYPES,
    OwnOptimizer,
    build_optimizer,
    clip_setting,
    lr_lambda,
    step_lever_problem,
)

CKPT_FILE = "plain.pt"
"""The checkpoint file under root/tag: rank 0's model, masters, optimizer(s), schedule and micro-batch count."""


class PlainEngine(OwnOptimizer):
    """The rank side of the plain engine: no wrapper on one rank, DDP on several, behind the step contract."""

    name = "plain"

    @classmethod
    def from_plan(cls, plan: Plan, run_dir: Path, device: torch.device) -> PlainEngine:
        """The engine for a plain plan, from its strategy, precision and levers (plan.json holds them all)."""
        s = plan.strategy
        return cls(precision=plan.precision, grad_accum_steps=s.grad_accum_steps, device=device,
                   activation_checkpointing=s.activation_checkpointing, checkpoint_every=s.checkpoint_every,
                   checkpoint_policy=s.checkpoint_policy, pure_bf16=s.pure_bf16, qlora=s.qlora,
                   optimizer_in_backward=s.optimizer_in_backward, low_memory_optimizer=s.low_memory_optimizer)

    @staticmethod
    def checkpoint_problem(tag_dir: Path, plan: Plan, world_size: int) -> str | None:
        """plain.pt present and a whole torch.save file (launcher.worker.ckpt_check.torch_file_problem)."""
        from launcher.worker.ckpt_check import torch_file_problem

        path = tag_dir / CKPT_FILE
        return torch_file_problem(path) if path.is_file() else f"{CKPT_FILE} is missing"

    @staticmethod
    def read_checkpoint(root: Path, tag: str, plan: Plan) -> dict[str, torch.Tensor]:
        """The model's state dict from root/tag/plain.pt, on the host (`launch export`; the optimizer not read)."""
        # Our own run dir's file, as DeepSpeed's module file is read: it holds torchao's optimizer states too.
        return torch.load(root / tag / CKPT_FILE, map_location="cpu", weights_only=False, mmap=True)["model"]

    def __init__(self, *, precision: str, grad_accum_steps: int, device: torch.device,
                 activation_checkpointing: bool = False, checkpoint_every: int = 1, checkpoint_policy: str = "full",
                 pure_bf16: bool = False, qlora: bool = False, optimizer_in_backward: bool = False,
                 low_memory_optimizer: str = "none"):
        step_lever_problem(precision=precision, grad_accum_steps=grad_accum_steps,
                           optimizer_in_backward=optimizer_in_backward, pure_bf16=pure_bf16)
        self.precision = precision
        self.grad_accum_steps = grad_accum_steps
        self.device = device
        self.hf_checkpointing = activation_checkpointing
        """transformers' gradient checkpointing (every k-th block, the op policy) at build: the plain engine has no
        block wrapper of its own."""
        self.checkpoint_every = checkpoint_every
        self.checkpoint_policy = checkpoint_policy
        self.pure_bf16 = pure_bf16
        self.qlora = qlora
        self.optimizer_in_backward = optimizer_in_backward
        self.low_memory_optimizer = low_memory_optimizer
        self.work_dtype = WORK_DTYPES.get(precision)
        self.masters: list[torch.Tensor] = []
        """fp32 copies of the trainable parameters the optimizer steps (bf16/fp16 without pure bf16), else none."""
        self.params: list[nn.Parameter] = []
        """The trainable parameters, in the masters' order."""
        self.optimizers: list[torch.optim.Optimizer] = []
        self.schedulers: list[torch.optim.lr_scheduler.LRScheduler] = []
        self.micro = 0
        self.scaler = None
        self.max_grad_norm = 0.0
        self._grad_norm: torch.Tensor | None = None
        self.module: nn.Module | None = None
        """The model itself (DDP's .module)."""
        self.rank0_load = False

    def before_build(self) -> None:
        """Settle rank0_load: on several ranks rank 0 alone builds and the others receive the weights."""
        from launcher.worker.loading import loads_on_rank0_only

        self.rank0_load = loads_on_rank0_only()

    @property
    def world(self) -> int:
        """The ranks the model is replicated over."""
        return dist.get_world_size() if dist.is_initialized() else 1

    def setup(self, model: nn.Module, train: TrainConfig, probe) -> None:
        """QLoRA's NF4 base, the fp32 masters, the cast to the working dtype, the move to the device (from rank 0 on
        several ranks), DDP there, then the optimizer(s), schedule and fp16 scaler."""
        from launcher.worker.loading import broadcast_from_rank0, keeping_ties

        if self.qlora:
            self._quantize(model)
        trainable = [p for p in model.parameters() if p.requires_grad]
        mixed = self.work_dtype is not None and not self.pure_bf16
        dtype = torch.bfloat16 if self.pure_bf16 else self.work_dtype
        if mixed:
            # From the fp32 build, before the cast: the masters keep every bit (the receiving ranks get rank 0's).
            self.masters = [torch.empty(p.shape, dtype=torch.float32, device=self.device) if p.is_meta
                            else p.detach().to(self.device, torch.float32, copy=True) for p in trainable]
            if self.rank0_load:
                for m in self.masters:
                    dist.broadcast(m, src=0)
        if dtype is not None:
            # Parameters only, in place so tied weights stay tied; buffers (rotary frequencies) keep their dtype.
            for p in model.parameters():
                if p.is_floating_point() and not hasattr(p, "get_original_weight"):
                    p.data = p.data.to(dtype)
        if self.rank0_load:
            model = broadcast_from_rank0(model, self.device)
        else:
            model = keeping_ties(model, lambda m: m.to(self.device))
        self.module = model
        self.params = trainable = [p for p in model.parameters() if p.requires_grad]
        if self.world > 1:
            from torch.nn.parallel import DistributedDataParallel

            ids = [self.device] if self.device.type == "cuda" else None
            model = DistributedDataParallel(model, device_ids=ids, init_sync=False, broadcast_buffers=False,
                                            gradient_as_bucket_view=True)
        self.model = model
        self.max_grad_norm = clip_setting(train.max_grad_norm)
        stepped = self.masters or trainable
        if self.optimizer_in_backward:
            # One rank (PlainSpec.lever_values): each hook steps its parameter (or master) and drops the gradient.
            self.optimizers_in_backward(trainable, stepped, train, pure_bf16=self.pure_bf16)
        else:
            # Pure bf16 rounds with the same bits on every replica (salt 0), so the replicas stay equal.
            self.optimizer = build_optimizer(train, stepped, self.low_memory_optimizer, pure_bf16=self.pure_bf16)
            self.optimizers = [self.optimizer]
            self.schedulers = [torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(train.warmup_steps))]
        if self.precision == "fp16":
            self.scaler = torch.amp.GradScaler("cuda")  # fp16 runs only on CUDA (the worker refuses it on CPU)
        probe.track(self.module, self.optimizers[0], optimizer=self.masters)

    def _quantize(self, model: nn.Module) -> None:
        """QLoRA on one rank: each block's frozen linears to NF4, from the rank's own fp32 build."""
        from launcher.model.introspect import find_blocks
        from launcher.worker.qlora import nf4_targets, quantize

        if self.world > 1:
            raise ConfigError("strategy.qlora: the plain engine keeps QLoRA's NF4 base on one rank; use engine: "
                              "fsdp for QLoRA on several ranks, or gpus: 1")
        _, blocks = find_blocks(model, fix="QLoRA quantizes each block's linears; use engine: fsdp for this model")
        dtype = torch.bfloat16 if self.pure_bf16 else (self.work_dtype or torch.float32)
        for targets in nf4_targets(model, blocks, 1):
            quantize(targets, {}, from_rank0=False, dtype=dtype, comm_device=self.device, device=self.device)

    def backward(self, loss: torch.Tensor) -> None:
        """Backward of loss / grad_accum_steps, loss-scaled under fp16; DDP reduces only at the boundary."""
        boundary = (self.micro + 1) % self.grad_accum_steps == 0
        with self.model.no_sync() if self.world > 1 and not boundary else contextlib.nullcontext():
            self.scaled(loss).backward()

    def optimizer_step(self) -> None:
        """The masters' fp32 gradients, then unscale, clip, step, zero-grad and the masters copied back."""
        if self.masters:
            # Every master's fp32 gradient first, then the working ones dropped (the plan counts both at once).
            for p, m in zip(self.params, self.masters, strict=True):
                m.grad = None if p.grad is None else p.grad.float()
            for p in self.params:
                p.grad = None
        # After DDP's all-reduce every replica holds the same gradients: no group to sum over.
        self.clip_and_step(self.masters or self.params, None, self.device)
        with torch.no_grad():
            for p, m in zip(self.params, self.masters, strict=False):
                p.copy_(m)
        for p in self.params:
            p.grad = None

    def gather_weights(self, dtype: torch.dtype, adapter_only: bool) -> dict[str, torch.Tensor] | None:
        """Rank 0's replica copied to its host in ``dtype`` (None elsewhere); adapter_only: the trainable tensors."""
        from launcher.worker.export import gather_replicated

        return gather_replicated(self.module, dtype, adapter_only)

    def save(self, root: Path, tag: str) -> None:
        """Rank 0 writes root/tag/plain.pt (the replicas are equal): model, masters, optimizer(s), schedule and
        micro-batch count."""
        if dist.is_initialized() and dist.get_rank() != 0:
            return
        (root / tag).mkdir(parents=True, exist_ok=True)
        torch.save({"model": self.module.state_dict(), "masters": self.masters,
                    "optimizers": [opt.state_dict() for opt in self.optimizers],
                    "scheduler": self.schedulers[0].state_dict(), "micro": self.micro}, root / tag / CKPT_FILE)

    def load(self, root: Path, tag: str) -> None:
        """Load what save wrote under root/tag onto this rank's device."""
        # Our own run dir's file (torchao's optimizer states are tensor subclasses weights_only refuses). Mapped on
        # the host and copied into the rank's own tensors one at a time (the optimizers move their state to their
        # parameters' device): never a second copy of the model on the device, which the plan does not count.
        state = torch.load(root / tag / CKPT_FILE, map_location="cpu", weights_only=False, mmap=True)
        trainable = {n for n, p in self.module.named_parameters() if p.requires_grad}
        own, params = self.module.state_dict(), dict(self.module.named_parameters())
        with torch.no_grad():
            for name, value in state["model"].items():
                # The frozen base (QLoRA's NF4 among it) is rebuilt as it was; the trained tensors and buffers load.
                if name in trainable or name not in params:
                    own[name].copy_(value)
            for m, saved in zip(self.masters, state["masters"], strict=True):
                m.copy_(saved)
        for opt, sd in zip(self.optimizers, state["optimizers"], strict=True):
            opt.load_state_dict(sd)
        for sched in self.schedulers:
            sched.load_state_dict(state["scheduler"])
        self.micro = int(state["micro"])
