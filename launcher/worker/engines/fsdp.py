"""FSDP2 (torch.distributed.fsdp.fully_shard): one FSDP unit per transformer block, then the root.

Activation checkpointing wraps each block (non-reentrant), or every checkpoint_every-th one, before it is sharded;
with checkpoint_policy "ops" each wrapped block saves the outputs of the ops launcher.model.sac's policy names.
Hybrid sharding (HSDP) passes a 2-D mesh (nodes x ranks per node) to fully_shard, which shards over the
second dimension and all-reduces the shards' gradients over the first.
At the accumulation boundary the gradients are clipped to train.max_grad_norm over their global norm
(clip_grad_norm: every rank's shards, host-resident under CPU offload), as DeepSpeed clips.
Gradients are reduce-scattered after every micro-batch: accumulating unsharded
gradients instead (set_requires_gradient_sync(False)) would hold a full gradient
copy per rank, which the memory plan does not budget for.
With the optimizer step in backward (Strategy.optimizer_in_backward) every trainable parameter has its own optimizer,
stepped from the parameter's post-accumulate-grad hook: FSDP2 calls that hook itself on the sharded DTensor
gradient right after the reduce-scatter (_fsdp_collectives.py foreach_reduce), so each unit's gradients are
consumed and dropped before the next unit's backward. There is no step-time gradient, and no global-norm clipping.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from launcher.config.job import TrainConfig
from launcher.engines.fsdp.layout import FsdpSharding
from launcher.errors import ConfigError
from launcher.levers.checkpoint_every import checkpointed
from launcher.model.introspect import find_blocks
from launcher.planner.plan import Plan
from launcher.worker.engines.base import (
    WORK_DTYPES,
    OwnOptimizer,
    build_optimizer,
    clip_setting,
    lr_lambda,
    step_lever_problem,
)


class FsdpEngine(OwnOptimizer):
    """The rank side of FSDP2: fully_shard per block (and the root) with the plan's sharding, offload, precision and
    levers, the optimizer over the shards, behind the step contract."""

    name = "fsdp"
    hf_checkpointing = False
    """FSDP wraps each block in checkpoint_wrapper itself (setup)."""
    low_memory_optimizer = "none"
    """The plan's Strategy.low_memory_optimizer (set by from_plan): build_optimizer's choice."""

    @classmethod
    def from_plan(cls, plan: Plan, run_dir: Path, device: torch.device) -> FsdpEngine:
        """The engine for an FSDP2 plan, configured from its strategy, precision and levers (plan.json holds them
        all; fsdp.yaml in ``run_dir`` documents the same settings)."""
        s = plan.strategy
        reshard = s.layout.fsdp_reshard_after_forward
        engine = cls(
            reshard_after_forward=bool(reshard if reshard is not None else True),
            offload_params=s.layout.offload_params,
            offload_optimizer=s.layout.offload_optimizer,
            activation_checkpointing=s.activation_checkpointing,
            checkpoint_every=s.checkpoint_every,
            checkpoint_policy=s.checkpoint_policy,
            precision=plan.precision,
            grad_accum_steps=s.grad_accum_steps,
            device=device,
            sharding=s.layout.fsdp_sharding or "full",
            pure_bf16=s.pure_bf16,
            qlora=s.qlora,
            optimizer_in_backward=s.optimizer_in_backward,
        )
        engine.low_memory_optimizer = s.low_memory_optimizer
        return engine

    @staticmethod
    def checkpoint_problem(tag_dir: Path, plan: Plan, world_size: int) -> str | None:
        """The DCP dir's .metadata readable and every shard it indexes whole (launcher.worker.ckpt_check
        .dcp_problem)."""
        from launcher.worker.ckpt_check import dcp_problem

        return dcp_problem(tag_dir / "dcp")

    @staticmethod
    def read_checkpoint(root: Path, tag: str, plan: Plan) -> dict[str, torch.Tensor]:
        """The "model" entries of the DCP dir ``save`` wrote under root/tag (`launch export`; the optimizer state is
        not read), without a process group."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.metadata import TensorStorageMetadata

        reader = dcp.FileSystemReader(str(root / tag / "dcp"))
        meta = reader.read_metadata()
        sd = {k.removeprefix("model."): torch.empty(m.size, dtype=m.properties.dtype)
              for k, m in meta.state_dict_metadata.items()
              if k.startswith("model.") and isinstance(m, TensorStorageMetadata)}
        state = {"model": sd}
        dcp.load(state, storage_reader=reader, no_dist=True)
        return state["model"]

    def __init__(
        self,
        *,
        reshard_after_forward: bool,
        offload_params: str,
        offload_optimizer: str,
        activation_checkpointing: bool,
        checkpoint_every: int = 1,
        checkpoint_policy: str = "full",
        precision: str,
        grad_accum_steps: int,
        device: torch.device,
        sharding: FsdpSharding = "full",
        pure_bf16: bool = False,
        qlora: bool = False,
        optimizer_in_backward: bool = False,
    ):
        step_lever_problem(precision=precision, grad_accum_steps=grad_accum_steps,
                           optimizer_in_backward=optimizer_in_backward, pure_bf16=pure_bf16)
        if offload_params == "nvme" or offload_optimizer == "nvme":
            raise ConfigError("strategy: FSDP2 cannot offload to NVMe; use engine: deepspeed with ZeRO-3 for nvme")
        if offload_optimizer != offload_params:
            raise ConfigError(
                f"strategy: FSDP2 offloads parameters, gradients and optimizer states together "
                f"(offload_params={offload_params!r}, offload_optimizer={offload_optimizer!r}); set both to "
                "'cpu' or both to 'none', or use engine: deepspeed to offload the optimizer alone"
            )
        self.pure_bf16 = pure_bf16
        self.qlora = qlora
        self.reshard_after_forward = reshard_after_forward
        self.offload = offload_params == "cpu"
        self.activation_checkpointing = activation_checkpointing
        self.checkpoint_every = checkpoint_every
        self.checkpoint_policy = checkpoint_policy
        self.precision = precision
        self.grad_accum_steps = grad_accum_steps
        self.device = device
        self.sharding = sharding
        self.optimizer_in_backward = optimizer_in_backward
        self.optimizers: list[torch.optim.Optimizer] = []
        """One optimizer per trainable parameter with the step in backward; otherwise [self.optimizer]."""
        self.schedulers: list[torch.optim.lr_scheduler.LRScheduler] = []
        self.micro = 0
        self.scaler = None
        self.max_grad_norm = 0.0
        self.shard_group = None
        self._grad_norm: torch.Tensor | None = None
        self.rank0_load = False
        """Set by before_build: rank 0 holds the real model and the others a meta one (launcher.worker.loading)."""

    def before_build(self) -> None:
        """Settle rank0_load: whether rank 0 alone loads the weights and the others build on meta."""
        from launcher.worker.loading import loads_on_rank0_only

        self.rank0_load = loads_on_rank0_only()

    def setup(self, model: nn.Module, train: TrainConfig, probe) -> None:
        """Shard the model (checkpoint-wrapped blocks, QLoRA's NF4 weights, offload and mixed-precision policies),
        fill the shards from rank 0 where it alone loaded, and build the optimizer(s), schedule and fp16 scaler."""
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

        from launcher.worker.loading import fill_sharded, rank0_state

        state, buffers = rank0_state(model) if self.rank0_load else ({}, {})
        _, blocks = find_blocks(model, fix="FSDP needs one to shard per block; use engine: deepspeed for this model")
        nf4_targets: list[dict] = [{} for _ in blocks]
        nf4_full = {}
        if self.qlora:  # found by their state-dict names, before checkpoint_wrapper renames the blocks' modules
            from launcher.worker.qlora import nf4_targets as find_nf4

            nf4_targets = find_nf4(model, blocks, self.mesh_shape()[0][-1])
            # Rank 0's full weights for them leave the scatter below; launcher.worker.qlora sends them itself.
            nf4_full = {k: state.pop(k) for t in nf4_targets for k in t if k in state}
        if self.activation_checkpointing:
            from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper

            # The op policy: torch.utils.checkpoint's context_fn, a fresh policy context per checkpointed call.
            extra = {}
            if self.checkpoint_policy == "ops":
                from launcher.model.sac import sac_context

                extra["context_fn"] = sac_context
            for i, block in enumerate(blocks):
                # Every k-th block from the first, the rule the memory model counts (planner.memory.checkpointed).
                if checkpointed(i, self.checkpoint_every):
                    blocks[i] = checkpoint_wrapper(block, checkpoint_impl=CheckpointImpl.NO_REENTRANT, **extra)
        shape, dim_names = self.mesh_shape()
        mesh = init_device_mesh(self.device.type, shape, mesh_dim_names=dim_names)
        self.shard_group = mesh.get_group(mesh.ndim - 1)  # the ranks that hold one shard each of every gradient
        dtype = WORK_DTYPES.get(self.precision)
        if self.pure_bf16:
            # Pure bf16 (LitGPT's "bf16-true"): the sharded parameters themselves are bf16, so gradients are
            # reduced in bf16 and AdamW's states, allocated like the parameter (zeros_like), are bf16 too: no fp32
            # master anywhere. Adam and AdamW round the new weights stochastically (build_optimizer's pure_bf16),
            # so updates under half a bf16 ulp are not lost. Parameters only (buffers such as rotary frequencies keep
            # their dtype), in place so tied weights stay tied; on the meta model rank 0's fp32 state dict is then
            # copied into bf16 shards.
            for p in model.parameters():
                p.data = p.data.to(torch.bfloat16)
            mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)
        elif dtype:
            # Frozen parameters (LoRA's base) are kept in the working dtype: mixed precision would cast their fp32
            # shards to it at every all-gather anyway, so the math is the same, and they need no fp32 master (no
            # gradient, no optimizer step). FSDP2 requires one dtype only among trainable parameters
            # (_fsdp_param_group.py _init_mp_dtypes).
            for p in model.parameters():
                if not p.requires_grad:
                    p.data = p.data.to(dtype)
            mp = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
        else:
            mp = MixedPrecisionPolicy()
        offload = CPUOffloadPolicy(pin_memory=self.device.type == "cuda") if self.offload else OffloadPolicy()
        kw = {"mesh": mesh, "mp_policy": mp, "offload_policy": offload}
        home = torch.device("cpu") if self.offload else self.device
        # QLoRA on a one-rank shard group: FSDP2 skips the all-gather there and copies each parameter's first
        # all-gather input alone (torch _fsdp_param_group.py wait_for_unshard, "if world_size == 1"), which breaks
        # NF4Tensor's three (fsdp_post_all_gather: "expected 3, got 1"; seen on one H100, 2026-11-26). With nothing
        # to shard, the NF4 weights are left out of FSDP2 (ignored_params) and stay whole on the device, offload or
        # not (LinearNF4 computes there); the planner counts them so (launcher.engines.fsdp.nf4_outside_fsdp).
        outside = bool(self.qlora and shape[-1] == 1)
        ignored: set[nn.Parameter] = set()
        for block, targets in zip(blocks, nf4_targets, strict=True):
            if targets:  # QLoRA: this block's frozen linears to NF4 just before it is sharded
                from launcher.worker.qlora import quantize

                quantize(targets, nf4_full, from_rank0=self.rank0_load, device=self.device if outside else home,
                         dtype=torch.bfloat16 if self.pure_bf16 else (dtype or torch.float32),
                         comm_device=self.device if dist.get_backend() == "nccl" else torch.device("cpu"))
                if outside:
                    ignored |= {mod.weight for mod in targets.values()}
            fully_shard(block, reshard_after_forward=self.reshard_after_forward, **kw,
                        **({"ignored_params": ignored} if outside else {}))
        # The root (embeddings, final norm, head) is never resharded after forward: its pre-backward hook would
        # gather it again at once, holding the all-gather buffer and the unsharded copy together while every
        # activation is saved (measured on MiniLM, whose root is half the model: +2 x 48 MB at the backward start).
        # fully_shard does this itself only when reshard_after_forward is left unset (_fsdp_state.py _lazy_init).
        fully_shard(model, reshard_after_forward=False, **kw, **({"ignored_params": ignored} if outside else {}))
        if self.rank0_load:
            # Shards allocated where the policy keeps them (host with CPU offload), then filled from rank 0.
            # The NF4 weights are real already: only what is still on meta is allocated and scattered.
            fill_sharded(model, state, buffers, home, keep_real=any(nf4_targets))
            del state, buffers
        self.model = model
        self.max_grad_norm = clip_setting(train.max_grad_norm)
        trainable = [p for p in model.parameters() if p.requires_grad]
        if self.optimizer_in_backward:
            self.setup_optimizer_in_backward(trainable, train)
            probe.use_fsdp_tracker(model, None)  # FSDPMemTracker follows one optimizer; the states count as other
            return
        self.optimizer = build_optimizer(train, trainable, self.low_memory_optimizer, pure_bf16=self.pure_bf16)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(train.warmup_steps))
        self.optimizers, self.schedulers = [self.optimizer], [self.scheduler]
        if self.precision == "fp16":
            # fp16 runs only on CUDA (the worker refuses it on CPU); grads need loss scaling.
            self.scaler = torch.amp.GradScaler("cuda")
        probe.use_fsdp_tracker(model, self.optimizer)

    def setup_optimizer_in_backward(self, params: list[nn.Parameter], train: TrainConfig) -> None:
        """One optimizer per parameter, stepped in its gradient hook (OwnOptimizer.optimizers_in_backward).

        Under FSDP2 the hook fires on the sharded parameter once its reduce-scattered gradient is assigned
        (foreach_reduce calls ``_post_accumulate_grad_hooks`` itself), so the step runs on this rank's shard and
        the gradient is dropped before the next unit's backward. Each optimizer is the plan's (the job's, or its
        8-/4-bit AdamW, stochastically rounded under pure bf16, as torchtune's low-memory recipe pairs them).
        """
        self.optimizers_in_backward(params, params, train, pure_bf16=self.pure_bf16)

    def mesh_shape(self) -> tuple[tuple[int, ...], tuple[str, ...]]:
        """(shape, dimension names) of the device mesh: (world,) or, hybrid, (nodes, ranks per node)."""
        from launcher.engines.fsdp.emit import MESH_DIM_NAMES_FULL, MESH_DIM_NAMES_HYBRID

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

    def backward(self, loss: torch.Tensor) -> None:
        """Backward of loss / grad_accum_steps, loss-scaled under fp16."""
        self.scaled(loss).backward()

    def optimizer_step(self) -> None:
        """Unscale, clip over the shard group (every rank's shards), step and zero-grad."""
        comm = self.device if dist.get_backend() == "nccl" else torch.device("cpu")
        self.clip_and_step(self.optimizer_params(), self.shard_group, comm)

    def optimizer_params(self) -> list[torch.Tensor]:
        """Every parameter the optimizer(s) step, in their order."""
        return [p for opt in self.optimizers for group in opt.param_groups for p in group["params"]]

    def gather_weights(self, dtype: torch.dtype, adapter_only: bool) -> dict[str, torch.Tensor] | None:
        """The trained weights in ``dtype`` on rank 0's host, gathered from the shards (None elsewhere; every rank
        calls it)."""
        from launcher.worker.export import gather_fsdp

        return gather_fsdp(self.model, dtype, adapter_only)

    def save(self, root: Path, tag: str) -> None:
        """Save model and optimizer shards with torch.distributed.checkpoint under root/tag/dcp, and (rank 0) the
        schedule and micro-batch count in engine.pt."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        # One optimizer or one per parameter (the step in backward): get_state_dict keys the state by parameter
        # name either way, and set_state_dict hands each optimizer its own parameters' part.
        model_sd, optim_sd = get_state_dict(self.model, self.optimizers)
        state = {"model": model_sd, "optim": optim_sd}
        dcp.save(state, checkpoint_id=str(root / tag / "dcp"))
        if dist.get_rank() == 0:
            # Every schedule is the same function of the step: the first one's state stands for all of them.
            torch.save({"scheduler": self.schedulers[0].state_dict(), "micro": self.micro}, root / tag / "engine.pt")

    def load(self, root: Path, tag: str) -> None:
        """Load what save wrote under root/tag into the sharded model, optimizer(s) and schedules."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        model_sd, optim_sd = get_state_dict(self.model, self.optimizers)
        state = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, checkpoint_id=str(root / tag / "dcp"))
        set_state_dict(self.model, self.optimizers, model_state_dict=state["model"], optim_state_dict=state["optim"])
        extra = torch.load(root / tag / "engine.pt", weights_only=True)
        for sched in self.schedulers:
            sched.load_state_dict(extra["scheduler"])
        self.micro = int(extra["micro"])
