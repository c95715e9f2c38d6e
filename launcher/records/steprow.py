"""RUN_DIR/steps/rank-K.jsonl: one line per optimizer step of one rank (written by launcher.runtime.probe).

Every line has the step, its time and memory; a log step (train.log_every_steps) adds the loss and tokens/s, which
the other steps leave out. The worker stamps the attempt (and a resumed Slurm job its job id); a user's script may
add fields of its own through ``MemoryProbe.step_done(..., **extra)``, kept in ``extra``, written at the top level.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

from launcher.records.shared import known_and_extra

STEP_ROW_SCHEMA = 1
"""Version of a step line's layout; never written (the lines stay as they were), from_json refuses a newer one."""


@dataclass(kw_only=True, slots=True)
class StepRow:
    """One optimizer step of one rank: its time, memory, and on a log step its loss and throughput."""

    step: int = 0
    """The optimizer step, 1-based (0: a line without one)."""
    loss: float | None = None
    """The step's loss, the mean over ranks; only on a log step."""
    tokens_per_s: float | None = None
    """Tokens per second over all ranks; only on a log step."""
    step_time_s: float | None = None
    """Seconds since the previous step (the first step: since the step clock started)."""
    mem_current_bytes: int | None = None
    """Bytes in use after the step on the verdict's basis (allocated on CUDA, tracked tensors on CPU)."""
    mem_peak_bytes: int | None = None
    """The highest phase peak so far on the verdict's basis, bytes."""
    time: float | None = None
    """When the step ended, seconds since the epoch."""
    lr: float | None = None
    """The learning rate the step used."""
    grad_norm: float | None = None
    """The global gradient norm before clipping; only on a log step, and not with the optimizer step in backward."""
    attempt: int | None = None
    """The attempt that ran the step (the ladder's or Slurm's restart count); None in lines from before the stamp."""
    slurm_job_id: str | None = None
    """A resumed Slurm run's job id (its restart count starts at 0 again)."""
    extra: dict[str, object] = field(default_factory=dict)
    """Fields a user's script added, written at the top level."""

    def to_json(self) -> dict:
        """The line's dict: fields that are None left out, the extra fields after them."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extra"}
        return {**{k: v for k, v in out.items() if v is not None}, **self.extra}

    def to_line(self) -> str:
        """The line as written to steps/rank-K.jsonl, without its newline."""
        return json.dumps(self.to_json())

    @classmethod
    def from_json(cls, d: dict) -> StepRow:
        """A step line read back; a line without a field reads with its default, keys it does not list go to
        ``extra``. ValueError for a line that is not a JSON object."""
        if not isinstance(d, dict):
            raise ValueError(f"a step line is a JSON object, not {type(d).__name__}")
        known, extra = known_and_extra(cls, d, newest=STEP_ROW_SCHEMA, what="step line")
        if not isinstance(known.get("step", 0), int):
            raise ValueError(f"a step line's step is an integer, not {known['step']!r}")
        return cls(**known, extra=extra)

    @classmethod
    def from_line(cls, line: str | bytes) -> StepRow:
        """A step line as written; ValueError for one that does not parse (a line being written, or cut short)."""
        return cls.from_json(json.loads(line))

    @property
    def log_step(self) -> bool:
        """A log step: the line carries the loss."""
        return self.loss is not None


def read_rows(lines: list) -> list[StepRow]:
    """The step lines that parse, in order: a line being written right now (or cut by a read window) is skipped."""
    rows = []
    for ln in lines:
        try:
            rows.append(StepRow.from_line(ln))
        except ValueError:
            continue
    return rows
