"""The emitted sbatch script read by its real consumer: sbatch and slurmd of the dev cluster (slurm/dev-cluster).

`sbatch --test-only` parses every #SBATCH line and asks the scheduler whether the allocation could be given, so
a directive sbatch does not know, a bad --time or --mem, or a quoting sbatch reads differently from us fails here.
One script is run for real up to srun (its setup line ends it there) to see that a run dir with spaces, quotes,
'#' and '%' reaches Slurm's --output and the script's RUN_DIR intact; and one, as `launch plan --sbatch --out`
writes it, is submitted with plain sbatch from another directory and runs through srun to its verdict.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launcher.config.job import Job
from launcher.config.jobfile import set_dotted
from launcher.config.load import from_dict
from launcher.emit.sbatch import sbatch_text
from launcher.planner.plan import Buckets, Estimate, Plan, Strategy
from launcher.records.runreport import read_report
from tests.conftest import own_leftovers, require_cluster
from tests.slurm_cluster.test_slurm_dev_cluster import CLUSTER_UP, DEADLINE_S, _sacct_state

REPO = Path(__file__).resolve().parents[2]
RUN_DEADLINE_S = 420
"""Two CPU ranks of a tiny GPT-2 import torch, transformers and DeepSpeed and take 3 steps: ~1 min idle, more on
a loaded 2-core machine."""

pytestmark = [pytest.mark.slurm]

# Every character that naive quoting breaks, plus '#' (sbatch's comment start) and '%' (its file-name patterns).
WEIRD = "my runs/it's \"q\" $HOME `id` ;&|#%x"


@pytest.fixture(autouse=True)
def _cluster_reachable():
    require_cluster(None if CLUSTER_UP else "dev Slurm cluster not running (bash slurm/dev-cluster/start.sh)")


def offload_plan() -> Plan:
    """ZeRO-2 with the optimizer on the host, 2 nodes x 2 GPUs: --time, --mem and --cpus-per-task get derived."""
    return Plan(
        strategy=Strategy.from_json(dict(engine="deepspeed", zero_stage=2, fsdp_reshard_after_forward=None,
                                         offload_optimizer="cpu", offload_params="none", micro_batch_size=2,
                                         grad_accum_steps=2, activation_checkpointing=False)),
        estimate=Estimate(breakdown={"params": 1}, peak_bytes=1 << 30, host_bytes_per_node=2 * 10**9,
                          nvme_bytes_per_node=0,
                          step_time_s=0.5, basis="cuda_reserved_plus_context"),
        buckets=Buckets(reduce_bucket_size=10**6, allgather_bucket_size=10**6, stage3_prefetch_bucket_size=10**6,
                        stage3_max_live_parameters=10**6, stage3_param_persistence_threshold=10**4),
        num_params=200_000, trainable_params=200_000, budget_bytes=16 << 30, usable_bytes=15 << 30, world_size=4,
        nodes=2, gpus_per_node=2, global_batch_size=16, seq_len=128, precision="bf16", hardware="a100-80gb")


def cluster_job(**over) -> Job:
    d = {"name": "it's a \"$job\"", "model": "gpt2", "task": "causal_lm", "data": {"path": "/data.jsonl"},
         "train": {"global_batch_size": 16, "max_steps": 100},
         "slurm": {"partition": "debug", "account": "launcher", "signal_delay_s": 60,
                   "additional_parameters": {"comment": "it's \"quoted\" $HOME ;&| #x"}}}
    for dotted, value in over.items():
        set_dotted(d, dotted, value)
    return from_dict(Job, d)


def _sbatch(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["sbatch", *args], capture_output=True, text=True, timeout=60, cwd=cwd)


def test_sbatch_test_only_accepts_the_derived_script(tmp_path):
    run_dir = tmp_path / WEIRD
    script = tmp_path / "job.sbatch"
    script.write_text(sbatch_text(offload_plan(), cluster_job(), run_dir=run_dir))
    text = script.read_text()
    # 100 steps x 0.5 s x 1.5 + start-up (120 s, cpu_adam's build 50 s, the first step's extra 1 s, 0.8 MB of fp32
    # weights) = 246 s = 5 min; 2 GB x 1.25 + 2 x 4 GB = 10.5 GB = 9.8 GiB; 2 ranks x the a100-80gb profile's 8 CPUs
    assert "#SBATCH --time=5\n" in text and "#SBATCH --mem=10G\n" in text and "#SBATCH --cpus-per-task=16\n" in text
    out = _sbatch("--test-only", str(script), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    started = r"Job \d+ to start at .* using 32 processors on nodes .* in partition debug"
    assert re.search(started, out.stderr), out.stderr


def test_sbatch_test_only_refuses_what_the_node_cannot_give(tmp_path):
    """The consumer check can fail: the derived --mem of a 116 GB offload plan is more than a dev node has."""
    plan = offload_plan()
    plan = dataclasses.replace(plan, estimate=dataclasses.replace(plan.estimate, host_bytes_per_node=116 * 10**9))
    script = tmp_path / "job.sbatch"
    script.write_text(sbatch_text(plan, cluster_job(), run_dir=tmp_path / "run"))
    out = _sbatch("--test-only", str(script), cwd=tmp_path)
    assert out.returncode != 0 and "node configuration is not available" in out.stderr, out.stderr


def test_weird_values_reach_slurm_and_the_script_intact(tmp_path):
    run_dir = tmp_path / WEIRD
    run_dir.mkdir(parents=True)  # as the script's header says: Slurm opens --output before the script runs
    # The setup line (raw shell, by design) ends the job after the run files are written, before srun.
    job = cluster_job(**{"slurm.setup": ['echo "RUN_DIR=$RUN_DIR"; exit 0']})
    script = tmp_path / "job.sbatch"
    script.write_text(sbatch_text(offload_plan(), job, run_dir=run_dir))
    out = _sbatch("--parsable", str(script), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    job_id = out.stdout.strip().split(";")[0]
    show = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True, timeout=30).stdout
    assert "Comment=it's \"quoted\" $HOME ;&| #x" in show, show
    assert "TimeLimit=00:05:00" in show and "MinMemoryNode=10G" in show and "CPUs/Task=16" in show, show
    log = run_dir / f"slurm-{job_id}.out"  # '%' in the path came through as itself, not as a pattern
    deadline = time.monotonic() + DEADLINE_S
    while not (log.is_file() and "RUN_DIR=" in log.read_text()):
        assert time.monotonic() < deadline, f"no {log} after {DEADLINE_S}s; run dir holds {list(run_dir.iterdir())}"
        time.sleep(0.5)
    assert log.read_text().strip().splitlines()[-1] == f"RUN_DIR={run_dir}"
    assert (run_dir / "job.yaml").is_file() and (run_dir / "plan.json").is_file()


def test_the_plain_script_runs_through_srun_to_its_verdict(tmp_path):
    """Issue 36 section 3: the script `launch plan --sbatch --out` writes, submitted as is with sbatch from another
    directory, starts the ranks through srun with the interpreter it was planned with and ends in the verdict."""
    job = tmp_path / "job.yaml"
    job.write_text(json.dumps({
        "name": "plain-sbatch", "task": "causal_lm", "gpus": 2, "budget": "1GB",
        "model": {"family": "gpt2", "hidden_size": 64, "num_layers": 2, "num_heads": 4, "vocab_size": 1024,
                  "max_position_embeddings": 256},
        "data": {"path": str(REPO / "examples" / "data" / "causal.jsonl"), "max_seq_len": 64},
        "train": {"global_batch_size": 8, "precision": "fp32", "lr": 1e-3, "max_steps": 3},
        "strategy": {"engine": "fsdp"}, "cluster": {"hardware": "cpu"},
        # Pinned: on a loaded 2-core machine the derived 3 minutes could end in USR2's requeue before 3 steps.
        "slurm": {"partition": "debug", "timeout_min": 15, "signal_delay_s": 60}}))
    run_dir, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "tmp").mkdir()  # the job's TMPDIR (sbatch exports this environment): torchrun's agent once left
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TMPDIR": str(tmp_path / "tmp")}  # a torchelastic_* dir there
    env.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".cache" / "torch_extensions"))
    plan = subprocess.run([sys.executable, "-m", "launcher", "plan", str(job), "--sbatch", "--out", "run"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    assert plan.returncode == 0, plan.stderr
    assert "plan for plain-sbatch" in plan.stdout and "slurm allocation per node:" in plan.stdout, plan.stdout
    text = (run_dir / "job.sbatch").read_text()
    assert f"RUN_DIR={run_dir}\n" in text, text[:3000]
    assert f"PYTHON={sys.executable}\n" in text and "#SBATCH --gpus-per-node" not in text
    out = subprocess.run(["sbatch", "--parsable", str(run_dir / "job.sbatch")], capture_output=True, text=True,
                         timeout=60, cwd=elsewhere, env=env)
    assert out.returncode == 0, out.stderr
    job_id = out.stdout.strip().split(";")[0]
    deadline, state = time.monotonic() + RUN_DEADLINE_S, ""
    while state in ("", "PENDING", "RUNNING", "COMPLETING", "CONFIGURING"):
        if time.monotonic() > deadline:
            subprocess.run(["scancel", job_id], timeout=30)
            raise AssertionError(f"job {job_id} still {state!r} after {RUN_DEADLINE_S}s; log: {_log(run_dir, job_id)}")
        time.sleep(2)
        state = _sacct_state(job_id)
    assert state == "COMPLETED", f"job {job_id}: {state}; log: {_log(run_dir, job_id)}"
    report = read_report(run_dir)
    assert report is not None and report.verdict == "within_budget" and report.within_budget, _log(run_dir, job_id)
    assert sorted(r.rank for r in report.ranks) == [0, 1] and report.world_size == 2
    steps = [json.loads(ln)["step"] for ln in (run_dir / "steps" / "rank-0.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]
    assert json.loads((run_dir / "state.json").read_text())["state"] == "completed"
    log = _log(run_dir, job_id)
    assert "within budget" in log and not list(elsewhere.iterdir())  # nothing written where sbatch ran
    assert not list(run_dir.glob(".torchelastic.*")), "torchrun's error-file dir is removed when srun returns"
    left = own_leftovers(tmp_path / "tmp")
    assert not left, f"the job leaves nothing of its own in TMPDIR: {left}"


def _log(run_dir: Path, job_id: str) -> str:
    p = run_dir / f"slurm-{job_id}.out"
    return p.read_text()[-3000:] if p.is_file() else f"(no {p})"
