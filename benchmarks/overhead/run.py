"""Launcher overhead: `launch` against bare torchrun running the same worker on the same run dir and steps.

    .venv/bin/python benchmarks/overhead/run.py            # 5 pairs, ~6 min on 2 idle cores
    .venv/bin/python benchmarks/overhead/run.py --pairs 2

bare:   `launch plan --out D` once (plus job.yaml, what launch's prepare_run_dir writes), then per repeat
        `python -m torch.distributed.run --standalone --nproc-per-node 2 -m launcher.worker.rank_entry D` with the
        environment launch gives its ranks (launcher.session.prepare.rank_env); the worker's outputs are cleared between
        repeats so it never resumes.
launch: `launch --gpus 2 --budget 4GB JOB --run-dir D2 --overwrite --quiet` (D2 removed before the clock starts,
        as bare clears its outputs): plan, run dir, torchrun (in process), live view off, report.json,
        memory.png, verdict.
The pairs alternate (launch, bare, launch, ...) so drift in the machine's load hits both. The launch runs are
split by file times: start -> plan.json written (planning), -> last rank file (ranks), -> report.json (merge),
-> exit (plot, print, exit).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.accuracy.harness import (  # noqa: E402
    BENCH_CACHE,
    DATA,
    LAUNCH,
    PYTHON,
    REPO,
    RESULTS,
    RUNS,
    bench_env,
    launch,
    log,
    machine,
    write_job,
)

ROOT = RUNS / "overhead"
GOAL_S = 1.0
JOB = {
    "name": "overhead", "task": "causal_lm",
    "model": {"family": "gpt2", "hidden_size": 64, "num_layers": 2, "num_heads": 4, "vocab_size": 1024,
              "max_position_embeddings": 256},
    "data": {"path": str(DATA / "causal.jsonl"), "text_field": "text", "max_seq_len": 64, "eval_fraction": 0.0},
    "train": {"global_batch_size": 8, "precision": "bf16", "lr": 1.0e-3, "max_steps": 4},
    "strategy": {"engine": "fsdp", "fsdp_reshard_after_forward": True, "offload_optimizer": "none",
                 "offload_params": "none", "micro_batch_size": 4, "activation_checkpointing": False},
    "cluster": {"hardware": "cpu"}, "gpus": 2, "budget": "4GB",
}
WORKER_OUTPUTS = ("ranks", "steps", "logs", "checkpoint", "control")


def prepare_bare(job_file: Path, run_dir: Path) -> dict[str, str]:
    """The run dir launch would write, made by `launch plan --out`, and the env launch gives its ranks."""
    from launcher.config.jobfile import job_to_data, load_job
    from launcher.files.rundir import RunDir
    from launcher.planner.plan import Plan
    from launcher.session.prepare import rank_env

    if run_dir.exists():
        shutil.rmtree(run_dir)
    subprocess.run([str(LAUNCH), "plan", str(job_file), "--out", str(run_dir)], env=bench_env(), check=True,
                   capture_output=True)
    job = load_job(job_file)
    (run_dir / "job.yaml").write_text(yaml.safe_dump(job_to_data(job), sort_keys=False))
    plan = Plan.from_json(json.loads((run_dir / "plan.json").read_text()))
    return {**bench_env(), **rank_env(RunDir(run_dir), plan, job, enforce=False)}


def run_bare(run_dir: Path, env: dict[str, str]) -> float:
    for name in WORKER_OUTPUTS:
        shutil.rmtree(run_dir / name, ignore_errors=True)
    argv = [str(PYTHON), "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
            "-m", "launcher.worker.rank_entry", str(run_dir)]
    t = time.perf_counter()
    p = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=REPO)
    wall = time.perf_counter() - t
    if p.returncode != 0:
        raise RuntimeError(f"bare torchrun failed ({p.returncode}): {p.stderr[-2000:]}")
    return wall


def split_launch(run_dir: Path, started_wall: float, ended_wall: float) -> dict[str, float]:
    """Seconds per stage of one launch run, from the files it wrote (wall-clock times)."""
    plan_t = (run_dir / "plan.json").stat().st_mtime
    ranks_t = max(p.stat().st_mtime for p in (run_dir / "ranks").glob("rank-*.json"))
    report_t = (run_dir / "report.json").stat().st_mtime
    return {"plan": plan_t - started_wall, "ranks": ranks_t - plan_t, "report": report_t - ranks_t,
            "after_report": ended_wall - report_t}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=5)
    args = ap.parse_args(argv)

    job_file = write_job(JOB, ROOT / "job.yaml")
    bare_dir, launch_dir = ROOT / "bare", ROOT / "launch"
    env = prepare_bare(job_file, bare_dir)
    # One untimed run of each: the first start compiles/loads caches (introspection, DeepSpeed ops, fake probe).
    launch(job_file, launch_dir, gpus=2, budget="4GB", cache=BENCH_CACHE)
    run_bare(bare_dir, env)
    launches, bares, stages = [], [], []
    for i in range(args.pairs):
        # As run_bare clears its outputs before its clock starts: --overwrite's rmtree of the last run (its
        # checkpoint included) is not launcher overhead.
        shutil.rmtree(launch_dir, ignore_errors=True)
        t_wall = time.time()
        res = launch(job_file, launch_dir, gpus=2, budget="4GB", cache=BENCH_CACHE)
        if res.returncode != 0:
            raise RuntimeError(f"launch failed ({res.returncode}): {res.output_tail}")
        launches.append(res.wall_s)
        stages.append(split_launch(launch_dir, t_wall, t_wall + res.wall_s))
        bares.append(run_bare(bare_dir, env))
        log(f"pair {i + 1}/{args.pairs}: launch {launches[-1]:.2f} s, bare torchrun {bares[-1]:.2f} s")
    diffs = [a - b for a, b in zip(launches, bares, strict=True)]
    result = {
        "launch_s": launches, "bare_s": bares, "diff_s": diffs,
        "median_launch_s": statistics.median(launches), "median_bare_s": statistics.median(bares),
        "median_diff_s": statistics.median(diffs),
        "median_ratio": statistics.median(a / b for a, b in zip(launches, bares, strict=True)),
        "launch_stages_median_s": {k: statistics.median(s[k] for s in stages) for k in stages[0]},
        "meta": machine(), "job": JOB,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "overhead.json").write_text(json.dumps(result, indent=1) + "\n")
    (RESULTS / "overhead.md").write_text(markdown(result, args.pairs))
    print(markdown(result, args.pairs))
    return 0


def markdown(r: dict, pairs: int) -> str:
    m, st = r["meta"], r["launch_stages_median_s"]
    verdict = "met" if r["median_diff_s"] <= GOAL_S else "NOT met"
    return "\n".join([
        "# Launcher overhead: `launch` vs bare torchrun",
        "",
        f"Measured {m['time']} on {m['cores']} cores (load average {m['load_avg_1m']} when written; shared machine). "
        f"Same worker (launcher.worker.rank_entry), same run dir contents, tiny GPT-2, FSDP2, "
        f"{JOB['train']['max_steps']} steps on 2 CPU ranks; {pairs} alternating pairs after one untimed warm-up of "
        "each.",
        "Rerun: `.venv/bin/python benchmarks/overhead/run.py`.",
        "",
        "| | median wall s | runs (s) |",
        "|---|---|---|",
        f"| `launch` | {r['median_launch_s']:.2f} | {', '.join(f'{x:.2f}' for x in r['launch_s'])} |",
        f"| bare torchrun | {r['median_bare_s']:.2f} | {', '.join(f'{x:.2f}' for x in r['bare_s'])} |",
        f"| **launch - bare** | **{r['median_diff_s']:+.2f}** (ratio {r['median_ratio']:.3f}) | "
        f"{', '.join(f'{x:+.2f}' for x in r['diff_s'])} |",
        "",
        f"Goal: at most {GOAL_S:.0f} s extra per run: {verdict}.",
        "",
        "Where a `launch` run's time goes (median s, from the times its files were written): "
        f"start to plan.json {st['plan']:.2f} (Python start, imports, planning, run dir); ranks {st['ranks']:.2f} "
        f"(torchrun and the worker: the part bare torchrun also does); last rank file to report.json "
        f"{st['report']:.2f} (torchrun shutdown, merge); report to exit {st['after_report']:.2f} (memory.png, "
        "verdict, interpreter exit). The bare figure has no planning: its run dir was written once beforehand by "
        "`launch plan --out`.",
        "",
    ])


if __name__ == "__main__":
    sys.exit(main())
