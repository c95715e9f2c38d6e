"""The memory levers beyond sharding, offload and micro-batch, one module each; LEVERS is the registry.

Each module holds one lever's plan side as a LeverSpec (launcher.levers.spec): its field and off value, whether it
needs the job's permission, the values the search tries (which are where it applies), its words and the pins it
refuses, with the helpers its memory and cost terms call. Everything else is derived from the registry: the
fields of Strategy, of the strategy: pins and of LeverSetting (``with_lever_fields``), plan.json's keys, the
tables below, the search's settings (launcher.planner.levers) and the lever decisions (launcher.planner
.lever_choice). Adding a lever is a module here, its line in LEVERS (and DECIDED), and its rank side.

Nothing here imports the planner or the job schema: they import this.
"""

from __future__ import annotations

from launcher.config.fields import with_fields
from launcher.levers import (
    activation_offload,
    checkpoint_every,
    checkpoint_policy,
    chunked_loss,
    low_memory_optimizer,
    optimizer_in_backward,
    pure_bf16,
    qlora,
    release_frozen_weights,
)
from launcher.levers.spec import LeverSpec, Shape

CHECKPOINT_EVERY = checkpoint_every.SPEC
CHECKPOINT_POLICY = checkpoint_policy.SPEC
CHUNKED_LOSS = chunked_loss.SPEC
ACTIVATION_OFFLOAD = activation_offload.SPEC
OPTIMIZER_IN_BACKWARD = optimizer_in_backward.SPEC
LOW_MEMORY_OPTIMIZER = low_memory_optimizer.SPEC
PURE_BF16 = pure_bf16.SPEC
QLORA = qlora.SPEC
RELEASE_FROZEN_WEIGHTS = release_frozen_weights.SPEC

LEVERS: dict[str, LeverSpec] = {spec.field: spec for spec in (
    CHECKPOINT_EVERY, CHECKPOINT_POLICY, CHUNKED_LOSS, ACTIVATION_OFFLOAD, OPTIMIZER_IN_BACKWARD,
    LOW_MEMORY_OPTIMIZER, PURE_BF16, QLORA, RELEASE_FROZEN_WEIGHTS)}
"""Field -> spec. The order is the fields' in Strategy, the strategy: pins and plan.json, and the search's: its
settings are the product of the levers' values in this order, and ties between candidates go to the earlier."""

DECIDED: tuple[LeverSpec, ...] = (CHUNKED_LOSS, CHECKPOINT_EVERY, CHECKPOINT_POLICY, ACTIVATION_OFFLOAD,
                                  OPTIMIZER_IN_BACKWARD, RELEASE_FROZEN_WEIGHTS, LOW_MEMORY_OPTIMIZER, PURE_BF16,
                                  QLORA)
"""The order a plan's lever decisions are listed in (Plan.levers, `launch plan`): the exact levers, then those that
need permission."""

LEVER_FIELDS = tuple(LEVERS)
"""The levers' Strategy fields, in LEVERS' order."""
LEVERS_OFF = {spec.field: spec.off for spec in LEVERS.values()}
"""Each lever field's off value: Strategy's defaults, what a plan.json from before the levers means."""
EXACT = tuple(spec.field for spec in DECIDED if spec.exact)
"""The levers that keep the training math."""
MATH_LEVERS = {spec.field: spec.permits for spec in LEVERS.values() if not spec.exact}
"""Field of each lever that changes the training math -> the train.allow_levers words that permit it."""
SCRIPT_LEVERS = frozenset(spec.field for spec in LEVERS.values() if spec.script)
"""The levers a user's own script (launch --script) receives without a change (LeverSpec.script)."""
PERMITS = tuple(word for spec in LEVERS.values() for word in spec.permits)
"""Every train.allow_levers word (config.job.MathLever)."""
REFINEMENTS = tuple(spec for spec in LEVERS.values() if spec.refines_checkpointing)
"""The levers that choose how activation checkpointing checkpoints."""


def fields(*specs: LeverSpec) -> frozenset[str]:
    """The fields of ``specs``: what an engine spec lists as the levers its rank side implements (EngineSpec.levers)."""
    return frozenset(spec.field for spec in specs)


def with_lever_fields(*, pins: bool = False, after: str | None = None):
    """A class decorator, under @dataclass: adds a field per registered lever, in LEVERS' order, after the field
    ``after`` (else at the end): the lever's own type with its off value as default (Strategy, LeverSetting); with
    ``pins``, ``type | None`` and None, "the planner chooses" (the job's strategy: section)."""
    return with_fields({spec.field: ((spec.type | None, None) if pins else (spec.type, spec.off))
                        for spec in LEVERS.values()}, after=after)


__all__ = ["ACTIVATION_OFFLOAD", "CHECKPOINT_EVERY", "CHECKPOINT_POLICY", "CHUNKED_LOSS", "DECIDED", "EXACT",
           "LEVERS", "LEVERS_OFF", "LEVER_FIELDS", "LOW_MEMORY_OPTIMIZER", "MATH_LEVERS", "OPTIMIZER_IN_BACKWARD",
           "PERMITS", "PURE_BF16", "QLORA", "REFINEMENTS", "RELEASE_FROZEN_WEIGHTS", "SCRIPT_LEVERS", "LeverSpec",
           "Shape", "fields", "with_lever_fields"]
