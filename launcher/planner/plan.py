"""The plan: what the planner decided, with the numbers behind it.

``to_json`` keys are a public contract (tests and outside checks read them).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from launcher.config.job import Precision
from launcher.engines import flat_layout, layout_type
from launcher.engines.layout import Layout
from launcher.levers import LEVER_FIELDS, LEVERS, REFINEMENTS, with_lever_fields


@dataclass(kw_only=True, slots=True)
class Buckets:
    """DeepSpeed communication buffer sizes, in elements (DeepSpeed's unit)."""

    reduce_bucket_size: int
    """Gradient reduce bucket, elements."""
    allgather_bucket_size: int
    """ZeRO-1/2 parameter all-gather bucket, elements."""
    stage3_prefetch_bucket_size: int
    """ZeRO-3 parameters fetched ahead, elements."""
    stage3_max_live_parameters: int
    """ZeRO-3 unsharded parameters alive at once, elements."""
    stage3_param_persistence_threshold: int
    """ZeRO-3 parameters smaller than this stay unsharded, elements."""
    sub_group_size: int = 1_000_000_000
    """ZeRO-3 optimizer sub-group, elements: the step prepares, updates and frees one sub-group's fp32 gradient at
    a time (stage3.py step); DeepSpeed's default (1e9) where a plan.json written before this field is read."""


@dataclass(kw_only=True, slots=True)
@with_lever_fields()
class Strategy:
    """One point of the search space: the engine's layout, the micro-batch and checkpointing, and after them one
    field per registered lever (launcher.levers: its LeverSpec says what it holds), off by default, so a plan.json
    written before a lever reads back as the plan it was."""

    layout: Layout
    """How the engine shards and offloads: its own type (launcher.engines.LAYOUTS), which names the engine."""
    micro_batch_size: int
    """Sequences per rank per forward."""
    grad_accum_steps: int
    """Micro-batches per optimizer step."""
    activation_checkpointing: bool
    """Recompute of blocks in backward (the checkpointing levers say which and how)."""

    @property
    def engine(self) -> str:
        """The engine's registry name (the layout's)."""
        return self.layout.engine

    def label(self) -> str:
        """The short description plans and reports print, e.g. "ZeRO-3 +opt->cpu, mb=2x4, AC"."""
        s = f"{self.layout.label()}, mb={self.micro_batch_size}x{self.grad_accum_steps}"
        if self.activation_checkpointing:
            s += ", AC" + "".join(spec.checkpointing_words(spec.of(self))[0] for spec in REFINEMENTS)
        return s + "".join(f", {word}" for word in self.lever_words())

    def lever_words(self) -> list[str]:
        """The levers in use beyond sharding, offload, micro-batch and checkpointing, a short word each
        (LeverSpec.word)."""
        return [word for spec in LEVERS.values()
                if not spec.refines_checkpointing and (word := spec.word(spec.of(self)))]

    def to_json(self) -> dict:
        """The strategy flat, as plan.json and report.json write it: the engine, every registered layout's fields
        (null where this engine has none: launcher.engines.LAYOUT_KEYS), the micro-batch, checkpointing, levers."""
        return {"engine": self.engine, **flat_layout(self.layout), "micro_batch_size": self.micro_batch_size,
                "grad_accum_steps": self.grad_accum_steps, "activation_checkpointing": self.activation_checkpointing,
                **{name: getattr(self, name) for name in LEVER_FIELDS}}

    @classmethod
    def from_json(cls, d: dict) -> Strategy:
        """A strategy from its flat keys (to_json's); a field added later (a lever, a layout's) takes its default
        where an older file lacks it."""
        return cls(layout=layout_type(d["engine"]).from_flat(d),
                   **{f.name: d[f.name] for f in dataclasses.fields(cls)
                      if f.name != "layout" and (f.name in d or f.default is dataclasses.MISSING)})


@dataclass(kw_only=True, slots=True)
class MemoryEstimate:
    """The memory model's answer for one strategy (launcher.planner.memory.estimate_memory)."""

    breakdown: dict[str, int]
    """Device bytes per rank by category at the predicted peak (params, grads, optimizer, activations, logits,
    buffers, reserve)."""
    peak_bytes: int
    """Predicted peak device bytes per rank (the breakdown's sum)."""
    host_bytes_per_node: int
    """Host RAM bytes per node: offloaded state and pinned buffers of every rank, or the weight load."""
    nvme_bytes_per_node: int
    """NVMe bytes per node for offloaded optimizer state and parameters."""
    peak_moment: str = "backward"
    """Which moment is the peak: backward (activations), backward_end (gradient reduce), step (optimizer) or
    init (the weight load); not in plan.json, so "backward" where a plan is read back."""
    basis: str = "cpu_tensor_bytes"
    """What peak_bytes counts (launcher.planner.cuda_overhead.Basis): cpu_tensor_bytes (CPU ranks) or
    cuda_reserved_plus_context (CUDA ranks: reserved plus context, the thing that OOMs there)."""
    overhead: dict[str, int] = field(default_factory=dict)
    """CUDA-only named terms inside breakdown["reserve"], bytes: cublas_workspace, allocator_reserve,
    cuda_context, nccl_buffers (launcher.planner.cuda_overhead)."""
    moment_bytes: dict[str, int] = field(default_factory=dict)
    """Predicted bytes per rank at every moment (backward, backward_end, step, init; export on CPU ranks), reserve
    included: what each measured phase is compared with (benchmarks/accuracy); the peak is the largest."""
    training_breakdown: dict[str, int] = field(default_factory=dict)
    """Where the peak is rank 0's weight load or export: the breakdown at training's largest moment (the one a
    training OOM is corrected on, launcher.planner.fallback); empty where the peak is a training moment."""
    moment_stream_pool_bytes: dict[str, int] = field(default_factory=dict)
    """CUDA only: the part of each moment_bytes entry that the engine's side streams keep cached (overhead
    "stream_pools" at that moment; launcher.planner.cuda_overhead [POOL]); empty where none."""
    tensor_peak_bytes: int = 0
    """CUDA only: the tensor bytes (reserve apart) of the largest tensor moment, where a side-stream pool made
    another moment the peak on the verdict basis (what a basis that counts no pool compares with,
    launcher.records.report.predicted_on_basis); 0 where the peak's moment is also the tensor peak."""


@dataclass(kw_only=True, slots=True)
class Estimate(MemoryEstimate):
    """The memory model's figures for one strategy (the MemoryEstimate it extends) and the cost model's."""

    step_time_s: float
    """Predicted seconds per optimizer step."""
    step_time_terms: dict[str, float] = field(default_factory=dict)
    """Seconds by term: compute, communication, offload."""

    @classmethod
    def of(cls, memory: MemoryEstimate, step_time_terms: dict[str, float]) -> Estimate:
        """The memory model's answer with the cost model's terms; the step time is their sum."""
        fields = {name: getattr(memory, name) for name in _MEMORY_FIELDS}
        return cls(**fields, step_time_s=sum(step_time_terms.values()), step_time_terms=step_time_terms)


_MEMORY_FIELDS = tuple(f.name for f in dataclasses.fields(MemoryEstimate))
"""MemoryEstimate's field names, read once: Estimate.of runs for every candidate the search scores."""


Resource = Literal["device", "host_ram", "nvme"]


@dataclass(kw_only=True, slots=True, frozen=True)
class Problem:
    """Why a candidate does not fit: the resource it overruns, what it needs and what there is, bytes (numbers
    only: launcher.planner.plan_words words it)."""

    resource: Resource
    """device: the usable per-GPU budget; host_ram: host RAM per node; nvme: free NVMe per node."""
    need_bytes: int
    """Device: the predicted peak per rank; host RAM and NVMe: bytes per node."""
    have_bytes: int
    """What there is of that resource, bytes (the usable budget for device)."""
    largest: str = ""
    """Device: the largest category of the predicted peak."""


@dataclass(kw_only=True, slots=True)
class Rejected:
    """An alternative the planner did not choose, and why, as numbers (launch plan words them: launcher.cli.render)."""

    label: str
    """The strategy, as Strategy.label() writes it (no unit)."""
    why: Literal["device", "host_ram", "nvme", "slower"]
    """device / host_ram / nvme: the resource it overruns; slower: it fits but ranks behind the plan (steps
    slower, or changes the training math more for less than levers.MATH_LEVER_MARGIN faster)."""
    peak_bytes: int
    """Its predicted peak per rank, bytes."""
    step_time_s: float
    """Its predicted seconds per optimizer step."""
    need_bytes: int = 0
    """What it needs of the resource it overruns, bytes (device: the peak per rank; host RAM, NVMe: per node)."""
    have_bytes: int = 0
    """What there is of that resource, bytes (device: the usable budget)."""
    largest: str = ""
    """device: the largest category of its predicted peak."""

    @classmethod
    def from_json(cls, d: dict) -> Rejected | None:
        """A plan.json entry; None for one written before the typed fields (it carries only a reason sentence,
        which is not parsed back into a why: nothing reads a loaded plan's alternatives, only `launch plan`
        words them, from the plan it has just made)."""
        if "why" not in d:
            return None
        return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls) if f.name in d})


Why = Literal["needed_to_fit", "faster", "faster_than_without", "lower_peak", "pinned", "fits_without", "would_not_fit",
              "would_fit", "no_fit_either", "not_allowed", "engine_lacks", "not_paired", "not_applicable", "plan_lacks",
              "script_lacks"]
"""Used: needed_to_fit (no plan without it fits: for a math lever the search without it finds none, for an exact
one this plan without it is over a limit), faster (it fits without, but steps slower), faster_than_without (a math
lever this plan needs, where other plans fit without it but rank behind it: slower by more than
levers.MATH_LEVER_MARGIN per unit of math departure, or departing further) or
lower_peak (it fits without and steps as fast, with a higher peak).
Not used: fits_without (the plan fits, and would with it too: the deltas say what it would cost or save),
would_not_fit (switched on, the plan would go over: selective checkpointing keeps more than full), would_fit /
no_fit_either (a forced plan over its budget), not_allowed (a math lever train.allow_levers does not list),
engine_lacks (the chosen engine does not implement it), not_paired (pure bf16 and this low-memory optimizer
together, which the engine does not step: EngineSpec.pure_bf16_optimizers), not_applicable (not for this job: task,
precision, LoRA, optimizer), plan_lacks (not with the chosen plan's shape, which another plan of the job could have: the
checkpointing refinements with checkpointing off, the optimizer step in backward under accumulation), script_lacks (a
launch --script run: the user's script does not receive it, launcher.levers.SCRIPT_LEVERS). pinned: the job fixed it."""

@dataclass(kw_only=True, slots=True, frozen=True)
class LeverDecision:
    """One lever of the chosen plan: used or not, and why, with what switching it would change."""

    lever: str
    """The strategy field (launcher.levers.LEVER_FIELDS)."""
    exact: bool
    """True: the training math is the same with it; False: it needs train.allow_levers."""
    used: bool
    """The chosen plan uses it."""
    why: Why
    """The reason, as a code (see Why)."""
    other_value: object = None
    """The value compared with (the lever switched the other way); None when none was scored."""
    peak_delta_bytes: int = 0
    """Predicted peak with the other value minus the plan's, bytes (positive: the lever saves that much)."""
    step_time_delta_s: float = 0.0
    """Predicted step time with the other value minus the plan's, seconds."""
    other_problem: Problem | None = None
    """The limit the other value would overrun (the device budget, host RAM or NVMe per node); None where it
    fits or nothing was scored. A lever can save device memory and still not fit: activation offload's host RAM."""
    layout_reason: str = ""
    """engine_lacks where the engine implements the lever but not on the chosen layout: why, in the engine spec's
    words (EngineSpec.lever_values); "" otherwise."""

    def to_json(self) -> dict:
        """The decision as plan.json's dict (from_json reads it back); layout_reason only where there is one."""
        d = dataclasses.asdict(self)
        if not d["layout_reason"]:
            del d["layout_reason"]
        return d

    @classmethod
    def from_json(cls, d: dict) -> LeverDecision:
        """A decision read from plan.json; keys it does not know are ignored."""
        kw = {f.name: d[f.name] for f in dataclasses.fields(cls) if f.name in d}
        if kw.get("other_problem") is not None:
            kw["other_problem"] = Problem(**kw["other_problem"])
        return cls(**kw)


PLAN_SCHEMA = 2
"""plan.json's schema version: raised when a field changes meaning or goes (added fields read with defaults).
2: on CUDA the init moment of moment_bytes counts no cuBLAS workspace or kernels (cuda_overhead.absent_at)."""


@dataclass(kw_only=True, slots=True)
class Plan:
    """The chosen strategy with its estimate, the request it answers, and the reasons."""

    strategy: Strategy
    """What runs (no unit)."""
    estimate: Estimate
    """Its predicted bytes per rank and seconds per step."""
    buckets: Buckets
    """DeepSpeed communication buffers, elements."""
    num_params: int
    """All parameters of the model."""
    trainable_params: int
    """Parameters that get gradients (fewer under LoRA)."""
    budget_bytes: int
    """Per-GPU budget the plan was made for."""
    usable_bytes: int
    """Budget less the safety margin: what the prediction had to fit under."""
    world_size: int
    """Ranks in all, GPUs (or CPU ranks)."""
    nodes: int
    """Machines, each running gpus_per_node ranks."""
    gpus_per_node: int
    """Ranks per node, GPUs (or CPU ranks)."""
    global_batch_size: int
    """Sequences per optimizer step over all ranks."""
    seq_len: int
    """Tokens per sequence."""
    precision: Precision
    """Working dtype of params and activations (no unit)."""
    hardware: str
    """Hardware profile name."""
    reasons: list[str] = field(default_factory=list)
    """Why this plan, in sentences."""
    rejected: list[Rejected] = field(default_factory=list)
    """The nearest alternatives not chosen (launcher.planner.build.top_rejected), with why."""
    pinned: list[str] = field(default_factory=list)
    """Strategy fields the job pinned."""
    constants: dict[str, object] = field(default_factory=dict)
    """Memory-model constants used and where they came from."""
    status: Literal["fits", "forced"] = "fits"
    """fits: predicted within the usable budget; forced: a fully pinned plan run over it (--force)."""
    problem: Problem | None = None
    """forced: what the prediction overruns, with its numbers (the first reason words it:
    launcher.planner.plan_words.forced_reason); None for a plan that fits."""
    largest_layer_params: int = 0
    """DeepSpeed's L: the largest module's own parameters (sizes NVMe swap buffers)."""
    block_class: str | None = None
    """Transformer block class, the FSDP wrap and checkpointing unit."""
    precision_reason: str = ""
    """Why this precision: set by the job, or what train.precision: auto found on the devices (no unit)."""
    levers: list[LeverDecision] = field(default_factory=list)
    """Each lever beyond sharding: used or not, and why (launcher.planner.lever_choice)."""
    math_notes: list[str] = field(default_factory=list)
    """What the plan turns off in the job's training math, a sentence each (also among the reasons): the optimizer
    step in backward and clipping. The report repeats them (launcher.records.report)."""
    script: bool = False
    """Planned for the user's own script (launch --script, PlanRequest.script), not the launcher's recipe: what
    re-plans this run (the fallback ladder, --resume, calibrate --from) plans for the script again."""

    def to_json(self) -> dict:
        """The plan as plan.json's dict: the strategy's fields, the estimate, the request's numbers and the reasons."""
        s = self.strategy
        return {
            "schema": PLAN_SCHEMA,
            **s.to_json(),
            "num_params": self.num_params,
            "trainable_params": self.trainable_params,
            "budget_bytes": self.budget_bytes,
            "usable_bytes": self.usable_bytes,
            "predicted_peak_bytes": self.estimate.peak_bytes,
            "breakdown": dict(self.estimate.breakdown),
            "basis": self.estimate.basis,
            "overhead": dict(self.estimate.overhead),
            "host_bytes_per_node": self.estimate.host_bytes_per_node,
            "nvme_bytes_per_node": self.estimate.nvme_bytes_per_node,
            "predicted_step_time_s": self.estimate.step_time_s,
            "step_time_terms": dict(self.estimate.step_time_terms),
            # Only a plan the memory model made has moments (a plan.json read back from an older one has none).
            **({"moment_bytes": dict(self.estimate.moment_bytes)} if self.estimate.moment_bytes else {}),
            **({"training_breakdown": dict(self.estimate.training_breakdown)}
               if self.estimate.training_breakdown else {}),
            **({"moment_stream_pool_bytes": dict(self.estimate.moment_stream_pool_bytes)}
               if self.estimate.moment_stream_pool_bytes else {}),
            **({"tensor_peak_bytes": self.estimate.tensor_peak_bytes} if self.estimate.tensor_peak_bytes else {}),
            "buckets": dataclasses.asdict(self.buckets),
            "world_size": self.world_size,
            "nodes": self.nodes,
            "gpus_per_node": self.gpus_per_node,
            "global_batch_size": self.global_batch_size,
            "seq_len": self.seq_len,
            "precision": self.precision,
            "precision_reason": self.precision_reason,
            "hardware": self.hardware,
            "label": s.label(),
            "status": self.status,
            # Only a forced plan has one: a fitting plan's plan.json is as before the field.
            **({"problem": dataclasses.asdict(self.problem)} if self.problem else {}),
            "pinned": list(self.pinned),
            "reasons": list(self.reasons),
            "rejected": [dataclasses.asdict(r) for r in self.rejected],
            "constants": dict(self.constants),
            "largest_layer_params": self.largest_layer_params,
            "block_class": self.block_class,
            "levers": [d.to_json() for d in self.levers],
            "math_notes": list(self.math_notes),
            # Only a script's plan has it: a recipe's plan.json is as before the field.
            **({"script": True} if self.script else {}),
        }

    @classmethod
    def from_json(cls, d: dict) -> Plan:
        """A plan read from plan.json; fields added later take their defaults when an older file lacks them (one
        without "schema" is schema 1); ConfigError for a plan.json a newer launcher wrote."""
        if int(d.get("schema", 1)) > PLAN_SCHEMA:
            from launcher.errors import ConfigError

            raise ConfigError(f"plan.json has schema {d['schema']}, newer than this launcher reads ({PLAN_SCHEMA}): "
                              "upgrade launcher, or plan again with this one (launch plan ... --out DIR)")
        # Fields with a default were added later; a plan.json written before them still loads.
        strategy = Strategy.from_json(d)
        estimate = Estimate(
            breakdown=d["breakdown"], peak_bytes=d["predicted_peak_bytes"],
            host_bytes_per_node=d["host_bytes_per_node"], nvme_bytes_per_node=d["nvme_bytes_per_node"],
            step_time_s=d["predicted_step_time_s"], step_time_terms=d.get("step_time_terms", {}),
            basis=d.get("basis", "cpu_tensor_bytes"), overhead=d.get("overhead", {}),
            moment_bytes=d.get("moment_bytes", {}),
            training_breakdown=d.get("training_breakdown", {}),
            moment_stream_pool_bytes=d.get("moment_stream_pool_bytes", {}),
            tensor_peak_bytes=d.get("tensor_peak_bytes", 0),
        )
        return cls(
            strategy=strategy, estimate=estimate, buckets=Buckets(**d["buckets"]),
            num_params=d["num_params"], trainable_params=d["trainable_params"], budget_bytes=d["budget_bytes"],
            usable_bytes=d["usable_bytes"], world_size=d["world_size"], nodes=d["nodes"],
            gpus_per_node=d["gpus_per_node"], global_batch_size=d["global_batch_size"], seq_len=d["seq_len"],
            precision=d["precision"], hardware=d["hardware"], reasons=d.get("reasons", []),
            rejected=[r for r in map(Rejected.from_json, d.get("rejected", [])) if r is not None],
            pinned=d.get("pinned", []),
            constants=d.get("constants", {}), status=d.get("status", "fits"),
            problem=Problem(**d["problem"]) if d.get("problem") else None,
            largest_layer_params=d.get("largest_layer_params", 0), block_class=d.get("block_class"),
            precision_reason=d.get("precision_reason", ""),
            levers=[LeverDecision.from_json(x) for x in d.get("levers", [])], math_notes=d.get("math_notes", []),
            script=bool(d.get("script", False)),
        )


PLAN_JSON = "plan.json"
"""The plan's file in a run dir (or a `launch plan --out` set)."""


def read_plan(run_dir: Path) -> Plan:
    """RUN_DIR/plan.json as a Plan, the one way a stored plan is read: OSError when it cannot be read, ValueError
    when it is no plan (bad JSON, a field missing or of the wrong type), ConfigError when a newer launcher wrote it."""
    data = json.loads((Path(run_dir) / PLAN_JSON).read_text())
    try:
        return Plan.from_json(data)
    except (KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{PLAN_JSON} is no plan this launcher wrote ({type(e).__name__}: {e})") from e
