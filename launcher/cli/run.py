"""`launch run` (the default verb): plan, write the run dir, start the ranks, check every rank's peak."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import time
from pathlib import Path

from launcher.backends.base import LaunchSpec, Outcome
from launcher.cli.common import add_job_args, job_from_args, non_negative_int, seconds
from launcher.config.job import Job
from launcher.config.jobfile import job_to_data
from launcher.errors import EXIT_BAD_INPUT, EXIT_OK, EXIT_OVER_BUDGET, EXIT_TRAINING_FAILED, ConfigError, NoPlanError
from launcher.fallback import Measurement, next_strategy, pins_for
from launcher.plan_inputs import plan_job
from launcher.planner.plan import Plan
from launcher.report import build_report, over_budget_message, plot_memory, render_report
from launcher.rundir import RunDir, default_run_dir, redact
from launcher.units import format_bytes

OOM_EXIT = 75  # what a rank exits with after writing its OOM report (launcher.runtime)
REPO = Path(__file__).resolve().parents[2]

EPILOG = """examples:
  launch --gpus 2 --budget 2GB examples/minilm-embed.yaml
  launch --gpus 2 --budget 1GB examples/tiny-gpt2.yaml --run-dir runs/tiny --overwrite
  launch --gpus 2 --budget 1GB job.yaml --script train.py -- --epochs 1
  launch --gpus 2 --nodes 2 --node-rank 0 --rdzv-endpoint head:29400 --run-dir /shared/run job.yaml
  launch --gpus 2 --budget 16MB job.yaml --enforce --auto-fallback 3     relaunch down the OOM ladder
  launch --gpus 2 --budget 1GB job.yaml --run-dir runs/a --checkpoint-on-interrupt   then --resume after Ctrl-C
"""


def add_parser(sub) -> None:
    p = sub.add_parser("run", help="plan, run through torchrun (or Slurm), and check every rank's peak memory",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_args(p)
    p.set_defaults(func=run)


def add_run_args(p: argparse.ArgumentParser) -> None:
    add_job_args(p)
    p.add_argument("--run-dir", type=Path, help="where the run writes (default runs/<name>-<timestamp>)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing run dir")
    p.add_argument("--resume", action="store_true", help="continue an interrupted run dir from its last checkpoint")
    p.add_argument("--enforce", action="store_true",
                   help="cap each rank at the budget (CUDA: per-process memory fraction; CPU: the probe raises OOM)")
    p.add_argument("--memory-snapshot", action="store_true",
                   help="CUDA: record the allocator's history through the first step into "
                        "RUN/memory-snapshot/rank-K.pickle (view it at pytorch.org/memory_viz)")
    p.add_argument("--node-rank", type=int, default=0, help="this node's rank in a multi-node run")
    p.add_argument("--rdzv-endpoint", help="host:port of the c10d rendezvous for multi-node runs")
    p.add_argument("--script", help="run this training script under the launcher instead of the built-in recipe")
    p.add_argument("--hang-timeout", type=seconds, default=0.0, metavar="S",
                   help="end the run when no rank progresses for S seconds and name the rank that did not arrive "
                        "(0: off)")
    p.add_argument("--auto-fallback", type=non_negative_int, metavar="N",
                   help="when a rank runs out of memory or the run ends over budget, relaunch down the ladder "
                        "(smaller micro-batch, checkpointing, more sharding, offload) up to N times; the global "
                        "batch never changes (auto_fallback: in the job)")
    p.add_argument("--checkpoint-on-interrupt", action="store_true",
                   help="on Ctrl-C or SIGTERM ask the ranks to checkpoint and wait for them (then --resume continues; "
                        "checkpoint_on_interrupt: true in the job)")
    p.add_argument("--checkpoint-timeout", type=seconds, default=120.0, metavar="S",
                   help="with --checkpoint-on-interrupt: wait at most S seconds for the checkpoint (default 120)")
    p.add_argument("--slurm", action="store_true", help="submit through submitit to Slurm (as launcher: slurm)")
    p.add_argument("--wait", action="store_true", help="with Slurm: follow the job and end with the memory report")
    p.add_argument("--array-parallelism", type=int, metavar="N",
                   help="with a sweep: at most N array tasks run at once (slurm.array_parallelism)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--quiet", action="store_true", help="no live view")
    g.add_argument("--verbose", action="store_true", help="live view as lines even when not on a terminal")


def cuda_available() -> bool:
    from launcher.machine import detect_gpu_name

    return detect_gpu_name() is not None


def check_runnable(job: Job, plan: Plan, args: argparse.Namespace | None = None) -> None:
    if plan.precision == "fp16" and plan.hardware == "cpu":
        raise ConfigError("train.precision: 'fp16' is refused on CPU ranks (no fp16 kernels); use bf16 or fp32")
    if args is not None and getattr(args, "memory_snapshot", False) and job.launcher == "local" \
            and not cuda_available():
        raise ConfigError("--memory-snapshot: records the CUDA allocator's history, and this machine has no CUDA "
                          "GPU; drop the flag (CPU ranks already write their breakdown to ranks/rank-K.json)")
    if job.launcher == "local":  # a Slurm job's NVMe is on the compute nodes, not here
        problems = check_nvme(job, plan)
        if problems:
            raise ConfigError(problems)


def check_nvme(job: Job, plan: Plan) -> list[str]:
    """A plan that swaps to NVMe needs cluster.nvme_path creatable, writable and with the room the plan uses."""
    s = plan.strategy
    if "nvme" not in (s.offload_optimizer, s.offload_params):
        return []
    if not job.cluster.nvme_path:
        return ["cluster.nvme_path: missing, but the plan offloads to NVMe; set it to a directory on a local NVMe drive"]
    raw = job.cluster.nvme_path
    try:
        path = Path(raw).expanduser().absolute()
    except RuntimeError as e:  # '~nosuchuser/...'
        return [f"cluster.nvme_path: {raw!r} cannot be expanded ({e}); give an absolute path"]
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return [f"cluster.nvme_path: {raw!r} cannot be created: {str(existing)!r} is a file, not a directory; "
                "point nvme_path at a directory on the NVMe drive"]
    # access() also answers for root: EROFS on a read-only mount, and it needs no file written to find out.
    if not os.access(existing, os.W_OK | os.X_OK):
        return [f"cluster.nvme_path: {raw!r} is not writable ({str(existing)!r} is read-only or not yours); "
                "point nvme_path at a directory you can write"]
    need = plan.estimate.nvme_bytes_per_node
    free = shutil.disk_usage(existing).free
    if need > free:
        return [f"cluster.nvme_path: {raw!r} has {format_bytes(free)} free, the plan swaps {format_bytes(need)} "
                "to NVMe per node; free space there, use a larger drive, or unpin the NVMe offload"]
    return []


def cluster_hints(job: Job, message: str) -> str:
    """The job fields behind a host-RAM or NVMe refusal, for a no-plan message that names only the resource."""
    hints = ""
    if "host RAM:" in message:
        have = job.cluster.host_ram_per_node_bytes
        hints += (f"\n  - cluster.host_ram_per_node: {format_bytes(have)} is less than the offload needs; raise it"
                  if have else "\n  - cluster.host_ram_per_node: this machine's RAM is less than the offload needs; "
                  "run where there is more, or offload less")
    if "NVMe:" in message:
        free = job.cluster.nvme_free_bytes
        hints += (f"\n  - cluster.nvme_free: {format_bytes(free)} is less than the NVMe offload needs; free space at "
                  "cluster.nvme_path or point it at a larger drive" if free else
                  f"\n  - cluster.nvme_path: {job.cluster.nvme_path!r} has less free space than the NVMe offload "
                  "needs; free space there or point it at a larger drive")
    return hints


def check_fallback(job: Job, args: argparse.Namespace) -> None:
    if not job.auto_fallback:
        return
    if job.launcher == "slurm" or job.nodes > 1 or args.node_rank > 0:
        raise ConfigError(f"auto_fallback: {job.auto_fallback} relaunches the ranks of this node only, so it works "
                          "with the local launcher on one node; set auto_fallback: 0 (or --auto-fallback 0) for "
                          "--slurm and --nodes > 1")
    if args.resume:
        raise ConfigError(f"--auto-fallback: {job.auto_fallback} with --resume would restart the checkpointed run "
                          "from step 0 on another rung; resume without --auto-fallback")


def resume_plan(args: argparse.Namespace, job: Job, plan: Plan) -> tuple[Job, Plan]:
    """--resume keeps the strategy recorded in the run dir (the rung a fallback ladder ended on): its checkpoint
    is in that engine's layout, and a re-plan could pick another."""
    recorded = (args.run_dir or Path()) / "plan.json"
    if not args.run_dir or not recorded.is_file():
        return job, plan
    try:
        old = Plan.from_json(json.loads(recorded.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return job, plan
    if old.strategy == plan.strategy:
        return job, plan
    job = dataclasses.replace(job, strategy=pins_for(old.strategy, job.strategy.safety_margin))
    print(f"launch: --resume keeps the run dir's strategy {old.strategy.label()} (its checkpoint is in that layout)",
          file=sys.stderr)
    return job, plan_job(job, force=True)


def rank_env(run: RunDir, plan: Plan, job: Job, enforce: bool, snapshot: bool = False) -> dict[str, str]:
    env = {
        "LAUNCHER_RUN_DIR": str(run.path),
        "LAUNCHER_PLAN": str(run.path / "plan.json"),
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    if plan.strategy.engine == "deepspeed":
        env["LAUNCHER_DS_CONFIG"] = str(run.path / "ds_config.json")
    if enforce:
        env["LAUNCHER_ENFORCE_BYTES"] = str(plan.budget_bytes)
    if snapshot:
        env["LAUNCHER_MEMORY_SNAPSHOT"] = "1"
    # A rank aborted by the hang watchdog (SIGABRT) writes its Python stack into its log on the way out.
    env["PYTHONFAULTHANDLER"] = "1"
    # torchrun's own default for several ranks per node, set here so it does not warn about it.
    env["OMP_NUM_THREADS"] = os.environ.get("OMP_NUM_THREADS", "1")
    # DeepSpeed compiles its ops once per machine into this cache instead of at every start.
    env["TORCH_EXTENSIONS_DIR"] = os.environ.get("TORCH_EXTENSIONS_DIR", str(REPO / ".cache" / "torch_extensions"))
    return env


def prepare_run_dir(args, job: Job, plan: Plan) -> RunDir:
    from launcher.cli.plan import write_plan_outputs

    path = args.run_dir or default_run_dir(job.name)
    if args.resume and not (Path(path) / "checkpoint" / "latest").is_file():  # before anything is created
        raise ConfigError(f"--resume: {str(path)!r} has no checkpoint to resume from; run without --resume")
    run = RunDir.create(path, overwrite=args.overwrite, resume=args.resume)
    run.write_yaml("job.yaml", job_to_data(job))
    write_plan_outputs(run.path, plan, job)
    return run


def total_steps(job: Job) -> int | None:
    return job.train.max_steps


def wait_for_rank_files(run: RunDir, world_size: int, timeout_s: float) -> None:
    """Ranks on other nodes may still be writing their memory files when this node's agent returns."""
    import time

    deadline = time.monotonic() + timeout_s
    while len(run.rank_files()) < world_size and time.monotonic() < deadline:
        time.sleep(0.2)


def finish(run: RunDir, plan: Plan, outcome: Outcome) -> int:
    """Merge the rank files, write report.json and memory.png, print the table, and return the exit code."""
    if outcome.ok and plan.nodes > 1:
        wait_for_rank_files(run, plan.world_size, timeout_s=60)
    run.redact_logs()  # before any tail of them is printed or kept
    report = build_report(run, plan.to_json(), expected_ranks=plan.world_size)
    report["outcome"] = {"ok": outcome.ok, "interrupted": outcome.interrupted, "message": outcome.message,
                         "failures": [{"rank": f.rank, "exitcode": f.exitcode, "host": f.host} for f in outcome.failures]}
    run.write_json("report.json", report)
    try:
        plot_memory(report, run.path / "memory.png")
    except Exception as e:  # a plot must never turn a good run into a failure
        print(f"launch: warning: memory.png not written: {e}", file=sys.stderr)
    print(render_report(report))
    print(f"run dir: {run.path}")
    if outcome.interrupted:
        run.set_state("interrupted", message=outcome.message)
        print(f"launch: {redact(outcome.message)}; the run dir is marked interrupted (resume with --resume)",
              file=sys.stderr)
        return 130
    if not outcome.ok:
        run.set_state("failed", message=outcome.message)
        describe_failure(run, outcome)
        return EXIT_TRAINING_FAILED
    msg = over_budget_message(report)
    if msg:
        run.set_state("over_budget", message=msg)
        print(f"launch: over budget: {msg}", file=sys.stderr)
        return EXIT_OVER_BUDGET
    if not report["within_budget"]:
        run.set_state("failed", message="ranks missing from the report")
        print(f"launch: error: ranks {report['missing_ranks']} wrote no memory file", file=sys.stderr)
        return EXIT_TRAINING_FAILED
    run.set_state("completed")
    return EXIT_OK


def describe_failure(run: RunDir, outcome: Outcome) -> None:
    if outcome.message:
        print(f"launch: error: {redact(outcome.message)}", file=sys.stderr)
    for f in sorted(outcome.failures, key=lambda f: f.rank):
        kind = "ran out of memory" if f.exitcode == OOM_EXIT else f"failed with exit code {f.exitcode}"
        print(f"launch: error: rank {f.rank} on {f.host} {kind}; log: {run.rank_log(f.rank)}", file=sys.stderr)
        log = run.rank_log(f.rank)
        if log.is_file():
            tail = log.read_text(errors="replace").splitlines()[-15:]
            print("\n".join(f"  | {ln}" for ln in tail), file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    extra = {"launcher": "slurm"} if args.slurm else {}
    if args.array_parallelism is not None:
        extra["slurm.array_parallelism"] = args.array_parallelism
    if args.auto_fallback is not None:
        extra["auto_fallback"] = args.auto_fallback
    job = job_from_args(args, extra)
    if job.sweep is not None:  # each variant is planned for itself, so the base job is not planned here
        from launcher.backends.slurm_array import submit_sweep_from_cli

        return submit_sweep_from_cli(args, job)
    if args.script and not Path(args.script).is_file():
        raise ConfigError(f"--script: {args.script!r} does not exist; give the path of your training script")
    if job.launcher == "local" and job.nodes > 1 and not args.rdzv_endpoint:
        raise ConfigError("--nodes: a multi-node run needs --rdzv-endpoint host:port (the first node's address)")
    check_fallback(job, args)
    try:
        plan = plan_job(job, force=args.force)
    except NoPlanError as e:
        raise NoPlanError(str(e) + cluster_hints(job, str(e))) from None
    if args.resume:
        job, plan = resume_plan(args, job, plan)
    check_runnable(job, plan, args)
    if plan.status == "forced":
        print(f"launch: warning: running a plan predicted over budget because of --force: {plan.reasons[0]}",
              file=sys.stderr)
    if job.launcher == "slurm":
        from launcher.backends.slurm import submit_from_cli

        return submit_from_cli(args, job, plan)
    if args.node_rank > 0:
        if not args.run_dir:
            raise ConfigError("--node-rank: nodes after the first need the shared --run-dir of node 0")
        run_dir = RunDir(args.run_dir.resolve())
        run_dir.path.mkdir(parents=True, exist_ok=True)
    else:
        run_dir = prepare_run_dir(args, job, plan)
        announce(plan, run_dir)
        run_dir.set_state("running", pid=os.getpid())
    if job.auto_fallback:
        return run_ladder(args, job, plan, run_dir)
    return launch_local(args, job, plan, run_dir)


def announce(plan: Plan, run_dir: RunDir, attempt: int | None = None) -> None:
    head = f"attempt {attempt}: " if attempt else ""
    print(f"{head}plan: {plan.strategy.label()}, predicted peak per rank "
          f"{plan.estimate.peak_bytes / 1e9:.3f} GB of {plan.budget_bytes / 1e9:.3f} GB; run dir {run_dir.path}",
          flush=True)


def preload_plotting() -> None:
    """Import matplotlib while the ranks train: it costs most of a second that would otherwise come after the
    ranks exit, between the last step and the verdict (benchmarks/results/overhead.md)."""
    import threading

    def load() -> None:
        try:
            import matplotlib.backends.backend_agg  # noqa: F401
            import matplotlib.figure  # noqa: F401
        except Exception:  # plotting is optional; plot_memory reports its own failure
            pass

    threading.Thread(target=load, name="preload-matplotlib", daemon=True).start()


def interrupt_grace_s(args, job: Job) -> float:
    """Seconds a signal waits for the ranks' checkpoint: the flag or the job's checkpoint_on_interrupt asks for it."""
    return float(args.checkpoint_timeout) if (args.checkpoint_on_interrupt or job.checkpoint_on_interrupt) else 0.0


def launch_local(args, job: Job, plan: Plan, run_dir: RunDir) -> int:
    return run_attempt(args, job, plan, run_dir)[0]


def run_attempt(args, job: Job, plan: Plan, run_dir: RunDir) -> tuple[int, Outcome]:
    from launcher.backends.local import LocalBackend
    from launcher.live import LiveView, view_mode

    spec = LaunchSpec(gpus_per_node=plan.gpus_per_node, nodes=plan.nodes, node_rank=args.node_rank,
                      rdzv_endpoint=args.rdzv_endpoint, script=str(Path(args.script).resolve()) if args.script else None,
                      script_args=list(args.script_args),
                      env=rank_env(run_dir, plan, job, args.enforce, args.memory_snapshot),
                      hang_timeout_s=args.hang_timeout)
    grace = interrupt_grace_s(args, job)
    view = LiveView(run_dir.path, plan.world_size, total_steps(job), mode=view_mode(args.quiet, args.verbose))
    view.start()
    preload_plotting()
    try:
        outcome = LocalBackend(checkpoint_on_interrupt_s=grace).run(run_dir, spec)
    finally:
        view.stop()
    if args.node_rank > 0:
        return (EXIT_OK if outcome.ok else EXIT_TRAINING_FAILED), outcome
    return finish(run_dir, plan, outcome), outcome


# -- the OOM ladder (--auto-fallback) --------------------------------------------------------------------------------

def _rank_reports(run: RunDir) -> list[dict]:
    rows = []
    for p in run.rank_files():
        try:
            rows.append(json.loads(p.read_text()))
        except (OSError, ValueError):
            continue  # a rank killed while writing: the others still tell what happened
    return rows


def measure_attempt(run: RunDir, code: int, outcome: Outcome) -> Measurement | None:
    """What the attempt measured when it ended for lack of memory (OOM or over budget); None for any other end."""
    rows = _rank_reports(run)
    ooms = [r for r in rows if r.get("status") == "oom"]
    if ooms:
        worst = max(ooms, key=lambda r: int(r.get("measured_peak_bytes") or 0))
        oom = worst.get("oom") or {}
        return Measurement(kind="oom", rank=worst.get("rank"), phase=oom.get("phase"), step=oom.get("step"),
                           peak_bytes=int(oom.get("crossed_at_bytes") or worst.get("measured_peak_bytes") or 0),
                           by_category=worst.get("peak_by_category") or oom.get("current_by_category") or {})
    if code == EXIT_TRAINING_FAILED and any(f.exitcode == OOM_EXIT for f in outcome.failures):
        rank = min(f.rank for f in outcome.failures if f.exitcode == OOM_EXIT)
        return Measurement(kind="oom", rank=rank, peak_bytes=0)  # a script that wrote no rank report
    if code == EXIT_OVER_BUDGET and rows:
        worst = max(rows, key=lambda r: int(r.get("measured_peak_bytes") or 0))
        return Measurement(kind="over_budget", rank=worst.get("rank"), peak_bytes=int(worst["measured_peak_bytes"]),
                           by_category=worst.get("peak_by_category") or {})
    return None


def _outcome_name(code: int, outcome: Outcome, m: Measurement | None) -> str:
    if m is not None:
        return m.kind
    if outcome.interrupted:
        return "interrupted"
    return {EXIT_OK: "ok", EXIT_OVER_BUDGET: "over_budget"}.get(code, "failed")


def run_ladder(args, job: Job, plan: Plan, run_dir: RunDir) -> int:
    """Attempt 1 is the plan; each OOM or over-budget end moves one rung down the ladder (launcher.fallback)
    until an attempt ends within budget, a non-memory failure or interrupt ends it, or the tries run out."""
    from launcher.cli.plan import write_plan_outputs
    from launcher.plan_inputs import plan_request

    tries = job.auto_fallback
    records: list[dict] = []
    tried = [plan.strategy]
    attempt = 1
    while True:
        t0 = time.monotonic()
        code, outcome = run_attempt(args, job, plan, run_dir)
        m = measure_attempt(run_dir, code, outcome)
        report = run_dir.read_json("report.json") if (run_dir.path / "report.json").is_file() else {}
        record = {
            "attempt": attempt, "label": plan.strategy.label(), "strategy": dataclasses.asdict(plan.strategy),
            "outcome": _outcome_name(code, outcome, m), "exit_code": code,
            "global_batch_size": plan.global_batch_size, "predicted_peak_bytes": plan.estimate.peak_bytes,
            "budget_bytes": plan.budget_bytes,
            "measured_peak_bytes": m.peak_bytes if m else max(
                (r["measured_peak_bytes"] for r in report.get("ranks", [])), default=None),
            "oom": {"rank": m.rank, "phase": m.phase, "step": m.step} if m and m.kind == "oom" else None,
            "seconds": round(time.monotonic() - t0, 1), "dir": ".", "next": None,
        }
        records.append(record)
        if m is None:
            break  # within budget, or a failure no memory rung can fix (or an interrupt)
        if attempt > tries:
            record["stopped"] = f"auto_fallback: all {tries} relaunch(es) used"
            print(f"launch: auto-fallback: all {tries} relaunch(es) used; the last attempt ended {record['outcome']}",
                  file=sys.stderr)
            break
        req = plan_request(job, force=True)
        fb = next_strategy(plan.strategy, plan.estimate, req, m, tried)
        if fb.strategy is None:
            record["stopped"] = fb.reason
            print(f"launch: auto-fallback: {fb.reason}", file=sys.stderr)
            break
        record["next"] = {"label": fb.strategy.label(), "rung": fb.rung, "reason": fb.reason,
                          "predicted_peak_bytes": fb.predicted_peak_bytes,
                          "corrected_peak_bytes": fb.corrected_peak_bytes, "skipped": fb.skipped}
        record["dir"] = f"attempts/{attempt}"
        run_dir.archive_attempt(attempt)
        print(f"launch: auto-fallback {attempt}/{tries}: {fb.reason}; attempt {attempt} kept in "
              f"{run_dir.path / record['dir']}", file=sys.stderr, flush=True)
        job = dataclasses.replace(job, strategy=pins_for(fb.strategy, job.strategy.safety_margin))
        plan = plan_job(job, force=True)  # every field pinned: the planner rebuilds buckets and configs for it
        tried.append(plan.strategy)
        attempt += 1
        run_dir.write_yaml("job.yaml", job_to_data(job))
        write_plan_outputs(run_dir.path, plan, job)
        run_dir.set_state("running", pid=os.getpid(), attempt=attempt)
        announce(plan, run_dir, attempt)
    finish_ladder(run_dir, records, tries, code)
    return code


def finish_ladder(run_dir: RunDir, records: list[dict], tries: int, code: int) -> None:
    """report.json of the last attempt gains the ladder: every attempt, its outcome and why the next one."""
    report = run_dir.read_json("report.json") if (run_dir.path / "report.json").is_file() else {}
    report["auto_fallback"] = {"tries": tries, "relaunches": len(records) - 1, "ended_within_budget": code == EXIT_OK}
    report["attempts"] = records
    run_dir.write_json("report.json", report)
    run_dir.set_state(run_dir.state().get("state", "failed"), attempts=len(records))
    if len(records) > 1:
        last = records[-1]
        verdict = "ended within budget" if code == EXIT_OK else f"ended {last['outcome']} (exit {code})"
        print(f"launch: auto-fallback: {verdict} on attempt {last['attempt']} with {last['label']} after "
              f"{len(records) - 1} relaunch(es); the ladder is in report.json under attempts", file=sys.stderr)


__all__ = ["run", "add_parser", "EXIT_BAD_INPUT"]
