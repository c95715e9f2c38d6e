"""`launch status | logs | cancel RUN_DIR` decided: what a run's dir, Slurm's sacct and submitit say about a run, as
typed results (LocalStatus, Progress, CancelResult) or, for Slurm, its records as sacct gives them;
launcher.cli.manage only renders them.

status and logs serve both a local run (torchrun on this machine: state.json, the rank files and logs) and a
job submitted to a queued backend (slurm.json, sacct, submitit); cancel is that backend's (a local run stops with
Ctrl-C or kill -INT on the pid status prints).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from launcher.backends.slurm_state import (
    SLURM_JSON,
    SlurmRecord,
    allocation_rows,
    current_state,
    is_active,
    read_requeues,
    read_slurm_json,
    restarts,
    sacct_rows,
    step_rows,
    submitit_logs,
    submitit_results,
)
from launcher.errors import ConfigError
from launcher.files.rundir import RunDir, is_marked
from launcher.planner.plan import Plan, read_plan
from launcher.records.live import last_line, rank_rows
from launcher.records.runreport import RunVerdict, read_report
from launcher.records.runstate import RunState
from launcher.records.steprow import StepRow, read_rows

CANCEL_WAIT_S = 60.0
"""How long `launch cancel` waits for Slurm to say the job ended, seconds."""


@dataclass(kw_only=True, slots=True)
class Progress:
    """Where a run is: the slowest rank's step of the total, rank 0's latest loss, the highest peak so far against
    the budget, and the time left at the mean step time so far."""

    step: int = 0
    """The slowest rank's last step (0: a rank has not stepped yet)."""
    total_steps: int | None = None
    """Steps the run is to take; None while unknown."""
    loss: float | None = None
    """Rank 0's latest loss (the mean over ranks)."""
    peak_bytes: int | None = None
    """The highest peak any rank measured so far, bytes."""
    budget_bytes: int | None = None
    """The plan's budget per rank, bytes."""
    eta_s: float | None = None
    """Seconds left at the mean step time so far; None while unknown."""

    def to_json(self) -> dict:
        """`launch status --json`'s progress object."""
        return dataclasses.asdict(self)


@dataclass(kw_only=True, slots=True)
class LocalStatus:
    """A local run's status: its state, progress, ranks and, once it ended, the verdict."""

    run_dir: str
    """The run dir as given."""
    state: str
    """state.json's state, "killed" for a launch gone without a verdict, or a `plan --out` set's words."""
    message: str | None = None
    """Why it stands so."""
    pid: int | None = None
    """The launch process while the run is live."""
    attempt: int | None = None
    """The attempt running."""
    progress: Progress = field(default_factory=Progress)
    """Where it is."""
    ranks: list[dict] = field(default_factory=list)
    """Per rank: its state and latest step line's fields (launcher.records.live.rank_rows), its verdict once
    reported."""
    verdict: RunVerdict | None = None
    """report.json's verdict; None until the run ended."""
    eval_loss: float | None = None
    """The run's last eval loss."""
    eval_accuracy: float | None = None
    """seq_cls: the run's last eval accuracy, a fraction."""
    kind: str = "local"
    """Always "local" (a Slurm run's status is a dict of its records)."""

    def to_json(self) -> dict:
        """`launch status --json`'s object."""
        return {"run_dir": self.run_dir, "kind": self.kind, "state": self.state, "message": self.message,
                "pid": self.pid, "attempt": self.attempt, "progress": self.progress.to_json(), "ranks": self.ranks,
                "verdict": self.verdict, "eval_loss": self.eval_loss, "eval_accuracy": self.eval_accuracy}


def job_status(run_dir: Path, rec: SlurmRecord, rows: list[dict]) -> dict:
    """One job (kind job or array-task): sacct records, submitit's per-task results, ranks, requeues."""
    job_id = rec.first_job_id
    tasks = rec.nodes
    results = submitit_results(Path(rec.submitit_folder), job_id, tasks)
    plan = stored_plan(run_dir)
    world = plan.world_size if plan else tasks * rec.gpus_per_node
    return {
        "run_dir": str(run_dir), "kind": rec.kind, "job_id": job_id, "state": current_state(rows, job_id),
        "requeued": restarts(rows, job_id),
        "allocations": allocation_rows(rows, job_id), "steps": step_rows(rows, job_id),
        "tasks": [{"task": t, "node": node_of(run_dir, t), "result": r} for t, r in enumerate(results)],
        "ranks": rank_rows(run_dir, world), "requeues": read_requeues(run_dir),
        "run_state": RunDir(run_dir).state(),
    }


def node_of(run_dir: Path, task: int) -> str | None:
    """The node name that ran Slurm task ``task``, from its latest rendezvous view; None without one."""
    views = sorted((run_dir / "rdzv").glob(f"*/node-{task}.json"), key=lambda p: p.stat().st_mtime)
    return json.loads(views[-1].read_text()).get("node_name") if views else None


def collect_status(run_dir: Path) -> dict:
    """A Slurm run's status from slurm.json and sacct: the job (with its Progress) or each array variant, with its
    state; sacct's and submitit's records as they give them."""
    rec = read_slurm_json(run_dir)
    if rec.kind != "array":
        return job_status(run_dir, rec, sacct_rows(rec.job_ids)) | {"progress": progress(run_dir)}
    rows = sacct_rows([rec.job_id])
    from launcher.backends.slurm_array import variant_row

    variants = []
    for v in rec.variants:
        variants.append({**dataclasses.asdict(v), "state": current_state(rows, v.job_id),
                         **variant_row(Path(v.run_dir))})
    return {"run_dir": str(run_dir), "kind": "array", "job_id": rec.job_id, "variants": variants,
            "unplanned": [dataclasses.asdict(u) for u in rec.unplanned],
            "state": "RUNNING" if any(is_active(v["state"]) for v in variants) else "DONE"}


def is_local(run_dir: Path) -> bool:
    """A run dir without slurm.json: a local run (or a `plan --out` set); refused when it is no run dir at all."""
    if (run_dir / SLURM_JSON).is_file():
        return False
    if not any((run_dir / name).is_file() for name in ("state.json", "plan.json")):
        raise ConfigError(f"RUN_DIR: {str(run_dir)!r} holds no state.json, plan.json or {SLURM_JSON}; give the run "
                          "dir launch printed (\"run dir ...\")")
    return True


def stored_plan(run_dir: Path) -> Plan | None:
    """The run dir's plan.json as a Plan; None when it is missing or cannot be read (status still says the rest)."""
    try:
        return read_plan(run_dir)
    except (OSError, ValueError, ConfigError):
        return None


def world_of(run_dir: Path) -> int:
    """A run's rank count: plan.json's world_size, else the rank logs present."""
    plan = stored_plan(run_dir)
    if plan is not None:
        return plan.world_size
    return len(list((run_dir / "logs").glob("rank-*.log")))


def progress(run_dir: Path) -> Progress:
    """Where the run is: the slowest rank's step of the total, rank 0's latest loss (the mean over ranks), the
    highest peak any rank measured so far (its step lines, then its final file) against the plan's budget, and
    the ETA at the mean step time so far."""
    world = world_of(run_dir)
    plan = stored_plan(run_dir)
    steps = [last_line(run_dir / "steps" / f"rank-{r}.jsonl") or StepRow() for r in range(world)]
    finals = [f for r, f in RunDir(run_dir).rank_reports().items() if r < world]
    done = [s.step for s in steps]  # a rank not started yet: 0
    total = next((f.total_steps for f in finals if f.total_steps), None)
    if total is None:
        import yaml

        try:
            total = (yaml.safe_load((run_dir / "job.yaml").read_text()) or {}).get("train", {}).get("max_steps")
        except (OSError, yaml.YAMLError, AttributeError):
            total = None
    peaks = [s.mem_peak_bytes or 0 for s in steps] + [f.measured_peak_bytes for f in finals]
    out = Progress(step=min(done) if done else 0, total_steps=total, loss=steps[0].loss if steps else None,
                   peak_bytes=max(peaks, default=0) or None, budget_bytes=plan.budget_bytes if plan else None)
    first = _first_line(run_dir / "steps" / "rank-0.jsonl")
    last = steps[0] if steps else StepRow()
    if total and first and last.step > first.step and last.time is not None and first.time is not None:
        per_step = (last.time - first.time) / (last.step - first.step)
        out.eta_s = max(0, total - out.step) * per_step
    return out


def _first_line(path: Path) -> StepRow | None:
    """The first step line of the latest attempt in ``path`` (attempts are stamped on each line)."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    rows = read_rows(lines)
    if not rows:
        return None
    attempt = rows[-1].attempt or 0
    return next(r for r in rows if (r.attempt or 0) == attempt)


def local_status(run_dir: Path) -> LocalStatus:
    """A local run's status: state ("killed" when the launch that owned it is gone without a verdict), progress,
    ranks, verdict."""
    from launcher.records.runstate import KILLED, LIVE_STATES

    st = RunDir(run_dir).run_state()
    run_state = st.state or "planned (launch plan --out: not run)"
    message, ranks = st.message, rank_rows(run_dir, world_of(run_dir))
    if st.abandoned():
        run_state, message = KILLED, killed_message(RunDir(run_dir.resolve()), st)
        for row in ranks:  # a rank's own word ("running") was cut short with its launch
            if row["state"] in ("starting", "training", "running"):
                row["state"] = KILLED
    report = read_report(run_dir)  # None until the run has ended
    verdicts = {r.rank: r for r in report.ranks} if report else {}
    for row in ranks:  # each rank's verdict as report.json gives it (ok only for a rank that ran every step)
        if row["rank"] in verdicts:
            row["verdict"], row["ended"] = verdicts[row["rank"]].verdict, verdicts[row["rank"]].ended
    return LocalStatus(run_dir=str(run_dir), state=run_state, message=message,
                       pid=st.pid if run_state in LIVE_STATES else None, attempt=st.attempt,
                       progress=progress(run_dir), ranks=ranks, verdict=report and report.verdict,
                       eval_loss=report and report.eval_loss, eval_accuracy=report and report.eval_accuracy)


def killed_message(run: RunDir, st: RunState) -> str:
    """Why a run still marked running has no verdict: its launch was killed; whether ranks outlived it, and what
    to do next."""
    from launcher.session.finish import next_step_after_interrupt

    left = [r.pid for r in st.live_ranks()]
    ranks = (f"rank process(es) {left} still run: stop them (kill {' '.join(map(str, left))})" if left
             else "its ranks are gone too")
    return (f"launch process {st.pid} is gone and never wrote how the run ended: it was killed (SIGKILL, the OOM "
            f"killer, a reboot); {ranks}; {next_step_after_interrupt(run)}")


def log_files(run_dir: Path, rec: SlurmRecord, rank: int | None) -> list[tuple[str, Path]]:
    """(label, path) of a Slurm run's rank logs (one rank or all) and each task's submitit stdout and stderr;
    ConfigError for an array root or a rank out of range."""
    if rec.kind == "array":
        names = [v.run_dir for v in rec.variants]
        raise ConfigError(f"RUN_DIR: {str(run_dir)!r} is an array; give one variant's run dir: {', '.join(names)}")
    plan = stored_plan(run_dir)
    world = plan.world_size if plan else rec.nodes * rec.gpus_per_node
    if rank is not None and not 0 <= rank < world:
        raise ConfigError(f"--rank: {rank} is not a rank of this run (0..{world - 1}); pick one of those")
    ranks = [rank] if rank is not None else list(range(world))
    files = [(f"rank {r}", run_dir / "logs" / f"rank-{r}.log") for r in ranks]
    for t in range(rec.nodes):
        out, err = submitit_logs(Path(rec.submitit_folder), rec.first_job_id, t)
        files += [(f"submitit task {t} stdout", out), (f"submitit task {t} stderr", err)]
    return files


def local_log_files(run_dir: Path, rank: int | None) -> list[tuple[str, Path]]:
    """(label, path) of a local run's rank logs, one rank or all; ConfigError for a rank out of range."""
    world = world_of(run_dir)
    if rank is not None and not 0 <= rank < world:
        raise ConfigError(f"--rank: {rank} is not a rank of this run (0..{world - 1}); pick one of those")
    return [(f"rank {r}", run_dir / "logs" / f"rank-{r}.log") for r in ([rank] if rank is not None else range(world))]


def local_active(run_dir: Path) -> bool:
    """The local launch that owns the run dir still runs (state.json running, its pid and start time alive)."""
    from launcher.records.runstate import LIVE_STATES

    st = RunDir(run_dir).run_state()
    return st.state in LIVE_STATES and st.live_launch() is not None



@dataclass(kw_only=True, slots=True)
class CancelResult:
    """What `launch cancel` did: the job, its state at the end, and whether it was sent a cancel and ended."""

    job_id: str
    """The Slurm job (an array's whole id)."""
    state: str | None
    """sacct's state last seen."""
    sent: bool
    """scancel was sent (False: the job had already ended)."""
    ended: bool
    """Slurm says the job ended (with --no-wait: not waited for, False)."""
    foreign: list[str] = field(default_factory=list)
    """Run dirs slurm.json names that launch did not make (no marker): left without a state.json."""


def cancel_run(run_dir: Path, *, wait: bool, on_sent: Callable[[str], None] | None = None) -> CancelResult:
    """scancel the run's job (``on_sent(job_id)`` once sent) and, with ``wait``, wait up to CANCEL_WAIT_S for Slurm
    to end it, then mark its run dirs (an array's variants too) cancelled; ConfigError for a local run, with how to
    stop it."""
    from submitit.slurm.slurm import SlurmJob

    if is_local(run_dir):
        pid = RunDir(run_dir).run_state().pid
        how = f"stop it with kill -INT {pid} (or Ctrl-C where it runs)" if local_active(run_dir) else \
            "it is not running"
        raise ConfigError(f"RUN_DIR: {str(run_dir)!r} is a local run, not a Slurm job; {how}")
    rec = read_slurm_json(run_dir)
    job_id = rec.job_id if rec.kind == "array" else rec.first_job_id
    state = current_state(sacct_rows([job_id]), job_id)
    if state and not is_active(state):
        return CancelResult(job_id=job_id, state=state, sent=False, ended=True)
    SlurmJob(folder=rec.submitit_folder, job_id=job_id).cancel(check=True)
    if on_sent is not None:
        on_sent(job_id)
    if not wait:
        return CancelResult(job_id=job_id, state=state, sent=True, ended=False)
    deadline = time.monotonic() + CANCEL_WAIT_S
    while time.monotonic() < deadline:
        state = current_state(sacct_rows([job_id]), job_id)
        if state and not is_active(state):
            break
        time.sleep(0.5)
    else:
        return CancelResult(job_id=job_id, state=state, sent=True, ended=False)
    dirs = [run_dir] + ([Path(v.run_dir) for v in rec.variants] if rec.kind == "array" else [])
    foreign = []
    for d in dirs:
        path = Path(d).resolve()
        if not is_marked(path):  # slurm.json names it, but only a dir launch made and marked gets a state.json
            foreign.append(str(path))
            continue
        RunDir(path).set_state("cancelled", message=f"slurm job {job_id}: {state}")
    return CancelResult(job_id=job_id, state=state, sent=True, ended=True, foreign=foreign)
