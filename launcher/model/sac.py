"""Op-level selective activation checkpointing: torchtitan's "op" policy (Strategy.checkpoint_policy "ops").

A checkpointed block runs under torch.utils.checkpoint with ``context_fn`` = ``sac_context``: the policy sees each
aten op the block runs (create_selective_checkpoint_contexts) and saves the outputs of the ops in SAVE_OPS,
recomputing the rest in backward. As torchtitan's apply_ac (torchtitan/distributed/activation_checkpoint.py,
``_get_custom_policy``): every second aten.mm of a block is recomputed, the others saved, counted separately in
forward and in the recompute so both make the same choice. The result is exact: recompute re-runs the same ops on
the same inputs.

Only the block's own ops may be counted: ``unseen`` hides the ops of code that runs inside a block but is no part of
it (ZeRO-3's parameter fetch and release, launcher.worker.engines.deepspeed), whose count differs between the
forward and the recompute.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Iterator


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


@contextlib.contextmanager
def unseen() -> Iterator[None]:
    """Run the body with the op policy's dispatch modes off the stack, every other mode kept (the CPU ranks'
    MemTracker still counts what it allocates).

    torch.utils.checkpoint's selective checkpointing keys what it stores by op and by the op's invocation index in
    the block, counted over every op the block runs, whatever the policy says: _CachingTorchDispatchMode counts in
    forward, _CachedTorchDispatchMode counts again in the recompute and looks each op up at its index. Code that runs
    a different number of ops in the two passes shifts those indices: an error when the recompute runs an op more
    often than the forward ("aten.cat.default invocation index 2 encountered during backward but not found in
    storage"), a wrong tensor handed back when the shifted op is one the policy saves. Hidden here, such code's ops
    are neither stored nor looked up; the block's own ops, the same in both passes, keep their indices. A no-op
    outside a selectively checkpointed block."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack, _pop_mode, _push_mode
    from torch.utils.checkpoint import _CachedTorchDispatchMode, _CachingTorchDispatchMode

    sac = (_CachingTorchDispatchMode, _CachedTorchDispatchMode)
    stack = _get_current_dispatch_mode_stack()
    first = next((i for i, mode in enumerate(stack) if isinstance(mode, sac)), None)
    if first is None:
        yield
        return
    above = stack[first:]  # the SAC mode and any mode entered after it, innermost last
    for _ in above:
        _pop_mode()
    kept = [mode for mode in above if not isinstance(mode, sac)]
    for mode in kept:
        _push_mode(mode)
    try:
        yield
    finally:
        for _ in kept:
            _pop_mode()
        for mode in above:
            _push_mode(mode)


__all__ = ["sac_context", "save_ops", "unseen"]
