"""Mixture of experts: memory counts every expert, compute counts the active ones (top-k of E), the plan says so."""

import dataclasses
import json

import pytest

from launcher.config.job import Job
from launcher.config.load import from_dict
from launcher.model.introspect import introspect
from launcher.planner.cost import attention_flops_per_token, step_time_terms
from launcher.planner.hardware import PROFILES
from launcher.planner.scoring import memory_inputs
from launcher.planner.search import PlanRequest, make_plan
from tests.model.families import save_model_dir

H, INTER, LAYERS, E, K = 64, 128, 2, 4, 2


def stats(tmp_path, family, **over):
    tmp_path.mkdir(parents=True, exist_ok=True)
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"text": "a"}) + "\n")
    job = from_dict(Job, {"name": "t", "model": str(save_model_dir(family, tmp_path, **over)), "task": "causal_lm",
                          "data": {"path": str(data), "max_seq_len": 32},
                          "train": {"global_batch_size": 8, "max_steps": 1, "precision": "bf16"}})
    return introspect(job)


def request(m, **kw):
    base = dict(model=m, gpus_per_node=8, nodes=1, budget_bytes=80 * 10**9, seq_len=32, global_batch_size=64,
                precision="bf16", optimizer="adamw", hardware=PROFILES["a100-80gb"], host_ram_per_node_bytes=10**13)
    return PlanRequest(**{**base, **kw})


def test_mixtral_counts_every_expert_and_activates_top_k(tmp_path):
    m = stats(tmp_path, "mixtral")
    expert = 3 * H * INTER  # gate, up and down projections of one SwiGLU expert
    assert (m.num_experts, m.experts_per_token) == (E, K)
    assert m.expert_params == LAYERS * E * expert
    assert m.active_params == m.num_params - LAYERS * (E - K) * expert
    assert m.intermediate_size == K * INTER  # a token runs through k experts' MLPs


def test_qwen2_moe_keeps_its_shared_expert_active(tmp_path):
    m = stats(tmp_path, "qwen2_moe")
    routed = 3 * H * 32  # moe_intermediate_size 32 per expert
    assert m.expert_params == LAYERS * E * routed
    assert m.active_params == m.num_params - LAYERS * (E - K) * routed
    assert m.intermediate_size == K * 32 + 64  # shared_expert_intermediate_size beside the routed ones


def test_a_dense_model_is_all_active(tmp_path):
    m = stats(tmp_path, "mistral")
    assert (m.num_experts, m.expert_params, m.active_params) == (0, 0, m.num_params)


def test_compute_scales_with_active_parameters_memory_with_all(tmp_path):
    moe = stats(tmp_path / "a", "mixtral")
    dense = dataclasses.replace(moe, num_experts=0, experts_per_token=0, expert_params=0)  # every expert active
    plan_moe, plan_dense = make_plan(request(moe)), make_plan(request(dense))
    s = plan_moe.strategy
    # The weights' matmuls only: no per-block overhead, no memory-bound term (bandwidth 0), attention apart.
    hw = dataclasses.replace(PROFILES["a100-80gb"], block_overhead_s=0.0, memory_bw=0.0)

    def weights_s(m) -> float:
        inp = dataclasses.replace(memory_inputs(request(m)), hardware=hw)
        tokens = s.micro_batch_size * s.grad_accum_steps * inp.seq_len
        attn = attention_flops_per_token(inp, s) * tokens / (hw.flops_bf16 * hw.mfu)
        return step_time_terms(inp, s, plan_moe.buckets.reduce_bucket_size)["compute"] - attn

    assert weights_s(moe) / weights_s(dense) == pytest.approx(moe.active_params / moe.num_params, rel=1e-9)
    # The same strategy holds the same parameters, optimizer state and gradients: every expert is stored.
    assert plan_moe.estimate.breakdown["params"] == plan_dense.estimate.breakdown["params"]
    assert plan_moe.estimate.breakdown["optimizer"] == plan_dense.estimate.breakdown["optimizer"]


def test_the_plan_says_moe_total_and_active(tmp_path):
    m = stats(tmp_path, "mixtral")
    reasons = make_plan(request(m)).reasons
    assert f"MoE: {m.num_params:,} total, {m.active_params:,} active (top-2 of 4 experts)" in " ".join(reasons)
    assert not any("MoE" in r for r in make_plan(request(stats(tmp_path / "d", "mistral"))).reasons)


def test_an_moe_plans_through_the_cli_without_a_failed_probe(tmp_path, capsys, monkeypatch):
    from launcher.cli.main import main

    monkeypatch.setenv("LAUNCHER_CACHE", str(tmp_path / "cache"))
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"text": f"row {i}"}) + "\n" for i in range(8)))  # launch plan checks it
    job = tmp_path / "job.yaml"
    job.write_text(json.dumps({"name": "moe", "model": str(save_model_dir("mixtral", tmp_path)), "task": "causal_lm",
                               "data": {"path": str(data), "max_seq_len": 32},
                               "train": {"global_batch_size": 4, "max_steps": 1, "precision": "fp32"},
                               "cluster": {"hardware": "cpu"}}))
    assert main(["plan", str(job), "--gpus", "2", "--budget", "2GB", "--json"]) == 0
    out = capsys.readouterr()
    plan = json.loads(out.out)
    assert "warning" not in out.err and "Traceback" not in out.err and "FAILED" not in " ".join(plan["reasons"])
    assert any(r.startswith("MoE: ") and "active (top-2 of 4 experts)" in r for r in plan["reasons"])
    assert "MoE routing is data-dependent" in plan["constants"]["activations"]["source"]
