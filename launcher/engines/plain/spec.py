"""The plain engine's spec: its layouts (one device, or DDP replicas), the levers it offers, cost terms and words. The
memory terms are launcher.engines.plain.memory's. It writes no config file of its own: the ranks read plan.json,
and `plan --out`'s accelerate.yaml is accelerate's MULTI_GPU (DDP) or NO (one process) config.
"""

from __future__ import annotations

from pathlib import Path

from launcher.config.job import Job
from launcher.emit.exports import ACCELERATE_PRECISION, accelerate_base
from launcher.engines.plain.layout import PlainLayout
from launcher.engines.plain.memory import DDP_BUCKET_CAP_BYTES, init_bytes, plain_states, qlora_blocks, working_bytes
from launcher.engines.spec import EngineSpec
from launcher.levers import (
    ACTIVATION_OFFLOAD,
    CHECKPOINT_EVERY,
    CHECKPOINT_POLICY,
    CHUNKED_LOSS,
    LOW_MEMORY_OPTIMIZER,
    OPTIMIZER_IN_BACKWARD,
    PURE_BF16,
    QLORA,
    fields,
)
from launcher.levers.low_memory_optimizer import PAGED
from launcher.planner.plan import Buckets, Plan, Strategy
from launcher.planner.terms import MemoryInputs, States, Traffic, nf4_dequant_s, over_links

DDP_REFUSED = {
    OPTIMIZER_IN_BACKWARD.field: "DDP all-reduces a gradient after its post-accumulate-grad hook has run, so a step "
                                 "there would use this rank's gradient alone",
    QLORA.field: "DDP broadcasts and buckets plain tensors; the plain engine keeps QLoRA's NF4 base on one rank",
}
"""Why a DDP layout does not offer a lever the one-device layout does (PlainSpec.lever_values)."""



class PlainSpec(EngineSpec):
    """No sharding wrapper: one device, or whole replicas under torch DDP (gradients all-reduced in 25 MiB
    buckets). Nothing is offloaded, so it has no fallback rung beyond the generic ones (micro-batch,
    checkpointing, the levers); the rank side is launcher.worker.engines.plain.PlainEngine."""

    name = PlainLayout.engine
    rank_engine = "PlainEngine"
    # Every rank-side lever: the model's own parameters are stepped (low-bit AdamW, Adafactor, pure bf16), and the
    # checkpointing, loss and offload levers are the model's and the loop's.
    levers = fields(CHUNKED_LOSS, PURE_BF16, QLORA, OPTIMIZER_IN_BACKWARD, LOW_MEMORY_OPTIMIZER, CHECKPOINT_EVERY,
                    CHECKPOINT_POLICY, ACTIVATION_OFFLOAD)
    # torchao's low-bit AdamW steps bf16 parameters with bf16_stochastic_round (optimizers.low_memory_optimizer).
    pure_bf16_optimizers = frozenset({"adamw8bit", "adamw4bit", PAGED})

    def lever_values(self, layout: PlainLayout) -> dict[str, tuple[tuple[object, ...], str]]:
        """Under DDP neither the step in backward nor QLoRA (DDP_REFUSED); one device offers every lever."""
        if not layout.ddp:
            return {}
        return {name: ((False,), why) for name, why in DDP_REFUSED.items()}

    def candidates(self, *, nodes: int, nvme: bool, world_size: int) -> list[PlainLayout]:
        """One layout: no wrapper on one rank, DDP on more."""
        return [PlainLayout(ddp=world_size > 1)]

    def states(self, inp: MemoryInputs, s: Strategy, buckets: Buckets) -> States:
        """The whole model's states on the rank (plain_states; DDP keeps its own 25 MiB buckets, not the plan's)."""
        return plain_states(inp, s)

    def init_bytes(self, inp: MemoryInputs, s: Strategy) -> float:
        """The cast model, the masters and DDP's buckets (memory.init_bytes); on CPU ranks rank 0's fp32 build."""
        return init_bytes(inp, s)

    def load_bytes_per_node(self, inp: MemoryInputs, s: Strategy) -> float:
        """Rank 0 builds the fp32 model on its host (4Ψ); the other ranks receive it by broadcast."""
        return 4 * inp.model.num_params

    def optimizer_shard_ranks(self, inp: MemoryInputs, s: Strategy) -> int:
        """1: every rank steps the whole model."""
        return 1

    def communication(self, inp: MemoryInputs, s: Strategy, bucket_elems: int) -> Traffic:
        """DDP's ring all-reduce of every gradient once per optimizer step (2(n-1)/n of them per rank; the rank side
        skips it on the micro-steps before, no_sync), one call per 25 MiB bucket, overlapped with backward as the
        cost model overlaps every engine's traffic. None on one rank."""
        if not s.layout.ddp:
            return Traffic(intra_node_bytes=0.0, inter_node_bytes=0.0, calls=0)
        grad_payload = working_bytes(inp, s) * inp.model.trainable_params
        calls = max(1, -(-int(grad_payload) // DDP_BUCKET_CAP_BYTES))
        return over_links(inp, 2 * grad_payload, calls)

    def optimizer_on_host(self, s: Strategy) -> bool:
        """Never: nothing is offloaded."""
        return False

    def offload_s(self, inp: MemoryInputs, s: Strategy) -> float:
        """0: nothing is offloaded."""
        return 0.0

    def dequant_s(self, inp: MemoryInputs, s: Strategy) -> float:
        """QLoRA's NF4 weights dequantized in forward, backward and the recompute (terms.nf4_dequant_s)."""
        return nf4_dequant_s(inp, s, qlora_blocks(inp, s))

    def rung_options(self, rung: str, s: Strategy, *, nvme: bool) -> list[Strategy]:
        """None: no sharding to raise and nothing to offload (the ladder's generic rungs still apply)."""
        if rung in ("sharding", "optimizer_offload", "param_offload", "nvme"):
            return []
        raise ValueError(f"unknown rung {rung!r}")

    def config_files(self, plan: Plan, job: Job) -> dict[str, str]:
        """None: the ranks read plan.json."""
        return {}

    def rank_files(self, plan: Plan, job: Job) -> dict[str, str]:
        """None: the ranks read plan.json."""
        return {}

    def accelerate_config(self, plan: Plan, job: Job, *, config_dir: Path | None = None) -> dict:
        """accelerate's DDP config (MULTI_GPU), or NO for one process."""
        kind = "MULTI_GPU" if plan.strategy.layout.ddp else "NO"
        return accelerate_base(plan, kind, ACCELERATE_PRECISION[plan.precision])

    def accelerate_title(self, s: Strategy) -> str:
        """"DDP" or "one process", accelerate.yaml's header."""
        return "DDP" if s.layout.ddp else "one process (no wrapper)"

    def accelerate_notes(self, plan: Plan, config_dir: Path, *, optimizer: str) -> list[str]:
        """What a script must do for the plan's memory: its levers are the script's own code."""
        notes = []
        s = plan.strategy
        if plan.precision != "fp32" and not PURE_BF16.on(s):
            notes += ["accelerate's mixed precision autocasts an fp32 model: the plan counts fp32 parameters and "
                      "gradients", "  for a script, not the launcher's working-dtype model with fp32 masters."]
        if PURE_BF16.on(s):
            notes.append("Pure bf16: cast the model to bfloat16 (model.to(torch.bfloat16)) before accelerator.prepare.")
        if OPTIMIZER_IN_BACKWARD.on(s):
            notes.append("The plan steps the optimizer in backward: one optimizer per parameter, stepped from "
                         "param.register_post_accumulate_grad_hook, no clipping.")
        if LOW_MEMORY_OPTIMIZER.of(s) != "none":
            notes.append(f"The plan assumes the {LOW_MEMORY_OPTIMIZER.of(s)} optimizer: build it over the model's "
                         "parameters (docs/memory-model.md, Low-memory optimizers).")
        return notes

    def accelerate_env(self, plan: Plan) -> str:
        """The plan's gradient accumulation as ACCELERATE_GRADIENT_ACCUMULATION_STEPS."""
        return f"ACCELERATE_GRADIENT_ACCUMULATION_STEPS={plan.strategy.grad_accum_steps}"


SPEC = PlainSpec()
"""The registered spec (launcher.engines.ENGINES["plain"])."""
