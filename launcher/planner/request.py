"""What the planner is asked: the PlanRequest, and the rules a request must meet before any candidate is tried."""

from __future__ import annotations

from dataclasses import dataclass, field

from launcher.config.job import StrategyConfig
from launcher.config.problem import Problem
from launcher.model.introspect import ModelStats
from launcher.planner.hardware import HardwareProfile
from launcher.planner.terms import ActivationConstants


@dataclass(kw_only=True, slots=True)
class PlanRequest:
    """What the planner is asked: a model, a cluster shape, a batch and a per-GPU budget."""

    model: ModelStats
    """Parameter counts and shapes (counts in parameters, sizes in features)."""
    gpus_per_node: int
    """Ranks per node, GPUs (or CPU ranks)."""
    nodes: int
    """Machines, each with gpus_per_node ranks."""
    budget_bytes: int
    """Per-GPU budget, bytes."""
    seq_len: int
    """Tokens per sequence."""
    global_batch_size: int
    """Sequences per optimizer step over all ranks; never changed by the planner."""
    precision: str
    """Working dtype: bf16, fp16 or fp32 (train.precision: auto is decided before the planner, with its reason)."""
    optimizer: str
    """adamw, adam or sgd."""
    hardware: HardwareProfile
    """Device constants the memory and cost models read."""
    pins: StrategyConfig = field(default_factory=StrategyConfig)
    """Strategy fields the job fixed; None fields are searched."""
    host_ram_per_node_bytes: int | None = None
    """None skips the host check (unknown)."""
    nvme_free_bytes: int | None = None
    """None: no NVMe path given, so NVMe offload is not a candidate."""
    activations: ActivationConstants | None = None
    """Measured activation constants; None derives them from the paper (analytic_constants)."""
    force: bool = False
    """Return a fully pinned plan even when it is over budget."""
    precision_reason: str = ""
    """Why this precision (launcher.inputs.precision.choose_precision); the plan repeats it among its reasons."""
    allow_levers: tuple[str, ...] = ()
    """The math-changing levers the job allows (train.allow_levers); the exact ones need no permission."""
    script: bool = False
    """The ranks run the user's own training script (launch --script), not the launcher's recipe: a lever the
    script does not receive through the engine's config is not tried unless the job pins it
    (launcher.levers.SCRIPT_LEVERS)."""
    max_grad_norm: float = 0.0
    """The job's gradient clipping (train.max_grad_norm; 0: off): the optimizer step in backward cannot clip, and
    the plan says so."""

    @property
    def world_size(self) -> int:
        """Ranks in the job: GPUs per node x nodes."""
        return self.gpus_per_node * self.nodes

    @property
    def usable_bytes(self) -> int:
        """The per-device budget less the safety margin (strategy.safety_margin), bytes: what a plan may predict."""
        return int(self.budget_bytes * (1.0 - self.pins.safety_margin))


def micro_batches(req: PlanRequest) -> list[int]:
    """The micro-batch sizes the search may try: every divisor of the per-rank batch, ascending."""
    per_rank = req.global_batch_size // req.world_size
    return [d for d in range(1, per_rank + 1) if per_rank % d == 0]


def batch_problem(global_batch_size: int, world_size: int) -> Problem | None:
    """The global batch must split evenly over the data-parallel ranks (gpus x nodes): it is never changed to fit."""
    if global_batch_size % world_size == 0:
        return None
    example = world_size * max(1, round(global_batch_size / world_size))
    return Problem("train.global_batch_size", f"{global_batch_size} is not divisible by {world_size} GPUs; use a "
                   f"multiple of {world_size} (e.g. {example}) or another --gpus", reads=("gpus", "nodes"))


def context_problem(m: ModelStats, seq_len: int) -> str | None:
    """A sequence past the model's position table indexes embeddings that do not exist (learned positions) or
    positions it never trained on (RoPE): refused, never silently truncated."""
    if m.max_positions is None or seq_len <= m.max_positions:
        return None
    rope = (f", or raise {m.position_key} together with the config's rope_scaling ({m.rope_scaling})"
            if m.rope_scaling else "")
    return (f"data.max_seq_len: {seq_len} tokens is past this {m.model_type} model's position table "
            f"({m.position_key} = {m.max_positions}); use --seq-len {m.max_positions} or less{rope}")


