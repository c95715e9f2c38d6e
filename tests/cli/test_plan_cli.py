import json
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.cli.main import main
from launcher.engines import NAMES
from tests.conftest import REPO


def run_cli(capsys, *argv):
    """The CLI's exit code, stdout and stderr; argparse's own errors exit through SystemExit."""
    try:
        code = main([str(a) for a in argv])
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def test_plan_prints_choice_breakdown_and_alternatives(capsys, write_job):
    code, out, err = run_cli(capsys, "plan", "--gpus", "2", "--budget", "1GB", write_job())
    assert code == 0, err
    assert "predicted peak per rank, by category" in out
    assert "why this plan:" in out and "alternatives not chosen:" in out
    assert "budget 1.00 GB per GPU" in out


def test_plan_states_its_basis_and_itemises_the_cuda_terms(capsys, write_job):
    job = write_job()
    # 4 GB: on a GPU about 1.6 GB lie outside the allocator before any tensor (the first GPU check's terms).
    code, out, err = run_cli(capsys, "plan", "--gpus", "2", "--budget", "4GB", "--hardware", "h100-80gb", job)
    assert code == 0, err
    assert "the peak counts the allocator's reserved memory plus what lies outside it (the CUDA context" in out
    assert "= cublas workspace 67.11 MB, allocator reserve" in out
    assert "cuda context 629.15 MB, cuda kernels 155.19 MB, nccl communicators " in out and "nccl buffers" in out
    code, out, _ = run_cli(capsys, "plan", "--gpus", "2", "--budget", "4GB", "--hardware", "h100-80gb", "--json", job)
    plan = json.loads(out)
    assert plan["basis"] == "cuda_reserved_plus_context"
    assert sum(plan["overhead"].values()) == plan["breakdown"]["reserve"]
    code, out, _ = run_cli(capsys, "plan", "--gpus", "2", "--budget", "1GB", "--hardware", "cpu", job)
    assert "the peak counts tensor bytes (CPU ranks" in out and "cublas" not in out


def test_plan_json_has_the_contract_keys(capsys, write_job):
    code, out, _ = run_cli(capsys, "plan", "--gpus", "2", "--budget", "1GB", "--json", write_job())
    assert code == 0
    plan = json.loads(out)
    for key in ("engine", "zero_stage", "fsdp_reshard_after_forward", "offload_optimizer", "offload_params",
                "micro_batch_size", "grad_accum_steps", "activation_checkpointing", "num_params", "budget_bytes",
                "predicted_peak_bytes", "breakdown", "host_bytes_per_node"):
        assert key in plan
    assert plan["engine"] in NAMES
    assert plan["budget_bytes"] == 10**9
    assert plan["micro_batch_size"] * plan["grad_accum_steps"] * 2 == 8
    assert sum(plan["breakdown"].values()) == plan["predicted_peak_bytes"]


@pytest.mark.parametrize("engine,pins,written", [
    ("deepspeed", {"engine": "deepspeed", "zero_stage": 2},
     {"plan.json", "ds_config.json", "ds_config.hf.json", "accelerate.yaml", "job.yaml"}),
    ("fsdp", {"engine": "fsdp"}, {"plan.json", "fsdp.yaml", "accelerate.yaml", "job.yaml"}),
])
def test_plan_out_writes_the_exports(capsys, write_job, tmp_path, engine, pins, written):
    import yaml

    from launcher.config.jobfile import load_job

    out_dir = tmp_path / "out"
    code, out, err = run_cli(capsys, "plan", "--out", out_dir, write_job(**{"strategy": pins}), "train.lr=3e-4")
    assert code == 0, err
    assert {p.name for p in out_dir.iterdir()} == written | {".launcher-run", ".lock"}  # the marker, the lock
    assert json.loads((out_dir / "plan.json").read_text())["engine"] == engine
    # job.yaml is the resolved job: overrides applied, paths absolute, loadable as it is from anywhere.
    job = load_job(out_dir / "job.yaml")
    assert job.train.lr == 3e-4 and job.data.path.startswith("/")
    assert yaml.safe_load((out_dir / "job.yaml").read_text())["data"]["path"] == job.data.path
    acc = yaml.safe_load((out_dir / "accelerate.yaml").read_text())
    assert acc["distributed_type"] == {"deepspeed": "DEEPSPEED", "fsdp": "FSDP"}[engine]
    if engine == "deepspeed":
        assert acc["deepspeed_config"]["deepspeed_config_file"] == str((out_dir / "ds_config.json").resolve())


def test_cli_flags_override_the_file(capsys, write_job):
    code, out, _ = run_cli(capsys, "plan", "--gpus", "4", "--seq-len", "32", "--global-batch", "16", "--json",
                           write_job())
    plan = json.loads(out)
    assert (plan["world_size"], plan["seq_len"], plan["global_batch_size"]) == (4, 32, 16)


@pytest.mark.parametrize("flag", ["--nodes", "--nnodes"])
def test_nodes_flag_plans_across_nodes(capsys, write_job, flag):
    code, out, err = run_cli(capsys, "plan", "--gpus", "2", flag, "2", "--global-batch", "16", "--json",
                             "--hardware", "a100-80gb", "--budget", "40GB", write_job(model="llama-1b"))
    assert code == 0, err
    plan = json.loads(out)
    assert (plan["nodes"], plan["gpus_per_node"], plan["world_size"]) == (2, 2, 4)
    assert plan["micro_batch_size"] * plan["grad_accum_steps"] * 4 == 16
    # Two nodes open the hybrid FSDP candidate; on one node it is never offered.
    code, out, err = run_cli(capsys, "plan", "--gpus", "2", flag, "2", "--global-batch", "16", "--json",
                             "--hardware", "a100-80gb", "--budget", "40GB", write_job(model="llama-1b",
                             **{"strategy.engine": "fsdp", "strategy.fsdp_sharding": "hybrid"}))
    assert code == 0, err
    assert json.loads(out)["fsdp_sharding"] == "hybrid"
    code, _, err = run_cli(capsys, "plan", "--gpus", "2", "--json", "--hardware", "a100-80gb", "--budget", "40GB",
                           write_job(model="llama-1b", **{"strategy.engine": "fsdp",
                                                          "strategy.fsdp_sharding": "hybrid"}))
    assert code == 2 and "fsdp_sharding" in err


@pytest.mark.parametrize("argv_tail,over,message", [
    (["--budget", "lots"], {}, "argument --budget: 'lots' is not a size"),
    (["--gpus", "0"], {}, "argument --gpus: '0' must be greater than 0"),
    ([], {"train.global_batch": 8}, "train.global_batch: unknown key; did you mean 'global_batch_size'?"),
    ([], {"train.precision": 16}, "train.precision: 16 is not one of 'auto', 'bf16', 'fp16', 'fp32'"),
    ([], {"data.max_seq_len": -1}, "data.max_seq_len: -1 must be greater than 0"),
    (["--gpus", "3"], {}, "train.global_batch_size: 8 is not divisible by 3 GPUs"),
    (["--budget", "1MB"], {}, "budget: 1.00 MB is below 16 MB"),
    (["--budget", "20MB"], {"model": "llama-7b"}, "no plan fits 20.00 MB per GPU"),
    (["--budget", "900TB"], {}, "budget: 900.00 TB per GPU is absurd"),
    (["--hardware", "tpu"], {}, "cluster.hardware: 'tpu' is not a known profile"),
])
def test_bad_input_exits_2_with_one_clear_line(capsys, write_job, argv_tail, over, message):
    code, out, err = run_cli(capsys, "plan", write_job(**over), *argv_tail)
    assert code == 2
    assert message in err
    assert "Traceback" not in err


def test_console_script_and_module_entry_agree(write_job):
    job = write_job()
    a = subprocess.run([str(REPO / ".venv" / "bin" / "launch"), "plan", "--json", str(job)], capture_output=True,
                       text=True)
    b = subprocess.run([sys.executable, "-m", "launcher", "plan", "--json", str(job)], capture_output=True, text=True)
    assert a.returncode == b.returncode == 0, a.stderr + b.stderr
    assert json.loads(a.stdout) == json.loads(b.stdout)


def test_help_explains_gb_and_gib():
    out = subprocess.run([sys.executable, "-m", "launcher", "--help"], capture_output=True, text=True).stdout
    assert "GB is 1e9 bytes, GiB is 2^30 bytes" in out
    assert "Exit codes: 0" in out


def test_a_slurm_plan_says_which_allocation_values_it_derived(capsys, write_job):
    """--time, --mem and --cpus-per-task from the plan, and the sbatch script asks for exactly those."""
    import math

    job = write_job(launcher="slurm", **{"train.max_steps": 4000, "strategy.engine": "deepspeed",
                                         "strategy.zero_stage": 2, "strategy.offload_optimizer": "cpu",
                                         "slurm.cpus_per_task": None})
    args = ("plan", "--gpus", "2", "--budget", "4GB", "--hardware", "h100-80gb", job)
    code, out, err = run_cli(capsys, *args, "--json")
    assert code == 0, err
    plan = json.loads(out)
    slurm = plan["slurm"]
    assert slurm["derived"] == ["--time", "--mem", "--cpus-per-task"]
    step = plan["predicted_step_time_s"]
    startup = slurm["startup"]
    # The start-up: 120 s, the weights read (none: an inline model), cpu_adam's build where this machine lacks it,
    # the first step's extra; the DeepSpeed ops dir this test sees decides the build.
    from launcher.processes.ops import built

    assert slurm["facts"]["ops_to_build"] == ([] if built("cpu_adam") else ["cpu_adam"])
    assert startup == {"base_s": 120.0, "load_s": 0.0, "build_s": 0.0 if built("cpu_adam") else 50.0,
                       "first_step_s": pytest.approx(2 * step)}
    assert slurm["time_min"] == math.ceil((step * 4000 * 1.5 + slurm["startup_s"]) / 60)
    assert slurm["mem_bytes"] == math.ceil((plan["host_bytes_per_node"] * 1.25 + 2 * 4e9) / 2**30) * 2**30
    assert slurm["cpus_per_task"] == 16 and slurm["threads_per_rank"] == 8 and slurm["gpus_per_node"] == 2
    code, out, _ = run_cli(capsys, *args)
    assert "slurm allocation per node:" in out
    assert f"--time={slurm['time_min']}" in out and "(4000 x " in out and "train.max_steps) x 1.5 + " in out
    assert "--cpus-per-task=16" in out and "from the h100-80gb profile: 8 CPU(s) per rank" in out
    code, out, _ = run_cli(capsys, *args, "--sbatch")
    for line in (f"#SBATCH --time={slurm['time_min']}\n", f"#SBATCH --mem={slurm['mem_bytes'] // 2**30}G\n",
                 "#SBATCH --cpus-per-task=16\n", 'OMP_NUM_THREADS="${OMP_NUM_THREADS:-8}"',
                 "#SBATCH --gpus-per-node=2\n"):
        assert line in out, line
    # A value the job pins is kept and not called derived.
    code, out, _ = run_cli(capsys, *args[:-1], write_job(launcher="slurm", **{"slurm.timeout_min": 45}), "--json")
    assert json.loads(out)["slurm"]["time_source"] == "job" and json.loads(out)["slurm"]["time_min"] == 45


def test_a_local_plan_json_has_no_slurm_section(capsys, write_job):
    code, out, _ = run_cli(capsys, "plan", "--gpus", "2", "--budget", "1GB", "--json", write_job())
    assert code == 0 and "slurm" not in json.loads(out)


def test_plan_help_lists_every_hardware_profile(capsys):
    from launcher.planner.hardware import PROFILES

    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps the help at any space
    assert len(PROFILES) == 13
    assert all(name in text for name in PROFILES), [n for n in PROFILES if n not in text]


def test_plan_prints_the_predicted_total_time_and_warns_past_the_threshold(capsys, write_job):
    job = write_job(**{"train.max_steps": 100_000, "train.warn_total_time_h": 0.01})
    code, out, err = run_cli(capsys, "plan", job)
    assert code == 0, err
    line = next(ln for ln in out.splitlines() if ln.startswith("  total time"))
    step_s = float(line.split("(")[1].split(" s/step")[0])
    assert "x 100000 steps, train.max_steps" in line
    assert "WARNING: the predicted training time" in out and "train.warn_total_time_h (0.01 h)" in out
    code, out, err = run_cli(capsys, "plan", "--json", job)
    total = json.loads(out)["total_time"]
    assert total["too_long"] and total["predicted_total_s"] == pytest.approx(step_s * 100_000, rel=1e-2)
    assert "launch: warning: the predicted training time" in err
    # No warning under the default 72 h; epochs count the data's training examples (64 rows less 6 held out).
    code, out, _ = run_cli(capsys, "plan", write_job(**{"train.max_steps": None, "train.epochs": 2}))
    assert "train.epochs 2 x 7 steps (58 training examples)" in out and "WARNING" not in out
    # Packed, the epoch is counted in the packed sequences the data check found (it was "not predicted").
    code, out, _ = run_cli(capsys, "plan", write_job(**{"train.max_steps": None, "train.epochs": 2,
                                                         "data.packing": True}))
    assert "train.epochs 2 x 7 steps (57 training examples)" in out and "57 packed sequence(s)" in out


def test_alternatives_are_worded_from_their_numbers(capsys, write_job):
    from launcher.cli.render import rejected_reason
    from launcher.config.jobfile import load_job
    from launcher.inputs.plan_inputs import plan_job
    from launcher.planner.plan import Rejected

    plan = plan_job(load_job(write_job()))
    over = Rejected(label="x", why="device", peak_bytes=3 * 10**9, step_time_s=plan.estimate.step_time_s / 2,
                    need_bytes=3 * 10**9, have_bytes=2 * 10**9, largest="activations")
    assert rejected_reason(over, plan) == (f"over budget by 1.00 GB (peak 3.00 GB of 2.00 GB usable, largest: "
                                           f"activations); would step at {over.step_time_s:.3g} s/step (-50%)")
    slow = Rejected(label="y", why="slower", peak_bytes=1, step_time_s=plan.estimate.step_time_s * 1.25)
    assert rejected_reason(slow, plan).startswith("fits but slower: ") and "(+25%)" in rejected_reason(slow, plan)


def test_a_forced_plan_says_what_it_overruns_first_and_keeps_the_numbers(capsys, write_job):
    """The planner returns the forced plan's overrun typed (plan.json's "problem"); its sentence is the first
    reason, worded outside the planner (launcher.planner.plan_words), in the text plan and in plan.json alike."""
    from launcher.units import format_bytes

    pins = {"engine": "deepspeed", "zero_stage": 0, "offload_optimizer": "none", "offload_params": "none",
            "micro_batch_size": 4, "activation_checkpointing": False}
    job = write_job(**{"strategy": pins, "model.hidden_size": 128, "model.vocab_size": 2048})
    code, out, err = run_cli(capsys, "plan", "--budget", "16MB", "--force", "--json", job)
    assert code == 0, err
    plan = json.loads(out)
    p = plan["problem"]
    assert plan["status"] == "forced" and p["resource"] == "device" and p["have_bytes"] == plan["usable_bytes"]
    assert p["need_bytes"] == plan["predicted_peak_bytes"] and p["largest"] in plan["breakdown"]
    first = (f"forced: every strategy field is pinned and the prediction is over budget by "
             f"{format_bytes(p['need_bytes'] - p['have_bytes'])} (peak {format_bytes(p['need_bytes'])}, largest: "
             f"{p['largest']})")
    assert plan["reasons"][0] == first
    code, out, err = run_cli(capsys, "plan", "--budget", "16MB", "--force", job)
    assert code == 0 and f"why this plan:\n  - {first}\n" in out


def test_plan_for_a_script_tries_only_the_levers_a_script_receives(capsys, write_job, tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    job = write_job()
    code, out, err = run_cli(capsys, "plan", "--gpus", "2", "--budget", "1GB", "--script", script, "--json", job)
    assert code == 0, err
    plan = json.loads(out)
    assert plan["script"] is True  # what re-plans the run (ladder, --resume, calibrate --from) reads
    why = {d["lever"]: d["why"] for d in plan["levers"]}
    assert why["activation_offload"] in ("script_lacks", "not_applicable")
    assert why["checkpoint_every"] in ("script_lacks", "not_applicable")
    assert "script_lacks" in why.values()
    assert (plan["loss_chunks"], plan["checkpoint_every"], plan["checkpoint_policy"]) == (0, 1, "full")
    code, out, err = run_cli(capsys, "plan", "--gpus", "2", "--budget", "1GB", "--script", script, job)
    assert code == 0 and "not tried: your --script does not receive it" in out
    code, out, err = run_cli(capsys, "plan", "--gpus", "2", "--budget", "1GB", "--json", job)
    assert code == 0 and "script" not in json.loads(out)  # a recipe's plan.json is as before the field
    # Refused, one line each, nothing planned: a missing script, and an sbatch that would run the recipe instead.
    code, out, err = run_cli(capsys, "plan", "--gpus", "2", "--budget", "1GB", "--script", tmp_path / "no.py", job)
    assert code == 2 and "--script: " in err and "does not exist" in err and out == ""
    code, out, err = run_cli(capsys, "plan", "--gpus", "2", "--budget", "1GB", "--script", script, "--sbatch", job)
    assert code == 2 and "--sbatch writes a script that runs the launcher's recipe" in err and out == ""


def test_an_epoch_job_asks_slurm_for_the_time_its_plan_predicts(capsys, write_job):
    """Issue 35 section 3: a train.epochs job got --time=60 beside a plan predicting days; now the counted steps."""
    import math

    job = write_job(launcher="slurm", **{"train.max_steps": None, "train.epochs": 200, "cluster.hardware": "cpu"})
    code, out, err = run_cli(capsys, "plan", job, "--json")
    assert code == 0, err
    plan = json.loads(out)
    slurm, total = plan["slurm"], plan["total_time"]
    assert slurm["facts"]["train_steps"] == total["total_steps"] and "train.epochs 200" in total["basis"]
    assert slurm["time_min"] == math.ceil((total["predicted_total_s"] * 1.5 + slurm["startup_s"]) / 60) != 60
    code, out, err = run_cli(capsys, "plan", job, "--sbatch")
    assert code == 0 and f"#SBATCH --time={slurm['time_min']}\n" in out, err
    # With packing the steps are counted from the packed sequences the plan's data summary finds: still no 60.
    packed = write_job(name="packed.yaml", launcher="slurm", **{"train.max_steps": None, "train.epochs": 2,
                                                                  "data.packing": True, "cluster.hardware": "cpu"})
    code, out, err = run_cli(capsys, "plan", packed, "--json")
    assert code == 0, err
    plan = json.loads(out)
    steps = plan["total_time"]["total_steps"]
    assert plan["slurm"]["facts"]["train_steps"] == steps and "train.epochs 2" in plan["total_time"]["basis"]
    assert steps == 2 * (plan["data"]["sequences"] // 8)  # global batch 8, the last partial batch dropped


def test_plan_sbatch_out_prints_the_plan_and_how_the_allocation_was_reached(capsys, write_job, tmp_path,
                                                                             monkeypatch):
    """Issue 36 section 3: `plan --sbatch --out` printed only the files it wrote; and a relative --out made a
    script that ran only from the directory it was written in."""
    monkeypatch.chdir(tmp_path)
    job = write_job(**{"cluster.hardware": "cpu", "cluster.cpus_per_node": 16})
    code, out, err = run_cli(capsys, "plan", job, "--sbatch", "--out", "exports")
    assert code == 0, err
    assert out.index("plan for t:") < out.index("slurm allocation per node:") < out.index("wrote ")
    for words in ("--time=", "s of steps (4 x", "start-up (2 min imports, rendezvous and report;",
                  "--cpus-per-task=16  from cluster.cpus_per_node, shared by the node's ranks; OMP_NUM_THREADS=8",
                  "--gpus-per-node=-   the cpu profile's ranks compute on the host", f"wrote {Path('exports')}"):
        assert words in out, words
    script = (tmp_path / "exports" / "job.sbatch").read_text()
    assert f"\nRUN_DIR={tmp_path / 'exports'}\n" in script and f"\nPYTHON={sys.executable}\n" in script
