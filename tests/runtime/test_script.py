"""launch --script runs a plain script (no launcher import) inside the rank wrapper (launcher.runtime.script):
its peak is measured, the rank files are written, and the run gets a verdict and its exit code."""

import json
import os
import sys
from pathlib import Path

from tests.cli.test_run_cli import job_file, launch
from tests.conftest import TINY_GPT2 as TINY

# A plain torch script: nothing from the launcher; it only holds argv[1] floats and takes three SGD steps.
PLAIN = """
import atexit, os, shutil, sys
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
# A script's own exit hook (a tracker's final sync, say) runs when its rank finishes (rank_entry.exit_rank).
atexit.register(lambda: open(os.path.join(os.environ["LAUNCHER_RUN_DIR"], f"atexit-{os.environ['RANK']}"), "w").close())
hold = torch.ones(int(sys.argv[1]))  # 4 bytes per element, kept for the whole run
model = torch.nn.Linear(64, 64)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    model(torch.randn(8, 64)).square().mean().backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
    opt.step()
    opt.zero_grad()
print("ninja:", shutil.which("ninja"), flush=True)
print("plan:", os.environ["LAUNCHER_MICRO_BATCH_SIZE"], os.environ["LAUNCHER_GRAD_ACCUM_STEPS"],
      os.environ["ACCELERATE_MIXED_PRECISION"], os.environ["ACCELERATE_GRADIENT_ACCUMULATION_STEPS"], flush=True)
dist.destroy_process_group()
"""


def test_a_plain_script_is_measured_and_judged_without_a_launcher_import(tmp_path):
    script = tmp_path / "plain.py"
    script.write_text(PLAIN)
    # The plan predicts about 11 MB per rank, so a 40 MB budget fits; the script's own tensors decide the verdict.
    job = job_file(tmp_path, "plain", budget="40MB")
    held = 1_000_000
    # Launched with a PATH that lacks this interpreter's bin: each rank puts it first itself (rank_entry's
    # use_local_tools), so a script's ninja is the one the op cache was built with (tests/runtime/test_plan_digest.py).
    env = {**os.environ, "PATH": os.pathsep.join(["/usr/bin", "/bin"])}
    res = launch(job, "--run-dir", tmp_path / "ok", "--quiet", "--script", script, "--", held, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    plan = json.loads((tmp_path / "ok" / "plan.json").read_text())
    for rank in (0, 1):
        r = json.loads((tmp_path / "ok" / "ranks" / f"rank-{rank}.json").read_text())
        assert r["status"] == "completed" and r["basis"] == "cpu_tensor_bytes", r
        # The held tensor is counted (4 MB) plus the model's few kB, nothing like the process's RSS.
        assert 4 * held <= r["measured_peak_bytes"] < 4 * held + 200_000, r
        assert r["peak_rss_bytes"] > 10 * r["measured_peak_bytes"]
        steps = [json.loads(ln) for ln in (tmp_path / "ok" / "steps" / f"rank-{rank}.jsonl").read_text().splitlines()]
        assert [s["step"] for s in steps] == [1, 2, 3] and r["steps_done"] == 3
        log = (tmp_path / "ok" / "logs" / f"rank-{rank}.log").read_text()
        assert f"plan: {plan['micro_batch_size']} {plan['grad_accum_steps']} no {plan['grad_accum_steps']}" in log, log
        assert f"ninja: {Path(sys.executable).parent / 'ninja'}" in log, log
    assert (tmp_path / "ok" / "atexit-0").is_file() and (tmp_path / "ok" / "atexit-1").is_file()
    report = json.loads((tmp_path / "ok" / "report.json").read_text())
    assert report["within_budget"] is True and report["basis"] == "cpu_tensor_bytes", report
    assert "every rank within budget" in res.stdout

    over = launch(job, "--run-dir", tmp_path / "over", "--quiet", "--script", script, "--", 16_000_000)
    assert over.returncode == 3, over.stdout + over.stderr
    report = json.loads((tmp_path / "over" / "report.json").read_text())
    assert report["within_budget"] is False
    assert all(r["measured_peak_bytes"] >= 64_000_000 for r in report["ranks"]), report["ranks"]


def run_unchanged(tmp_path, job, example: str, expect: dict, *args) -> tuple[dict, dict]:
    """launch --script an example unchanged, through tests/runtime/expect_plan.py, which asserts on each rank that
    ``expect`` (the plan's values) arrived where the libraries took them; (report.json, plan.json)."""
    from tests.conftest import REPO

    script = REPO / "examples" / example / "train.py"
    code = script.read_text().split('"""', 2)[2]  # after the docstring: no launcher import, no launcher variable
    assert "launcher" not in code.lower() and "LAUNCHER_" not in code and "ACCELERATE_" not in code
    res = launch(job, "--run-dir", tmp_path / "run", "--script", Path(__file__).parent / "expect_plan.py", "--",
                 json.dumps(expect), script, *args)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "every rank within budget" in res.stdout
    for rank in range(expect["world_size"]):
        assert "plan arrived: " in (tmp_path / "run" / "logs" / f"rank-{rank}.log").read_text()
    return (json.loads((tmp_path / "run" / "report.json").read_text()),
            json.loads((tmp_path / "run" / "plan.json").read_text()))


def test_an_unchanged_hf_trainer_script_runs_zero2_with_its_own_learning_rate(tmp_path):
    """examples/hf_trainer (HfArgumentParser over TrainingArguments, from_pretrained after it) under ZeRO-2 on 2 CPU
    ranks: its --per_device_train_batch_size 8 and --bf16 give way to the plan's, its --learning_rate (not the job's)
    is used, not refused, and the step lines carry the Trainer's loss."""
    import yaml

    from tests.conftest import REPO

    data = yaml.safe_load((REPO / "examples" / "seq-cls.yaml").read_text())
    data["data"]["path"] = str(REPO / "examples" / "data" / "sentiment.jsonl")
    data["strategy"] = {"engine": "deepspeed", "zero_stage": 2, "micro_batch_size": 2}
    data["train"].update(global_batch_size=8, precision="fp32", lr=2e-5, max_steps=5)  # the script takes 3
    job = tmp_path / "trainer.yaml"
    job.write_text(yaml.safe_dump(data))
    expect = {"world_size": 2, "distributed_type": "DEEPSPEED", "zero_stage": 2, "offload_optimizer": "none",
              "precision": "no", "micro_batch_size": 2, "ds_micro_batch_size": 2, "grad_accum_steps": 2}
    report, _ = run_unchanged(tmp_path, job, "hf_trainer", expect, "--output_dir", tmp_path / "out", "--max_steps", 3,
                              "--per_device_train_batch_size", 8, "--bf16", "--learning_rate", 5e-5, "--max_len", 48,
                              "--logging_steps", 1, "--report_to", "none")
    got = {o["setting"]: (o["script"], o["plan"]) for o in report["script_overrides"]}
    assert got["TrainingArguments.per_device_train_batch_size"] == ("8", "2")
    assert got["TrainingArguments.bf16"] == ("True", "False")
    assert got["TrainingArguments.gradient_accumulation_steps"] == ("1", "2")
    assert not any("learning_rate" in k for k in got)
    steps = [json.loads(ln) for ln in (tmp_path / "run" / "steps" / "rank-0.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2, 3] and all("loss" in s for s in steps)
    assert 2e-5 < steps[0]["lr"] <= 5e-5  # its own rate on its own linear decay, above the job's 2e-5
    log = (tmp_path / "run" / "logs" / "rank-1.log").read_text()
    assert "[launcher] the plan sets TrainingArguments.per_device_train_batch_size: 8 -> 2" in log
    for r in report["ranks"]:
        assert r["verdict"] == "ok" and r["steps_done"] == 3, r
    # The Trainer's own count is the run's total (the live view's and status's), not the job's 5.
    assert json.loads((tmp_path / "run" / "ranks" / "rank-0.json").read_text())["total_steps"] == 3


def test_an_unchanged_accelerate_script_runs_the_fsdp2_plan_sharded_on_cpu_ranks(tmp_path):
    """examples/accelerate_script under an FSDP2 plan on 2 CPU ranks: its own --batch-size 8 and bf16 give way to
    the plan's micro-batch 2 and fp32, accelerate gets gloo and shards with FSDP2 (on CPU it would otherwise run every
    rank alone), and the run is judged; a pipe still gets step lines though the loop logs no loss."""
    job = job_file(tmp_path, "acc", model={**TINY, "vocab_size": 256, "max_position_embeddings": 64},
                   train={"global_batch_size": 8, "precision": "fp32", "lr": 3e-3, "max_steps": 3},
                   strategy={"engine": "fsdp", "micro_batch_size": 2})
    expect = {"world_size": 2, "distributed_type": "FSDP", "sharded": True, "precision": "no",
              "micro_batch_size": 2, "grad_accum_steps": 2}
    report, plan = run_unchanged(tmp_path, job, "accelerate_script", expect, "--max-steps", 3, "--batch-size", 8,
                                 "--mixed-precision", "bf16")
    assert {(o["setting"], o["script"], o["plan"]) for o in report["script_overrides"]} >= {
        ("DataLoader.batch_size", "8", "2"), ("Accelerator.mixed_precision", "'bf16'", "'no'"),
        ("accelerate AcceleratorState.distributed_type", "'NO'", "'FSDP'")}
    assert (plan["loss_chunks"], plan["checkpoint_every"], plan["activation_offload"]) == (0, 1, False)
    for r in report["ranks"]:
        assert r["verdict"] == "ok" and r["steps_done"] == 3, r


def test_an_unchanged_trl_script_runs_zero3_with_optimizer_offload(tmp_path):
    """examples/trl_sft (HfArgumentParser over SFTConfig) under ZeRO-3 + CPU optimizer offload on 2 CPU ranks: its
    batch size, bf16 default, checkpointing default and max_length give way to the plan's where SFTConfig is built,
    its learning rate and schedule stay its own, and the Trainer's logged loss is in the step lines."""
    from tests.conftest import TINY_GPT2

    model = {**TINY_GPT2, "vocab_size": 30522, "max_position_embeddings": 64}  # the script's GPT-2, MiniLM's vocab
    job = job_file(tmp_path, "sft", model=model, train={"global_batch_size": 8, "precision": "fp32", "lr": 3e-3,
                                                        "max_steps": 2},
                   strategy={"engine": "deepspeed", "zero_stage": 3, "offload_optimizer": "cpu", "micro_batch_size": 2})
    expect = {"world_size": 2, "distributed_type": "DEEPSPEED", "zero_stage": 3, "offload_optimizer": "cpu",
              "precision": "no", "micro_batch_size": 2, "ds_micro_batch_size": 2, "grad_accum_steps": 2}
    report, _ = run_unchanged(tmp_path, job, "trl_sft", expect, "--output_dir", tmp_path / "out", "--max_steps", 2,
                              "--per_device_train_batch_size", 8, "--learning_rate", 1e-3, "--max_length", 128,
                              "--logging_steps", 1, "--report_to", "none")
    got = {o["setting"]: (o["script"], o["plan"]) for o in report["script_overrides"]}
    assert got["SFTConfig.per_device_train_batch_size"] == ("8", "2") and got["SFTConfig.bf16"] == ("True", "False")
    assert got["SFTConfig.max_length"] == ("128", "64") and got["SFTConfig.activation_checkpointing"][1] == "False"
    ds = json.loads((tmp_path / "run" / "ds_config.script.json").read_text())
    assert ds["optimizer"]["params"]["lr"] == "auto" and "scheduler" not in ds  # the script's math, the plan's AdamW
    steps = [json.loads(ln) for ln in (tmp_path / "run" / "steps" / "rank-0.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2] and all(s["loss"] > 0 and s["lr"] <= 1e-3 for s in steps), steps
    assert steps[0]["tokens_per_s"] > 0
    for r in report["ranks"]:
        assert r["verdict"] == "ok" and r["steps_done"] == 2, r


def _run_in_process(tmp_path, monkeypatch, body: str, keep: tuple[str, ...] = ()) -> tuple[int, dict]:
    """launcher.runtime.script.run_script on one rank in this process (no torchrun): its exit code and rank file."""
    import sys

    from launcher.runtime.script import run_script

    script = tmp_path / "s.py"
    script.write_text(body)
    run = tmp_path / "run"
    monkeypatch.setenv("LAUNCHER_RUN_DIR", str(run))
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LAUNCHER_ENFORCE_BYTES", "LAUNCHER_PLAN"):
        if var not in keep:
            monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    code = run_script(str(script), ["7"])
    return code, json.loads((run / "ranks" / "rank-0.json").read_text())


def test_a_script_that_trains_alone_on_a_rank_of_several_fails_with_the_fix(tmp_path, monkeypatch):
    """A plan of 2 ranks, a script with no process group (an accelerate loop on CPU without gloo, a torch loop
    without init_process_group): each rank would run its own training and exit 0. Its first optimizer step fails."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    body = ("import torch\nm = torch.nn.Linear(4, 4)\nopt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
            "m(torch.ones(2, 4)).sum().backward()\nopt.step()\nopen('after-the-step', 'w').close()\n")
    code, r = _run_in_process(tmp_path, monkeypatch, body, keep=("WORLD_SIZE",))
    assert code == 1 and r["status"] == "failed" and r["steps_done"] == 0
    assert "the script trains on 1 of the plan's 2 ranks" in r["error"]
    assert "init_process_group" in r["error"] and "InitProcessGroupKwargs(backend='gloo')" in r["error"]
    assert not (tmp_path / "after-the-step").exists()


def test_a_failing_script_still_leaves_its_rank_report(tmp_path, monkeypatch):
    code, r = _run_in_process(tmp_path, monkeypatch, "import sys, torch\nx = torch.ones(int(sys.argv[1]) * 1000)\n"
                                                     "raise RuntimeError('boom in the script')\n")
    assert code == 1 and r["status"] == "failed" and "boom in the script" in r["error"]
    assert r["measured_peak_bytes"] >= 28_000 and r["phases"]["script"] == r["measured_peak_bytes"]


def test_sys_exit_codes_are_kept(tmp_path, monkeypatch):
    code, r = _run_in_process(tmp_path, monkeypatch, "import sys\nsys.exit(0)\n")
    assert (code, r["status"]) == (0, "completed")
    code, r = _run_in_process(tmp_path, monkeypatch, "import sys\nsys.exit(4)\n")
    assert (code, r["status"]) == (4, "failed") and "exited with 4" in r["error"]


def test_a_script_with_its_own_probe_keeps_its_own_report(tmp_path, monkeypatch):
    body = ("import torch\nfrom launcher.runtime import memory_probe\nprobe = memory_probe()\nwith probe:\n"
            "    with probe.phase('forward'):\n        x = torch.ones(1000)\nprobe.record(mine=True)\nprobe.write()\n")
    code, r = _run_in_process(tmp_path, monkeypatch, body)
    assert code == 0 and r["mine"] is True and "script" not in r and set(r["phases"]) >= {"forward"}
