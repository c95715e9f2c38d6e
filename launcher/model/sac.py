"""Op-level selective activation checkpointing: torchtitan's "op" policy (Strategy.checkpoint_policy "ops").

A checkpointed block runs under torch.utils.checkpoint with ``context_fn`` = ``sac_context``: the policy sees each
aten op the block runs (create_selective_checkpoint_contexts) and saves the outputs of the ops in SAVE_OPS,
recomputing the rest in backward. As torchtitan's apply_ac (torchtitan/distributed/activation_checkpoint.py,
``_get_custom_policy``): every second aten.mm of a block is recomputed, the others saved, counted separately in
forward and in the recompute so both make the same choice. The result is exact: recompute re-runs the same ops on
the same inputs.
"""

from __future__ import annotations

from collections import defaultdict


def save_ops() -> set:
    """torchtitan's _save_list: the matmuls, the fused attention kernels, the reduce-scatter and aten.max, plus the
    CPU flash kernel sdpa dispatches to on CPU ranks (the same attention, the CPU's op name)."""
    import torch

    aten = torch.ops.aten
    ops = {aten.mm.default, aten._scaled_dot_product_efficient_attention.default,
           aten._scaled_dot_product_flash_attention.default, aten.max.default,
           aten._scaled_dot_product_flash_attention_for_cpu.default}
    for name in ("_scaled_dot_product_cudnn_attention",):  # newer torch only
        if hasattr(aten, name):
            ops.add(getattr(aten, name).default)
    if hasattr(torch.ops, "_c10d_functional"):
        ops.add(torch.ops._c10d_functional.reduce_scatter_tensor.default)
    return ops


def sac_context():
    """A fresh (forward, recompute) context pair for one checkpointed call: torch.utils.checkpoint's context_fn."""
    import torch
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    ops = save_ops()
    mm = torch.ops.aten.mm.default
    counts: dict[str, int] = defaultdict(int)

    def policy(ctx, func, *args, **kwargs):
        mode = "recompute" if ctx.is_recompute else "forward"
        if func == mm:
            counts[mode] += 1
        save = func in ops and not (func == mm and counts[mode] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if save else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


__all__ = ["sac_context", "save_ops"]
