"""The predicted total training time of a plan: step time x optimizer steps, and whether it is past the job's
warning threshold (train.warn_total_time_h). Pure: the step count comes in as numbers.

The step count is known at plan time when the job gives train.max_steps, or train.epochs with the number of
training sequences the caller counted (the data's summary: the kept examples, or the packed sequences;
launcher.records.datasummary). Without the data the total is not predicted; the plan says so instead of guessing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from launcher.units import format_duration


def steps_per_epoch(train_examples: int, *, world_size: int, samples_per_step: int) -> int:
    """Whole optimizer steps in one pass: each rank's shard (DistributedSampler's padded split) over the
    examples one step takes per rank (micro-batch x accumulation). launcher.worker.data.Stream uses the same."""
    return math.ceil(train_examples / world_size) // samples_per_step


def epoch_steps(epochs: float, steps_in_epoch: int) -> int:
    """Optimizer steps for `epochs` (may be fractional) passes of `steps_in_epoch` steps, rounded up, at least 1."""
    return max(1, math.ceil(epochs * steps_in_epoch))


@dataclass(kw_only=True, slots=True, frozen=True)
class TotalTime:
    """A plan's predicted training time, or why it cannot be predicted yet."""

    step_time_s: float
    """The plan's predicted seconds per optimizer step."""
    total_steps: int | None
    """Optimizer steps the run will take; None when not known at plan time."""
    basis: str
    """Where the step count comes from (train.max_steps; train.epochs over N examples), or why it is unknown."""
    warn_after_s: float | None
    """The job's threshold, seconds (train.warn_total_time_h); None never warns."""

    @property
    def total_s(self) -> float | None:
        """Predicted seconds of training (steps only: start-up, evaluation and checkpoints not counted)."""
        return None if self.total_steps is None else self.step_time_s * self.total_steps

    @property
    def too_long(self) -> bool:
        """True when the predicted total is known and past the job's warning threshold."""
        return self.total_s is not None and self.warn_after_s is not None and self.total_s > self.warn_after_s

    def describe(self) -> str:
        """The sentence launch plan and launch run print."""
        if self.total_s is None:
            return f"not predicted: {self.basis}"
        return (f"{format_duration(self.total_s)} predicted ({self.step_time_s:.3g} s/step x {self.total_steps} "
                f"steps, {self.basis}; start-up, evaluation and checkpoints not counted)")

    def warning(self) -> str | None:
        """Why the total is worth a second look, when it is past the threshold."""
        if not self.too_long:
            return None
        return (f"the predicted training time {format_duration(self.total_s)} is past train.warn_total_time_h "
                f"({self.warn_after_s / 3600:g} h): check the plan, add GPUs or nodes, or shorten the run; raise "
                "warn_total_time_h (or set it to null) to accept it")


def total_time(*, step_time_s: float, max_steps: int | None, epochs: float | None, train_examples: int | None,
               unknown_why: str, world_size: int, samples_per_step: int,
               warn_after_h: float | None) -> TotalTime:
    """The total for max_steps, else for epochs over ``train_examples``; ``unknown_why`` says why the examples
    are not known when they are None."""
    warn = None if warn_after_h is None else warn_after_h * 3600.0
    if max_steps is not None:
        return TotalTime(step_time_s=step_time_s, total_steps=max_steps, basis="train.max_steps", warn_after_s=warn)
    if epochs is None:
        return TotalTime(step_time_s=step_time_s, total_steps=None, warn_after_s=warn,
                         basis="the job gives neither train.max_steps nor train.epochs")
    if train_examples is None:
        return TotalTime(step_time_s=step_time_s, total_steps=None, warn_after_s=warn, basis=unknown_why)
    per_epoch = steps_per_epoch(train_examples, world_size=world_size, samples_per_step=samples_per_step)
    return TotalTime(step_time_s=step_time_s, total_steps=epoch_steps(epochs, per_epoch), warn_after_s=warn,
                     basis=f"train.epochs {epochs:g} x {per_epoch} steps ({train_examples} training examples)")
