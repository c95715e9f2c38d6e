"""The activation constants the planner actually plans with (the fake-tensor probe, through
launcher.inputs.plan_inputs.activation_constants) held against the paper's structure, with numbers taken from the paper
rather than from our code [Korthikanti et al. 2022, eq. 1: a transformer block saves sbh(34 + 5as/h) bytes in
16-bit, 2sbh with full recompute].

HF's GPT-2 saves more than Megatron's minimal block (fp32 softmax, GELU and layer-norm inputs, dropout masks), so
the measured per-h cost may exceed 34 but must stay within twice it; what must hold exactly is the paper's
shape: the block cost grows with h alone, the score cost with a·s alone.
"""

import pytest

from launcher.config.jobfile import job_from_data
from tests.conftest import REPO

KORT_PER_H = 34.0  # bytes per token per hidden unit saved by one block, 16-bit [Korthikanti eq. 1]
KORT_PER_AS = 5.0  # bytes per token per (head x sequence position): the a·s² scores, softmax and dropout mask


def planned_constants(tmp_path, monkeypatch, *, h: int, heads: int, seq: int = 256):
    """What the planner would use for this job: launcher.inputs.plan_inputs.activation_constants, cache empty."""
    from launcher.inputs.machine import hardware_profile
    from launcher.inputs.plan_inputs import activation_constants, model_stats

    monkeypatch.setenv("LAUNCHER_CACHE", str(tmp_path / "cache"))
    job = job_from_data({
        "name": "paper", "model": {"family": "gpt2", "hidden_size": h, "num_layers": 2, "num_heads": heads,
                                   "vocab_size": 1024, "max_position_embeddings": 512},
        "task": "causal_lm", "data": {"path": str(REPO / "examples" / "data" / "causal.jsonl"), "max_seq_len": seq},
        "train": {"global_batch_size": 8, "precision": "bf16", "max_steps": 1, "attn_implementation": "eager"},
        "gpus": 1, "budget": "1GB", "cluster": {"hardware": "cpu"},
    }, tmp_path)
    return activation_constants(job, model_stats(job), hardware_profile(job))


@pytest.fixture(scope="module")
def two_sizes(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    try:
        small = planned_constants(tmp_path_factory.mktemp("s"), mp, h=256, heads=4)
        large = planned_constants(tmp_path_factory.mktemp("l"), mp, h=512, heads=8)
    finally:
        mp.undo()
    return small, large


def test_the_planner_plans_with_the_probe_not_the_papers_fallback(two_sizes):
    for c in two_sizes:
        assert c.source.startswith("measured on fake tensors"), c.source
        assert c.attention == "eager" and not c.probe_error


def test_block_cost_is_at_least_the_papers_and_at_most_twice_it(two_sizes):
    for c, h in zip(two_sizes, (256, 512), strict=True):
        assert KORT_PER_H <= c.block_bytes_per_token / h <= 2 * KORT_PER_H, c


def test_score_cost_per_head_and_position_is_at_least_the_papers_and_at_most_twice_it(two_sizes):
    for c, heads in zip(two_sizes, (4, 8), strict=True):
        assert KORT_PER_AS <= c.block_bytes_per_token_per_seq / heads <= 2 * KORT_PER_AS, c


def test_costs_scale_as_the_paper_says(two_sizes):
    """Doubling h and a doubles the per-token block cost and the per-position score cost, nothing else."""
    small, large = two_sizes
    assert large.block_bytes_per_token / small.block_bytes_per_token == pytest.approx(2.0, rel=0.02)
    assert large.block_bytes_per_token_per_seq / small.block_bytes_per_token_per_seq == pytest.approx(2.0, rel=0.02)
