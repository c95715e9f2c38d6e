"""FSDP2 (torch.distributed.fsdp.fully_shard): one FSDP unit per transformer block, then the root.

Activation checkpointing wraps each block (non-reentrant), or every checkpoint_every-th one, before it is sharded.
Hybrid sharding (HSDP) passes a 2-D mesh (nodes x ranks per node) to fully_shard, which shards over the
second dimension and all-reduces the shards' gradients over the first.
At the accumulation boundary the gradients are clipped to train.max_grad_norm over their global norm
(clip_grad_norm: every rank's shards, host-resident under CPU offload), as DeepSpeed clips.
Gradients are reduce-scattered after every micro-batch: accumulating unsharded
gradients instead (set_requires_gradient_sync(False)) would hold a full gradient
copy per rank, which the memory plan does not budget for.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from launcher.config.job import FsdpSharding, TrainConfig
from launcher.errors import ConfigError
from launcher.model.introspect import find_blocks
from launcher.planner.memory import checkpointed
from launcher.planner.plan import Plan
from launcher.worker.engines.base import CLIP_EPS, WORK_DTYPES, build_optimizer, clip_setting, lr_lambda


def clip_grad_norm(params, max_norm: float, group, comm_device: torch.device) -> torch.Tensor:
    """Clip the gradients of FSDP2's DTensor ``params`` to a global L2 norm of ``max_norm``; returns the norm before.

    Each rank holds a shard of every gradient (on the host under CPU offload): the squared norms of the local
    shards are summed over ``group``, the ranks one shard each of the whole (under HSDP the shard group: the
    replicas hold the same reduced gradients). The coefficient is torch's and DeepSpeed's:
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


class FsdpEngine:
    name = "fsdp"
    hf_checkpointing = False
    """FSDP wraps each block in checkpoint_wrapper itself (setup)."""

    @classmethod
    def from_plan(cls, plan: Plan, ds_config: dict | None, device: torch.device) -> FsdpEngine:
        s = plan.strategy
        return cls(
            reshard_after_forward=bool(s.fsdp_reshard_after_forward if s.fsdp_reshard_after_forward is not None
                                       else True),
            offload_params=s.offload_params,
            offload_optimizer=s.offload_optimizer,
            activation_checkpointing=s.activation_checkpointing,
            checkpoint_every=s.checkpoint_every,
            precision=plan.precision,
            grad_accum_steps=s.grad_accum_steps,
            device=device,
            sharding=s.fsdp_sharding or "full",
        )

    @staticmethod
    def init_process_group(backend: str) -> None:
        if not dist.is_initialized():
            dist.init_process_group(backend=backend)

    def __init__(
        self,
        *,
        reshard_after_forward: bool,
        offload_params: str,
        offload_optimizer: str,
        activation_checkpointing: bool,
        checkpoint_every: int = 1,
        precision: str,
        grad_accum_steps: int,
        device: torch.device,
        sharding: FsdpSharding = "full",
    ):
        if offload_params == "nvme" or offload_optimizer == "nvme":
            raise ConfigError("strategy: FSDP2 cannot offload to NVMe; use engine: deepspeed with ZeRO-3 for nvme")
        if offload_optimizer != offload_params:
            raise ConfigError(
                f"strategy: FSDP2 offloads parameters, gradients and optimizer states together "
                f"(offload_params={offload_params!r}, offload_optimizer={offload_optimizer!r}); set both to "
                "'cpu' or both to 'none', or use engine: deepspeed to offload the optimizer alone"
            )
        self.reshard_after_forward = reshard_after_forward
        self.offload = offload_params == "cpu"
        self.activation_checkpointing = activation_checkpointing
        self.checkpoint_every = checkpoint_every
        self.precision = precision
        self.grad_accum_steps = grad_accum_steps
        self.device = device
        self.sharding = sharding
        self.micro = 0
        self.scaler = None
        self.max_grad_norm = 0.0
        self.shard_group = None
        self._grad_norm: torch.Tensor | None = None
        self.rank0_load = False
        """Set by before_build: rank 0 holds the real model and the others a meta one (launcher.worker.loading)."""

    def before_build(self) -> None:
        from launcher.worker.loading import loads_on_rank0_only

        self.rank0_load = loads_on_rank0_only()

    def setup(self, model: nn.Module, train: TrainConfig, probe) -> None:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

        from launcher.worker.loading import fill_sharded, rank0_state

        state, buffers = rank0_state(model) if self.rank0_load else ({}, {})
        _, blocks = find_blocks(model, fix="FSDP needs one to shard per block; use engine: deepspeed for this model")
        if self.activation_checkpointing:
            from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper

            for i, block in enumerate(blocks):
                # Every k-th block from the first, the rule the memory model counts (planner.memory.checkpointed).
                if checkpointed(i, self.checkpoint_every):
                    blocks[i] = checkpoint_wrapper(block, checkpoint_impl=CheckpointImpl.NO_REENTRANT)
        shape, dim_names = self.mesh_shape()
        mesh = init_device_mesh(self.device.type, shape, mesh_dim_names=dim_names)
        self.shard_group = mesh.get_group(mesh.ndim - 1)  # the ranks that hold one shard each of every gradient
        dtype = WORK_DTYPES.get(self.precision)
        mp = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32) if dtype else MixedPrecisionPolicy()
        offload = CPUOffloadPolicy(pin_memory=self.device.type == "cuda") if self.offload else OffloadPolicy()
        kw = {"mesh": mesh, "mp_policy": mp, "offload_policy": offload}
        for block in blocks:
            fully_shard(block, reshard_after_forward=self.reshard_after_forward, **kw)
        # The root (embeddings, final norm, head) is never resharded after forward: its pre-backward hook would
        # gather it again at once, holding the all-gather buffer and the unsharded copy together while every
        # activation is saved (measured on MiniLM, whose root is half the model: +2 x 48 MB at the backward start).
        # fully_shard does this itself only when reshard_after_forward is left unset (_fsdp_state.py _lazy_init).
        fully_shard(model, reshard_after_forward=False, **kw)
        if self.rank0_load:
            # Shards allocated where the policy keeps them (host with CPU offload), then filled from rank 0.
            fill_sharded(model, state, buffers, torch.device("cpu") if self.offload else self.device)
            del state, buffers
        self.model = model
        self.max_grad_norm = clip_setting(train.max_grad_norm)
        self.optimizer = build_optimizer(train, (p for p in model.parameters() if p.requires_grad))
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(train.warmup_steps))
        if self.precision == "fp16":
            # fp16 runs only on CUDA (the worker refuses it on CPU); grads need loss scaling.
            self.scaler = torch.amp.GradScaler("cuda")
        probe.use_fsdp_tracker(model, self.optimizer)

    def mesh_shape(self) -> tuple[tuple[int, ...], tuple[str, ...]]:
        """(shape, dimension names) of the device mesh: (world,) or, hybrid, (nodes, ranks per node)."""
        from launcher.emit.fsdp import MESH_DIM_NAMES_FULL, MESH_DIM_NAMES_HYBRID

        world = dist.get_world_size()
        if self.sharding != "hybrid":
            return (world,), MESH_DIM_NAMES_FULL
        # torchrun's ranks per node; the loop has checked it equals the plan's gpus_per_node.
        per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        if world % per_node or world // per_node < 2:
            raise ConfigError(
                f"strategy.fsdp_sharding: 'hybrid' needs 2 or more nodes of equal size, but this run has "
                f"{world} ranks with {per_node} per node; use fsdp_sharding: full or run on more nodes"
            )
        return (world // per_node, per_node), MESH_DIM_NAMES_HYBRID

    def forward(self, **inputs):
        return self.model(**inputs)

    def backward(self, loss: torch.Tensor) -> None:
        loss = loss / self.grad_accum_steps
        if self.scaler is not None:
            loss = self.scaler.scale(loss)
        loss.backward()

    def step(self) -> bool:
        self.micro += 1
        if self.micro % self.grad_accum_steps:
            return False
        if self.max_grad_norm > 0:
            if self.scaler is not None:
                self.scaler.unscale_(self.optimizer)  # clip the true gradients, not the scaled ones
            comm = self.device if dist.get_backend() == "nccl" else torch.device("cpu")
            self._grad_norm = clip_grad_norm(self.optimizer_params(), self.max_grad_norm, self.shard_group, comm)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return True

    def optimizer_params(self) -> list[torch.Tensor]:
        return [p for group in self.optimizer.param_groups for p in group["params"]]

    def grad_norm(self) -> torch.Tensor | None:
        return self._grad_norm if self.max_grad_norm > 0 else None

    def train(self, mode: bool = True) -> None:
        self.model.train(mode)

    def lr(self) -> float:
        return float(self.scheduler.get_last_lr()[0])

    def save(self, root: Path, tag: str) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        state = {"model": model_sd, "optim": optim_sd}
        dcp.save(state, checkpoint_id=str(root / tag / "dcp"))
        if dist.get_rank() == 0:
            torch.save({"scheduler": self.scheduler.state_dict(), "micro": self.micro}, root / tag / "engine.pt")

    def load(self, root: Path, tag: str) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        state = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, checkpoint_id=str(root / tag / "dcp"))
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        extra = torch.load(root / tag / "engine.pt", weights_only=True)
        self.scheduler.load_state_dict(extra["scheduler"])
        self.micro = int(extra["micro"])
