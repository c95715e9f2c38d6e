"""`launch status | logs | cancel RUN_DIR`: look after a run submitted with --slurm, from its run dir alone."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

from launcher.backends.slurm_state import (
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
from launcher.live import rank_rows

CANCEL_WAIT_S = 60.0

STATUS_EPILOG = """examples:
  launch status runs/tiny-20250101-120000
  launch status runs/sweep --json
"""
LOGS_EPILOG = """examples:
  launch logs runs/tiny                   last lines of every rank's log and of submitit's stdout/stderr
  launch logs runs/tiny --rank 1 --follow  keep printing rank 1's log until the job ends
"""
CANCEL_EPILOG = """examples:
  launch cancel runs/tiny                 scancel the job (every task of an array) and wait until Slurm says so
"""


def add_parser(sub) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    p = sub.add_parser("status", help="state of a Slurm run per task (submitit and sacct) and per rank",
                       epilog=STATUS_EPILOG, formatter_class=fmt)
    p.add_argument("run_dir", type=Path, help="the run dir printed at submission")
    p.add_argument("--json", action="store_true", help="print the status as JSON")
    p.set_defaults(func=status)
    p = sub.add_parser("logs", help="tails of the rank logs and of submitit's stdout/stderr", epilog=LOGS_EPILOG,
                       formatter_class=fmt)
    p.add_argument("run_dir", type=Path)
    p.add_argument("--rank", type=int, help="only this rank's log (submitit's logs still follow)")
    p.add_argument("--lines", type=int, default=20, help="lines per file (default 20)")
    p.add_argument("--follow", action="store_true", help="keep printing new lines until the job ends")
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
    plan_path = run_dir / "plan.json"
    world = json.loads(plan_path.read_text())["world_size"] if plan_path.is_file() else tasks * rec.gpus_per_node
    state_path = run_dir / "state.json"
    return {
        "run_dir": str(run_dir), "kind": rec.kind, "job_id": job_id, "state": current_state(rows, job_id),
        "requeued": restarts(rows, job_id),
        "allocations": allocation_rows(rows, job_id), "steps": step_rows(rows, job_id),
        "tasks": [{"task": t, "node": node_of(run_dir, t), "result": r} for t, r in enumerate(results)],
        "ranks": rank_rows(run_dir, world), "requeues": read_requeues(run_dir),
        "run_state": json.loads(state_path.read_text()) if state_path.is_file() else {},
    }


def node_of(run_dir: Path, task: int) -> str | None:
    views = sorted((run_dir / "rdzv").glob(f"*/node-{task}.json"), key=lambda p: p.stat().st_mtime)
    return json.loads(views[-1].read_text()).get("node_name") if views else None


def collect_status(run_dir: Path) -> dict:
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
    st = collect_status(args.run_dir)
    print(json.dumps(st, indent=2, default=str) if args.json else render_status(st))
    return 0


# -- logs -----------------------------------------------------------------------------------------------------
def log_files(run_dir: Path, rec: SlurmRecord, rank: int | None) -> list[tuple[str, Path]]:
    if rec.kind == "array":
        names = [v.run_dir for v in rec.variants]
        raise ConfigError(f"RUN_DIR: {str(run_dir)!r} is an array; give one variant's run dir: {', '.join(names)}")
    plan = json.loads((run_dir / "plan.json").read_text()) if (run_dir / "plan.json").is_file() else {}
    world = int(plan.get("world_size") or rec.nodes * rec.gpus_per_node)
    if rank is not None and not 0 <= rank < world:
        raise ConfigError(f"--rank: {rank} is not a rank of this run (0..{world - 1}); pick one of those")
    ranks = [rank] if rank is not None else list(range(world))
    files = [(f"rank {r}", run_dir / "logs" / f"rank-{r}.log") for r in ranks]
    for t in range(rec.nodes):
        out, err = submitit_logs(Path(rec.submitit_folder), rec.first_job_id, t)
        files += [(f"submitit task {t} stdout", out), (f"submitit task {t} stderr", err)]
    return files


def tail(path: Path, lines: int) -> str:
    if not path.is_file():
        return "(not written yet)"
    with path.open("rb") as f:
        f.seek(0, 2)
        f.seek(max(0, f.tell() - 200 * lines))
        text = f.read().decode(errors="replace")
    return "\n".join(text.splitlines()[-lines:])


def logs(args: argparse.Namespace) -> int:
    from launcher.rundir import redact, secret_values

    rec = read_slurm_json(args.run_dir)
    files = log_files(args.run_dir, rec, args.rank)
    # The files themselves are scrubbed only when the job ends; while it runs they hold what the ranks printed.
    secrets = secret_values()
    for label, path in files:
        print(f"==> {label}: {path} <==")
        print(redact(tail(path, args.lines), secrets))
    sys.stdout.flush()
    if args.follow:
        follow(files, rec, secrets=secrets)
    return 0


def follow(files: list[tuple[str, Path]], rec: SlurmRecord, poll_s: float = 0.5, check_every_s: float = 2.0, *,
           secrets: list[str] | None = None) -> None:
    """Print what the files gain, line by line with their label (secret values redacted), until the job is over."""
    from launcher.rundir import redact

    offsets = {p: (p.stat().st_size if p.is_file() else 0) for _, p in files}
    job_id = rec.first_job_id
    last_check, active = 0.0, True
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
        if not active:
            return
        if time.monotonic() - last_check >= check_every_s:
            last_check = time.monotonic()
            active = is_active(current_state(sacct_rows([job_id]), job_id))
        time.sleep(poll_s)


# -- cancel ---------------------------------------------------------------------------------------------------
def cancel(args: argparse.Namespace) -> int:
    from submitit.slurm.slurm import SlurmJob

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
    from launcher.rundir import RunDir

    dirs = [args.run_dir] + ([Path(v.run_dir) for v in rec.variants] if rec.kind == "array" else [])
    for d in dirs:
        RunDir(Path(d).resolve()).set_state("cancelled", message=f"slurm job {job_id}: {state}")
    return 0
