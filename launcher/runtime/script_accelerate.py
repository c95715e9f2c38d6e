"""The accelerate side of the --script seam (launcher.runtime.script_args): what ``accelerate launch`` cannot say
through its environment, set where accelerate builds its state, its Accelerator and its DataLoaders.

- ``PartialState.__init__`` on CPU ranks: gloo where the script names no backend. accelerate picks none without a
  GPU unless told ``cpu=True``, and every rank then trains alone (DeepSpeed's comm included).
- ``AcceleratorState.__init__`` on CPU ranks under an FSDP2 plan: accelerate applies FSDP only on GPUs and would
  run the model unsharded (every rank holding all of it, not the plan's memory). With the process group up over
  gloo, FSDP2's fully_shard runs on CPU as the launcher's own FSDP2 ranks do, so the state is set to FSDP.
  Its CPU-RAM-efficient load (non-zero ranks load on the meta device, rank 0's weights broadcast) is off there:
  an HF Trainer over a model with a newly made head (from_pretrained(num_labels=...)) then built its optimizer
  groups in another order on rank 1, and its checkpoint's optimizer save failed (KeyError in
  torch.distributed.checkpoint's get_optimizer_state_dict; seen on CPU ranks, accelerate 1.15, transformers 5.24).
- ``GradientState.__init__`` under an FSDP2 plan: ``sync_each_batch``, so gradients are reduce-scattered after
  every micro-batch, as the plan's memory counts them (launcher.worker.engines.fsdp). Under accumulation the HF
  Trainer and ``accelerator.accumulate`` otherwise skip the sync (FSDP2's set_requires_gradient_sync(False)) and hold
  a whole unsharded gradient per rank, which the plan does not count.
- ``Accelerator.__init__``: the plan's precision over a ``mixed_precision`` the script passes (the environment's
  ACCELERATE_MIXED_PRECISION only fills an absent one; the accumulation's variable wins by itself).
- ``Accelerator.prepare_data_loader``: the plan's micro-batch for a DataLoader the script made with another
  batch_size (accelerate has no variable for it). Not for a Trainer's loaders: TrainingArguments carries it there.
"""

from __future__ import annotations

import functools
import inspect
import os

RAM_EFFICIENT_LOADING = "FSDP_CPU_RAM_EFFICIENT_LOADING"
"""accelerate's (and transformers' from_pretrained's) switch for loading on rank 0 alone under FSDP."""


def set_cpu_env(seam) -> None:
    """On CPU ranks under an FSDP2 plan, before the script imports anything: the CPU-RAM-efficient load off (see
    the module's docstring)."""
    plan = seam.plan
    if plan.cpu_ranks and plan.fsdp and plan.world_size > 1 and os.environ.get(RAM_EFFICIENT_LOADING) == "true":
        seam.note(RAM_EFFICIENT_LOADING, "true", "false")
        seam.set_env(RAM_EFFICIENT_LOADING, "false")


def patch_state(seam, module) -> None:
    """Patch accelerate.state: GradientState under FSDP2, PartialState and AcceleratorState on CPU ranks (see the
    module's docstring)."""
    plan = seam.plan
    if plan.fsdp:
        grad_init = module.GradientState.__init__

        @functools.wraps(grad_init)
        def gradient_state_init(self, gradient_accumulation_plugin=None):
            if gradient_accumulation_plugin is not None and not gradient_accumulation_plugin.sync_each_batch:
                seam.note("GradientAccumulationPlugin.sync_each_batch", False, True)
                gradient_accumulation_plugin.sync_each_batch = True
            grad_init(self, gradient_accumulation_plugin)

        seam.patch(module.GradientState, "__init__", gradient_state_init)
    if not plan.cpu_ranks or plan.world_size < 2:
        return
    partial_init = module.PartialState.__init__

    @functools.wraps(partial_init)
    def partial_state_init(self, cpu: bool = False, **kwargs):
        if not cpu and kwargs.get("backend") is None and not module.PartialState._shared_state:
            seam.note("accelerate PartialState backend", kwargs.get("backend"), "gloo")
            kwargs["backend"] = "gloo"
        partial_init(self, cpu, **kwargs)

    seam.patch(module.PartialState, "__init__", partial_state_init)
    if not plan.fsdp:
        return
    state_init = module.AcceleratorState.__init__
    distributed = module.DistributedType

    @functools.wraps(state_init)
    def accelerator_state_init(self, *args, fsdp_plugin=None, **kwargs):
        state_init(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        if fsdp_plugin is not None and self.distributed_type in (distributed.NO, distributed.MULTI_CPU):
            import torch.distributed as dist

            if dist.is_initialized() and dist.get_world_size() > 1:
                seam.note("accelerate AcceleratorState.distributed_type", self.distributed_type.value, "FSDP")
                if self._mixed_precision != "no":
                    fsdp_plugin.set_mixed_precision(self._mixed_precision)
                self.fsdp_plugin = fsdp_plugin
                self.distributed_type = distributed.FSDP
                module.PartialState._shared_state["distributed_type"] = distributed.FSDP

    seam.patch(module.AcceleratorState, "__init__", accelerator_state_init)


def patch_accelerator(seam, module) -> None:
    """Patch accelerate.accelerator's Accelerator: the plan's precision and micro-batch (see the module's docstring)."""
    cls = module.Accelerator
    init, prepare_loader = cls.__init__, cls.prepare_data_loader
    signature = inspect.signature(init)
    from launcher.emit.exports import ACCELERATE_PRECISION

    precision = ACCELERATE_PRECISION[seam.plan.precision]

    @functools.wraps(init)
    def accelerator_init(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        asked = bound.arguments.get("mixed_precision")
        if asked is not None and str(getattr(asked, "value", asked)).lower() != precision:
            seam.note("Accelerator.mixed_precision", str(getattr(asked, "value", asked)), precision)
            bound.arguments["mixed_precision"] = precision
        init(*bound.args, **bound.kwargs)

    @functools.wraps(prepare_loader)
    def prepare_data_loader(self, data_loader, *args, **kwargs):
        if not seam.trainer_args_seen:
            data_loader = rebatched(seam, data_loader, seam.plan.micro_batch_size)
        return prepare_loader(self, data_loader, *args, **kwargs)

    seam.patch(cls, "__init__", accelerator_init)
    seam.patch(cls, "prepare_data_loader", prepare_data_loader)


def rebatched(seam, loader, micro_batch_size: int):
    """``loader`` with ``micro_batch_size`` per batch, everything else kept; itself where it already has that size,
    is not a torch DataLoader, or batches through a batch_sampler of its own (batch_size None: left as it is)."""
    import torch

    if type(loader) is not torch.utils.data.DataLoader or loader.batch_size in (None, micro_batch_size):
        return loader
    seam.note("DataLoader.batch_size", loader.batch_size, micro_batch_size)
    iterable = isinstance(loader.dataset, torch.utils.data.IterableDataset)
    return torch.utils.data.DataLoader(
        loader.dataset, batch_size=micro_batch_size, sampler=None if iterable else loader.sampler,
        num_workers=loader.num_workers, collate_fn=loader.collate_fn, pin_memory=loader.pin_memory,
        drop_last=loader.drop_last, timeout=loader.timeout, worker_init_fn=loader.worker_init_fn,
        multiprocessing_context=loader.multiprocessing_context, generator=loader.generator,
        prefetch_factor=loader.prefetch_factor, persistent_workers=loader.persistent_workers,
        pin_memory_device=loader.pin_memory_device)
