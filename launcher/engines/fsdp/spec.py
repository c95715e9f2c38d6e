"""FSDP2's spec: its layouts, the levers it offers, cost terms, fallback rungs, config file and words. The memory
terms are launcher.engines.fsdp.memory's; fsdp.yaml is launcher.engines.fsdp.emit's.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import get_args

from launcher.config.job import Job
from launcher.emit.exports import ADAM_TITLES, PURE_BF16_CLIENT
from launcher.engines.fsdp.emit import fsdp_config, fsdp_yaml_text
from launcher.engines.fsdp.layout import FsdpLayout
from launcher.engines.fsdp.memory import (
    fsdp_shard_ranks,
    fsdp_states,
    init_copy_bytes,
    nf4_resident_bytes,
    qlora_blocks,
    sharded_param_bytes,
)
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
from launcher.levers.low_memory_optimizer import PAGED, LowMemoryOptimizer
from launcher.model.qlora import NF4_TABLE, nf4_bytes, quantize_transient_bytes
from launcher.planner.plan import Buckets, Plan, Strategy
from launcher.planner.terms import (
    BYTES,
    MemoryInputs,
    States,
    Traffic,
    nf4_dequant_s,
    optimizer_offload_s,
    over_links,
    ring,
    untied_head_bytes,
)

FSDP_YAML = "fsdp.yaml"
"""The run dir's FSDP2 settings (the worker reads plan.json; this documents them and holds accelerate's config)."""
LOW_MEMORY_CLASSES = {"adamw8bit": "torchao.optim.AdamW8bit", "adamw4bit": "torchao.optim.AdamW4bit",
                      PAGED: "bitsandbytes.optim.PagedAdamW8bit",
                      # torch.optim.Adafactor itself refuses FSDP2's DTensor shards (torch 2.13)
                      "adafactor": "launcher.worker.engines.optimizers.ShardedAdafactor"}
"""What a script of its own builds for Strategy.low_memory_optimizer (the worker:
launcher.worker.engines.optimizers)."""

PAGED_REFUSED = ("CPU offload keeps the state and the step on the host already: bitsandbytes' paged state is for an "
                 "optimizer stepped on the device")
"""Why FSDP2's CPU-offload layouts do not offer paged_adamw8bit (FsdpSpec.lever_values)."""
LOW_MEMORY_VALUES = get_args(LowMemoryOptimizer)

FSDP_NOTES = [
    "GPUs only: accelerate applies FSDP2 (fully_shard) on GPUs; on CPU ranks it ignores the FSDP settings",
    "  (with ACCELERATE_USE_CPU=1 it runs unsharded DDP over gloo), so the plan's memory does not hold there.",
]
"""What a script run with an FSDP2 accelerate.yaml must know."""


class FsdpSpec(EngineSpec):
    """FSDP2 (fully_shard) with full or hybrid sharding, resharding after forward or not, and CPU offload: its layouts,
    memory and cost terms, fallback rungs and fsdp.yaml; the rank side is launcher.worker.engines.fsdp.FsdpEngine."""

    name = FsdpLayout.engine
    rank_engine = "FsdpEngine"
    config_names = (FSDP_YAML,)
    # The optimizer steps FSDP2's DTensor shards: torchao's low-bit AdamW and ShardedAdafactor both run there
    # (launcher.worker.engines.optimizers).
    levers = fields(CHUNKED_LOSS, PURE_BF16, QLORA, OPTIMIZER_IN_BACKWARD, LOW_MEMORY_OPTIMIZER, CHECKPOINT_EVERY,
                    CHECKPOINT_POLICY, ACTIVATION_OFFLOAD)
    # torchao's low-bit AdamW steps bf16 shards with bf16_stochastic_round (optimizers.low_memory_optimizer): the
    # parameters, gradients and step of pure bf16 with the quantized moments. Adafactor would keep bf16 factors
    # and round to nearest: not paired.
    # bitsandbytes' paged AdamW8bit steps bf16 weights in its own kernel, rounding to nearest (as torchtune's
    # single-device recipes run it; PureBf16.strategy_note says so).
    pure_bf16_optimizers = frozenset({"adamw8bit", "adamw4bit", PAGED})

    def lever_values(self, layout: FsdpLayout) -> dict[str, tuple[tuple[object, ...], str]]:
        """No paged_adamw8bit under CPU offload: the optimizer then steps on the host already (PAGED_REFUSED)."""
        if layout.offload_params == "none":
            return {}
        return {LOW_MEMORY_OPTIMIZER.field: (tuple(v for v in LOW_MEMORY_VALUES if v != PAGED), PAGED_REFUSED)}

    def candidates(self, *, nodes: int, nvme: bool, world_size: int) -> list[FsdpLayout]:
        """Reshard after forward or not x CPU offload or none, with full sharding and on several nodes hybrid too."""
        # Hybrid sharding differs from full sharding only across nodes: on one node the two are the same plan.
        groups = ("full", "hybrid") if nodes > 1 else ("full",)
        # CPUOffloadPolicy moves params, grads and optimizer together: both offloaded, or neither.
        return [FsdpLayout(fsdp_reshard_after_forward=reshard, fsdp_sharding=group, offload_optimizer=off,
                           offload_params=off)
                for group in groups for reshard in (True, False) for off in ("none", "cpu")]

    def states(self, inp: MemoryInputs, s: Strategy, buckets: Buckets) -> States:
        """FSDP2's model states per rank (fsdp_states; the buckets do not apply)."""
        return fsdp_states(inp, s)

    def init_bytes(self, inp: MemoryInputs, s: Strategy) -> float:
        """Rank 0's fp32 build, kept as the state dict it scatters, beside its 4Ψ/N shards (2Ψ/N under pure bf16)
        (on CPU ranks, where host memory is the device); on a GPU the shards (none when CPUOffloadPolicy holds them)
        and the one whole tensor being filled into them (init_copy_bytes)."""
        m = inp.model
        shards = sharded_param_bytes(inp, s)
        # QLoRA quantizes each weight on the rank before it is sharded, one at a time (launcher.worker.qlora): the
        # largest one's to_nf4 temporaries come on top, on the device where the collectives run. On rank 0 that is
        # in the first block, whose weights up to it (module order) have left its fp32 state dict by then.
        nf4 = qlora_blocks(inp, s)
        quantizing = quantize_transient_bytes(max(nf4), BYTES[inp.precision]) if nf4 else 0.0
        if inp.hardware.device_is_host:
            consumed = 4 * sum(nf4[:nf4.index(max(nf4)) + 1]) if nf4 else 0.0
            return 4 * m.num_params + max(untied_head_bytes(m), shards, quantizing - consumed)
        on_device = shards if s.layout.offload_params == "none" else nf4_resident_bytes(inp, s)
        return on_device + max(quantizing, init_copy_bytes(inp, s))

    def fp32_adapters(self, s: Strategy, *, script: bool) -> bool:
        """Never: the rank's MixedPrecisionPolicy (param_dtype the working dtype, launcher.worker.engines.fsdp
        setup; pure bf16 casts every parameter) all-gathers peft's fp32 adapters in bf16/fp16, so in forward
        lora_A.weight has the working dtype and peft's input cast to it (BaseTunerLayer._cast_input_dtype) is a
        no-op: no fp32 copy. Checked with a forward hook on one-rank FSDP2 and FSDP2-offload runs (stop 31)."""
        return False

    def nccl_communicators(self, s: Strategy) -> int:
        """The default group; hybrid sharding's 2-D mesh adds one group per dimension (init_device_mesh creates the
        replicate and the shard group, launcher.worker.engines.fsdp); a 1-D mesh reuses the default group."""
        return 3 if s.layout.hybrid else 1

    def load_bytes_per_node(self, inp: MemoryInputs, s: Strategy) -> float:
        """Host bytes per node while loading: rank 0's fp32 model (4Ψ); the other ranks receive their shards."""
        # Rank 0 builds in fp32 on its host; the others build on meta and receive their shards
        # (set_model_state_dict(broadcast_from_rank0)).
        return 4 * inp.model.num_params

    def optimizer_shard_ranks(self, inp: MemoryInputs, s: Strategy) -> int:
        """The ranks a parameter is sharded over (fsdp_shard_ranks): all, or one node's under hybrid sharding."""
        return fsdp_shard_ranks(inp, s)

    def communication(self, inp: MemoryInputs, s: Strategy, bucket_elems: int) -> Traffic:
        """ZeRO-3's traffic with one gather fewer without resharding; hybrid sharding gathers and reduce-scatters
        within a node and all-reduces its 1/n shard of the gradients across nodes."""
        m, w, accum = inp.model, BYTES[inp.precision], s.grad_accum_steps
        grad_payload = w * m.trainable_params
        nf4 = qlora_blocks(inp, s)  # QLoRA's blocks all-gather NF4 codes and scalers for those weights
        param_payload = w * (m.num_params - m.num_blocks * sum(nf4)) + m.num_blocks * sum(
            nf4_bytes(e, w) - w * (1 + NF4_TABLE) for e in nf4)
        gathers = 2 if s.layout.fsdp_reshard_after_forward else 1
        units = m.num_blocks + 1  # one FSDP unit per block, then the root
        volume = accum * (gathers * param_payload + grad_payload)
        calls = accum * (gathers + 1) * units
        if s.layout.hybrid and inp.nodes > 1:
            g = inp.gpus_per_node
            # Gather and reduce-scatter inside the node; the node's shard of each gradient (1/g of it) is then
            # all-reduced with the same shard on every other node: 2·(nodes-1)/nodes of it per rank.
            cross = accum * 2 * ring(inp.nodes) * grad_payload / g
            return Traffic(intra_node_bytes=volume * ring(g), inter_node_bytes=cross, calls=calls + accum * units)
        return over_links(inp, volume, calls)

    def dequant_s(self, inp: MemoryInputs, s: Strategy) -> float:
        """QLoRA's NF4 weights dequantized in forward, backward and the recompute (terms.nf4_dequant_s)."""
        return nf4_dequant_s(inp, s, qlora_blocks(inp, s))

    def optimizer_on_host(self, s: Strategy) -> bool:
        """True with CPU offload (CPUOffloadPolicy): then the optimizer steps on the host."""
        # CPUOffloadPolicy moves the parameters, gradients and optimizer state together.
        return s.layout.offload_optimizer != "none" or s.layout.offload_params == "cpu"

    def offload_s(self, inp: MemoryInputs, s: Strategy) -> float:
        """Seconds per step of the host optimizer step over this rank's shard, plus with CPU offload the fp32 shards
        copied to the device before each all-gather on every micro-step."""
        m, hw = inp.model, inp.hardware
        offload = 0.0
        if self.optimizer_on_host(s):
            # The optimizer runs over this rank's shard: 1/N of the model, or 1/gpus_per_node under hybrid.
            # torch's AdamW (build_optimizer) steps the host shards, not DeepSpeed's vectorized CPU Adam.
            offload += optimizer_offload_s(inp, m.trainable_params / fsdp_shard_ranks(inp, s),
                                           s.layout.offload_optimizer == "nvme", torch_adam=True)
        if s.layout.offload_params == "cpu":
            # CPUOffloadPolicy keeps every fp32 shard on the host and copies it to the device before each
            # all-gather: once in forward and again in backward when resharded, every micro-step, frozen (LoRA)
            # weights included, since the device holds no copy between uses [PyTorch FSDP2 offload_policy].
            gathers = 2 if s.layout.fsdp_reshard_after_forward else 1
            offload += s.grad_accum_steps * gathers * sharded_param_bytes(inp, s) / hw.host_link_bw
        return offload

    def rung_options(self, rung: str, s: Strategy, *, nvme: bool) -> list[Strategy]:
        """The fallback ladder's changes: reshard after forward, then CPU offload of everything; no parameter-only or
        NVMe rung."""
        if rung == "sharding":
            return [] if s.layout.fsdp_reshard_after_forward else [
                dataclasses.replace(s, layout=dataclasses.replace(s.layout, fsdp_reshard_after_forward=True))]
        if rung == "optimizer_offload":
            if s.layout.offload_optimizer != "none":
                return []
            # CPUOffloadPolicy moves parameters, gradients and optimizer state together.
            return [dataclasses.replace(s, layout=dataclasses.replace(s.layout, offload_optimizer="cpu",
                                                                      offload_params="cpu"))]
        if rung in ("param_offload", "nvme"):
            return []  # parameters move with the optimizer (above); FSDP2 has no NVMe offload
        raise ValueError(f"unknown rung {rung!r}")

    def config_files(self, plan: Plan, job: Job) -> dict[str, str]:
        """fsdp.yaml for the run dir."""
        return {FSDP_YAML: fsdp_yaml_text(plan, job)}

    def rank_files(self, plan: Plan, job: Job) -> dict[str, str]:
        """None: the ranks read plan.json."""
        return {}  # the ranks read plan.json; fsdp.yaml documents the same settings

    def accelerate_config(self, plan: Plan, job: Job, *, config_dir: Path | None = None) -> dict:
        """fsdp.yaml's accelerate section: accelerate's FSDP2 config for the plan."""
        return fsdp_config(plan, job)["accelerate"]

    def accelerate_title(self, s: Strategy) -> str:
        """"FSDP2", accelerate.yaml's header."""
        return "FSDP2"

    def accelerate_env(self, plan: Plan) -> str:
        """The plan's gradient accumulation as ACCELERATE_GRADIENT_ACCUMULATION_STEPS."""
        # accelerate reads FSDP's accumulation only from its environment.
        return f"ACCELERATE_GRADIENT_ACCUMULATION_STEPS={plan.strategy.grad_accum_steps}"

    def accelerate_notes(self, plan: Plan, config_dir: Path, *, optimizer: str) -> list[str]:
        """What a script launched with this accelerate.yaml must do, and what pure bf16, the optimizer step in
        backward or a low-memory optimizer add to it."""
        notes = list(FSDP_NOTES)
        opt = LOW_MEMORY_OPTIMIZER.of(plan.strategy)
        if PURE_BF16.on(plan.strategy):
            # accelerate's mixed_precision keeps fp32 parameters; pure bf16 is the script's own cast.
            notes.append("Pure bf16: cast the model to bfloat16 (model.to(torch.bfloat16)) before accelerator.prepare;")
            notes.append("  accelerate's bf16 mixed precision alone keeps fp32 parameters and optimizer states.")
            # The rank side's step (launcher.worker.engines.base.build_optimizer): a low-bit AdamW rounds
            # stochastically (optimizers.low_memory_optimizer), as do Adam/AdamW (optimizers.stochastic_round_adam);
            # SGD is torch's.
            if opt == PAGED:
                notes.append(f"  The plan's {opt} (bitsandbytes) rounds each bf16 weight to nearest in its own "
                             "kernel, as torchtune's recipes run it.")
            elif opt != "none":
                notes.append(f"  The plan's {opt} rounds stochastically: build it (below) with "
                             "bf16_stochastic_round=True; rounding to nearest")
                notes.append("  drops updates under half a bf16 spacing of the weight.")
            elif optimizer in PURE_BF16_CLIENT:
                name = ADAM_TITLES[optimizer]
                notes.append(f"  The plan's {name} rounds stochastically: build {PURE_BF16_CLIENT[optimizer]};")
                notes.append(f"  torch's {name} rounds to nearest and drops updates under half a bf16 spacing of the "
                             "weight.")
            else:
                notes.append("  The job's SGD is torch.optim.SGD, as on the plan's ranks: it rounds to nearest, so "
                             "updates under half")
                notes.append("  a bf16 spacing of a weight are lost (torchao has no stochastically rounding SGD).")
        if OPTIMIZER_IN_BACKWARD.on(plan.strategy):
            # accelerate and the HF Trainer have no setting for it: the script has to do it, or hold the gradients.
            notes += ["The plan steps the optimizer in backward (no gradient buffer, no clipping); accelerate has no",
                      "  setting for it: build one optimizer per parameter and step it from",
                      "  param.register_post_accumulate_grad_hook (as torchtune's optimizer_in_bwd), with no "
                      "clip_grad_norm;",
                      "  a plain optimizer.step() holds every gradient at the step, beyond the plan's peak."]
        if opt != "none":
            # accelerate carries no optimizer: the script builds the one the plan's memory assumes.
            notes.append(f"The plan assumes the {opt} optimizer: build {LOW_MEMORY_CLASSES[opt]} over the prepared "
                         "model's parameters (docs/memory-model.md, Low-memory optimizers).")
        return notes


SPEC = FsdpSpec()
"""The registered spec (launcher.engines.ENGINES["fsdp"])."""
