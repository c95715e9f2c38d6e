"""`launch run` (the default verb): plan, write the run dir, start the ranks, check every rank's peak."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from launcher.backends.base import LaunchSpec, Outcome
from launcher.cli.common import add_job_args, job_from_args
from launcher.config.job import Job
from launcher.config.jobfile import job_to_data
from launcher.errors import EXIT_BAD_INPUT, EXIT_OK, EXIT_OVER_BUDGET, EXIT_TRAINING_FAILED, ConfigError
from launcher.planner.plan import Plan
from launcher.planning import plan_job
from launcher.report import build_report, over_budget_message, plot_memory, render_report
from launcher.rundir import RunDir, default_run_dir

OOM_EXIT = 75  # what a rank exits with after writing its OOM report (launcher.runtime)
REPO = Path(__file__).resolve().parents[2]

EPILOG = """examples:
  launch --gpus 2 --budget 2GB examples/minilm-embed.yaml
  launch --gpus 2 --budget 1GB examples/tiny-gpt2.yaml --run-dir runs/tiny --overwrite
  launch --gpus 2 --budget 1GB job.yaml --script train.py -- --epochs 1
  launch --gpus 2 --nodes 2 --node-rank 0 --rdzv-endpoint head:29400 --run-dir /shared/run job.yaml
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
    p.add_argument("--node-rank", type=int, default=0, help="this node's rank in a multi-node run")
    p.add_argument("--rdzv-endpoint", help="host:port of the c10d rendezvous for multi-node runs")
    p.add_argument("--script", help="run this training script under the launcher instead of the built-in recipe")
    p.add_argument("--hang-timeout", type=float, default=0.0, metavar="S",
                   help="end the run when no rank progresses for S seconds (0: off)")
    p.add_argument("--slurm", action="store_true", help="submit through submitit to Slurm (as launcher: slurm)")
    p.add_argument("--wait", action="store_true", help="with Slurm: follow the job and end with the memory report")
    p.add_argument("--array-parallelism", type=int, metavar="N",
                   help="with a sweep: at most N array tasks run at once (slurm.array_parallelism)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--quiet", action="store_true", help="no live view")
    g.add_argument("--verbose", action="store_true", help="live view as lines even when not on a terminal")
    p.add_argument("script_args", nargs="*", help=argparse.SUPPRESS)


def cuda_available() -> bool:
    from launcher.planning import detect_gpu_name

    return detect_gpu_name() is not None


def check_runnable(job: Job, plan: Plan) -> None:
    if plan.precision == "fp16" and plan.hardware == "cpu":
        raise ConfigError("train.precision: 'fp16' is refused on CPU ranks (no fp16 kernels); use bf16 or fp32")


def rank_env(run: RunDir, plan: Plan, job: Job, enforce: bool) -> dict[str, str]:
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
    # torchrun's own default for several ranks per node, set here so it does not warn about it.
    env["OMP_NUM_THREADS"] = os.environ.get("OMP_NUM_THREADS", "1")
    # DeepSpeed compiles its ops once per machine into this cache instead of at every start.
    env["TORCH_EXTENSIONS_DIR"] = os.environ.get("TORCH_EXTENSIONS_DIR", str(REPO / ".cache" / "torch_extensions"))
    return env


def prepare_run_dir(args, job: Job, plan: Plan) -> RunDir:
    from launcher.cli.plan import write_plan_outputs

    path = args.run_dir or default_run_dir(job.name)
    run = RunDir.create(path, overwrite=args.overwrite, resume=args.resume)
    if args.resume and not run.has_checkpoint():
        raise ConfigError(f"--resume: {str(run.path)!r} has no checkpoint to resume from; run without --resume")
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
        print(f"launch: {outcome.message}; the run dir is marked interrupted (resume with --resume)", file=sys.stderr)
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
        print(f"launch: error: {outcome.message}", file=sys.stderr)
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
    job = job_from_args(args, extra)
    if job.sweep is not None:  # each variant is planned for itself, so the base job is not planned here
        from launcher.backends.slurm_array import submit_sweep_from_cli

        return submit_sweep_from_cli(args, job)
    if args.script and not Path(args.script).is_file():
        raise ConfigError(f"--script: {args.script!r} does not exist; give the path of your training script")
    plan = plan_job(job, force=args.force)
    check_runnable(job, plan)
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
        print(f"plan: {plan.strategy.label()}, predicted peak per rank "
              f"{plan.estimate.peak_bytes / 1e9:.3f} GB of {plan.budget_bytes / 1e9:.3f} GB; run dir {run_dir.path}")
        run_dir.set_state("running", pid=os.getpid())
    if job.nodes > 1 and not args.rdzv_endpoint:
        raise ConfigError("--nodes: a multi-node run needs --rdzv-endpoint host:port (the first node's address)")
    return launch_local(args, job, plan, run_dir)


def launch_local(args, job: Job, plan: Plan, run_dir: RunDir) -> int:
    from launcher.backends.local import LocalBackend
    from launcher.live import LiveView, view_mode

    spec = LaunchSpec(gpus_per_node=plan.gpus_per_node, nodes=plan.nodes, node_rank=args.node_rank,
                      rdzv_endpoint=args.rdzv_endpoint, script=str(Path(args.script).resolve()) if args.script else None,
                      script_args=list(args.script_args), env=rank_env(run_dir, plan, job, args.enforce),
                      hang_timeout_s=args.hang_timeout)
    view = LiveView(run_dir.path, plan.world_size, total_steps(job), mode=view_mode(args.quiet, args.verbose))
    view.start()
    try:
        outcome = LocalBackend().run(run_dir, spec)
    finally:
        view.stop()
    if args.node_rank > 0:
        return EXIT_OK if outcome.ok else EXIT_TRAINING_FAILED
    return finish(run_dir, plan, outcome)


__all__ = ["run", "add_parser", "EXIT_BAD_INPUT"]
