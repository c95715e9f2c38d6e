"""Slurm path timings on the dev cluster (slurm/dev-cluster/start.sh must be running).

    .venv/bin/python benchmarks/slurm/run.py [--repeats 3] [--tasks 100] [--json out.json]

1. The 2-rank job (tiny GPT-2, FSDP, CPU ranks on gloo) through the real CLI, `launch --slurm --wait`:
   submit -> first step (the first line of steps/rank-0.jsonl, by its own timestamp) and submit -> report
   (the CLI returns after writing report.json). "submit" is the moment the CLI is started, so planning,
   sbatch, scheduling, python/torch start-up, rendezvous and model build are all inside.
2. Array fan-out: N trivial tasks (math.sqrt) submitted in one call with submitit's map_array, timed until
   every result is back (submitit reads sacct and the result pickles).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from launcher.backends.slurm_state import read_slurm_json

REPO = Path(__file__).resolve().parents[2]
JOB = {"name": "bench-2rank", "task": "causal_lm",
       "model": {"family": "gpt2", "hidden_size": 64, "num_layers": 2, "num_heads": 4, "vocab_size": 1024,
                 "max_position_embeddings": 256},
       "data": {"path": str(REPO / "examples" / "data" / "causal.jsonl"), "max_seq_len": 64},
       "train": {"global_batch_size": 8, "precision": "bf16", "lr": 1e-3, "max_steps": 4},
       "strategy": {"engine": "fsdp"}, "gpus": 2, "budget": "1GB", "launcher": "slurm",
       "slurm": {"timeout_min": 10}}


def two_rank_job(tmp: Path) -> dict:
    job = tmp / "job.yaml"
    job.write_text(yaml.safe_dump(JOB))
    run_dir = tmp / "run"
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(REPO / ".cache" / "torch_extensions")}
    t0 = time.time()
    out = subprocess.run([sys.executable, "-m", "launcher", str(job), "--wait", "--run-dir", str(run_dir)],
                         capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
    t_report = time.time() - t0
    if out.returncode != 0:
        raise RuntimeError(f"2-rank job failed (exit {out.returncode}):\n{out.stdout}\n{out.stderr}")
    first = json.loads((run_dir / "steps" / "rank-0.jsonl").read_text().splitlines()[0])
    rec = read_slurm_json(run_dir)
    start = subprocess.run(["sacct", "-n", "-X", "-P", "-o", "Start", "-j", rec.job_id], capture_output=True,
                           text=True).stdout.split()[0]
    t_start = time.mktime(time.strptime(start, "%Y-%m-%dT%H:%M:%S"))  # sacct has 1 s resolution
    return {"submit_to_first_step_s": first["time"] - t0, "submit_to_report_s": t_report,
            "cli_to_sbatch_s": rec.submitted_at - t0, "sbatch_to_job_start_s": t_start - rec.submitted_at,
            "job_start_to_first_step_s": first["time"] - t_start}


def fan_out(tmp: Path, n: int) -> dict:
    import submitit

    ex = submitit.SlurmExecutor(folder=tmp / "submitit")
    ex.update_parameters(time=10, array_parallelism=n, cpus_per_task=1, job_name="bench-fanout")
    t0 = time.time()
    jobs = ex.map_array(math.sqrt, list(range(n)))
    t_submitted = time.time() - t0
    results = [j.result() for j in jobs]
    t_done = time.time() - t0
    assert results == [math.sqrt(k) for k in range(n)]
    return {"tasks": n, "submit_s": t_submitted, "submit_to_all_done_s": t_done}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tasks", type=int, default=100)
    ap.add_argument("--only", choices=("two_rank", "fan_out"), help="run one of the two measurements")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()
    summary: dict = {"date": time.strftime("%Y-%m-%d %H:%M"),
                     "machine": f"{platform.node()}, {os.cpu_count()} cores, {platform.platform()}",
                     "load_avg_1_5_15_before": os.getloadavg()}
    for name, fn in (("two_rank", two_rank_job), ("fan_out", lambda tmp: fan_out(tmp, args.tasks))):
        if args.only and args.only != name:
            continue
        runs = []
        for _ in range(args.repeats):
            with tempfile.TemporaryDirectory(dir=REPO / ".cache") as tmp:
                runs.append(fn(Path(tmp)))
                print(f"{name}: {runs[-1]}", flush=True)
        summary[name] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        summary[f"{name}_runs"] = runs
    print(json.dumps(summary, indent=2))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    (REPO / ".cache").mkdir(exist_ok=True)
    main()
