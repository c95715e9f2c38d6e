"""What an engine tells the planner: the EngineSpec interface. The layouts it offers the search are its own type
(launcher.engines.layout.Layout, in its package's ``layout`` module).

The plan side of an engine is pure (numbers and text in, numbers and text out) and sits in the core layer;
its rank side (launcher.worker.engines) imports torch and is found by the same name there.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from launcher.config.job import Job
from launcher.emit.exports import accelerate_env, accelerate_yaml_text, ops_notes
from launcher.engines.layout import Layout
from launcher.planner.plan import Buckets, Plan, Strategy
from launcher.planner.terms import MemoryInputs, States, Traffic


class EngineSpec:
    """One engine's plan side. Subclasses fill every method; nothing outside launcher.engines names an engine.

    The fallback rungs an engine answers (``rung_options``) are the engine-specific ones of
    launcher.planner.fallback.RUNGS: sharding, optimizer_offload, param_offload and nvme.
    """

    name: str
    """Registry name, as a job's strategy.engine and plan.json's engine say it."""
    rank_engine: str
    """The rank side's Engine class name in launcher.worker.engines (found there by ``name``)."""
    uses_buckets: bool = False
    """The engine reads the planner's communication buckets (sized to the budget, retried at their smallest)."""
    config_env: tuple[tuple[str, str], ...] = ()
    """(environment variable, file in the run dir) pairs the ranks read their config through."""
    config_names: tuple[str, ...] = ()
    """The config files every run of the engine has in its run dir (``config_files``; each attempt of the fallback
    ladder archives them)."""
    export_names: tuple[str, ...] = ()
    """The engine's other files: what ``export_files`` adds for `plan --out`, and what ``config_files`` adds for a
    plan made for the user's script. A plan for another engine removes both kinds
    (launcher.files.rundir.ENGINE_FILES)."""
    levers: frozenset[str] = frozenset()
    """The lever fields (launcher.planner.plan.LEVER_FIELDS) this engine's rank side implements; the search
    leaves the others off for it (launcher.planner.levers)."""
    pure_bf16_optimizers: frozenset[str] = frozenset()
    """The low-memory optimizers (Strategy.low_memory_optimizer) this engine's rank side steps pure bf16 weights
    with; the search pairs pure bf16 with no other (launcher.planner.levers.options)."""

    # -- search --------------------------------------------------------------------------------------------------
    def lever_values(self, layout: Layout) -> dict[str, tuple[tuple[object, ...], str]]:
        """Lever fields whose values this layout limits further than ``levers`` says: field -> (the values it
        offers, why it offers no other), for levers an engine implements on some of its layouts only."""
        return {}

    def candidates(self, *, nodes: int, nvme: bool, world_size: int) -> list[Layout]:
        """Every layout this engine offers on ``nodes`` machines and ``world_size`` ranks, with NVMe offload when
        ``nvme``; in search order."""
        raise NotImplementedError

    # -- memory --------------------------------------------------------------------------------------------------
    def states(self, inp: MemoryInputs, s: Strategy, buckets: Buckets) -> States:
        """Model states per rank, split by when each exists (launcher.planner.memory assembles the moments)."""
        raise NotImplementedError

    def init_bytes(self, inp: MemoryInputs, s: Strategy) -> float:
        """Rank 0's bytes while the weights load and the engine wraps them, before any forward."""
        raise NotImplementedError

    def load_bytes_per_node(self, inp: MemoryInputs, s: Strategy) -> float:
        """Host bytes per node while the weights load."""
        raise NotImplementedError

    def fp32_adapters(self, s: Strategy, *, script: bool) -> bool:
        """Under LoRA in bf16/fp16, whether this layout's ranks compute the adapters in fp32 rather than in the
        working dtype; the planner then adds the probe's fp32-adapter terms (launcher.planner.memory
        .strategy_activations). The launcher's recipes make them in the base's dtype (launcher.model.lora
        .apply_lora); a user's script (``script``, MemoryInputs.script) is taken to use peft's default, fp32."""
        return False

    def nccl_communicators(self, s: Strategy) -> int:
        """NCCL communicators a CUDA rank of this engine holds (launcher.planner.cuda_overhead [COMM]): the default
        process group every rank creates (launcher.worker.main), plus the engine's own groups."""
        return 1

    # -- cost ----------------------------------------------------------------------------------------------------
    def optimizer_shard_ranks(self, inp: MemoryInputs, s: Strategy) -> int:
        """Ranks the optimizer's parameters are divided over."""
        raise NotImplementedError

    def communication(self, inp: MemoryInputs, s: Strategy, bucket_elems: int) -> Traffic:
        """Per-rank collective traffic of one optimizer step, on more than one rank."""
        raise NotImplementedError

    def optimizer_on_host(self, s: Strategy) -> bool:
        """The optimizer steps on the host CPUs (its state offloaded)."""
        return s.layout.offload_optimizer != "none"

    def offload_s(self, inp: MemoryInputs, s: Strategy) -> float:
        """Seconds per step spent moving offloaded state and stepping the optimizer on the host."""
        raise NotImplementedError

    def native_ops(self, plan: Plan) -> tuple[str, ...]:
        """The compiled ops (launcher.processes.ops.OPS names) a run of ``plan`` loads; built before its ranks start."""
        return ()

    def dequant_s(self, inp: MemoryInputs, s: Strategy) -> float:
        """Seconds per step dequantizing a quantized frozen base (QLoRA) where this engine implements it."""
        return 0.0

    # -- fallback ------------------------------------------------------------------------------------------------
    def rung_options(self, rung: str, s: Strategy, *, nvme: bool) -> list[Strategy]:
        """This engine's changes to ``s`` for one of its rungs, least disruptive first; [] when used up."""
        raise NotImplementedError

    # -- emit ----------------------------------------------------------------------------------------------------
    def config_files(self, plan: Plan, job: Job) -> dict[str, str]:
        """File name -> text of the engine's configs in the run dir (launcher.engines.<name>.emit)."""
        raise NotImplementedError

    def rank_files(self, plan: Plan, job: Job) -> dict[str, str]:
        """The part of config_files the ranks read (a Slurm script carries these)."""
        raise NotImplementedError

    def export_files(self, plan: Plan, job: Job) -> dict[str, str]:
        """`plan --out`'s extra files for other tools, each checked before anything is written."""
        return {}

    def accelerate_config(self, plan: Plan, job: Job, *, config_dir: Path | None = None) -> dict:
        """An `accelerate launch --config_file` config; ``config_dir`` holds the engine's config files."""
        raise NotImplementedError

    def accelerate_title(self, s: Strategy) -> str:
        """The engine as accelerate.yaml's header names it."""
        raise NotImplementedError

    def buckets_shown(self, layout: Layout) -> tuple[str, ...]:
        """The Buckets fields `launch plan` shows for this layout (those its config uses); none by default."""
        return ()

    def script_env(self, plan: Plan, job: Job, *, config_dir: Path) -> dict[str, str]:
        """A --script rank's environment for the engine: what ``accelerate launch`` would set for the plan's
        accelerate config (launcher.emit.exports.accelerate_env), the engine's config files in ``config_dir``."""
        return accelerate_env(plan, self.accelerate_config(plan, job, config_dir=config_dir))

    def accelerate_env(self, plan: Plan) -> str:
        """What the launch line sets in the environment because accelerate reads it only from there."""
        return ""

    def accelerate_notes(self, plan: Plan, config_dir: Path, *, optimizer: str) -> list[str]:
        """What a script run with this engine's accelerate.yaml must do; ``optimizer``: the job's train.optimizer
        (plan.json does not carry it, and pure bf16's step depends on it)."""
        raise NotImplementedError

    def accelerate_yaml(self, plan: Plan, job: Job, *, config_dir: Path) -> str:
        """`plan --out`'s accelerate.yaml in ``config_dir``: the config under a header with the launch line."""
        return accelerate_yaml_text(plan, title=self.accelerate_title(plan.strategy),
                                    config=self.accelerate_config(plan, job, config_dir=config_dir),
                                    config_file=str((config_dir / "accelerate.yaml").resolve()),
                                    env=self.accelerate_env(plan),
                                    notes=[*self.accelerate_notes(plan, config_dir, optimizer=job.train.optimizer),
                                           *self._adapter_notes(plan, job), *self.export_notes(plan)])

    def export_notes(self, plan: Plan) -> list[str]:
        """What accelerate.yaml's header adds for the plan's other exports: the DeepSpeed ops a script run loads
        and the one command that builds them (launcher.emit.exports.ops_notes)."""
        return ops_notes(self.native_ops(dataclasses.replace(plan, script=True)))

    def _adapter_notes(self, plan: Plan, job: Job) -> list[str]:
        """Under LoRA in bf16/fp16, where a script's peft defaults would cost what the recipe's plan does not count."""
        if job.train.lora is None or plan.precision == "fp32" or not self.fp32_adapters(plan.strategy, script=True):
            return []
        return [f"LoRA: the plan counts the adapters in {plan.precision}, as the launcher's ranks make them:",
                "  get_peft_model(model, config, autocast_adapter_dtype=False). peft's default fp32 adapters compute "
                "in",
                "  fp32 here, an fp32 copy of each adapted linear's input saved (`launch plan --script` counts it)."]
