"""The emitted sbatch script read by its real consumer: sbatch and slurmd of the dev cluster (slurm/dev-cluster).

`sbatch --test-only` parses every #SBATCH line and asks the scheduler whether the allocation could be given, so
a directive sbatch does not know, a bad --time or --mem, or a quoting sbatch reads differently from us fails here.
One script is also run for real (its setup line ends it before srun) to see that a run dir with spaces, quotes,
'#' and '%' reaches Slurm's --output and the script's RUN_DIR intact.
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
import time
from pathlib import Path

import pytest

from launcher.config.job import Job
from launcher.config.jobfile import set_dotted
from launcher.config.load import from_dict
from launcher.emit.sbatch import sbatch_text
from launcher.planner.plan import Buckets, Estimate, Plan, Strategy
from tests.conftest import require_cluster
from tests.slurm_cluster.test_slurm_dev_cluster import CLUSTER_UP, DEADLINE_S

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
        estimate=Estimate(breakdown={"params": 1}, peak_bytes=1 << 30, host_bytes_per_node=2 * 10**9, nvme_bytes_per_node=0,
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
    # 100 steps x 0.5 s x 1.5 + 600 s = 675 s = 12 min; 2 GB x 1.25 + 2 x 4 GB = 10.5 GB = 9.8 GiB; 2 ranks x 4 CPUs
    assert "#SBATCH --time=12\n" in text and "#SBATCH --mem=10G\n" in text and "#SBATCH --cpus-per-task=8\n" in text
    out = _sbatch("--test-only", str(script), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert re.search(r"Job \d+ to start at .* using 16 processors on nodes .* in partition debug", out.stderr), out.stderr


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
    assert "TimeLimit=00:12:00" in show and "MinMemoryNode=10G" in show and "CPUs/Task=8" in show, show
    log = run_dir / f"slurm-{job_id}.out"  # '%' in the path came through as itself, not as a pattern
    deadline = time.monotonic() + DEADLINE_S
    while not (log.is_file() and "RUN_DIR=" in log.read_text()):
        assert time.monotonic() < deadline, f"no {log} after {DEADLINE_S}s; run dir holds {list(run_dir.iterdir())}"
        time.sleep(0.5)
    assert log.read_text().strip().splitlines()[-1] == f"RUN_DIR={run_dir}"
    assert (run_dir / "job.yaml").is_file() and (run_dir / "plan.json").is_file()
