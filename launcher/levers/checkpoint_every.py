"""Selective activation checkpointing: every k-th block checkpointed rather than all of them (exact).

The rank side: launcher.worker.engines (transformers' every_n_layers for DeepSpeed, FSDP2's own wrappers) by the
rule ``checkpointed`` states; docs/memory-model.md#selective-activation-checkpointing-checkpoint_every.
"""

from __future__ import annotations

from launcher.levers.spec import LEVER_COUNT_MAX, LeverSpec, Shape, count_problems

TRIED = (1, 2, 4)
"""The k of "checkpoint every k-th block" the search tries (torchtitan's selective_ac_option takes any k)."""


def checkpointed(index: int, every: int) -> bool:
    """Whether block ``index`` (0-based, in forward order) is checkpointed when every ``every``-th block is: the first
    of each group, transformers' every_n_layers rule (docs/memory-model.md#which-blocks-are-checkpointed)."""
    return index % every == 0


def checkpoint_count(num_blocks: int, every: int) -> int:
    """How many of ``num_blocks`` blocks are checkpointed when every ``every``-th is (``checkpointed``): blocks 0, k,
    2k, ..., ceil(n / k) of them."""
    return -(-num_blocks // every)


class CheckpointEvery(LeverSpec):
    """Checkpointing every k-th block: more activations kept, fewer blocks recomputed."""

    field = "checkpoint_every"
    off = 1
    type = int
    doc = "With activation_checkpointing: every k-th block is checkpointed (1: all of them), blocks."
    pin_doc = "With activation_checkpointing: checkpoint every k-th block (1: every block; 2: half of them), blocks."
    title = "selective checkpointing (every k-th block)"
    refines_checkpointing = True
    plan_lacks = "not with this plan: it refines activation checkpointing, which the plan leaves off"

    def values(self, req, shape: Shape | None = None) -> tuple:
        """1, 2 and 4 where the model has more blocks than k, with checkpointing on."""
        if shape is not None and not shape.activation_checkpointing:
            return (self.off,)
        return tuple(k for k in TRIED if k < max(req.model.num_blocks, 2))

    def checkpointing_words(self, value: object) -> tuple[str, str]:
        """" every k" after "AC"; " for 1 block in k" after "activation checkpointing on"."""
        return ("", "") if value == 1 else (f" every {value}", f" for 1 block in {value}")

    def change_words(self, old: object, new: object, checkpointing_turned_on: bool) -> str:
        """"activation checkpointing every 2 -> every 1 block" (nothing where checkpointing itself came on)."""
        if checkpointing_turned_on or old == new:
            return ""
        return f"activation checkpointing every {old} -> every {new} block"

    def pin_problems(self, job) -> list:
        """A k from 1 to LEVER_COUNT_MAX."""
        return count_problems(self, self.of(job.strategy), 1, f"1 to {LEVER_COUNT_MAX} (1 checkpoints every block)", 2)


SPEC = CheckpointEvery()
"""The registered spec (launcher.levers.LEVERS)."""
