"""`launch calibrate --from` fits the engines' per-step seconds, and the planner's cost model then uses them."""

import dataclasses
import json
from pathlib import Path

import pytest

from launcher.calibrate.timing import fit_overheads
from launcher.cli.main import main
from launcher.config.jobfile import job_from_data
from launcher.inputs.machine import hardware_profile
from launcher.inputs.plan_inputs import plan_job
from tests.slurm_fixtures import build_plan

DATA = str(Path(__file__).resolve().parents[2] / "examples" / "data" / "causal.jsonl")


def fake_run(root: Path, name: str, engine: str, modeled: dict, step_s: list[float]) -> Path:
    """A run dir as a finished run leaves it: plan.json (a real plan, its step-time terms these) and rank 0's step
    stamps."""
    d = root / name
    (d / "steps").mkdir(parents=True)
    plan = build_plan(engine=engine)
    plan = dataclasses.replace(plan, estimate=dataclasses.replace(plan.estimate, step_time_terms=modeled))
    (d / "plan.json").write_text(json.dumps(plan.to_json()))
    t, lines = 1000.0, []
    for i, dt in enumerate([5.0, *step_s]):  # the first step carries start-up costs and is left out
        t += dt
        lines.append(json.dumps({"step": i + 1, "time": t}))
    (d / "steps" / "rank-0.jsonl").write_text("\n".join(lines) + "\n")
    return d


def test_fit_is_the_median_residual_per_engine(tmp_path):
    runs = [fake_run(tmp_path, "a", "deepspeed", {"compute": 0.3, "communication": 0.1, "engine": 7.0}, [1.4] * 4),
            fake_run(tmp_path, "b", "deepspeed", {"compute": 0.5, "communication": 0.0}, [1.5, 1.6, 1.5]),
            fake_run(tmp_path, "c", "deepspeed", {"compute": 0.2}, [2.0, 2.0, 2.0]),
            fake_run(tmp_path, "d", "fsdp", {"compute": 0.5}, [0.4, 0.4, 0.4]),
            fake_run(tmp_path, "e", "fsdp", {"compute": 0.5}, [9.0])]  # one interval: too few to time
    fitted = fit_overheads(runs)["cpu"]
    seconds, samples = fitted["deepspeed_step_overhead_s"]
    assert seconds == pytest.approx(1.0)  # residuals 1.0 (the old engine term is not modeled), 1.0, 1.8
    assert len(samples) == 3
    seconds, samples = fitted["fsdp_step_overhead_s"]
    assert seconds == 0.0 and len(samples) == 1  # faster than modeled: never a negative overhead


def test_refit_writes_the_profile_and_the_planner_charges_it(tmp_path, capsys):
    job = job_from_data({"name": "t", "model": {"family": "gpt2", "hidden_size": 64, "num_layers": 2, "num_heads": 4},
                         "task": "causal_lm", "data": {"path": DATA}, "train": {"global_batch_size": 4, "max_steps": 1},
                         "strategy": {"engine": "deepspeed", "zero_stage": 2}, "cluster": {"hardware": "cpu"},
                         "gpus": 2, "budget": "4GB"}, ".")
    before = plan_job(job).estimate
    run = fake_run(tmp_path, "z2", "deepspeed", {"compute": 0.25, "communication": 0.05}, [2.8, 2.8, 2.8])
    rc = main(["calibrate", "--from", str(run)])
    out = capsys.readouterr().out
    assert "deepspeed_step_overhead_s = 2.5 s" in out, out
    assert rc == 2  # the run dir has no rank records: no activation constants to refit, and it says so
    assert hardware_profile(job).step_overhead("deepspeed") == pytest.approx(2.5)
    after = plan_job(job).estimate
    assert after.step_time_terms["engine"] == pytest.approx(2.5)
    assert after.step_time_s == pytest.approx(before.step_time_s - before.step_time_terms["engine"] + 2.5)
