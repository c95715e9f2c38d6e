"""Op-level selective checkpointing: a checkpointed block also keeps the outputs of the ops torchtitan's policy
saves (exact). The rank side: launcher.model.sac (the policy), which the probe and the FSDP2 and DeepSpeed ranks use;
docs/memory-model.md, "Op-level selective checkpointing".
"""

from __future__ import annotations

from typing import Literal

from launcher.config.problem import Problem
from launcher.levers import activation_offload
from launcher.levers.spec import LeverSpec, Shape

CheckpointPolicy = Literal["full", "ops"]
"""What a checkpointed block keeps: its input alone (full recompute) or also the outputs of the ops torchtitan's
op-level policy saves (launcher.model.sac)."""


def sac_measured(req) -> bool:
    """Whether the probe measured what a block keeps under the op policy (ActivationConstants.sac_bytes_per_token;
    the paper's constants and caches from before it do not say): without it the policy is not offered."""
    return getattr(req.activations, "sac_bytes_per_token", 0.0) > 0


def recomputed_share(m, s) -> float:
    """Share of a checkpointed block's matmul FLOPs its recompute runs again: all of them under full recompute, k, o
    and up of a Llama block under the op policy ("Step time" in
    docs/memory-model.md#op-level-selective-checkpointing-checkpoint_policy)."""
    if SPEC.of(s) != "ops" or not m.gated_mlp:
        return 1.0
    h, inter, kv = m.hidden_size, m.intermediate_size, m.num_kv_heads * m.head_dim
    attn_q, attn_kv = m.num_heads * m.head_dim * h, kv * h
    total = 2 * attn_q + 2 * attn_kv + 3 * h * inter
    return (attn_kv + attn_q + h * inter) / total


class CheckpointPolicySpec(LeverSpec):
    """What a checkpointed block keeps: its input (full) or also its saved ops' outputs (ops)."""

    field = "checkpoint_policy"
    off = "full"
    type = CheckpointPolicy
    doc = ("With activation_checkpointing: what a checkpointed block keeps; ops is op-level selective checkpointing "
           "(launcher.model.sac), full its input alone.")
    pin_doc = ("With activation_checkpointing: full recomputes a checkpointed block from its input; ops also keeps "
               "the outputs of its matmuls (every other one) and attention, torchtitan's op-level selective "
               "checkpointing, and recomputes the rest (FSDP2 and DeepSpeed).")
    title = "op-level selective checkpointing"
    refines_checkpointing = True
    plan_lacks = "not with this plan: it refines activation checkpointing, which the plan leaves off"

    def values(self, req, shape: Shape | None = None) -> tuple:
        """full and ops, with checkpointing on and the probe's measure of what the policy keeps."""
        if (shape is not None and not shape.activation_checkpointing) or not sac_measured(req):
            return (self.off,)
        return ("full", "ops")

    def forces_checkpointing(self, pin: object) -> bool:
        """A pinned ops policy chooses what checkpointed blocks keep: it needs checkpointing."""
        return pin == "ops"

    def excludes(self, setting, pure_bf16_optimizers: frozenset[str]) -> bool:
        """Not with activation offload: the policy's saved outputs bypass the offload hooks, not modelled together."""
        return self.of(setting) == "ops" and activation_offload.SPEC.on(setting)

    def checkpointing_words(self, value: object) -> tuple[str, str]:
        """" (ops)" after "AC"; the policy's words after "activation checkpointing on"."""
        if value != "ops":
            return "", ""
        return " (ops)", ", op-level (torchtitan's policy: attention and every other matmul output kept)"

    def change_words(self, old: object, new: object, checkpointing_turned_on: bool) -> str:
        """"checkpoint policy ops -> full"."""
        return f"checkpoint policy {old} -> {new}" if old != new else ""

    def pin_problems(self, job) -> list:
        """ops needs checkpointing on, and is not modelled with activation offload."""
        pins, out = job.strategy, []
        if self.of(pins) == "ops" and pins.activation_checkpointing is False:
            out.append(Problem(f"strategy.{self.field}", "'ops' chooses what a checkpointed block keeps, but "
                               "strategy.activation_checkpointing is false; set it true, or leave "
                               f"strategy.{self.field} out", reads=("strategy.activation_checkpointing",)))
        offload = activation_offload.SPEC.field
        if self.of(pins) == "ops" and activation_offload.SPEC.of(pins):
            out.append(Problem(f"strategy.{self.field}", "'ops' keeps op outputs that activation offload's hooks "
                               f"never see, which the plan does not model; leave one of strategy.{self.field} and "
                               f"strategy.{offload} out", reads=(f"strategy.{offload}",)))
        return out


SPEC = CheckpointPolicySpec()
"""The registered spec (launcher.levers.LEVERS)."""
