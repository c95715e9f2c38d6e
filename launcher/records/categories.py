"""The one vocabulary of memory categories: the planner's breakdown, the ranks' measurement, the report's
"grew most", memory.png and the OOM ladder's correction all use these names.

A category means the same bytes on both sides:

  params       parameters on the device, sharded or gathered: FSDP2's unsharded working copies and ZeRO-3's
               gathered weights are parameters (FSDPMemTracker counts them as 'Unsharded Param'), never buffers
  grads        gradients, sharded or whole
  optimizer    optimizer state and the fp32 master weights
  activations  what forward saves for backward and the loss's temporaries (predicted: activations + logits;
               measured: activations + temp, which holds the collectives' short-lived buffers too)
  buffers      engine buffers: gradient reduce buckets, offload staging (measured: module buffers and what the
               worker labels other, DeepSpeed's buckets among it)

Predicted-only keys: "offloaded" (state in host RAM; on CPU ranks the same memory the rank is measured in, where
the tracker sees it as params, grads or optimizer) and "reserve" (CUDA allocator and context terms).
"""

from __future__ import annotations

MEASURED = ("params", "grads", "optimizer", "activations", "temp", "buffers", "other")
"""The categories a rank's tracker reports (launcher.runtime.tracker), bytes at its peak."""

PREDICTED = ("params", "grads", "optimizer", "buffers", "activations", "logits", "offloaded", "reserve")
"""The keys of a plan's breakdown (launcher.planner.memory), bytes at the predicted peak."""

CATEGORY_GROUPS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "params": (("params",), ("params",)),
    "grads": (("grads",), ("grads",)),
    "optimizer": (("optimizer",), ("optimizer",)),
    "activations": (("activations", "logits"), ("activations", "temp")),
    "buffers": (("buffers",), ("buffers", "other")),
}
"""Each compared category: (its predicted keys, its measured keys)."""

OFFLOADED_STATES = ("params", "grads", "optimizer")
"""Where a CPU rank's tracker counts the state the plan calls offloaded."""


def predicted_bytes(breakdown: dict[str, int], group: str) -> int:
    """A compared category's predicted bytes: the sum of its keys in a plan's breakdown (CATEGORY_GROUPS)."""
    return sum(int(breakdown.get(k, 0)) for k in CATEGORY_GROUPS[group][0])


def measured_bytes(breakdown: dict[str, int], group: str) -> int:
    """A compared category's measured bytes: the sum of its keys in a rank's tracker breakdown (CATEGORY_GROUPS)."""
    return sum(int(breakdown.get(k, 0)) for k in CATEGORY_GROUPS[group][1])


def grown_category(predicted: dict[str, int], measured: dict[str, int]) -> tuple[str, int]:
    """The category whose measured bytes exceed the prediction by the most, and by how many bytes.

    A plan that offloads on CPU ranks predicts that state as "offloaded" and the tracker counts it as params,
    grads or optimizer, which cannot be told apart: those three are then compared as one ("model states")."""
    diffs = {g: measured_bytes(measured, g) - predicted_bytes(predicted, g) for g in CATEGORY_GROUPS}
    offloaded = int(predicted.get("offloaded", 0))
    if offloaded:
        diffs = {g: d for g, d in diffs.items() if g not in OFFLOADED_STATES}
        diffs["model states"] = sum(measured_bytes(measured, g) - predicted_bytes(predicted, g)
                                    for g in OFFLOADED_STATES) - offloaded
    best = max(diffs, key=lambda g: diffs[g])
    return best, int(diffs[best])


__all__ = ["CATEGORY_GROUPS", "MEASURED", "PREDICTED", "grown_category", "measured_bytes", "predicted_bytes"]
