"""DeepSpeed ZeRO 0-3's spec: its layouts, the levers each offers, cost terms, fallback rungs, config files and
words. The memory terms are launcher.engines.deepspeed.memory's; ds_config.json is launcher.engines.deepspeed.emit's.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from launcher.config.job import Job
from launcher.emit.exports import ADAM_TITLES, PURE_BF16_CLIENT, ops_env
from launcher.engines.deepspeed.emit import DS_CONFIG_FILE, ds_config
from launcher.engines.deepspeed.exports import (
    deepspeed_accelerate_config,
    deepspeed_notes,
    hf_ds_config,
    hf_trainer_notes,
    script_ds_config,
)
from launcher.engines.deepspeed.layout import ZeroLayout
from launcher.engines.deepspeed.memory import DEEPSPEED_COMMUNICATORS, cuda_init_bytes, deepspeed_states
from launcher.engines.spec import EngineSpec
from launcher.levers import (
    ACTIVATION_OFFLOAD,
    CHECKPOINT_EVERY,
    CHECKPOINT_POLICY,
    CHUNKED_LOSS,
    LOW_MEMORY_OPTIMIZER,
    PURE_BF16,
    RELEASE_FROZEN_WEIGHTS,
    fields,
)
from launcher.levers.low_memory_optimizer import PAGED
from launcher.planner.hardware import ranks_on_host
from launcher.planner.plan import Buckets, Plan, Strategy
from launcher.planner.terms import (
    BYTES,
    LOW_BIT_STATE,
    MemoryInputs,
    States,
    Traffic,
    optimizer_offload_s,
    over_links,
    untied_head_bytes,
)
from launcher.processes.rankenv import DS_CONFIG_ENV

STAGES = (0, 1, 2, 3)
HF_EXPORT = "ds_config.hf.json"
SCRIPT_CONFIG = "ds_config.script.json"
"""A --script run's DeepSpeed config (exports.script_ds_config): the plan's memory, the script's math."""

LOW_MEMORY_REFUSED = {
    "offload": "ZeRO-Offload steps the optimizer with DeepSpeed's own CPU Adam (DeepSpeedCPUAdam; engine.py "
               "_configure_optimizer refuses a client optimizer there), which keeps fp32 moments",
    "stage3": "ZeRO-3 steps flat sub-groups of per-parameter padded partitions (stage3.py _optimizer_step), whose "
              "sizes the plan cannot check against torchao's block rule, and that was not measured",
    "paged": "bitsandbytes' paged AdamW8bit runs on FSDP2's one-rank plans only, not as DeepSpeed's client optimizer",
    "flat": "ZeRO-1/2 hand the optimizer one flat 1-D partition (stage_1_and_2.py single_partition_of_fp32_groups): "
            "Adafactor would factor nothing and take its RMS over the whole partition, another update for every N",
}
"""Why a DeepSpeed layout does not offer a low-memory optimizer (DeepSpeedSpec.lever_values)."""

PURE_BF16_REFUSED = {
    "stage0": "DeepSpeed keeps bf16 master weights and gradients only under ZeRO-1, 2 or 3 (runtime/config.py "
              "asserts it for bf16_master_weights_and_grads)",
    "offload": "ZeRO-Offload with bf16 master weights steps DeepSpeed's own CPU Adam (base_optimizer.py "
               "_configure_master_weights requires DeepSpeedCPUAdam with fp32_optimizer_states=False), which rounds "
               "to nearest, not the stochastically rounded AdamW pure bf16 steps with; and a client optimizer is "
               "refused there",
}
"""Why a DeepSpeed layout does not offer pure bf16 (DeepSpeedSpec.lever_values)."""
RELEASE_REFUSED = ("ZeRO-0/1/2 keep every weight whole on every rank: there is no gathered weight to release (the "
                   "linear is ZeRO-3's, zero/linear.py)")
"""Why a DeepSpeed layout below ZeRO-3 does not offer release_frozen_weights (DeepSpeedSpec.lever_values)."""


def pure_bf16_notes(optimizer: str) -> list[str]:
    """What a pure-bf16 DeepSpeed plan's accelerate.yaml adds for the script, by the job's train.optimizer: Adam and
    AdamW step the rounding client optimizer the script builds (PURE_BF16_CLIENT; ds_config.json names none), SGD
    is ds_config.json's own block (launcher.engines.deepspeed.emit._fill_optimizer)."""
    if optimizer in PURE_BF16_CLIENT:
        name = ADAM_TITLES[optimizer]
        return [
            "Pure bf16: ds_config.json keeps bf16 master weights, gradients and optimizer states; DeepSpeed's own "
            f"{name}",
            "  would round each new weight to nearest and drop updates under half a bf16 spacing, so the plan steps "
            "the",
            "  stochastically rounding one above. HF Trainer with ds_config.hf.json: pass it as optimizers=(opt, "
            "None).",
        ]
    return [
        "Pure bf16: ds_config.json keeps bf16 master weights and gradients and names the job's SGD, which DeepSpeed",
        "  builds (torch.optim.SGD) and which rounds each new weight to nearest: updates under half a bf16 spacing of",
        "  a weight are lost, on the plan's ranks too (torchao has no stochastically rounding SGD). HF Trainer with",
        "  ds_config.hf.json: its optimizer block builds the same SGD; pass no optimizer.",
    ]


CLIENT_OPTIMIZER = {"adamw8bit": "torchao.optim.AdamW8bit", "adamw4bit": "torchao.optim.AdamW4bit",
                    "adafactor": "torch.optim.Adafactor"}
"""The class a script builds for Strategy.low_memory_optimizer (ds_config.json names no optimizer then)."""
HF_TRAINER_OPTIM = {
    "adamw8bit": "HF Trainer with ds_config.hf.json: --optim adamw_torch_8bit (torchao's AdamW8bit).",
    "adamw4bit": "HF Trainer with ds_config.hf.json: --optim adamw_torch_4bit (torchao's AdamW4bit).",
    # transformers' Adafactor (optimization.py) scales by the parameter's RMS with a relative step by default and
    # is not torch.optim.Adafactor: the Trainer cannot run the plan's.
    "adafactor": "HF Trainer cannot carry it: its --optim adafactor is transformers' own Adafactor, another update.",
}
"""What the HF Trainer export (ds_config.hf.json, no optimizer block) needs for a low-memory optimizer."""



class DeepSpeedSpec(EngineSpec):
    """DeepSpeed ZeRO stages 0-3 with CPU and NVMe offload: its layouts, memory and cost terms, fallback rungs and
    ds_config.json (launcher.engines.deepspeed.emit); the rank side is
    launcher.worker.engines.deepspeed.DeepSpeedEngine."""

    name = ZeroLayout.engine
    rank_engine = "DeepSpeedEngine"
    uses_buckets = True
    config_env = ((DS_CONFIG_ENV, DS_CONFIG_FILE),)
    config_names = (DS_CONFIG_FILE,)
    export_names = (HF_EXPORT, SCRIPT_CONFIG)
    levers = fields(CHUNKED_LOSS, CHECKPOINT_EVERY, CHECKPOINT_POLICY, ACTIVATION_OFFLOAD, LOW_MEMORY_OPTIMIZER,
                    PURE_BF16, RELEASE_FROZEN_WEIGHTS)
    # At ZeRO-1/2 (the layouts offering both, lever_values) the client optimizer steps the flat bf16 master:
    # torchao's low-bit AdamW with bf16_stochastic_round (launcher.worker.engines.optimizers.low_memory_optimizer).
    pure_bf16_optimizers = frozenset({"adamw8bit", "adamw4bit"})

    def lever_values(self, c: ZeroLayout) -> dict[str, tuple[tuple[object, ...], str]]:
        """The low-memory optimizers a layout can run as DeepSpeed's client optimizer, and why not the others:
        torchao's two and Adafactor at ZeRO-0 (the parameters keep their shapes), torchao's low-bit AdamWs at ZeRO-1/2
        (one flat partition: block-wise quantization works, Adafactor's factoring does not), none at ZeRO-3 or with
        optimizer offload (LOW_MEMORY_REFUSED), bitsandbytes' paged one at none. Pure bf16 at ZeRO-1/2/3 without
        optimizer offload (PURE_BF16_REFUSED). The frozen weights released after forward at ZeRO-3 only
        (RELEASE_REFUSED)."""
        out: dict[str, tuple[tuple[object, ...], str]] = {}
        if c.zero_stage != 3:
            out[RELEASE_FROZEN_WEIGHTS.field] = ((False,), RELEASE_REFUSED)
        if c.offload_optimizer != "none":
            return {**out, LOW_MEMORY_OPTIMIZER.field: (("none",), LOW_MEMORY_REFUSED["offload"]),
                    PURE_BF16.field: ((False,), PURE_BF16_REFUSED["offload"])}
        if c.zero_stage == 3:
            return {**out, LOW_MEMORY_OPTIMIZER.field: (("none",), LOW_MEMORY_REFUSED["stage3"])}
        if c.zero_stage in (1, 2):
            torchao = tuple(v for v in LOW_BIT_STATE if v != PAGED)
            return {**out, LOW_MEMORY_OPTIMIZER.field: (("none", *torchao),
                                                        f"{LOW_MEMORY_REFUSED['flat']}; {LOW_MEMORY_REFUSED['paged']}")}
        return {**out, PURE_BF16.field: ((False,), PURE_BF16_REFUSED["stage0"]),
                LOW_MEMORY_OPTIMIZER.field: (("none", "adamw8bit", "adamw4bit", "adafactor"),
                                             LOW_MEMORY_REFUSED["paged"])}

    def native_ops(self, plan: Plan) -> tuple[str, ...]:
        """cpu_adam for an offloaded optimizer (DeepSpeedCPUAdam steps it, from NVMe too), async_io for NVMe, and
        on CPU ranks under a script deepspeed_shm_comm, which DeepSpeed's communication start loads there (the
        launcher's own ranks skip it: worker.engines.deepspeed.skip_shm_comm_op)."""
        lay, ops = plan.strategy.layout, []
        if lay.offload_optimizer != "none":
            ops.append("cpu_adam")
        if "nvme" in (lay.offload_optimizer, lay.offload_params):
            ops.append("async_io")
        if plan.script and ranks_on_host(plan):
            ops.append("deepspeed_shm_comm")
        return tuple(ops)

    def candidates(self, *, nodes: int, nvme: bool, world_size: int) -> list[ZeroLayout]:
        """Each ZeRO stage with the offloads it supports: optimizer offload from stage 2, parameters and NVMe at 3."""
        out = []
        for zero in STAGES:
            out += [ZeroLayout(zero_stage=zero, offload_optimizer=opt, offload_params=par)
                    for opt, par in self._offloads(zero, nvme)]
        return out

    @staticmethod
    def _offloads(zero: int, nvme: bool) -> list[tuple[str, str]]:
        if zero <= 1:
            return [("none", "none")]  # ZeRO-Offload of the optimizer needs gradient partitioning (stage 2+)
        opts = [("none", "none"), ("cpu", "none")]
        if zero == 3:
            opts += [("cpu", "cpu")]
            if nvme:
                opts += [("nvme", "none"), ("nvme", "nvme"), ("cpu", "nvme")]
        return opts

    def states(self, inp: MemoryInputs, s: Strategy, buckets: Buckets) -> States:
        """ZeRO's model states per rank (deepspeed_states: [ZeRO Table 1] with DeepSpeed's buffers)."""
        return deepspeed_states(inp, s, buckets)

    def fp32_adapters(self, s: Strategy, *, script: bool) -> bool:
        """A user's script at ZeRO-3 only: ZeRO-0/1/2 cast peft's fp32 adapters to the working dtype, a zero.Init
        model is not cast (docs/memory-model.md#loras-adapters-the-dtype-they-compute-in-probe-versions-9-and-10)."""
        return script and (s.layout.zero_stage or 0) == 3

    def init_bytes(self, inp: MemoryInputs, s: Strategy) -> float:
        """ZeRO-3: transformers reads the checkpoint into rank 0's host memory and copies it in one gathered
        parameter at a time (integrations/deepspeed.py _load_state_dict_into_zero3_model, map_location "cpu" on
        rank 0 only): checkpoint + the wΨ/N partition + the largest layer gathered (wL). ZeRO-0/1/2: rank 0
        builds in fp32 (4Ψ), casts to the working dtype on the host, and deepspeed.initialize flattens the
        trainable parameters into a copy (wΨ_t) beside the model (wΨ)."""
        m, w, n = inp.model, BYTES[inp.precision], inp.world_size
        device_is_host = inp.hardware.device_is_host
        if (s.layout.zero_stage or 0) >= 3:
            # Offloaded parameters are partitioned into host memory: on a GPU not on the device at this moment.
            partition_on_device = s.layout.offload_params == "none" or device_is_host
            checkpoint = m.checkpoint_bytes if device_is_host else 0.0
            partition = w * m.num_params / n if partition_on_device else 0.0
            return checkpoint + partition + w * m.largest_layer_params
        if not device_is_host:
            return cuda_init_bytes(inp, s)
        build = 4 * m.num_params + untied_head_bytes(m)
        return max(build, w * m.num_params + w * m.trainable_params)

    def nccl_communicators(self, s: Strategy) -> int:
        """The default group and DeepSpeed's data-parallel group, a clone of it (deepspeed/utils/groups.py
        _get_data_parallel_group -> _clone_world_group: dist.new_group(range(world_size))), at every stage."""
        return DEEPSPEED_COMMUNICATORS

    def load_bytes_per_node(self, inp: MemoryInputs, s: Strategy) -> float:
        """Host bytes per node while loading: fp32 weights (4Ψ), or under ZeRO-3 the checkpoint plus one fp32 copy of
        the largest layer per rank of the node (zero.Init)."""
        m = inp.model
        if (s.layout.zero_stage or 0) >= 3:
            # zero.Init: each rank copies in one parameter at a time [DS: "4nL·f with zero.Init"], after
            # transformers reads the checkpoint whole into rank 0's host memory (init_bytes).
            return 4 * m.largest_layer_params * inp.gpus_per_node + m.checkpoint_bytes
        return 4 * m.num_params

    def optimizer_shard_ranks(self, inp: MemoryInputs, s: Strategy) -> int:
        """Ranks the optimizer step is divided over, as the cost model counts them: every rank."""
        return inp.world_size

    def communication(self, inp: MemoryInputs, s: Strategy, bucket_elems: int) -> Traffic:
        """ZeRO-0 all-reduces the gradients once (2Ψ: reduce-scatter + all-gather) and ZeRO-1 all-gathers the
        updated parameters once more; ZeRO-2 reduce-scatters every micro-step and gathers once; ZeRO-3 gathers
        parameters in forward and backward and reduce-scatters gradients every micro-step (3Ψ) [ZeRO §7]."""
        m, w, accum = inp.model, BYTES[inp.precision], s.grad_accum_steps
        grad_payload = w * m.trainable_params
        param_payload = w * m.num_params
        stage = s.layout.zero_stage or 0
        buckets = max(1, -(-grad_payload // max(1, w * bucket_elems)))
        if stage <= 1:
            volume = 2 * grad_payload + (param_payload if stage == 1 else 0)  # all-reduce once; ZeRO-1 regathers
            calls = buckets
        elif stage == 2:
            volume = accum * grad_payload + param_payload  # reduce-scatter every micro-step, all-gather once
            calls = accum * buckets + 1
        else:
            volume = accum * (2 * param_payload + grad_payload)  # gather fwd + bwd, reduce-scatter
            calls = accum * 3 * m.num_blocks
        return over_links(inp, volume, calls)

    def offload_s(self, inp: MemoryInputs, s: Strategy) -> float:
        """Seconds per step of the host optimizer step and its transfers, plus the offloaded parameters' copies (PCIe,
        and NVMe for the node's ranks) on every micro-step."""
        m, hw, n, w = inp.model, inp.hardware, inp.world_size, BYTES[inp.precision]
        accum = s.grad_accum_steps
        offload = 0.0
        if s.layout.offload_optimizer != "none":
            offload += optimizer_offload_s(inp, m.trainable_params / n, s.layout.offload_optimizer == "nvme")
        if s.layout.offload_params != "none":
            offload += accum * 2 * w * m.num_params / n / hw.host_link_bw
            if s.layout.offload_params == "nvme":
                offload += accum * 2 * w * m.num_params / n * inp.gpus_per_node / hw.nvme_bw
        return offload

    def rung_options(self, rung: str, s: Strategy, *, nvme: bool) -> list[Strategy]:
        """The fallback ladder's changes: a higher ZeRO stage, optimizer offload (stage >= 2), parameter
        offload (stage 3), or further out to NVMe."""
        lay = s.layout
        stage = lay.zero_stage or 0

        def to(**changes) -> Strategy:
            return dataclasses.replace(s, layout=dataclasses.replace(lay, **changes))

        if rung == "sharding":
            return [to(zero_stage=z) for z in range(stage + 1, 4)]
        if rung == "optimizer_offload":
            if lay.offload_optimizer != "none":
                return []
            # ZeRO-Offload needs partitioned gradients (stage 2 or 3)
            return [to(offload_optimizer="cpu", zero_stage=max(stage, 2))]
        if rung == "param_offload":
            if lay.offload_params != "none":
                return []
            opt = lay.offload_optimizer if lay.offload_optimizer != "none" else "cpu"  # both, or the optimizer only
            return [to(offload_params="cpu", offload_optimizer=opt, zero_stage=3)]
        if rung == "nvme":
            if not nvme:
                return []
            # Only further out: nothing comes back from NVMe or host, and something new goes to NVMe.
            further = [ZeroLayout(zero_stage=3, offload_optimizer=opt, offload_params=par)
                       for opt, par in (("nvme", "none"), ("cpu", "nvme"), ("nvme", "nvme"))]
            return [dataclasses.replace(s, layout=new) for new in further if new.offloads_further(lay)]
        raise ValueError(f"unknown rung {rung!r}")

    def buckets_shown(self, layout: ZeroLayout) -> tuple[str, ...]:
        """The reduce and all-gather buckets; at ZeRO-3 the prefetch bucket and the live-parameter cap too."""
        stage3 = ("stage3_prefetch_bucket_size", "stage3_max_live_parameters") if layout.zero_stage == 3 else ()
        return ("reduce_bucket_size", "allgather_bucket_size", *stage3)

    def config_files(self, plan: Plan, job: Job) -> dict[str, str]:
        """ds_config.json for the run dir; a plan for the user's script adds ds_config.script.json."""
        files = {DS_CONFIG_FILE: json.dumps(ds_config(plan, job), indent=2) + "\n"}
        if plan.script:
            files[SCRIPT_CONFIG] = json.dumps(script_ds_config(plan, job), indent=2) + "\n"
        return files

    def script_env(self, plan: Plan, job: Job, *, config_dir: Path) -> dict[str, str]:
        """accelerate's variables, its DeepSpeed config file the script's variant (ds_config.script.json)."""
        env = super().script_env(plan, job, config_dir=config_dir)
        env["ACCELERATE_DEEPSPEED_CONFIG_FILE"] = str((Path(config_dir) / SCRIPT_CONFIG).resolve())
        return env

    def rank_files(self, plan: Plan, job: Job) -> dict[str, str]:
        """ds_config.json: the ranks read it too."""
        return self.config_files(plan, job)

    def export_files(self, plan: Plan, job: Job) -> dict[str, str]:
        """The DeepSpeed config checked by DeepSpeed's own parser, and its HF Trainer variant."""
        from launcher.engines.deepspeed.check import check_ds_config

        check_ds_config(ds_config(plan, job), plan.world_size)
        return {HF_EXPORT: json.dumps(hf_ds_config(plan, job), indent=2) + "\n"}

    def accelerate_config(self, plan: Plan, job: Job, *, config_dir: Path | None = None) -> dict:
        """accelerate's DeepSpeed config pointing at the ds_config.json in ``config_dir``; ValueError without
        ``config_dir``."""
        # accelerate reads the concrete ds_config.json: it would fill the HF variant's "auto" precision and
        # accumulation with its own defaults (no mixed precision, 1), not the plan's.
        if config_dir is None:
            raise ValueError("accelerate_config: a DeepSpeed plan needs ds_config_file, the path of its DeepSpeed "
                             "config: give config_dir, the directory holding ds_config.json")
        return deepspeed_accelerate_config(plan, job, ds_config_file=self._ds_file(config_dir))

    @staticmethod
    def _ds_file(config_dir: Path) -> str:
        return str((Path(config_dir) / DS_CONFIG_FILE).resolve())

    def accelerate_title(self, s: Strategy) -> str:
        """"DeepSpeed ZeRO-<stage>", accelerate.yaml's header."""
        return s.layout.title(1)

    def accelerate_notes(self, plan: Plan, config_dir: Path, *, optimizer: str) -> list[str]:
        """What a script launched with this accelerate.yaml must do (exports.deepspeed_notes)."""
        opt = LOW_MEMORY_OPTIMIZER.of(plan.strategy)
        if PURE_BF16.on(plan.strategy) and opt != "none":
            # The low-bit AdamW over the bf16 master, rounding stochastically (the ranks' client optimizer).
            return [*deepspeed_notes(self._ds_file(config_dir), f"{CLIENT_OPTIMIZER[opt]}(params, lr, "
                                     "weight_decay=..., bf16_stochastic_round=True)"), *pure_bf16_notes("adamw")]
        if PURE_BF16.on(plan.strategy):
            # Adam/AdamW: the rounding client optimizer, not in ds_config.json; SGD: ds_config.json's (DummyOptim).
            client = PURE_BF16_CLIENT.get(optimizer, "")
            return [*deepspeed_notes(self._ds_file(config_dir), client), *pure_bf16_notes(optimizer)]
        if opt == "none":
            return deepspeed_notes(self._ds_file(config_dir))
        return [*deepspeed_notes(self._ds_file(config_dir), CLIENT_OPTIMIZER[opt]), HF_TRAINER_OPTIM[opt]]

    def accelerate_env(self, plan: Plan) -> str:
        """TORCH_EXTENSIONS_DIR: the ops `launch` built, which accelerate's DeepSpeed would otherwise compile again."""
        return ops_env()

    def export_notes(self, plan: Plan) -> list[str]:
        """The ops, and the flags HF Trainer needs beside ds_config.hf.json (its "auto" values are the Trainer's)."""
        return [*super().export_notes(plan), *hf_trainer_notes(plan, HF_EXPORT)]


SPEC = DeepSpeedSpec()
"""The registered spec (launcher.engines.ENGINES["deepspeed"])."""
