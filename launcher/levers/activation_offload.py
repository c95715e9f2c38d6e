"""Activation offload: the saved activations go to pinned host memory in forward and come back in backward (exact).

The rank side: launcher.worker.offload (save_on_cpu's hooks); docs/memory-model.md, "Activation offload".
"""

from __future__ import annotations

from launcher.levers.spec import LeverSpec, Shape


class ActivationOffload(LeverSpec):
    """Saved activations on the host between forward and backward, at the cost of the copies."""

    field = "activation_offload"
    off = False
    type = bool
    doc = "Saved activations are moved to host memory in forward and back in backward."
    pin_doc = "Saved activations move to host memory in forward and back in backward."
    title = "activation offload"

    def values(self, req, shape: Shape | None = None) -> tuple:
        """Off and on, but on CPU ranks, where the saved tensors are in host memory already: offload would move and
        save nothing."""
        return (False,) if req.hardware.device_is_host else (False, True)

    def word(self, value: object) -> str:
        """"act->cpu"."""
        return "act->cpu" if value else ""


SPEC = ActivationOffload()
"""The registered spec (launcher.levers.LEVERS)."""
