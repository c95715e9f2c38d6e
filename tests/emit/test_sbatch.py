"""The plain sbatch script: golden files, shell syntax, quoting of weird paths, and a run with fake srun/scontrol."""

from __future__ import annotations

import dataclasses
import json
import os
import stat
import subprocess
from pathlib import Path

import pytest
import yaml
from emit_helpers import check_golden, make_job, make_plan

from launcher.emit import sbatch
from launcher.errors import ConfigError
from launcher.files.rundir import MARKER, is_marked
from launcher.processes.rankenv import plan_digest

PYTHON = "/opt/venv/bin/python"
OPS_DIR = "/opt/launcher/.cache/torch_extensions"


def sbatch_text(plan, job, run_dir, **kw):
    """The emitter with a fixed interpreter and ops dir, so the goldens do not depend on this checkout."""
    return sbatch.sbatch_text(plan, job, run_dir, **{"python": PYTHON, "ops_dir": OPS_DIR, **kw})

# Like submitit's weird_tmp_path: every character that breaks naive shell quoting.
WEIRD = "my runs/it's \"quoted\" $HOME `id` ;&|"


def slurm_job(**over):
    base = {"name": "emit", "slurm.partition": "gpu", "slurm.account": "proj", "slurm.qos": "high",
            "slurm.timeout_min": 120, "slurm.mem_gb": 64, "slurm.constraint": "a100", "slurm.exclusive": True,
            "slurm.signal_delay_s": 120, "slurm.max_requeues": 2,
            "slurm.setup": ["module load cuda/12.4", "source $HOME/venv/bin/activate"],
            "slurm.additional_parameters": {"mail_type": "END", "comment": "launcher golden"}}
    base.update(over)
    return make_job(**base)


def fsdp_plan(nodes=2, world_size=16):
    return make_plan(engine="fsdp", world_size=world_size, nodes=nodes)


@pytest.fixture
def weird_tmp_path(tmp_path) -> Path:
    p = tmp_path / WEIRD
    p.mkdir(parents=True)
    return p


def bash_n(text: str, tmp_path: Path) -> None:
    script = tmp_path / "check.sbatch"
    script.write_text(text)
    out = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_golden_two_nodes_fsdp(tmp_path):
    text = sbatch_text(fsdp_plan(), slurm_job(), run_dir=Path("/scratch/runs/emit"))
    bash_n(text, tmp_path)
    check_golden("sbatch/fsdp_two_nodes.sbatch", text)


def test_golden_weird_path_and_name(tmp_path):
    job = slurm_job(name="it's a \"$job\" `x`", **{"slurm.setup": []})
    text = sbatch_text(fsdp_plan(nodes=1, world_size=2), job, run_dir=Path("/scratch") / WEIRD)
    bash_n(text, tmp_path)
    check_golden("sbatch/weird_path.sbatch", text)
    assert "#SBATCH --job-name=it-s-a-job-x" in text  # sanitized, so #SBATCH parsing cannot break
    assert "RUN_DIR='/scratch/my runs/it'\"'\"'s \"quoted\" $HOME `id` ;&|'" in text


def test_directives_and_srun_line():
    text = sbatch_text(fsdp_plan(), slurm_job(), run_dir=Path("/r"))
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=8",
                 "#SBATCH --cpus-per-task=64", "#SBATCH --time=120", "#SBATCH --mem=64GB", "#SBATCH --partition=gpu",
                 "#SBATCH --exclusive", "#SBATCH --signal=B:USR2@120", "#SBATCH --requeue",
                 "#SBATCH --mail-type=END", "#SBATCH --comment='launcher golden'", "MAX_REQUEUES=2",
                 "module load cuda/12.4", "source $HOME/venv/bin/activate"):
        assert line in text, line
    assert '"$PYTHON" -m torch.distributed.run --nnodes=2' in text and "--nproc-per-node=8" in text
    assert f"PYTHON={PYTHON}\n" in text and f"export TORCH_EXTENSIONS_DIR={OPS_DIR}" in text
    assert '--rdzv-endpoint="$head_addr:$port"' in text and '-m launcher.worker.rank_entry "$RUN_DIR"' in text
    assert 'hosts=$(scontrol show hostnames "$SLURM_JOB_NODELIST")' in text


def test_deepspeed_plan_carries_its_ds_config(tmp_path):
    text = sbatch_text(make_plan(zero_stage=2), slurm_job(), run_dir=Path("/r"))
    bash_n(text, tmp_path)
    assert "write_file ds_config.json <<'LAUNCHER_FILE_EOF'" in text
    assert 'export LAUNCHER_DS_CONFIG="$RUN_DIR/ds_config.json"' in text


def test_unknown_additional_key_is_refused(monkeypatch):
    from launcher.emit import slurm_params

    monkeypatch.setattr(slurm_params, "sbatch_long_options", lambda: frozenset({"reservation"}))
    with pytest.raises(ConfigError, match="slurm.additional_parameters.reservaton: unknown key.*did you mean"):
        sbatch_text(fsdp_plan(), slurm_job(**{"slurm.additional_parameters": {"reservaton": "x"}}), run_dir=Path("/r"))


def _fake_bin(tmp_path: Path, rank_status: str) -> Path:
    """srun, scontrol and python stand-ins: record argv, and play the ranks by writing rank-0.json."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.jsonl"
    scripts = {
        "scontrol": f"""#!/usr/bin/env python3
import json, sys
open({str(log)!r}, "a").write(json.dumps(["scontrol"] + sys.argv[1:]) + "\\n")
if sys.argv[1:3] == ["show", "hostnames"]:
    print("node7\\nnode8")
elif sys.argv[1:3] == ["show", "node"]:
    print("NodeName=node7 Arch=x86_64 NodeAddr=10.0.0.7 NodeHostName=n7 State=IDLE")
""",
        "srun": f"""#!/usr/bin/env python3
import json, os, sys
open({str(log)!r}, "a").write(json.dumps(["srun"] + sys.argv[1:]) + "\\n")
open({str(log)!r}, "a").write(json.dumps(["env", os.environ.get("LAUNCHER_PLAN_SHA256")]) + "\\n")
run_dir = sys.argv[-1]
os.makedirs(os.path.join(run_dir, "ranks"), exist_ok=True)
log_dir = next(a.split("=", 1)[1] for a in sys.argv if a.startswith("--log-dir="))  # torchrun's agent makes it
os.makedirs(os.path.join(log_dir, "run_x", "attempt_0", "0"))
json.dump({{"rank": 0, "status": {rank_status!r}}}, open(os.path.join(run_dir, "ranks", "rank-0.json"), "w"),
          indent=2)
""",
    }
    scripts["python"] = f"""#!/usr/bin/env python3
import json, sys
open({str(log)!r}, "a").write(json.dumps(["python"] + sys.argv[1:]) + "\\n")
"""
    for name, body in scripts.items():
        p = bin_dir / name
        p.write_text(body)
        p.chmod(p.stat().st_mode | stat.S_IXUSR)
    return bin_dir


@pytest.mark.parametrize("rank_status,requeued", [("completed", False), ("checkpointed", True)])
def test_script_runs_with_a_weird_run_dir(tmp_path, weird_tmp_path, rank_status, requeued):
    run_dir = weird_tmp_path / "run $1"
    run_dir.mkdir()
    job = slurm_job(name="weird $name", **{"slurm.setup": ['echo "setup ran" > "$RUN_DIR/setup.txt"']})
    script = tmp_path / "job.sbatch"
    bin_dir = _fake_bin(tmp_path, rank_status)
    script.write_text(sbatch_text(fsdp_plan(), job, run_dir=run_dir, python=str(bin_dir / "python")))
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_NODELIST": "node[7-8]",
           "SLURM_JOB_ID": "20042", "SLURM_RESTART_COUNT": "0"}
    out = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    calls = [json.loads(ln) for ln in (tmp_path / "calls.jsonl").read_text().splitlines()]
    srun = next(c for c in calls if c[0] == "srun")
    assert srun[-1] == str(run_dir)  # the path reached the ranks intact
    assert "--rdzv-endpoint=10.0.0.7:20042" in srun and "--rdzv-id=20042-0" in srun
    # torchrun's agents keep their error files in the run dir, removed when srun returns (not in each node's /tmp).
    assert f"--log-dir={run_dir}/.torchelastic.20042.launcher-tmp" in srun
    assert not (run_dir / ".torchelastic.20042.launcher-tmp").exists()
    assert (["scontrol", "requeue", "20042"] in calls) is requeued
    # The interpreter it was written with runs the ranks, and, unless the job requeued, the verdict.
    assert srun[srun.index("--kill-on-bad-exit=1") + 1:][:3] == [str(bin_dir / "python"), "-m", "torch.distributed.run"]
    assert (["python", "-m", "launcher.cli.finish", str(run_dir), "0"] in calls) is not requeued
    assert yaml.safe_load((run_dir / "job.yaml").read_text())["name"] == "weird $name"
    assert json.loads((run_dir / "plan.json").read_text())["world_size"] == 16
    # The ranks get the digest of the plan.json this script wrote, and check it (launcher.runtime.load_plan).
    assert ["env", plan_digest((run_dir / "plan.json").read_bytes())] in calls
    assert (run_dir / "setup.txt").read_text() == "setup ran\n"
    assert not (run_dir / "control" / "checkpoint").exists()


def test_script_writes_only_into_a_run_dir_launch_made_or_a_new_one(tmp_path):
    # A colleague's dir given as the run dir: the script stops before writing anything (Slurm's own output file is
    # all it may find in a new dir, and that is kept); a new dir gets the marker, so status/--resume know it.
    bin_dir = _fake_bin(tmp_path, "completed")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_NODELIST": "node[7-8]",
           "SLURM_JOB_ID": "20042", "SLURM_RESTART_COUNT": "0"}
    theirs, new = tmp_path / "theirs", tmp_path / "new"
    for d in (theirs, new):
        d.mkdir()
        (d / "slurm-20042.out").write_text("")
    (theirs / "notes.txt").write_text("mine")
    for d in (theirs, new):
        script = tmp_path / f"{d.name}.sbatch"
        job = slurm_job(**{"slurm.setup": []})
        script.write_text(sbatch_text(fsdp_plan(), job, run_dir=d, python=str(bin_dir / "python")))
        out = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)
        if d is theirs:
            assert out.returncode == 2 and "holds notes.txt and was not made by launch" in out.stderr
            assert sorted(p.name for p in theirs.iterdir()) == ["notes.txt", "slurm-20042.out"]
        else:
            assert out.returncode == 0, out.stderr
            assert json.loads((new / MARKER).read_text())["made_by"] == "sbatch job 20042"
            assert is_marked(new) and (new / "plan.json").is_file()


def offload_plan(**estimate):
    """ZeRO-3 with the optimizer on the CPUs of 2 GPU nodes x 8: a 116 GB host need per node, 2.0 s a step."""
    plan = make_plan(zero_stage=3, offload_optimizer="cpu", world_size=16, nodes=2)
    values = {"host_bytes_per_node": 116 * 10**9, "step_time_s": 2.0, "basis": "cuda_reserved_plus_context",
              **estimate}
    return dataclasses.replace(plan, estimate=dataclasses.replace(plan.estimate, **values))


def unpinned_job(**over):
    """The golden job without the three values the plan can derive."""
    return slurm_job(**{"slurm.timeout_min": None, "slurm.mem_gb": None, "train.max_steps": 8000, **over})


def test_golden_offload_plan_derives_time_mem_and_cpus(tmp_path):
    text = sbatch_text(offload_plan(), unpinned_job(), run_dir=Path("/scratch/runs/emit"))
    bash_n(text, tmp_path)
    check_golden("sbatch/offload_derived.sbatch", text)
    # 8000 steps x 2.0 s = 16000 s x 1.5 + start-up: 120 s + cpu_adam's build 50 s + the first step's 2 x 2.0 s
    # (an inline model reads no weights) = 24174 s = 403 min
    assert "#SBATCH --time=403" in text
    # 116 GB x 1.25 + 8 ranks x 4 GB = 177 GB = 164.8 GiB, rounded up
    assert "#SBATCH --mem=165G" in text
    # The a100-80gb profile's 8 CPUs for each of the node's 8 ranks, and the ranks use them (CPU Adam's threads)
    assert "#SBATCH --cpus-per-task=64" in text and 'OMP_NUM_THREADS="${OMP_NUM_THREADS:-8}"' in text
    # The header says how: the steps, the start-up's parts, the profile
    assert "DeepSpeed's cpu_adam to build 50 s" in text and "from the a100-80gb profile: 8 CPU(s) per rank" in text
    # cpu_adam is built on every node before the ranks start
    assert 'srun --ntasks-per-node=1 $SRUN_CPUS "$PYTHON" -m launcher.processes.ops cpu_adam\n' in text


def test_pinned_values_win_over_the_plan():
    job = unpinned_job(**{"slurm.timeout_min": 30, "slurm.mem_gb": 64, "slurm.cpus_per_task": 6})
    text = sbatch_text(offload_plan(), job, run_dir=Path("/r"))
    assert "#SBATCH --time=30\n" in text and "#SBATCH --mem=64GB\n" in text and "#SBATCH --cpus-per-task=6\n" in text
    assert "from the plan" not in text and "#   --time=30           slurm.timeout_min\n" in text


def test_memory_per_cpu_leaves_mem_unset():
    # sbatch refuses --mem beside --mem-per-cpu (and --cpus-per-task beside --cpus-per-gpu)
    job = unpinned_job(**{"slurm.additional_parameters": {"mem_per_cpu": "4G", "cpus_per_gpu": 2}})
    text = sbatch_text(offload_plan(), job, run_dir=Path("/r"))
    assert "#SBATCH --mem=" not in text and "#SBATCH --mem-per-cpu=4G" in text
    assert "#SBATCH --cpus-per-task" not in text and "#SBATCH --cpus-per-gpu=2" in text


def test_percent_in_the_run_dir_is_not_a_slurm_pattern(tmp_path):
    text = sbatch_text(fsdp_plan(), slurm_job(), run_dir=Path("/scratch/100%done"))
    assert "#SBATCH --output=/scratch/100%%done/slurm-%j.out" in text
    assert "RUN_DIR=/scratch/100%done\n" in text


def test_a_newline_in_the_run_dir_is_refused():
    with pytest.raises(ConfigError, match=r"run dir: '/scratch/a\\n#SBATCH --wrap=id' holds a newline"):
        sbatch_text(fsdp_plan(), slurm_job(), run_dir=Path("/scratch/a\n#SBATCH --wrap=id"))


@pytest.mark.parametrize("field,value", [
    ("slurm.partition", "gpu\nid"), ("slurm.account", "proj\rid"), ("slurm.qos", "high\x00"),
    ("slurm.constraint", "a100\nid"), ("name", "emit\n#SBATCH --wrap=id"),
    ("slurm.additional_parameters", {"comment": "x\nid"}), ("slurm.additional_parameters", {"x\n#SBATCH --wrap": "id"}),
])
def test_the_emitter_refuses_control_characters_even_without_the_loader(field, value):
    """make_job skips the job-file rules; the emitter checks again, so no caller can write an injected line."""
    with pytest.raises(ConfigError, match="holds a"):
        sbatch_text(fsdp_plan(), slurm_job(**{field: value}), run_dir=Path("/r"))
