"""Activation offload (Strategy.activation_offload): what forward saves for backward waits in host memory.

The hooks are torch.autograd.graph.save_on_cpu's (torch/autograd/graph.py): ``pack`` copies a saved tensor into
pinned host memory (torch.empty(pin_memory=True), then copy_(non_blocking=True)) and ``unpack`` copies it back
(.to(device, non_blocking=True)), both on the current stream. One difference: parameters are saved as they are.
A Linear saves its weight (or a transposed view of it) for the input's gradient; save_on_cpu would copy every
weight to the host and back in each micro-step, and under FSDP2 or ZeRO-3 those are the gathered full weights,
which the engine frees after the block anyway. torchtune's OffloadActivations skips parameters for the same
reason. Tensors already in host memory (CPU ranks) are kept as they are: save_on_cpu(pin_memory=False) does the
same (tensor.cpu() returns the tensor itself), so on CPU ranks nothing moves.

With activation checkpointing, non-reentrant torch.utils.checkpoint saves the block's inputs through these hooks
(_NoopSaveInputs, before its own hooks are entered) and what runs inside the block through its own, innermost
hooks: only the checkpoints move.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn


def _is_param(t: torch.Tensor) -> bool:
    return isinstance(t, nn.Parameter) or isinstance(getattr(t, "_base", None), nn.Parameter)


def _pack(t: torch.Tensor):
    if t.device.type == "cpu" or _is_param(t) or t.is_sparse:
        return t
    packed = torch.empty(t.size(), dtype=t.dtype, layout=t.layout, pin_memory=True)
    packed.copy_(t, non_blocking=True)
    return t.device, packed


def _unpack(packed):
    if isinstance(packed, torch.Tensor):
        return packed
    device, t = packed
    return t.to(device, non_blocking=True)


def offload_activations(on: bool) -> contextlib.AbstractContextManager:
    """The context to run forward and the loss in: saved tensors go to pinned host memory when ``on``."""
    if not on:
        return contextlib.nullcontext()
    return torch.autograd.graph.saved_tensors_hooks(_pack, _unpack)


__all__ = ["offload_activations"]
