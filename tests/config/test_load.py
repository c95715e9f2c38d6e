import os
import subprocess
import sys

import pytest

from launcher.config.job import Job
from launcher.config.jobfile import load_job
from launcher.config.load import from_dict, to_dict
from launcher.errors import ConfigError
from launcher.inputs.plan_inputs import request_problems
from tests.conftest import base_job, relative_project


def test_minimal_job_loads_with_typed_fields(write_job):
    job = load_job(write_job(**{"cluster": {"host_ram_per_node": "512GB", "nvme_free": "2TB", "gpus_per_node": 8}}))
    assert job.budget_bytes == 10**9
    assert job.cluster.host_ram_per_node_bytes == 512 * 10**9
    assert job.cluster.nvme_free_bytes == 2 * 10**12
    assert job.strategy.engine is None and job.strategy.safety_margin == 0.05
    assert job.model.family == "gpt2"


def test_round_trip_keeps_yaml_keys(data_file):
    job = from_dict(Job, base_job(str(data_file), **{"cluster.host_ram_per_node": "64GB"}))
    d = to_dict(job)
    assert d["budget"] == 10**9 and d["cluster"]["host_ram_per_node"] == 64 * 10**9
    assert "base_dir" not in d
    assert from_dict(Job, d) == job


def test_unknown_key_suggests_the_near_one(write_job):
    with pytest.raises(ConfigError) as e:
        load_job(write_job(**{"train.global_batch": 8}))
    assert "train.global_batch: unknown key; did you mean 'global_batch_size'?" in str(e.value)


def test_every_problem_is_reported_at_once(write_job):
    with pytest.raises(ConfigError) as e:
        load_job(write_job(**{"train.precision": "bf61", "data.max_seq_len": "long", "strategy.zero_stage": 5,
                              "budget": "lots", "tsak": "x"}))
    text = str(e.value)
    assert len(e.value.problems) == 5, text
    assert "train.precision: 'bf61' is not one of 'auto', 'bf16', 'fp16', 'fp32'; did you mean 'bf16'?" in text
    assert "data.max_seq_len: 'long' must be an integer" in text
    assert "strategy.zero_stage: 5 is not one of 0, 1, 2, 3" in text
    assert "budget: 'lots' is not a size" in text
    assert "tsak: unknown key; did you mean 'task'?" in text


def test_semantic_rules_name_value_and_fix(write_job):
    with pytest.raises(ConfigError) as e:
        load_job(write_job(**{"train.global_batch_size": -8, "data.max_seq_len": 0, "train.max_steps": None}))
    text = str(e.value)
    assert "train.global_batch_size: -8 must be greater than 0; use e.g. global_batch_size: 32" in text
    assert "data.max_seq_len: 0 must be greater than 0" in text
    assert "train.max_steps: missing; give train.max_steps (e.g. 100) or train.epochs (e.g. 1)" in text


def test_yaml_syntax_error_names_line_and_column(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("name: x\ntrain: {global_batch_size: 8\nmodel: y\n")
    with pytest.raises(ConfigError, match=r"YAML syntax error at line \d+, column \d+"):
        load_job(p)


def test_missing_data_file_and_empty_data(write_job, tmp_path):
    with pytest.raises(ConfigError, match="data.path: .* does not exist"):
        load_job(write_job(**{"data.path": str(tmp_path / "nope.jsonl")}))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(ConfigError, match="holds no examples"):
        load_job(write_job(**{"data.path": str(empty)}))


def test_yaml_is_loaded_safely(tmp_path, data_file):
    p = tmp_path / "evil.yaml"
    p.write_text(f"name: !!python/object/apply:os.system ['echo pwned']\ndata: {{path: {data_file}}}\n")
    with pytest.raises(ConfigError, match="YAML syntax error"):
        load_job(p)


def test_overrides_replace_file_values(write_job):
    job = load_job(write_job(), {"gpus": 4, "data.max_seq_len": 128, "budget": 5 * 10**9})
    assert (job.gpus, job.data.max_seq_len, job.budget_bytes) == (4, 128, 5 * 10**9)


def test_type_key_value_and_request_problems_come_in_one_error(write_job):
    """A typo'd key, a negative length, a budget over the card and a batch the ranks do not divide: all four."""
    with pytest.raises(ConfigError) as e:
        load_job(write_job(**{"train.max_step": 4, "train.max_steps": None, "data.max_seq_len": -5,
                              "cluster.hardware": "a100-40gb", "budget": "80GB", "gpus": 3}),
                 checks=request_problems)
    problems = e.value.problems
    assert len(problems) == 4, problems
    assert problems[0].startswith("train.max_step: unknown key; did you mean 'max_steps'?")
    assert any(p.startswith("data.max_seq_len: -5 must be greater than 0; use e.g. max_seq_len: 512") for p in problems)
    assert any(p.startswith("budget: 80.00 GB is more than an a100-40gb holds (42.95 GB)") for p in problems)
    assert any(p.startswith("train.global_batch_size: 8 is not divisible by 3 GPUs") for p in problems)
    # max_steps is absent only because of the typo: "train.max_steps: missing" would say the same thing twice.


def test_a_value_refused_for_its_type_is_not_judged_again(write_job):
    with pytest.raises(ConfigError) as e:
        load_job(write_job(**{"train.max_steps": "four", "train.lr": -1.0, "gpus": "two"}))
    problems = e.value.problems
    assert len(problems) == 3, problems
    # Type problems first, then the rules over the values that passed them.
    assert problems[0].startswith("train.max_steps: 'four' must be an integer")  # not also "max_steps: missing"
    assert problems[1].startswith("gpus: 'two' must be an integer")  # nor judged as a divisor of the batch
    assert problems[2].startswith("train.lr: -1.0 must be greater than 0")


def test_a_rule_that_read_a_refused_field_is_dropped_by_its_fields_not_its_words(write_job):
    """The batch rule reads gpus and nodes (gpus x nodes ranks) though its line names only GPUs: with nodes
    refused, its default stood in, so judging the batch against it would be a second, false problem."""
    with pytest.raises(ConfigError) as e:
        load_job(write_job(**{"gpus": 3, "nodes": "two"}), checks=request_problems)
    assert len(e.value.problems) == 1 and e.value.problems[0].startswith("nodes: 'two' must be an integer")


def test_a_refused_field_named_only_in_a_rules_words_does_not_hide_it(write_job):
    """Filtering reads a Problem's field and reads, never its text: a line that mentions train.lr in its fix
    is still said when train.lr was refused; one that read train.lr is not."""
    from launcher.config.problem import Problem

    def checks(job):
        return [Problem("budget", "x is too much; lower it, or train.lr"),
                Problem("train.warmup_steps", "y is too long for this lr", reads=("train.lr",))]

    with pytest.raises(ConfigError) as e:
        load_job(write_job(**{"train.lr": "fast"}), checks=checks)
    assert e.value.problems[1:] == ["budget: x is too much; lower it, or train.lr"], e.value.problems
    assert e.value.problems[0].startswith("train.lr: 'fast'")


def test_problem_judges_a_refused_field_and_the_fields_inside_it():
    from launcher.config.problem import Problem

    p = Problem("strategy.qlora", "true needs a LoRA run", reads=("train.lora",))
    assert p.judges(["train.lora"]) and p.judges(["strategy"]) and p.judges(["strategy.qlora"])
    assert not p.judges(["train.lora.r", "train.lr", "strategy.q", "train.l"])
    assert Problem("slurm.setup[0]", "bad").judges(["slurm.setup"])
    assert str(p) == "strategy.qlora: true needs a LoRA run"


def test_an_inline_model_names_its_bad_field(write_job, data_file):
    model = {"family": "gpt2", "hidden_size": "wide", "num_layers": 2, "num_heads": 4}
    with pytest.raises(ConfigError) as e:
        load_job(write_job(base_job(str(data_file), model=model)))
    assert e.value.problems == ["model.hidden_size: 'wide' must be an integer; write model.hidden_size as a whole "
                                "number, e.g. 8"]


def test_unknown_slurm_key_lists_every_valid_one(write_job):
    from launcher.config.job import SlurmConfig
    from launcher.config.load import public_fields, yaml_key

    with pytest.raises(ConfigError) as e:
        load_job(write_job(**{"slurm.partiton": "gpu", "slurm.timeout_min": -1}))
    typo = next(p for p in e.value.problems if p.startswith("slurm.partiton"))
    assert "unknown key; did you mean 'partition'?" in typo
    valid = [yaml_key(f) for f in public_fields(SlurmConfig)]
    assert typo.endswith("valid keys: " + ", ".join(valid)) and len(valid) == 13
    assert "slurm.timeout_min: -1 must be greater than 0; use e.g. timeout_min: 60" in e.value.problems


def test_gpus_per_node_stands_in_for_gpus(write_job):
    job = load_job(write_job(**{"gpus": None, "cluster.gpus_per_node": 4}))
    assert job.gpus == 4
    with pytest.raises(ConfigError, match="not divisible by 3 GPUs"):
        load_job(write_job(**{"gpus": None, "cluster.gpus_per_node": 3}), checks=request_problems)


def test_relative_paths_start_at_the_job_files_directory(tmp_path, monkeypatch):
    from launcher.config.jobfile import job_to_data

    job_path = relative_project(tmp_path / "proj", nvme=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    job = load_job(job_path)
    proj = str(tmp_path / "proj")
    assert job.model == f"{proj}/models/tiny"
    assert job.data.path == f"{proj}/data/d.jsonl"
    assert job.cluster.nvme_path == f"{proj}/scratch/nvme"
    # The run dir's job.yaml (read by the ranks, whose base is the run dir) and sbatch carry the same paths.
    data = job_to_data(job)
    assert (data["model"], data["data"]["path"], data["cluster"]["nvme_path"]) == (
        job.model, job.data.path, job.cluster.nvme_path)


def test_a_model_name_that_is_no_local_dir_stays_as_written(write_job):
    assert load_job(write_job(model="gpt2-124m")).model == "gpt2-124m"


def test_plan_and_sbatch_see_the_resolved_paths(tmp_path, monkeypatch):
    from launcher.emit.sbatch import sbatch_text
    from launcher.inputs.plan_inputs import plan_job

    job_path = relative_project(tmp_path / "proj")
    monkeypatch.chdir(tmp_path)
    job = load_job(job_path)
    text = sbatch_text(plan_job(job), job, run_dir=tmp_path / "run")
    assert f"model: {tmp_path}/proj/models/tiny" in text and f"path: {tmp_path}/proj/data/d.jsonl" in text


def test_loading_a_job_probes_nothing(write_job, tmp_path, monkeypatch):
    """Loading YAML reads the file and the data path, nothing else: no nvidia-smi, no machine or planner module."""
    fake = tmp_path / "bin"
    fake.mkdir()
    marker = tmp_path / "nvidia-smi-ran"
    (fake / "nvidia-smi").write_text(f"#!/bin/sh\ntouch {marker}\necho 'NVIDIA H100 80GB HBM3'\n")
    (fake / "nvidia-smi").chmod(0o755)
    job = write_job(**{"cluster.hardware": "auto", "budget": "900GB"})  # over any card: only a probe could tell
    code = ("import sys; from launcher.config.jobfile import load_job; load_job(sys.argv[1]); "
            "print(sorted(m for m in sys.modules if m.startswith(('launcher.inputs.machine', 'launcher.plan', "
            "'torch'))))")
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"}
    out = subprocess.run([sys.executable, "-c", code, str(job)], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
    assert not marker.exists()
    # The CLI's path does probe, and says what the probe found.
    monkeypatch.setenv("PATH", env["PATH"])
    with pytest.raises(ConfigError, match="more than an h100-80gb holds"):
        load_job(job, checks=request_problems)
    assert marker.exists()


def test_flash_attention_on_cpu_ranks_is_refused_before_anything_builds(write_job):
    with pytest.raises(ConfigError) as e:
        load_job(write_job(**{"train.attn_implementation": "flash_attention_2", "cluster.hardware": "cpu"}),
                 checks=request_problems)
    assert e.value.problems == ["train.attn_implementation: 'flash_attention_2' needs CUDA, and these ranks run on "
                                "CPU (cluster.hardware: cpu); use sdpa (the default) or eager"]
    # On a CUDA profile it is a valid choice.
    job = load_job(write_job(**{"train.attn_implementation": "flash_attention_2", "cluster.hardware": "a100-80gb"}),
                   checks=request_problems)
    assert job.train.attn_implementation == "flash_attention_2"
