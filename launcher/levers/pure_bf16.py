"""Pure bf16: bf16 weights, gradients and optimizer states, no fp32 master copy (LitGPT's "bf16-true"). It changes
the math: train.allow_levers must list it. Adam/AdamW step with stochastic rounding (torchao's
bf16_stochastic_round).

The rank side: launcher.worker.engines (the cast, the rounding optimizers); the memory terms: the engines' specs
and launcher.planner.terms; docs/memory-model.md, "Pure bf16".
"""

from __future__ import annotations

from launcher.config.problem import Problem
from launcher.levers import low_memory_optimizer
from launcher.levers.spec import LeverSpec, Shape


def unpaired(x, pure_bf16_optimizers: frozenset[str]) -> bool:
    """Whether ``x`` (a Strategy or a LeverSetting) sets pure bf16 beside a low-memory optimizer its engine does not
    step bf16 weights with (EngineSpec.pure_bf16_optimizers): the search does not offer it, the plan says
    not_paired."""
    opt = low_memory_optimizer.SPEC.of(x)
    return SPEC.on(x) and opt != "none" and opt not in pure_bf16_optimizers


class PureBf16(LeverSpec):
    """No fp32 master: the kept parameters, their gradients and the optimizer's states in bf16."""

    field = "pure_bf16"
    off = False
    type = bool
    doc = "bf16 weights, gradients and optimizer states, no fp32 master copy."
    pin_doc = "bf16 weights, gradients and optimizer states with no fp32 master (train.allow_levers must list it)."
    title = "pure bf16"
    exact = False
    permits = ("pure_bf16",)

    def values(self, req, shape: Shape | None = None) -> tuple:
        """Off and on where the job computes in bf16."""
        return (False, True) if req.precision == "bf16" else (False,)

    def excludes(self, setting, pure_bf16_optimizers: frozenset[str]) -> bool:
        """Only beside the low-memory optimizers the engine steps bf16 weights with (``unpaired``)."""
        return unpaired(setting, pure_bf16_optimizers)

    def math_note(self, req) -> str:
        """How the step rounds (launcher.worker.engines.build_optimizer): stochastically for Adam/AdamW."""
        if req.optimizer in ("adam", "adamw"):
            return ("pure bf16: no fp32 master; the step rounds each new bf16 weight stochastically (torchao's "
                    "bf16_stochastic_round), so updates under half a bf16 spacing of the weight are kept in "
                    "expectation, not lost")
        return (f"pure bf16: no fp32 master; {req.optimizer}'s step rounds to nearest (no stochastic rounding for it), "
                "so updates under half a bf16 spacing of the weight are lost")

    def strategy_note(self, req, s) -> str:
        """math_note, but bitsandbytes' paged AdamW8bit rounds its bf16 weights to nearest (its own kernel)."""
        if low_memory_optimizer.SPEC.of(s) == low_memory_optimizer.PAGED:
            return ("pure bf16: no fp32 master; paged_adamw8bit's step (bitsandbytes) rounds each new bf16 weight to "
                    "nearest, so updates under half a bf16 spacing of the weight are lost, as in torchtune's "
                    "single-device recipes")
        return self.math_note(req)

    def word(self, value: object) -> str:
        """"pure bf16"."""
        return "pure bf16" if value else ""

    def pin_problems(self, job) -> list:
        """Only where the job computes in bf16."""
        if self.of(job.strategy) and job.train.precision != "bf16":
            return [Problem(f"strategy.{self.field}", "true keeps weights, gradients and optimizer states in bf16, "
                            f"but train.precision is {job.train.precision!r}; set train.precision: bf16, or leave "
                            f"strategy.{self.field} out", reads=("train.precision",))]
        return []


SPEC = PureBf16()
"""The registered spec (launcher.levers.LEVERS)."""
