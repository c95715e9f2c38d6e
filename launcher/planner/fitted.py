"""Activation constants shipped per model family, fitted to measured runs (benchmarks/accuracy).

Each entry records what it was fitted on; `launch calibrate --from RUN_DIR` writes per-machine refits
that take precedence (see launcher.planning.activation_constants).
"""

from __future__ import annotations

from launcher.planner.memory import ActivationConstants

SHIPPED: dict[str, ActivationConstants] = {}


def shipped_constants(model_type: str) -> ActivationConstants:
    return SHIPPED.get(model_type, ActivationConstants())
