"""Weights the way large trainers load them: one host copy per job, not one per rank.

Rank 0 builds the model for real on the host (the checkpoint's weights, or a seeded random init) and every other
rank builds it on the meta device, which allocates nothing; the weights then reach them over the process group.
So host RAM holds one full copy, on rank 0's node, however many ranks a node runs.

  DeepSpeed ZeRO-0/1/2  the other ranks allocate the model on their device (to_empty) and receive every
                        parameter and buffer by broadcast from rank 0.
  FSDP2                 every rank shards the meta model (fully_shard), allocates its shards (to_empty), and
                        rank 0's full state dict is scattered into them (set_model_state_dict with
                        broadcast_from_rank0) [torchtitan's meta init; PyTorch torch.distributed.checkpoint.
                        state_dict.StateDictOptions.broadcast_from_rank0]. No rank holds the full model on its
                        device.
  DeepSpeed ZeRO-3      zero.Init partitions each parameter as it is created on every rank and transformers copies
                        checkpoint tensors in one gathered parameter at a time (HfDeepSpeedConfig): unchanged.
Non-persistent buffers (rotary inv_freq, position ids) are not in a state dict: they are broadcast on their own.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


def loads_on_rank0_only(*, partitioned_init: bool = False) -> bool:
    """Whether this run builds the model on rank 0 alone: in a process group of more than one rank, unless the
    engine partitions parameters as they are created (``partitioned_init``: ZeRO-3's zero.Init). Each engine asks
    for itself (its ``before_build``)."""
    many = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    return many and not partitioned_init


def is_loader() -> bool:
    """Rank 0 reads the checkpoint; the others receive it."""
    return not dist.is_initialized() or dist.get_rank() == 0


def keeping_ties(model: nn.Module, move) -> nn.Module:
    """``move(model)`` (to_empty, .to) with shared parameters still shared: both replace each module's parameters
    one module at a time, which would untie GPT-2's output head from its input embedding."""
    owners: dict[int, list[tuple[nn.Module, str]]] = {}
    for mod in model.modules():
        for name, p in mod._parameters.items():
            if p is not None:
                owners.setdefault(id(p), []).append((mod, name))
    move(model)
    for places in owners.values():
        first, first_name = places[0]
        for mod, name in places[1:]:
            mod._parameters[name] = first._parameters[first_name]
    return model


def _tensors(model: nn.Module) -> list[torch.Tensor]:
    # parameters() and buffers() skip shared tensors after their first name: a tied weight moves once.
    return [p.data for p in model.parameters()] + list(model.buffers())


def broadcast_from_rank0(model: nn.Module, device: torch.device, dtype: torch.dtype | None = None) -> nn.Module:
    """Rank 0's model on its device, and on every other rank a meta model allocated on its device and filled with
    rank 0's tensors.

    ``dtype`` (the working dtype of a bf16/fp16 run) casts on the host first: deepspeed.initialize would cast the
    module anyway, but only once it is on the device, so a GPU would hold the fp32 build (4Ψ) before the 16-bit
    copy (2Ψ) exists; for a LoRA run that instant is larger than training itself.
    """
    def cast(m: nn.Module) -> nn.Module:
        return m.to(dtype=dtype) if dtype is not None else m

    if is_loader():
        keeping_ties(model, lambda m: cast(m).to(device))
    else:
        keeping_ties(model, lambda m: cast(m).to_empty(device=device))
    for t in _tensors(model):
        dist.broadcast(t, src=0)
    return model


def rank0_state(model: nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(full state dict, every buffer) of rank 0's real model; empty on the other ranks. Rank 0's model then moves to
    the meta device, so all ranks shard the same empty structure; the two dicts keep its tensors alive."""
    if not is_loader():
        return {}, {}
    state = {k: v for k, v in model.state_dict().items()}
    buffers = {k: v for k, v in model.named_buffers()}
    keeping_ties(model, lambda m: m.to("meta"))
    return state, buffers


def empty_meta(model: nn.Module, device: torch.device) -> None:
    """to_empty for the meta tensors alone: the real ones (QLoRA's NF4 weights) stay as they are. FSDP2 takes the
    new parameter objects up at lazy init (FSDPParam.reset_sharded_param)."""
    for mod in model.modules():
        for name, p in list(mod._parameters.items()):
            if p is not None and p.is_meta:
                mod._parameters[name] = nn.Parameter(torch.empty_like(p, device=device), requires_grad=p.requires_grad)
        for name, b in list(mod._buffers.items()):
            if b is not None and b.is_meta:
                mod._buffers[name] = torch.empty_like(b, device=device)


def fill_sharded(model: nn.Module, state: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor],
                 device: torch.device, *, keep_real: bool = False) -> None:
    """After fully_shard: allocate the shards on ``device`` and scatter rank 0's weights into them. ``keep_real``:
    parameters already real (QLoRA's NF4 weights, filled before sharding) are neither reallocated nor expected in
    ``state``."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    if keep_real:
        keeping_ties(model, lambda m: empty_meta(m, device))
    else:
        keeping_ties(model, lambda m: m.to_empty(device=device))
    set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True,
                                                                strict=not keep_real))
    for name, buf in model.named_buffers():
        if is_loader():
            buf.copy_(buffers[name])
        dist.broadcast(buf, src=0)
