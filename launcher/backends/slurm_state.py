"""What a submitted run dir knows about its Slurm job: RUN_DIR/slurm.json, sacct's view, submitit's results.

    RUN/slurm.json     written at submit: kind (job | array | array-task), job ids, submitit folder, shape
    RUN/requeues.jsonl one line per USR2 the job handled (decision, checkpoint, rank statuses)
    RUN/rdzv/          each node's rendezvous view (multi-node jobs)
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from launcher.errors import ConfigError

SLURM_JSON = "slurm.json"
SACCT_FIELDS = ("JobID", "JobName", "State", "ExitCode", "Elapsed", "NodeList", "Start", "End")
ACTIVE = ("PENDING", "RUNNING", "REQUEUED", "COMPLETING", "CONFIGURING", "SUSPENDED", "RESIZING", "PREEMPTED",
          "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "SIGNALING", "STAGE_OUT", "UNKNOWN")


SLURM_RECORD_SCHEMA = 1
"""Version of slurm.json's layout; from_json refuses a newer one rather than misread it."""


@dataclass(kw_only=True, slots=True)
class SweepRow:
    """One planned and submitted variant of an array: a row of sweep.json and of the array's slurm.json."""

    index: int
    """The variant's position in the sweep (0-based)."""
    name: str
    """The variant's name (its overrides, or the list entry's name)."""
    overrides: dict
    """The dotted job keys this variant sets."""
    run_dir: str
    """The variant's own run dir."""
    job_id: str
    """The array task's Slurm job id (``123_4``)."""
    plan: str
    """The plan's label (engine, stage, micro-batch, ...)."""
    predicted_peak_bytes: int
    """The plan's predicted per-rank peak, bytes."""


@dataclass(kw_only=True, slots=True)
class UnplannedVariant:
    """A variant that could not be planned, with the reason; it was not submitted."""

    index: int
    """The variant's position in the sweep (0-based)."""
    name: str
    """The variant's name."""
    overrides: dict
    """The dotted job keys this variant sets."""
    reason: str
    """Why no plan was made, one line."""


@dataclass(kw_only=True, slots=True)
class SlurmRecord:
    """RUN_DIR/slurm.json: what was submitted, written once at submit time, read by status, logs and cancel."""

    kind: Literal["job", "array", "array-task"]
    """job: one run; array: a sweep's root dir; array-task: one variant's run dir inside a sweep."""
    job_id: str | None
    """The Slurm job id (an array's base id, without ``_N``)."""
    job_ids: list[str]
    """Every submitted id: one for a job or a task, one per task for an array."""
    submitit_folder: str
    """submitit's folder of pickles and logs."""
    submitted_at: float
    """Submit time, seconds since the epoch."""
    nodes: int
    """Nodes per job."""
    gpus_per_node: int
    """Ranks per node."""
    timeout_min: int | None
    """The --time the job was given, minutes."""
    signal_delay_s: int
    """Seconds before the time limit that Slurm sends USR2 (checkpoint and requeue)."""
    max_requeues: int
    """Requeues allowed after a time limit or preemption."""
    array_run_dir: str | None = None
    """array-task: the sweep's root run dir."""
    variant: str | None = None
    """array-task: the variant's name."""
    variants: list[SweepRow] = field(default_factory=list)
    """array: the submitted variants."""
    unplanned: list[UnplannedVariant] = field(default_factory=list)
    """array: the variants that could not be planned."""
    schema: int = SLURM_RECORD_SCHEMA
    """Layout version of this file."""

    def to_json(self) -> dict:
        """The record as slurm.json's dict."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> SlurmRecord:
        """A record read from slurm.json; unknown keys are ignored, a newer schema is a ValueError."""
        if int(d.get("schema", 1)) > SLURM_RECORD_SCHEMA:
            raise ValueError(f"slurm.json schema {d['schema']} is newer than this launcher reads "
                             f"({SLURM_RECORD_SCHEMA}); upgrade launcher")
        names = {f.name for f in dataclasses.fields(cls)}
        known = {k: v for k, v in d.items() if k in names}
        known["variants"] = [SweepRow(**v) for v in d.get("variants", [])]
        known["unplanned"] = [UnplannedVariant(**v) for v in d.get("unplanned", [])]
        return cls(**known)

    @property
    def first_job_id(self) -> str:
        """The job a single run or task is (its one id); an array's first task."""
        return self.job_ids[0]


def read_slurm_json(run_dir: Path) -> SlurmRecord:
    """The run dir's slurm.json; ConfigError when it is missing or unreadable."""
    p = Path(run_dir) / SLURM_JSON
    if not p.is_file():
        raise ConfigError(f"RUN_DIR: {str(run_dir)!r} holds no {SLURM_JSON}; give the run dir of a job submitted "
                          "with launch --slurm")
    try:
        return SlurmRecord.from_json(json.loads(p.read_text()))
    except (ValueError, TypeError, KeyError) as e:
        raise ConfigError(f"RUN_DIR: {str(p)!r} cannot be read as a slurm record ({e}); was it edited by hand?") \
            from None


def is_active(state: str) -> bool:
    """True while a job in this Slurm state may still run (pending, running, requeued, ...; an empty state counts)."""
    return state.split(" ")[0] in ACTIVE or not state


def sacct_command(job_ids: list[str]) -> list[str]:
    """The sacct command line listing these jobs' allocations and steps, requeued runs included."""
    # -D keeps the records of earlier runs of a requeued job; --parsable2 has no trailing '|'.
    return ["sacct", "-D", "--parsable2", "-o", ",".join(SACCT_FIELDS), "-j", ",".join(job_ids)]


def parse_sacct(text: str) -> list[dict[str, str]]:
    """sacct --parsable2 output (header first) as rows; empty output is no rows."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        return []
    names = lines[0].split("|")
    return [dict(zip(names, ln.split("|"), strict=False)) for ln in lines[1:]]


def _run(argv: list[str]) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        raise ConfigError(f"{argv[0]} is not on PATH; run this where Slurm's client tools are installed") from None
    except subprocess.TimeoutExpired:
        raise ConfigError(f"{argv[0]} did not answer in 30 s; is slurmdbd reachable?") from None
    if out.returncode != 0:
        raise ConfigError(f"{' '.join(argv)} failed (exit {out.returncode}): {out.stderr.strip()}")
    return out.stdout


def sacct_rows(job_ids: list[str], run: Callable[[list[str]], str] = _run) -> list[dict[str, str]]:
    """sacct's rows for these jobs (none without job ids)."""
    return parse_sacct(run(sacct_command(job_ids))) if job_ids else []


def allocation_rows(rows: list[dict[str, str]], job_id: str) -> list[dict[str, str]]:
    """The allocation records of one job (array task ids like 12_3 included), oldest first; no steps."""
    base = job_id.split("_")[0]
    out = []
    for r in rows:
        jid = r.get("JobID", "")
        if "." in jid:
            continue
        if jid == job_id or ("_" not in job_id and jid == base):
            out.append(r)
    return out


def step_rows(rows: list[dict[str, str]], job_id: str) -> list[dict[str, str]]:
    """The step records (<job>.<step>) among sacct rows of one job."""
    return [r for r in rows if r.get("JobID", "").startswith(job_id + ".")]


def current_state(rows: list[dict[str, str]], job_id: str) -> str:
    """The latest allocation record's State ('' when sacct does not know the job yet)."""
    alloc = allocation_rows(rows, job_id)
    if not alloc:
        # An array task that has not started yet is listed as 12_[1-3]: pending.
        base = job_id.split("_")[0]
        pending = [r for r in rows if r.get("JobID", "").startswith(base + "_[")]
        return pending[-1]["State"] if pending else ""
    return alloc[-1].get("State", "")


def restarts(rows: list[dict[str, str]], job_id: str) -> int:
    """How many times the job was requeued, by its REQUEUED allocation records."""
    return sum(1 for r in allocation_rows(rows, job_id) if r.get("State", "").startswith("REQUEUED"))


def submitit_results(folder: Path, job_id: str, num_tasks: int) -> list[str]:
    """Per task: 'success', 'error' (submitit wrote the traceback) or 'none' (no result pickle yet)."""
    from submitit.core.utils import JobPaths, pickle_load

    out = []
    for t in range(num_tasks):
        p = JobPaths(folder, job_id=job_id, task_id=t).result_pickle
        if not p.is_file():
            out.append("none")
            continue
        try:
            out.append(str(pickle_load(p)[0]))
        except Exception:  # a result being written, or unpicklable here: say so, never crash status
            out.append("unreadable")
    return out


def submitit_logs(folder: Path, job_id: str, task: int = 0) -> tuple[Path, Path]:
    """(stdout, stderr) paths of one task's submitit logs."""
    from submitit.core.utils import JobPaths

    paths = JobPaths(folder, job_id=job_id, task_id=task)
    return paths.stdout, paths.stderr


def read_requeues(run_dir: Path) -> list[dict]:
    """The run dir's requeues.jsonl rows (one per checkpoint-and-requeue decision), unreadable lines skipped."""
    p = Path(run_dir) / "requeues.jsonl"
    if not p.is_file():
        return []
    rows = []
    for ln in p.read_text().splitlines():
        try:
            rows.append(json.loads(ln))
        except ValueError:
            continue
    return rows


def squeue_states(job_id: str, run: Callable[[list[str]], str] = _run) -> list[str]:
    """States slurmctld still holds for the job (every task of an array); empty once it has forgotten the job."""
    try:
        out = run(["squeue", "-h", "-j", str(job_id), "-o", "%T"])
    except ConfigError as e:
        if "Invalid job id" in str(e):  # finished and purged (MinJobAge): sacct still knows it
            return []
        raise
    return [s for s in out.split() if s]


def live_state(job_id: str, run: Callable[[list[str]], str] = _run) -> str | None:
    """The job's state while it (or any task of its array) is queued or running; None once it has ended.

    squeue answers for jobs slurmctld still holds; sacct for the rest. A job neither knows is taken as gone.
    Raises ConfigError when neither tool answers: whether the job lives cannot be known then.
    """
    live = [s for s in squeue_states(job_id, run) if is_active(s)]
    if live:
        return live[0]
    state = current_state(sacct_rows([str(job_id)], run), str(job_id))
    return state if state and is_active(state) else None
