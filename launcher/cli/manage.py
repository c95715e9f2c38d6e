"""`launch status | logs | cancel RUN_DIR`: look after a run from its run dir alone. What each says is decided by
launcher.session.status; this module parses the flags and renders (text, or --json) and follows a log.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

from launcher.backends.slurm_state import SlurmRecord, current_state, is_active, read_slurm_json, sacct_rows
from launcher.files.rundir import MARKER
from launcher.session.status import (
    CANCEL_WAIT_S,
    LocalStatus,
    Progress,
    cancel_run,
    collect_status,
    is_local,
    local_active,
    local_log_files,
    local_status,
    log_files,
)
from launcher.units import format_bytes, format_duration

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
    p = sub.add_parser("status",
                       help="state of a run (local or Slurm): step/total, loss, peak memory vs budget, per rank",
                       epilog=STATUS_EPILOG, formatter_class=fmt)
    p.add_argument("run_dir", type=Path, help="the run dir printed at submission")
    p.add_argument("--json", action="store_true", help="print the status as JSON")
    p.set_defaults(func=status)
    p = sub.add_parser("logs", help="tails of the rank logs (and of submitit's stdout/stderr on Slurm)",
                       epilog=LOGS_EPILOG,
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
        lines.append(render_progress(st["progress"]))  # a Progress (collect_status)
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
        local = local_status(args.run_dir)
        print(json.dumps(local.to_json(), indent=2, default=str) if args.json else render_local_status(local))
        return 0
    st = collect_status(args.run_dir)
    print(json.dumps(st, indent=2, default=jsonable) if args.json else render_status(st))
    return 0


def jsonable(value: object) -> object:
    """A value json cannot write as it is: a typed one (Progress) as its to_json, any other as text."""
    return value.to_json() if hasattr(value, "to_json") else str(value)


def render_progress(p: Progress) -> str:
    """The "progress:" line: step of total, last loss, peak memory so far against the budget, ETA."""
    total = p.total_steps
    parts = [f"step {p.step}/{total or '?'}" + (f" ({p.step / total:.0%})" if total else "")]
    if isinstance(p.loss, (int, float)):
        parts.append(f"last loss {p.loss:.4f}")
    if p.peak_bytes:
        budget = p.budget_bytes
        parts.append(f"peak memory so far {format_bytes(p.peak_bytes)}"
                     + (f" of {format_bytes(budget)} budget ({p.peak_bytes / budget:.0%})" if budget else ""))
    if p.eta_s is not None and total and p.step < total:
        parts.append(f"ETA {format_duration(p.eta_s)}")
    return "progress: " + ", ".join(parts)


def render_local_status(st: LocalStatus) -> str:
    """A local run's status (launcher.session.status.local_status) as text."""
    pid = f" (launch pid {st.pid})" if st.pid else ""
    attempt = f", attempt {st.attempt}" if st.attempt else ""
    lines = [f"local run {st.run_dir}: {st.state}{pid}{attempt}"]
    if st.message:
        lines.append(f"  {st.message}")
    lines.append(render_progress(st.progress))
    if st.verdict:
        ev = ""
        if isinstance(st.eval_loss, (int, float)):
            ev = f"; eval loss {st.eval_loss:.4f}"
        if isinstance(st.eval_accuracy, (int, float)):
            ev += f", eval accuracy {st.eval_accuracy:.1%}"
        lines.append(f"verdict: {st.verdict}{ev} (report.json)")
    for r in st.ranks:
        step = f", step {r['step']}" if r.get("step") else ""
        peak = f", peak {format_bytes(r['mem_peak_bytes'])}" if r.get("mem_peak_bytes") else ""
        verdict = f"; verdict {r['verdict']}" + (f" ({r['ended']})" if r.get("ended") else "") if r.get("verdict") \
            else ""
        lines.append(f"  rank {r['rank']}: {r['state']}{step}{peak}{verdict}")
    return "\n".join(lines)


# -- logs -----------------------------------------------------------------------------------------------------


def tail(path: Path, lines: int) -> str:
    """The last ``lines`` lines of a file (reading only its end), or a note that it is not written yet."""
    if not path.is_file():
        return "(not written yet)"
    with path.open("rb") as f:
        f.seek(0, 2)
        f.seek(max(0, f.tell() - 200 * lines))
        text = f.read().decode(errors="replace")
    return "\n".join(text.splitlines()[-lines:])


def logs(args: argparse.Namespace) -> int:
    """`launch logs`: the tails of a run's logs, secret values redacted, and with --follow new lines until it ends."""
    from launcher.files.redact import redact, secret_values

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
    from launcher.files.redact import redact

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
    cancelled (launcher.session.status.cancel_run); a local run is refused with how to stop it."""
    done = cancel_run(args.run_dir, wait=not args.no_wait, on_sent=lambda job_id: print(f"scancel {job_id}: sent",
                                                                                           flush=True))
    if not done.sent:
        print(f"slurm job {done.job_id} already ended: {done.state}; nothing to cancel")
        return 0
    if args.no_wait:
        return 0
    if not done.ended:
        print(f"launch: warning: slurm job {done.job_id} still {done.state or 'unknown'} after {CANCEL_WAIT_S:.0f} s; "
              f"check with launch status {args.run_dir}", file=sys.stderr)
        return 1
    print(f"slurm job {done.job_id}: {done.state}")
    for path in done.foreign:
        print(f"launch: warning: {path!r} was not made by launch (no {MARKER}); left untouched", file=sys.stderr)
    return 0
