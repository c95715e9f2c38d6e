"""The worker's entry point: exit codes and the rank report on every way out."""

import json

import pytest

from launcher.processes.rankenv import ENFORCE_ENV, EXIT_OOM, RUN_DIR_ENV
from launcher.worker.main import main
from tests.worker.run_dirs import ds_config_dict, plan_dict, tiny_gpt2_job


@pytest.fixture(autouse=True)
def _restore_env(monkeypatch):
    # main() points these at the run dir; monkeypatch puts them back afterwards.
    monkeypatch.setenv(RUN_DIR_ENV, "")
    monkeypatch.setenv("LAUNCHER_PLAN", "")


def report(run_dir):
    return json.loads((run_dir / "ranks" / "rank-0.json").read_text())


def test_usage_error():
    assert main([]) == 2


def test_missing_files_are_bad_input(tmp_path):
    assert main([str(tmp_path)]) == 2
    r = report(tmp_path)
    assert r["status"] == "failed" and "job.yaml" in r["error"]


def test_fp16_is_refused_on_cpu(make_run_dir, examples_data):
    run = make_run_dir(tiny_gpt2_job(str(examples_data / "causal.jsonl")), plan_dict(precision="fp16"))
    assert main([str(run)]) == 2
    assert "fp16" in report(run)["error"] and "bf16" in report(run)["error"]


def test_deepspeed_plan_needs_a_matching_ds_config(make_run_dir, examples_data):
    job = tiny_gpt2_job(str(examples_data / "causal.jsonl"))
    plan = plan_dict(engine="deepspeed", micro_batch_size=2)
    run = make_run_dir(job, plan, name="no_ds")
    assert main([str(run)]) == 2 and "ds_config.json" in report(run)["error"]
    other = ds_config_dict(plan_dict(engine="deepspeed", micro_batch_size=4))
    run = make_run_dir(job, plan, other, name="mismatch")
    assert main([str(run)]) == 2 and "train_micro_batch_size_per_gpu" in report(run)["error"]


def test_over_the_enforced_cap_exits_75_with_a_breakdown(make_run_dir, examples_data, single_rank, monkeypatch):
    plan = plan_dict(engine="fsdp", micro_batch_size=2, world_size=1, seq_len=32, precision="fp32")
    job = tiny_gpt2_job(str(examples_data / "causal.jsonl"), max_steps=2)
    job["data"]["max_seq_len"] = 32
    job["data"]["eval_fraction"] = 0.02
    job["train"]["global_batch_size"] = 2
    run = make_run_dir(job, plan)
    monkeypatch.setenv(ENFORCE_ENV, "1500000")  # params + grads + AdamW states of this model are ~2.2 MB
    assert main([str(run)]) == EXIT_OOM
    r = report(run)
    assert r["status"] == "oom" and r["enforce_bytes"] == 1_500_000
    assert r["oom"]["crossed_at_bytes"] > 1_500_000
    assert r["oom"]["phase"] in ("eval", "forward", "backward", "optimizer_step")
    assert sum(r["oom"]["current_by_category"].values()) == r["oom"]["current_bytes"]


def test_importing_the_worker_sets_no_environment_and_main_sets_it_first():
    """Environment is set at one seam (rank_process_env, first thing in main), never at import."""
    import subprocess
    import sys

    code = ("import os, sys\n"
            "for k in ('HF_HUB_OFFLINE', 'TRANSFORMERS_OFFLINE', 'TOKENIZERS_PARALLELISM', 'TORCH_EXTENSIONS_DIR',\n"
            "          'LAUNCHER_RUN_DIR', 'PYTORCH_CUDA_ALLOC_CONF'):\n"
            "    os.environ.pop(k, None)\n"
            "import launcher.worker.main as m\n"
            "assert 'HF_HUB_OFFLINE' not in os.environ and 'TORCH_EXTENSIONS_DIR' not in os.environ\n"
            "assert 'huggingface_hub' not in sys.modules and 'deepspeed' not in sys.modules\n"
            "m.rank_process_env(m.Path('/nonexistent/run'))\n"
            "assert os.environ['HF_HUB_OFFLINE'] == '1' and os.environ['TORCH_EXTENSIONS_DIR']\n"
            "assert os.environ['LAUNCHER_RUN_DIR'] == '/nonexistent/run'\n"
            "assert os.environ['PYTORCH_CUDA_ALLOC_CONF'] == 'expandable_segments:True'\n"
            "os.environ['PYTORCH_CUDA_ALLOC_CONF'] = 'max_split_size_mb:512'  # a user's own setting wins\n"
            "m.rank_process_env(m.Path('/nonexistent/run'))\n"
            "assert os.environ['PYTORCH_CUDA_ALLOC_CONF'] == 'max_split_size_mb:512'\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
