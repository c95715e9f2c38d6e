"""`launch status | logs | cancel RUN_DIR`: look after a run from its run dir alone.

status and logs serve both a local run (torchrun on this machine: state.json, the rank files and logs) and a
job submitted with --slurm (slurm.json, sacct, submitit); cancel is Slurm's (a local run stops with Ctrl-C or
kill -INT on the pid status prints).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Callable
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
from launcher.live import last_line, rank_rows
from launcher.planner.plan import Plan, read_plan
from launcher.rundir import RunDir
from launcher.runreport import read_report
from launcher.steprow import StepRow, read_rows
from launcher.units import format_bytes, format_duration

CANCEL_WAIT_S = 60.0

STATUS_EPILOG = """examples:
  launch status runs/tiny-20250101-120000   state, step/total, last loss, peak memory so far vs the budget
  launch status runs/tiny --json
  launch status runs/sweep --json          a Slurm sweep: one row per variant
"""
LOGS_EPILOG = """examples:
  launch logs runs/tiny                   last lines of every rank's log (and, on Slurm, submitit's stdout/stderr)
  launch logs runs/tiny --rank 1 --follow  keep printing rank 1's log until the run (or the Slurm job) ends
"""
CANCEL_EPILOG = """examples:
  launch cancel runs/tiny                 scancel the job (every task of an array) and wait until Slurm says so
"""


def add_parser(sub) -> None:
    """Register `launch status`, `launch logs` and `launch cancel` on the verbs' subparsers."""
    fmt = argparse.RawDescriptionHelpFormatter
    p = sub.add_parser("status", help="state of a run (local or Slurm): step/total, loss, peak memory vs budget, per rank",
                       epilog=STATUS_EPILOG, formatter_class=fmt)
    p.add_argument("run_dir", type=Path, help="the run dir printed at submission")
    p.add_argument("--json", action="store_true", help="print the status as JSON")
    p.set_defaults(func=status)
    p = sub.add_parser("logs", help="tails of the rank logs (and of submitit's stdout/stderr on Slurm)", epilog=LOGS_EPILOG,
                       formatter_class=fmt)
    p.add_argument("run_dir", type=Path)
    p.add_argument("--rank", type=int, help="only this rank's log (submitit's logs still follow)")
    p.add_argument("--lines", type=int, default=20, help="lines per file (default 20)")
    p.add_argument("--follow", action="store_true", help="keep printing new lines until the run ends")
    p.set_defaults(func=logs)
    p = sub.add_parser("cancel", help="cancel the run's Slurm job (scancel through submitit)", epilog=CANCEL_EPILOG,
                       formatter_class=fmt)
    p.add_argument("run_dir", type=Path)
    p.add_argument("--no-wait", action="store_true", help="return right after scancel")
    p.set_defaults(func=cancel)


# -- status ---------------------------------------------------------------------------------------------------
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
    """A Slurm run's status from slurm.json and sacct: the job (or each array variant) with its state."""
    rec = read_slurm_json(run_dir)
    if rec.kind != "array":
        return job_status(run_dir, rec, sacct_rows(rec.job_ids))
    rows = sacct_rows([rec.job_id])
    from launcher.backends.slurm_array import variant_row

    variants = []
    for v in rec.variants:
        variants.append({**dataclasses.asdict(v), "state": current_state(rows, v.job_id), **variant_row(Path(v.run_dir))})
    return {"run_dir": str(run_dir), "kind": "array", "job_id": rec.job_id, "variants": variants,
            "unplanned": [dataclasses.asdict(u) for u in rec.unplanned],
            "state": "RUNNING" if any(is_active(v["state"]) for v in variants) else "DONE"}


def render_status(st: dict) -> str:
    """A Slurm run's status (collect_status) as text: job state, requeues, run state, progress and ranks, or the
    array's variant table."""
    if st["kind"] == "array":
        from launcher.backends.slurm_array import summary_table

        lines = [f"slurm array {st['job_id']}: {st['state']}; run dir {st['run_dir']}",
                 f"{'variant':<28} {'job':>10}  {'slurm state':<16}"]
        lines += [f"{(str(v['index']) + '-' + v['name'])[:28]:<28} {v['job_id']:>10}  {v['state'] or 'PENDING':<16}"
                  for v in st["variants"]]
        return "\n".join(lines + ["", summary_table(Path(st["run_dir"]))])
    requeued = f" (requeued {st['requeued']}x)" if st["requeued"] else ""
    lines = [f"slurm job {st['job_id']}: {st['state'] or 'unknown to sacct yet'}{requeued}; run dir {st['run_dir']}"]
    run_state = st["run_state"].get("state")
    if run_state:
        message = st["run_state"].get("message")
        lines.append(f"run state: {run_state}" + (f": {message}" if message else ""))
    if st.get("progress"):
        lines.append(render_progress(st["progress"]))
    lines.append(f"  {'record':<14} {'state':<16} {'exit':<6} {'elapsed':<10} nodes")
    for r in st["allocations"] + st["steps"]:
        lines.append(f"  {r.get('JobID', ''):<14} {r.get('State', ''):<16} {r.get('ExitCode', ''):<6} "
                     f"{r.get('Elapsed', ''):<10} {r.get('NodeList', '')}")
    lines.append("tasks (submitit): " + "; ".join(
        f"{t['task']}{' on ' + t['node'] if t['node'] else ''}: result {t['result']}" for t in st["tasks"]))
    for r in st["ranks"]:
        step = f", step {r['step']}" if r.get("step") else ""
        loss = f" loss {r['loss']:.4f}" if isinstance(r.get("loss"), (int, float)) else ""
        lines.append(f"  rank {r['rank']}: {r['state']}{step}{loss}")
    for q in st["requeues"]:
        lines.append(f"signal at {time.strftime('%H:%M:%S', time.localtime(q['time']))} (attempt {q['attempt']}): "
                     f"{q['decision']}, checkpoint {q.get('checkpoint')}, ranks {q.get('ranks')}")
    return "\n".join(lines)


def status(args: argparse.Namespace) -> int:
    """`launch status`: a local or Slurm run's state as text or JSON; the exit code."""
    if is_local(args.run_dir):
        st = local_status(args.run_dir)
        print(json.dumps(st, indent=2, default=str) if args.json else render_local_status(st))
        return 0
    st = collect_status(args.run_dir)
    if st["kind"] != "array":
        st["progress"] = progress(args.run_dir)
    print(json.dumps(st, indent=2, default=str) if args.json else render_status(st))
    return 0


# -- local runs -----------------------------------------------------------------------------------------------
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


def progress(run_dir: Path) -> dict:
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
    out = {"step": min(done) if done else 0, "total_steps": total,
           "loss": steps[0].loss if steps else None, "peak_bytes": max(peaks, default=0) or None,
           "budget_bytes": plan.budget_bytes if plan else None, "eta_s": None}
    first = _first_line(run_dir / "steps" / "rank-0.jsonl")
    last = steps[0] if steps else StepRow()
    if total and first and last.step > first.step and last.time is not None and first.time is not None:
        per_step = (last.time - first.time) / (last.step - first.step)
        out["eta_s"] = max(0, total - out["step"]) * per_step
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


def local_status(run_dir: Path) -> dict:
    """A local run's status: state ("killed" when the launch that owned it is gone without a verdict), progress,
    ranks, verdict."""
    from launcher.runstate import KILLED, LIVE_STATES

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
    return {"run_dir": str(run_dir), "kind": "local", "state": run_state, "message": message,
            "pid": st.pid if run_state in LIVE_STATES else None, "attempt": st.attempt,
            "progress": progress(run_dir), "ranks": ranks,
            "verdict": report and report.verdict, "eval_loss": report and report.eval_loss,
            "eval_accuracy": report and report.eval_accuracy}


def killed_message(run: RunDir, st) -> str:
    """Why a run still marked running has no verdict: its launch was killed; whether ranks outlived it, and what
    to do next."""
    from launcher.session.finish import next_step_after_interrupt

    left = [r.pid for r in st.live_ranks()]
    ranks = (f"rank process(es) {left} still run: stop them (kill {' '.join(map(str, left))})" if left
             else "its ranks are gone too")
    return (f"launch process {st.pid} is gone and never wrote how the run ended: it was killed (SIGKILL, the OOM "
            f"killer, a reboot); {ranks}; {next_step_after_interrupt(run)}")


def render_progress(p: dict) -> str:
    """The "progress:" line: step of total, last loss, peak memory so far against the budget, ETA."""
    total = p.get("total_steps")
    parts = [f"step {p['step']}/{total or '?'}" + (f" ({p['step'] / total:.0%})" if total else "")]
    if isinstance(p.get("loss"), (int, float)):
        parts.append(f"last loss {p['loss']:.4f}")
    if p.get("peak_bytes"):
        budget = p.get("budget_bytes")
        parts.append(f"peak memory so far {format_bytes(p['peak_bytes'])}"
                     + (f" of {format_bytes(budget)} budget ({p['peak_bytes'] / budget:.0%})" if budget else ""))
    if p.get("eta_s") is not None and total and p["step"] < total:
        parts.append(f"ETA {format_duration(p['eta_s'])}")
    return "progress: " + ", ".join(parts)


def render_local_status(st: dict) -> str:
    """A local run's status (local_status) as text."""
    pid = f" (launch pid {st['pid']})" if st.get("pid") else ""
    attempt = f", attempt {st['attempt']}" if st.get("attempt") else ""
    lines = [f"local run {st['run_dir']}: {st['state']}{pid}{attempt}"]
    if st.get("message"):
        lines.append(f"  {st['message']}")
    lines.append(render_progress(st["progress"]))
    if st.get("verdict"):
        ev = ""
        if isinstance(st.get("eval_loss"), (int, float)):
            ev = f"; eval loss {st['eval_loss']:.4f}"
        if isinstance(st.get("eval_accuracy"), (int, float)):
            ev += f", eval accuracy {st['eval_accuracy']:.1%}"
        lines.append(f"verdict: {st['verdict']}{ev} (report.json)")
    for r in st["ranks"]:
        step = f", step {r['step']}" if r.get("step") else ""
        peak = f", peak {format_bytes(r['mem_peak_bytes'])}" if r.get("mem_peak_bytes") else ""
        verdict = f"; verdict {r['verdict']}" + (f" ({r['ended']})" if r.get("ended") else "") if r.get("verdict") \
            else ""
        lines.append(f"  rank {r['rank']}: {r['state']}{step}{peak}{verdict}")
    return "\n".join(lines)


# -- logs -----------------------------------------------------------------------------------------------------
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


def tail(path: Path, lines: int) -> str:
    """The last ``lines`` lines of a file (reading only its end), or a note that it is not written yet."""
    if not path.is_file():
        return "(not written yet)"
    with path.open("rb") as f:
        f.seek(0, 2)
        f.seek(max(0, f.tell() - 200 * lines))
        text = f.read().decode(errors="replace")
    return "\n".join(text.splitlines()[-lines:])


def local_log_files(run_dir: Path, rank: int | None) -> list[tuple[str, Path]]:
    """(label, path) of a local run's rank logs, one rank or all; ConfigError for a rank out of range."""
    world = world_of(run_dir)
    if rank is not None and not 0 <= rank < world:
        raise ConfigError(f"--rank: {rank} is not a rank of this run (0..{world - 1}); pick one of those")
    return [(f"rank {r}", run_dir / "logs" / f"rank-{r}.log") for r in ([rank] if rank is not None else range(world))]


def local_active(run_dir: Path) -> bool:
    """The local launch that owns the run dir still runs (state.json running, its pid and start time alive)."""
    from launcher.runstate import LIVE_STATES

    st = RunDir(run_dir).run_state()
    return st.state in LIVE_STATES and st.live_launch() is not None


def logs(args: argparse.Namespace) -> int:
    """`launch logs`: the tails of a run's logs, secret values redacted, and with --follow new lines until it ends."""
    from launcher.rundir import redact, secret_values

    if is_local(args.run_dir):
        rec, files = None, local_log_files(args.run_dir, args.rank)
    else:
        rec = read_slurm_json(args.run_dir)
        files = log_files(args.run_dir, rec, args.rank)
    # The files themselves are scrubbed only when the job ends; while it runs they hold what the ranks printed.
    secrets = secret_values()
    for label, path in files:
        print(f"==> {label}: {path} <==")
        print(redact(tail(path, args.lines), secrets))
    sys.stdout.flush()
    if args.follow:
        if rec is None:
            follow(files, None, secrets=secrets, active=lambda: local_active(args.run_dir))
        else:
            follow(files, rec, secrets=secrets)
    return 0


def follow(files: list[tuple[str, Path]], rec: SlurmRecord | None, poll_s: float = 0.5, check_every_s: float = 2.0, *,
           secrets: list[str] | None = None, active: Callable[[], bool] | None = None) -> None:
    """Print what the files gain, line by line with their label (secret values redacted), until the run is over:
    the Slurm job of ``rec`` has ended, or (a local run) ``active`` says False."""
    from launcher.rundir import redact

    offsets = {p: (p.stat().st_size if p.is_file() else 0) for _, p in files}
    if active is None:
        job_id = rec.first_job_id

        def active() -> bool:
            return is_active(current_state(sacct_rows([job_id]), job_id))
    last_check, running = 0.0, True
    while True:
        for label, p in files:
            if not p.is_file() or p.stat().st_size <= offsets[p]:
                continue
            with p.open("rb") as f:
                f.seek(offsets[p])
                chunk = f.read()
            complete = chunk[: chunk.rfind(b"\n") + 1]  # print whole lines only
            offsets[p] += len(complete)
            for ln in complete.decode(errors="replace").splitlines():
                print(f"[{label}] {redact(ln, secrets)}")
            sys.stdout.flush()
        if not running:
            return
        if time.monotonic() - last_check >= check_every_s:
            last_check = time.monotonic()
            running = active()
        time.sleep(poll_s)


# -- cancel ---------------------------------------------------------------------------------------------------
def cancel(args: argparse.Namespace) -> int:
    """`launch cancel`: scancel a run's Slurm job, wait for it to end (unless --no-wait) and mark the run dirs
    cancelled; a local run is refused with how to stop it."""
    from submitit.slurm.slurm import SlurmJob

    if is_local(args.run_dir):
        pid = RunDir(args.run_dir).run_state().pid
        how = f"stop it with kill -INT {pid} (or Ctrl-C where it runs)" if local_active(args.run_dir) else \
            "it is not running"
        raise ConfigError(f"RUN_DIR: {str(args.run_dir)!r} is a local run, not a Slurm job; {how}")
    rec = read_slurm_json(args.run_dir)
    job_id = rec.job_id if rec.kind == "array" else rec.first_job_id
    state = current_state(sacct_rows([job_id]), job_id)
    if state and not is_active(state):
        print(f"slurm job {job_id} already ended: {state}; nothing to cancel")
        return 0
    SlurmJob(folder=rec.submitit_folder, job_id=job_id).cancel(check=True)
    print(f"scancel {job_id}: sent")
    if args.no_wait:
        return 0
    deadline = time.monotonic() + CANCEL_WAIT_S
    while time.monotonic() < deadline:
        state = current_state(sacct_rows([job_id]), job_id)
        if state and not is_active(state):
            break
        time.sleep(0.5)
    else:
        print(f"launch: warning: slurm job {job_id} still {state or 'unknown'} after {CANCEL_WAIT_S:.0f} s; "
              f"check with launch status {args.run_dir}", file=sys.stderr)
        return 1
    print(f"slurm job {job_id}: {state}")
    dirs = [args.run_dir] + ([Path(v.run_dir) for v in rec.variants] if rec.kind == "array" else [])
    for d in dirs:
        RunDir(Path(d).resolve()).set_state("cancelled", message=f"slurm job {job_id}: {state}")
    return 0
