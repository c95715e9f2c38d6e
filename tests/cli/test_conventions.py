"""The conventions people bring from torchrun, torchtune and every other CLI: --version, a typo'd verb,
``--``, KEY=VALUE overrides, --nproc-per-node, and one JSON object from --json whatever happens."""

import json
import subprocess

import pytest
import yaml

from launcher.cli.main import build_parser, split_argv
from tests.cli.test_plan_cli import run_cli
from tests.conftest import REPO

LAUNCH = str(REPO / ".venv" / "bin" / "launch")


def test_version_prints_the_package_version():
    import importlib.metadata

    res = subprocess.run([LAUNCH, "--version"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == f"launch {importlib.metadata.version('launcher')}"


@pytest.mark.parametrize("word,message", [
    ("plna", "unknown command 'plna'; did you mean 'plan'?"),
    ("calibrat", "unknown command 'calibrat'; did you mean 'calibrate'?"),
    ("frobnicate", "unknown command 'frobnicate'; use one of run, plan"),
])
def test_an_unknown_verb_is_named_with_the_nearest_one(capsys, write_job, word, message):
    code, out, err = run_cli(capsys, word, write_job())
    assert code == 2 and out == ""
    assert err.strip() == f"launch: error: {message}" or err.startswith(f"launch: error: {message}")


def test_double_dash_ends_the_options(capsys, write_job):
    code, out, err = run_cli(capsys, "plan", "--json", "--", write_job())
    assert code == 0, err
    assert json.loads(out)["world_size"] == 2


def test_double_dash_after_script_still_belongs_to_the_script():
    ours, overrides, script = split_argv(["run", "--script", "t.py", "job.yaml", "lr=2", "--", "--epochs", "a=1"])
    assert ours == ["run", "--script", "t.py", "job.yaml"] and overrides == ["lr=2"] and script == ["--epochs", "a=1"]


def test_dotted_overrides_set_any_job_key(capsys, write_job, tmp_path):
    code, out, err = run_cli(capsys, "plan", write_job(), "train.lr=1e-4", "strategy.zero_stage=3",
                             "data.max_seq_len=32", "--json", "train.global_batch_size=16", "budget=2GB")
    assert code == 0, err
    plan = json.loads(out)
    assert (plan["zero_stage"], plan["seq_len"], plan["global_batch_size"], plan["budget_bytes"]) == (
        3, 32, 16, 2 * 10**9)
    assert "kept as pinned by the job: zero_stage" in " ".join(plan["reasons"])


def test_an_override_is_a_yaml_value_checked_like_the_file(capsys, write_job):
    from launcher.config.jobfile import load_job, parse_overrides

    job = load_job(write_job(), sets=parse_overrides(["train.lr=1e-4", "train.lora={r: 4, target_modules: [c_attn]}",
                                                     "strategy.activation_checkpointing=true"]))
    assert job.train.lr == 1e-4 and job.train.lora.r == 4 and job.strategy.activation_checkpointing is True


def test_every_override_problem_in_one_error(capsys, write_job):
    code, out, err = run_cli(capsys, "plan", write_job(), "train.lrr=1", "strategy.zero_stage=5", "budget=16G",
                             "model.hidden_size=66")
    assert code == 2 and out == ""
    for part in ("train.lrr: unknown key; did you mean 'lr'?", "strategy.zero_stage: 5 is not one of 0, 1, 2, 3",
                 "budget: '16G' is ambiguous: GB (10^9) or GiB (2^30)? write 16GB or 16GiB",
                 "model.hidden_size: 66 is not divisible by model.num_heads 4"):
        assert part in err, err


def test_flags_win_over_overrides(capsys, write_job):
    code, out, err = run_cli(capsys, "plan", write_job(), "gpus=4", "--gpus", "2", "--json")
    assert code == 0, err
    assert json.loads(out)["world_size"] == 2


def test_overrides_belong_to_run_and_plan_only(capsys, tmp_path):
    code, _, err = run_cli(capsys, "status", tmp_path, "train.lr=1")
    assert code == 2 and "KEY=VALUE job overrides apply to run and plan" in err


@pytest.mark.parametrize("verb", ["run", "plan"])
def test_nproc_per_node_is_torchruns_name_for_gpus(verb):
    assert build_parser().parse_args([verb, "--nproc-per-node", "4", "job.yaml"]).gpus == 4


def test_a_float_with_an_exponent_is_a_number_in_the_file(write_job):
    from launcher.config.jobfile import load_job

    path = write_job()
    path.write_text(path.read_text().replace("lr: 0.001", "lr: 1e-4"))
    assert load_job(path).train.lr == 1e-4  # YAML 1.1 (PyYAML) alone reads '1e-4', a string


def test_plan_needs_neither_max_steps_nor_the_data_file(capsys, write_job, tmp_path):
    from tests.conftest import base_job

    doc = base_job(str(tmp_path / "not-yet.jsonl"), **{"train.max_steps": None})
    code, out, err = run_cli(capsys, "plan", write_job(doc), "--json")
    assert code == 0, err
    assert json.loads(out)["world_size"] == 2
    code, out, err = run_cli(capsys, "run", write_job(doc), "--run-dir", tmp_path / "run", "--quiet")
    assert code == 2
    assert "train.max_steps: missing" in err and "not-yet.jsonl' does not exist" in err
    assert not (tmp_path / "run").exists()


def test_plan_json_no_fit_is_one_object(capsys, write_job):
    code, out, err = run_cli(capsys, "plan", write_job(model="llama-7b"), "--budget", "20MB", "--json")
    assert code == 2
    doc = json.loads(out)
    assert doc["status"] == "no_fit"
    assert doc["reasons"][0].startswith("no plan fits 20.00 MB per GPU on 2 GPUs")
    assert doc["suggestions"] == [s for s in doc["suggestions"] if not s.startswith("  ")]
    assert doc["suggestions"]  # what is offered depends on this machine's host RAM (CPU ranks): re-planned


def test_plan_json_bad_input_is_one_object_and_the_line_on_stderr(capsys, write_job):
    code, out, err = run_cli(capsys, "plan", write_job(), "--budget", "1MB", "--json")
    assert code == 2
    assert json.loads(out) == {"status": "bad_input", "errors": [
        "budget: 1.00 MB is below 16 MB, too small to hold any model; did you mean GB (e.g. --budget 16GB)?"]}
    assert err.startswith("launch: error: budget: 1.00 MB is below 16 MB")


def test_job_yaml_round_trip_keeps_overrides(tmp_path, write_job):
    from launcher.config.jobfile import job_to_data, load_job, parse_overrides

    job = load_job(write_job(), sets=parse_overrides(["train.lr=3e-4"]))
    assert yaml.safe_load(yaml.safe_dump(job_to_data(job)))["train"]["lr"] == 3e-4


def test_plan_sbatch_still_needs_what_a_run_needs(capsys, write_job, tmp_path):
    from tests.conftest import base_job

    doc = base_job(str(tmp_path / "not-yet.jsonl"), **{"train.max_steps": None})
    code, out, err = run_cli(capsys, "plan", write_job(doc), "--sbatch")
    assert code == 2 and "train.max_steps: missing" in err and out == ""


def test_plan_json_with_out_keeps_stdout_one_object(capsys, write_job, tmp_path):
    code, out, err = run_cli(capsys, "plan", write_job(), "--json", "--out", tmp_path / "o")
    assert code == 0, err
    assert json.loads(out)["world_size"] == 2  # the whole of stdout parses
    assert f"wrote {tmp_path / 'o' / 'plan.json'}" in err
    code, out, err = run_cli(capsys, "plan", write_job(), "--json", "--sbatch")
    assert code == 2 and json.loads(out)["status"] == "bad_input" and "add --out DIR" in err


def test_plan_json_answers_argparse_errors_with_one_object_too(capsys, write_job):
    code, out, err = run_cli(capsys, "plan", write_job(), "--json", "--budget", "lots")
    assert code == 2
    assert json.loads(out) == {"status": "bad_input", "errors": [
        "launch plan: argument --budget: 'lots' is not a size; sizes take a unit: 16GB, 16GiB, 16000MB, 0.5TB or "
        "plain bytes; GB is 1e9 bytes, GiB is 2^30 bytes"]}
    assert "argument --budget: 'lots' is not a size" in err
    code, out, err = run_cli(capsys, "plan", write_job(), "--budget", "lots")  # without --json: stderr only
    assert code == 2 and out == ""
