"""The optimizer step in backward: each parameter steps in its gradient hook, so no full gradient buffer exists
(exact, but global-norm clipping is off). The rank side: launcher.worker.engines.fsdp (per-parameter optimizers
stepped from post-accumulate-grad hooks, torchtune's optimizer_in_bwd); docs/memory-model.md, "Optimizer step in
backward".
"""

from __future__ import annotations

from launcher.config.problem import Problem
from launcher.levers import low_memory_optimizer
from launcher.levers.spec import LeverSpec, Shape

CALL_S = 1e-4
"""Seconds one more optimizer.step() call costs with the optimizer step in backward (a per-parameter optimizer
stepped from each gradient hook, launcher.worker.engines.fsdp): the same per-tensor AdamW (foreach=False) as one
optimizer's step, plus each call's own Python overhead (Optimizer.step's hooks and profiling wrapper, zero_grad).
Measured on a shared 2-core CPU host: 200 tensors stepped by 200 optimizers against one, +138 us per tensor; a
loaded host, so an upper end. It is what makes the lever lose a tie: it is chosen when it fits what the plain step
does not, or lets a faster layout fit, never for nothing (it drops global-norm clipping)."""


IN_BACKWARD_REFUSED = frozenset({"adafactor"})
"""Low-memory optimizers not stepped in backward. The sharded Adafactor's step all-reduces each matrix's column
statistics and norms over the shard group (launcher.worker.engines.optimizers.ShardedAdafactor): a collective per
parameter from inside FSDP2's reduce hooks, which the rank side does not run. torchao's 8-/4-bit AdamW step each
shard alone (launcher.worker.engines.fsdp.FsdpEngine.setup_optimizer_in_backward)."""


def in_backward_possible(req, grad_accum_steps: int) -> bool:
    """The optimizer step in backward needs no accumulation (each parameter steps as its gradient is made, as in
    torchtune's optimizer_in_bwd) and no fp16 loss scaling (the scaler must see every gradient before any step)."""
    return grad_accum_steps == 1 and req.precision != "fp16"


def step_calls_s(m) -> float:
    """Seconds per step the lever adds to model ``m``'s step: one optimizer call per trainable tensor (CALL_S each,
    at least one tensor); the step's arithmetic is the same, moved into backward."""
    return max(m.trainable_tensors, 1) * CALL_S


class OptimizerInBackward(LeverSpec):
    """Each parameter's step in its gradient hook: no gradient buffer at the step, no clipping."""

    field = "optimizer_in_backward"
    off = False
    type = bool
    doc = "Each parameter steps in its gradient hook: no full gradient buffer, no global-norm clipping."
    pin_doc = "Each parameter steps in its gradient hook (no full gradient buffer; no global-norm clipping)."
    title = "optimizer step in backward"
    plan_lacks = ("not with this plan: it needs no gradient accumulation (each parameter steps as its gradient is "
                  "made), and the plan accumulates micro-batches")

    def values(self, req, shape: Shape | None = None) -> tuple:
        """Off and on where the plan does not accumulate (every plan of the job may not) and the job is not fp16."""
        return (False, True) if in_backward_possible(req, shape.grad_accum_steps if shape else 1) else (False,)

    def pin_refused(self, req, shape: Shape, pin: object) -> bool:
        """Pinned on where this plan cannot step in backward."""
        return bool(pin) and not in_backward_possible(req, shape.grad_accum_steps)

    def excludes(self, setting, pure_bf16_optimizers: frozenset[str]) -> bool:
        """Not with Adafactor (IN_BACKWARD_REFUSED): the 8-/4-bit AdamW (bitsandbytes' paged one too) step each
        parameter in its hook, with pure bf16 too, as torchtune's low-memory recipe runs them."""
        return self.on(setting) and low_memory_optimizer.SPEC.of(setting) in IN_BACKWARD_REFUSED

    def math_note(self, req) -> str:
        """Clipping is off: the one thing the lever changes in the math (its deltas are in the lever lines)."""
        if req.max_grad_norm > 0:
            return (f"optimizer step in backward: gradient clipping is OFF -- train.max_grad_norm "
                    f"{req.max_grad_norm:g} is not applied, since each parameter steps before the global norm of all "
                    f"gradients exists; pin strategy.{self.field}: false to keep it")
        return "optimizer step in backward: no clipping is lost (train.max_grad_norm is off)"

    def word(self, value: object) -> str:
        """"opt-in-bwd"."""
        return "opt-in-bwd" if value else ""

    def pin_problems(self, job) -> list:
        """Not under fp16, whose loss scaling checks every gradient before any step; not with a pinned Adafactor."""
        if not self.of(job.strategy):
            return []
        if job.train.precision == "fp16":
            return [Problem(f"strategy.{self.field}", "true steps each parameter in backward, but fp16 needs loss "
                            "scaling, which checks every gradient for overflow before any step; use train.precision: "
                            f"bf16 or fp32, or leave strategy.{self.field} out", reads=("train.precision",))]
        opt = low_memory_optimizer.SPEC.of(job.strategy)
        if opt in IN_BACKWARD_REFUSED:
            return [Problem(f"strategy.{self.field}", f"true steps each parameter in backward, but {opt}'s sharded "
                            "step all-reduces row and column statistics, which the rank side does not run inside "
                            f"backward; pin low_memory_optimizer: adamw8bit or adamw4bit, or leave strategy."
                            f"{self.field} out", reads=("strategy.low_memory_optimizer",))]
        return []


SPEC = OptimizerInBackward()
"""The registered spec (launcher.levers.LEVERS)."""
