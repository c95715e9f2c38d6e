"""launch --script runs a plain script (no launcher import) inside the rank wrapper (launcher.runtime.script):
its peak is measured, the rank files are written, and the run gets a verdict and its exit code."""

import json
import os
import sys
from pathlib import Path

from tests.cli.test_run_cli import job_file, launch

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


def test_the_accelerate_example_takes_the_plan_from_accelerates_environment(tmp_path):
    """examples/accelerate_script: a plain Accelerator loop gets DeepSpeed ZeRO-2, bf16, the micro-batch and the
    accumulation from the plan with no launcher line in it, and the wrapper judges it."""
    from tests.conftest import REPO

    script = REPO / "examples" / "accelerate_script" / "train.py"
    assert "launcher" not in script.read_text().split('"""')[2]  # the code after the docstring
    job = job_file(tmp_path, "acc", train={"global_batch_size": 8, "precision": "bf16", "lr": 3e-3, "max_steps": 3},
                   strategy={"engine": "deepspeed", "zero_stage": 2, "micro_batch_size": 2})
    res = launch(job, "--run-dir", tmp_path / "run", "--quiet", "--script", script, "--", "--max-steps", 3)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "every rank within budget" in res.stdout
    log = (tmp_path / "run" / "logs" / "rank-0.log").read_text()
    assert "world 2, DEEPSPEED, precision bf16, micro-batch 2, accumulation 2" in log, log[-3000:]
    # Planned for a script: no lever the script does not receive (chunked loss, hooks, wrappers, optimizers).
    plan = json.loads((tmp_path / "run" / "plan.json").read_text())
    assert "script_lacks" in {d["why"] for d in plan["levers"]}
    assert (plan["loss_chunks"], plan["checkpoint_every"], plan["activation_offload"]) == (0, 1, False)
    for rank in (0, 1):
        r = json.loads((tmp_path / "run" / "ranks" / f"rank-{rank}.json").read_text())
        assert r["status"] == "completed" and r["steps_done"] == 3 and r["measured_peak_bytes"] > 1_000_000, r


def _run_in_process(tmp_path, monkeypatch, body: str) -> tuple[int, dict]:
    """launcher.runtime.script.run_script on one rank in this process (no torchrun): its exit code and rank file."""
    import sys

    from launcher.runtime.script import run_script

    script = tmp_path / "s.py"
    script.write_text(body)
    run = tmp_path / "run"
    monkeypatch.setenv("LAUNCHER_RUN_DIR", str(run))
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LAUNCHER_ENFORCE_BYTES"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    code = run_script(str(script), ["7"])
    return code, json.loads((run / "ranks" / "rank-0.json").read_text())


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


def test_the_trl_sft_example_runs_unchanged_with_a_verdict(tmp_path):
    """examples/trl_sft: a plain SFTTrainer script (no launcher import) takes the DeepSpeed ZeRO-2 plan and the
    batch shape from the environment on 2 CPU ranks; the wrapper measures it and the run is judged."""
    from tests.conftest import REPO, TINY_GPT2

    script = REPO / "examples" / "trl_sft" / "train.py"
    assert "launcher" not in script.read_text().split('"""')[2]
    model = {**TINY_GPT2, "vocab_size": 30522, "max_position_embeddings": 64}  # the script's GPT-2, MiniLM's vocab
    job = job_file(tmp_path, "sft", model=model, strategy={"engine": "deepspeed", "zero_stage": 2},
                   train={"global_batch_size": 8, "precision": "fp32", "lr": 3e-3, "max_steps": 2})
    res = launch(job, "--run-dir", tmp_path / "run", "--quiet", "--script", script, "--", "--max-steps", 2,
                 "--lr", 3e-3, "--output-dir", tmp_path / "out")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "every rank within budget" in res.stdout
    plan = json.loads((tmp_path / "run" / "plan.json").read_text())
    for rank in (0, 1):
        log = (tmp_path / "run" / "logs" / f"rank-{rank}.log").read_text()
        assert (f"rank {rank} of 2, deepspeed=True, micro-batch {plan['micro_batch_size']}, "
                f"accumulation {plan['grad_accum_steps']}") in log, log[-3000:]
        r = json.loads((tmp_path / "run" / "ranks" / f"rank-{rank}.json").read_text())
        assert r["status"] == "completed" and r["steps_done"] == 2 and r["measured_peak_bytes"] > 10_000_000, r
