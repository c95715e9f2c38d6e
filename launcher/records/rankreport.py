"""RUN_DIR/ranks/rank-K.json: what one rank measured and recorded (written by launcher.runtime.probe).

The probe fills the measured fields; the worker and the script runner add the recorded ones through
``MemoryProbe.record``. A field a user's own script records under a name not listed here is kept in ``extra``
and written back at the top level, as before the type existed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal

from launcher.records.shared import known_and_extra, set_fields

RANK_REPORT_SCHEMA = 1
"""Version of rank-K.json's layout; from_json refuses a newer one rather than misread it."""
RankStatus = Literal["unknown", "running", "completed", "checkpointed", "interrupted", "failed", "oom"]
"""How a rank's file says it stands: running until it ends, then how it ended (launcher.worker.main)."""


@dataclass(kw_only=True, slots=True)
class OomDetails:
    """Where a rank ran out of memory and what was live (MemoryProbe.oom_details)."""

    phase: str
    """The phase it struck in (forward, backward, optimizer_step, ...)."""
    step: int
    """The optimizer step it struck in (1-based)."""
    current_bytes: int | None = None
    """Tracked bytes live when it struck (CPU ranks and --track-categories)."""
    current_by_category: dict[str, int] | None = None
    """Those bytes by category."""
    crossed_at_bytes: int | None = None
    """Tracked bytes when the enforced cap was crossed (CPU ranks), bytes."""
    memory_summary: str | None = None
    """torch.cuda.memory_summary at the OOM (CUDA ranks)."""

    def to_json(self) -> dict:
        """The details as the rank file's "oom" dict, fields that are None left out."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}

    @classmethod
    def from_json(cls, d: dict) -> OomDetails:
        """Details read from a rank file; unknown keys are ignored, a missing phase or step reads as unknown / 0."""
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{"phase": "unknown", "step": 0, **{k: v for k, v in d.items() if k in known}})


@dataclass(kw_only=True, slots=True, frozen=True)
class ScriptOverride:
    """A value a --script run's plan put in place of the script's own (launcher.runtime.script_args): where it
    lives, what the script asked for and what the plan set, both as Python writes them."""

    setting: str
    """Where the value lives: the class and field the library reads it from (SFTConfig.per_device_train_batch_size)."""
    script: str
    """The script's value."""
    plan: str
    """The plan's value, which the run used."""

    def to_json(self) -> dict:
        """The override as a dict of its three fields."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> ScriptOverride:
        """An override read from a rank file or report.json; unknown keys are ignored."""
        return cls(setting=str(d.get("setting", "?")), script=str(d.get("script", "?")), plan=str(d.get("plan", "?")))


# Fields written only when known (the probe on CUDA, or a record() call): left out of the file while None, so
# a rank file reads as it did before the type.
_WHEN_SET = ("max_memory_allocated_bytes", "max_memory_reserved_bytes", "outside_allocator_bytes", "phases_allocated",
             "heap_check",
             "engine", "label", "task", "total_params", "trainable_params", "micro_batch_size", "grad_accum_steps",
             "seq_len", "precision", "total_steps", "train_examples", "eval_examples", "plan_sha256", "oom",
             "eval_loss", "eval_step", "eval_accuracy", "eval_loss_initial", "resumed_from_step", "resumed_from",
             "checkpoint", "export", "export_format", "stop_reason", "script", "steps_counted_by", "script_overrides",
             "memory_snapshot")


@dataclass(kw_only=True, slots=True)
class RankReport:
    """One rank's report: its peaks (on ``basis``), the breakdown at the peak, how it ended, what it trained."""

    rank: int
    """Global rank."""
    local_rank: int = 0
    """Rank on its node."""
    host: str = "?"
    """Host name of the node."""
    device: str = "cpu"
    """Device type the rank ran on: cpu or cuda."""
    world_size: int = 1
    """Ranks in all."""
    status: RankStatus = "unknown"
    """running, completed, checkpointed, interrupted, failed or oom (launcher.worker.main)."""
    basis: str = "cpu_tensor_bytes"
    """What the peaks count: cpu_tensor_bytes, cuda_reserved_plus_context (cuda_allocated in older files)."""
    phases: dict[str, int] = field(default_factory=dict)
    """Peak per phase on ``basis``, bytes."""
    measured_peak_bytes: int = 0
    """The largest phase peak, bytes (0: nothing measured)."""
    training_peak_bytes: int = 0
    """The largest peak of forward, backward and optimizer_step, bytes."""
    peak_phase: str | None = None
    """The phase of the peak."""
    peak_by_category: dict[str, int] | None = None
    """Tracked bytes at the peak by category (None: no tracker ran)."""
    peak_by_category_raw: dict[str, int] | None = None
    """The tracker's own categories at the peak, bytes."""
    phase_breakdown: dict[str, dict[str, int]] | None = None
    """Per phase: bytes by category at that phase's peak."""
    after_step_by_category: dict[str, int] | None = None
    """Bytes by category live between steps (params, kept grads, optimizer states, engine buffers)."""
    peak_rss_bytes: int | None = None
    """The process's peak resident set, bytes."""
    enforce_bytes: int | None = None
    """The cap enforced on this rank (--enforce), bytes."""
    heap_check: dict[str, int] | None = None
    """$LAUNCHER_HEAP_CHECK=1, CPU ranks: the tracked total beside glibc's heap in use over the training phases
    (launcher.runtime.tracker.HeapCheck's fields, bytes)."""
    first_loss: float | None = None
    """The first logged loss."""
    final_loss: float | None = None
    """The last logged loss."""
    steps_done: int = 0
    """Optimizer steps done."""
    error: str | None = None
    """The traceback's tail when the rank failed."""
    # CUDA ranks only.
    max_memory_allocated_bytes: int | None = None
    """torch.cuda.max_memory_allocated over the run, bytes."""
    max_memory_reserved_bytes: int | None = None
    """torch.cuda.max_memory_reserved over the run, bytes."""
    outside_allocator_bytes: int | None = None
    """Device bytes outside the caching allocator (context, NCCL), the largest seen."""
    phases_allocated: dict[str, int] | None = None
    """max_memory_allocated per phase, bytes."""
    # Recorded by the worker (launcher.worker) or the script runner (launcher.runtime.script).
    engine: str | None = None
    """The engine that trained (no unit)."""
    label: str | None = None
    """The plan's strategy label."""
    task: str | None = None
    """causal_lm or seq_cls."""
    total_params: int | None = None
    """Parameters of the model."""
    trainable_params: int | None = None
    """Parameters that get gradients."""
    micro_batch_size: int | None = None
    """Sequences per rank per forward."""
    grad_accum_steps: int | None = None
    """Micro-batches per optimizer step."""
    seq_len: int | None = None
    """Tokens per sequence."""
    precision: str | None = None
    """Working dtype (no unit)."""
    total_steps: int | None = None
    """Optimizer steps the run was to take (None: not known ahead)."""
    train_examples: int | None = None
    """Training examples."""
    eval_examples: int | None = None
    """Evaluation examples."""
    plan_sha256: str | None = None
    """Digest of the plan.json the rank trained (launcher.processes.rankenv.plan_digest)."""
    oom: OomDetails | None = None
    """Where the rank ran out of memory, if it did."""
    eval_loss: float | None = None
    """The run's last eval loss (reduced over ranks)."""
    eval_step: int | None = None
    """The step of that eval."""
    eval_accuracy: float | None = None
    """seq_cls: the run's last eval accuracy, a fraction."""
    eval_loss_initial: float | None = None
    """Eval loss before the first step."""
    resumed_from_step: int | None = None
    """The step a resumed run continued from."""
    resumed_from: str | None = None
    """The checkpoint tag it continued from."""
    checkpoint: str | None = None
    """The last checkpoint written (a directory)."""
    export: str | None = None
    """Where the trained model was exported (a directory)."""
    export_format: str | None = None
    """The export's format (launcher.worker.export)."""
    stop_reason: str | None = None
    """Why training stopped before its last step."""
    script: str | None = None
    """launch --script: the script's path."""
    steps_counted_by: str | None = None
    """launch --script: how steps were counted."""
    script_overrides: list[ScriptOverride] | None = None
    """launch --script: each value the plan set in place of the script's own, on this rank."""
    memory_snapshot: str | None = None
    """--memory-snapshot: the pickle's path."""
    extra: dict[str, object] = field(default_factory=dict)
    """Fields a user's script recorded that are not listed above; written at the top level."""
    schema: int = RANK_REPORT_SCHEMA
    """Layout version of this file."""

    def to_json(self) -> dict:
        """The report as ranks/rank-K.json's dict: optional fields only when set, the extra fields merged in at the
        top."""
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "extra" or (value is None and f.name in _WHEN_SET):
                continue
            if isinstance(value, OomDetails):
                value = value.to_json()
            elif f.name == "script_overrides" and value is not None:
                value = [o.to_json() for o in value]
            out[f.name] = value
        return {**out, **self.extra}

    @classmethod
    def from_json(cls, d: dict) -> RankReport:
        """A rank file; one written before a field (the schema included) reads with that field's default."""
        known, extra = known_and_extra(cls, d, newest=RANK_REPORT_SCHEMA, what="rank report")
        if "basis" not in known:  # files before the basis field: CUDA ranks then measured allocated bytes
            known["basis"] = "cuda_allocated" if str(d.get("device", "cpu")).startswith("cuda") else "cpu_tensor_bytes"
        if isinstance(known.get("oom"), dict):
            known["oom"] = OomDetails.from_json(known["oom"])
        if isinstance(known.get("script_overrides"), list):
            known["script_overrides"] = [ScriptOverride.from_json(o) for o in known["script_overrides"]
                                         if isinstance(o, dict)]
        for k in ("measured_peak_bytes", "training_peak_bytes", "steps_done"):
            known[k] = int(known.get(k) or 0)
        known["rank"] = int(d["rank"])
        return cls(**known, extra=extra)

    def record(self, fields: dict[str, object]) -> None:
        """Set recorded fields by name: a listed field takes its value, any other goes to ``extra``."""
        fields = dict(fields)
        if isinstance(fields.get("oom"), dict):
            fields["oom"] = OomDetails.from_json(fields["oom"])
        if isinstance(fields.get("script_overrides"), list):
            fields["script_overrides"] = [o if isinstance(o, ScriptOverride) else ScriptOverride.from_json(o)
                                          for o in fields["script_overrides"]]
        set_fields(self, fields)
