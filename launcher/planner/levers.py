"""The memory levers beyond sharding, offload and micro-batch: which settings the search may try for one layout.

Two kinds (docs/levers.md):
  exact   the same math as without them, so the planner chooses them freely: chunked cross-entropy
          (loss_chunks), selective activation checkpointing (checkpoint_every), activation offload and the
          optimizer step in backward;
  math    they change what is computed, so only a job whose train.allow_levers lists them gets them:
          low-memory optimizers (adamw8bit, adamw4bit, adafactor), pure bf16 and QLoRA (NF4 base).

An engine offers a lever only when its rank side implements it (EngineSpec.levers); a lever the job pinned is
kept. Pure: plain data in, lists of settings out; the memory and cost terms of each lever live with the
engine specs and launcher.planner.memory / cost.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from launcher.planner.plan import LEVER_FIELDS, LEVERS_OFF
from launcher.planner.request import PlanRequest

MATH_LEVERS = {"low_memory_optimizer": ("adamw8bit", "adamw4bit", "adafactor"), "pure_bf16": ("pure_bf16",),
               "qlora": ("qlora",)}
"""Strategy field -> the train.allow_levers names that permit its non-default values."""

LOSS_CHUNKS = 8
"""Chunks of the chunked cross-entropy: torchtune's CEWithChunkedOutputLoss uses 8 (its num_output_chunks)."""

SCRIPT_LEVERS = frozenset({"release_frozen_weights"})
"""The levers a user's own script (launch --script) receives without a change: those the engine's config carries
(ds_config.json's memory_efficient_linear, which DeepSpeed applies itself). The others live in the launcher's
recipes: the loss (chunked cross-entropy), the blocks' checkpoint wrappers (every k-th block, the op policy; a
script's library checkpoints all blocks or none, launcher.runtime.script_args), the offload and step hooks, the optimizer
and the model's load (low-memory optimizers, pure bf16, QLoRA): planned for a script that does not apply them, the
prediction would not hold. A job that pins one says its script applies it."""

CHECKPOINT_EVERY = (1, 2, 4)
"""The k of "checkpoint every k-th block" the search tries (torchtitan's selective_ac_option takes any k)."""


@dataclass(kw_only=True, slots=True, frozen=True)
class LeverSetting:
    """One combination of the levers for a candidate: the Strategy fields of LEVER_FIELDS."""

    # Each lever's default is its "off" value, defined once in launcher.planner.plan.LEVERS_OFF.
    activation_checkpointing: bool = False
    checkpoint_every: int = LEVERS_OFF["checkpoint_every"]
    checkpoint_policy: str = LEVERS_OFF["checkpoint_policy"]
    loss_chunks: int = LEVERS_OFF["loss_chunks"]
    activation_offload: bool = LEVERS_OFF["activation_offload"]
    optimizer_in_backward: bool = LEVERS_OFF["optimizer_in_backward"]
    low_memory_optimizer: str = LEVERS_OFF["low_memory_optimizer"]
    pure_bf16: bool = LEVERS_OFF["pure_bf16"]
    qlora: bool = LEVERS_OFF["qlora"]
    release_frozen_weights: bool = LEVERS_OFF["release_frozen_weights"]

    def fields(self) -> dict[str, object]:
        """The setting as Strategy keyword arguments: activation_checkpointing and every LEVER_FIELDS field."""
        return {"activation_checkpointing": self.activation_checkpointing,
                **{name: getattr(self, name) for name in LEVER_FIELDS}}


def allowed(req: PlanRequest, field_name: str, value: object) -> bool:
    """Whether the job's train.allow_levers permits ``value`` of a math lever's field (off is always allowed)."""
    if field_name not in MATH_LEVERS or value in (False, "none"):
        return True
    name = "pure_bf16" if field_name == "pure_bf16" else "qlora" if field_name == "qlora" else str(value)
    return name in req.allow_levers


def math_departure(fields) -> int:
    """How far a Strategy (or LeverSetting) departs from the job's training math, for the planner's tie-break
    (launcher.planner.scoring.Searched.best): 0 for none; each math lever used adds 1, a low-memory optimizer its
    rank in MATH_LEVERS (8-bit moments 1, 4-bit 2, Adafactor's factored second moment and no first 3). So among
    plans equally fast, the job's own math wins, then the fewest and mildest departures (8-bit AdamW before 4-bit,
    either alone before with pure bf16): a job that allows 4-bit gets it only where it is faster or alone fits."""
    opt = fields.low_memory_optimizer
    n = MATH_LEVERS["low_memory_optimizer"].index(opt) + 1 if opt != "none" else 0
    return n + sum(bool(getattr(fields, name)) for name in MATH_LEVERS if name != "low_memory_optimizer")


def unpaired(fields, pure_bf16_optimizers: frozenset[str]) -> bool:
    """Whether a Strategy (or LeverSetting) sets pure bf16 beside a low-memory optimizer its engine does not step
    bf16 weights with (EngineSpec.pure_bf16_optimizers): the search does not offer it, the plan says not_paired."""
    opt = fields.low_memory_optimizer
    return bool(fields.pure_bf16) and opt != "none" and opt not in pure_bf16_optimizers


def in_backward_possible(req: PlanRequest, grad_accum_steps: int) -> bool:
    """The optimizer step in backward needs no accumulation (each parameter steps as its gradient is made, as in
    torchtune's optimizer_in_bwd) and no fp16 loss scaling (the scaler must see every gradient before any step)."""
    return grad_accum_steps == 1 and req.precision != "fp16"


def sac_measured(req: PlanRequest) -> bool:
    """Whether the probe measured what a block keeps under the op policy (ActivationConstants.sac_bytes_per_token;
    the paper's constants and caches from before it do not say): without it the policy is not offered."""
    return getattr(req.activations, "sac_bytes_per_token", 0.0) > 0


def frozen_inputs_measured(req: PlanRequest) -> bool:
    """Whether this job has frozen linears (LoRA) and the probe measured what their inputs add when saved
    (ActivationConstants.frozen_inputs_measured): without both release_frozen_weights is not offered."""
    return bool(req.model.lora_params) and bool(getattr(req.activations, "frozen_inputs_measured", False))


def reachable(req: PlanRequest, supported: frozenset[str]) -> frozenset[str]:
    """The levers of ``supported`` (an engine's) the search may try for this job: all of them for the launcher's
    recipes; for a user's script (PlanRequest.script) those it receives (SCRIPT_LEVERS) and those the job pins."""
    if not req.script:
        return supported
    pinned_levers = {name for name in LEVER_FIELDS if getattr(req.pins, name) is not None}
    return supported & (SCRIPT_LEVERS | pinned_levers)


def options(req: PlanRequest, supported: frozenset[str], grad_accum_steps: int,
            limits: dict[str, tuple[object, ...]] | None = None,
            pure_bf16_optimizers: frozenset[str] = frozenset()) -> list[LeverSetting]:
    """Every lever setting the search tries for one layout and micro-batch, the pins and permissions applied.

    ``supported``: the lever fields the engine implements (EngineSpec.levers); a lever it does not implement
    stays off. ``grad_accum_steps``: the optimizer step in backward needs 1 (in_backward_possible). ``limits``:
    field -> the only values this layout offers (EngineSpec.lever_values), a pin outside them admits nothing.
    ``pure_bf16_optimizers``: the low-memory optimizers the engine pairs with pure bf16
    (EngineSpec.pure_bf16_optimizers).
    """
    limits = limits or {}
    p, m = req.pins, req.model
    ac = [False, True] if p.activation_checkpointing is None else [p.activation_checkpointing]
    if p.checkpoint_policy == "ops" and p.activation_checkpointing is None:
        ac = [True]  # the pinned policy is what checkpointed blocks keep: it needs checkpointing
    every = [k for k in CHECKPOINT_EVERY if k < max(m.num_blocks, 2)] if "checkpoint_every" in supported else [1]
    axes: dict[str, list] = {
        # Not where the head cannot compute it (ModelStats.chunk_problem: a LoRA-wrapped head, soft-capped logits).
        "loss_chunks": [0, LOSS_CHUNKS] if m.task == "causal_lm" and not m.chunk_problem else [0],
        # On CPU ranks the saved tensors are already in host memory: offload moves nothing and saves nothing.
        "activation_offload": [False] if req.hardware.device_is_host else [False, True],
        "optimizer_in_backward": [False, True] if in_backward_possible(req, grad_accum_steps) else [False],
        # In place of Adam only, and not under LoRA: its adapters' state is already small.
        "low_memory_optimizer": ["none", *(o for o in MATH_LEVERS["low_memory_optimizer"]
                                           if req.optimizer in ("adamw", "adam") and not m.lora_params)],
        "pure_bf16": [False, True] if req.precision == "bf16" else [False],
        # Only where some frozen block linear could be NF4 (launcher.model.qlora; none for Conv1D models, GPT-2).
        "qlora": [False, True] if m.lora_params and m.block_linear_shapes else [False],
        # Only where the probe measured the frozen linears' inputs (LoRA; frozen_inputs_measured).
        "release_frozen_weights": [False, True] if frozen_inputs_measured(req) else [False],
    }
    for name in axes:
        pin = getattr(p, name)
        if pin is not None and name not in supported and pin != axes[name][0]:
            return []  # pinned on, and this engine does not implement it
        if pin is not None:
            axes[name] = [pin]
            if name == "optimizer_in_backward" and pin and not in_backward_possible(req, grad_accum_steps):
                return []  # pinned on where it cannot step in backward
        elif name not in supported:
            axes[name] = [axes[name][0]]
        if name in limits:
            if pin is not None and pin not in limits[name]:
                return []  # pinned to a value this layout does not offer
            axes[name] = [v for v in axes[name] if v in limits[name]]
        axes[name] = [v for v in axes[name] if pin is not None or allowed(req, name, v)]
    out = []
    if p.checkpoint_every not in (None, 1) and "checkpoint_every" not in supported:
        return []
    if p.checkpoint_policy == "ops" and "checkpoint_policy" not in supported:
        return []  # pinned on, and this engine does not implement it
    # The op policy only where checkpointing is on (it chooses what a checkpointed block keeps) and measured.
    policies = ([p.checkpoint_policy] if p.checkpoint_policy is not None
                else ["full", "ops"] if "checkpoint_policy" in supported and sac_measured(req) else ["full"])
    if "checkpoint_policy" in limits:
        if p.checkpoint_policy is not None and p.checkpoint_policy not in limits["checkpoint_policy"]:
            return []  # pinned to a policy this layout does not offer
        policies = [policy for policy in policies if policy in limits["checkpoint_policy"]]
    for on in ac:
        ks = ([p.checkpoint_every] if p.checkpoint_every is not None else every) if on else [1]
        for k, policy, *rest in itertools.product(ks, policies if on else ["full"], *axes.values()):
            setting = LeverSetting(activation_checkpointing=on, checkpoint_every=k, checkpoint_policy=policy,
                                   **dict(zip(axes, rest, strict=True)))
            if setting.low_memory_optimizer != "none" and setting.optimizer_in_backward:
                continue  # not modelled together: its step copies would sit in backward
            if unpaired(setting, pure_bf16_optimizers):
                continue  # pure bf16 only beside the low-memory optimizers the engine steps bf16 weights with
            if policy == "ops" and setting.activation_offload:
                continue  # the policy's saved outputs bypass the offload hooks: not modelled together
            out.append(setting)
    return out


__all__ = ["CHECKPOINT_EVERY", "LOSS_CHUNKS", "MATH_LEVERS", "SCRIPT_LEVERS", "LeverSetting", "allowed",
           "frozen_inputs_measured", "math_departure", "in_backward_possible", "options", "reachable", "sac_measured",
           "unpaired"]
