"""Frozen weights released after forward: under LoRA at ZeRO-3, the frozen linears run DeepSpeed's
memory_efficient_linear, which saves their inputs and lets their gathered weights go after forward (exact).

ds_config.json carries it (launcher.engines.deepspeed.emit), which DeepSpeed applies itself: a user's own script
receives it. The memory terms: launcher.planner.memory.strategy_activations and launcher.engines.deepspeed.memory;
docs/memory-model.md, "Frozen weights released".
"""

from __future__ import annotations

from launcher.config.problem import Problem
from launcher.levers.spec import LeverSpec, Shape


def frozen_inputs_measured(req) -> bool:
    """Whether this job has frozen linears (LoRA) and the probe measured what their inputs add when saved
    (ActivationConstants.frozen_inputs_measured): without both the lever is not offered."""
    return bool(req.model.lora_params) and bool(getattr(req.activations, "frozen_inputs_measured", False))


class ReleaseFrozenWeights(LeverSpec):
    """DeepSpeed's linear for LoRA's frozen weights: their inputs saved, the gathered weights freed."""

    field = "release_frozen_weights"
    off = False
    type = bool
    doc = ("ZeRO-3 under LoRA: the frozen linears save their inputs and let their gathered weights go after forward "
           "(DeepSpeed's memory_efficient_linear); off, torch's linear keeps each gathered weight until its "
           "backward.")
    pin_doc = ("DeepSpeed ZeRO-3 under LoRA: frozen linears run DeepSpeed's memory_efficient_linear, which saves "
               "their inputs and frees their gathered weights after forward; false keeps torch's linear, which "
               "holds each gathered weight until its backward.")
    title = "frozen weights released after forward (ZeRO-3)"
    script = True

    def values(self, req, shape: Shape | None = None) -> tuple:
        """Off and on where the probe measured the frozen linears' inputs (LoRA; frozen_inputs_measured)."""
        return (False, True) if frozen_inputs_measured(req) else (False,)

    def word(self, value: object) -> str:
        """"frozen weights released"."""
        return "frozen weights released" if value else ""

    def pin_problems(self, job) -> list:
        """Only in a LoRA run (a full fine-tune releases them already)."""
        if self.of(job.strategy) and job.train.lora is None:
            return [Problem(f"strategy.{self.field}", "true changes how a LoRA run's frozen linears keep their "
                            "weights, but this job has no train.lora (a full fine-tune releases them already); add "
                            f"train.lora, or leave strategy.{self.field} out", reads=("train.lora",))]
        return []

    def request_problem(self, req) -> str:
        """Pinned on without the probe's measure of the inputs it saves: the plan could not count them."""
        if self.of(req.pins) and not frozen_inputs_measured(req):
            source = getattr(req.activations, "source", "the paper's constants")
            return (f"strategy.{self.field}: true saves every frozen linear's input, which the activation constants "
                    f"in use do not measure ({source}); leave strategy.{self.field} out (the planner then counts the "
                    "pinned weights of torch's linear)")
        return ""


SPEC = ReleaseFrozenWeights()
"""The registered spec (launcher.levers.LEVERS)."""
