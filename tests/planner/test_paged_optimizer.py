"""bitsandbytes' paged 8-bit AdamW (Strategy.low_memory_optimizer "paged_adamw8bit"): its state in host memory,
stepped on the device (launcher.planner.terms.paged_state_bytes, paged_state_s), and when the planner keeps it there.

The published figure judged here: torchtune's README, "Memory and training speed" (github.com/pytorch/torchtune,
README.md, Llama 3.1 rows): Llama 3.1 8B full fine-tune on 1x RTX 4090, 1650 tokens/s at batch 2 packed to 2048
tokens, torch.compile on, its full_finetune_single_device recipe (llama3_1/8B_full_single_device.yaml: bf16,
PagedAdamW8bit, optimizer_in_bwd). 4096 tokens / 1650 tokens/s = 2.48 s per step. Nothing is fitted to it.
"""

import dataclasses

import pytest

from launcher.engines.fsdp.memory import fsdp_states
from launcher.planner.cost import step_time_terms
from launcher.planner.hardware import PROFILES
from launcher.planner.memory import MemoryInputs, analytic_constants
from launcher.planner.plan import Strategy
from launcher.planner.search import PlanRequest, make_plan
from launcher.planner.terms import (
    BNB_MIN_8BIT_NUMEL,
    low_bit_tensor_bytes,
    optimizer_state_bytes,
    paged_state_bytes,
    paged_state_s,
)
from launcher.units import GB
from tests.planner.conftest import llama_stats

TORCHTUNE_8B_4090_S = 2 * 2048 / 1650
"""torchtune's published step of the 8B full fine-tune on one RTX 4090 (module docstring): 2.48 s."""
EVERY_LEVER = ("adamw8bit", "adamw4bit", "adafactor", "pure_bf16")


def llama31_8b():
    """Llama-3.1-8B's shapes: 32 blocks of q, k, v, o (8 KV heads of 128) and the gated MLP; untied 128k tables."""
    h, inter, kv, vocab = 4096, 14336, 1024, 128256
    linears = [[h, h], [kv, h], [kv, h], [h, h], [inter, h], [inter, h], [h, inter]]
    m = llama_stats(num_params=8_030_261_248, blocks=32, h=h, inter=inter, vocab=vocab)
    return dataclasses.replace(m, num_kv_heads=8, head_dim=128, block_linear_shapes=linears)


def _inp(m, hw="rtx4090", precision="bf16"):
    return MemoryInputs(model=m, world_size=1, gpus_per_node=1, nodes=1, seq_len=2048, precision=precision,
                        optimizer="adamw", hardware=PROFILES[hw], activations=analytic_constants(m, precision))


def _s(opt="paged_adamw8bit", **kw):
    base = dict(engine="fsdp", zero_stage=None, fsdp_reshard_after_forward=True, offload_optimizer="none",
                offload_params="none", micro_batch_size=2, grad_accum_steps=1, activation_checkpointing=True,
                low_memory_optimizer=opt, pure_bf16=True, optimizer_in_backward=True, loss_chunks=8)
    base.update(kw)
    return Strategy.from_json(base)


def test_the_state_is_bitsandbytes_codes_and_block_scales_kept_in_host_memory():
    m, inp = llama31_8b(), _inp(llama31_8b())
    device, host, working = paged_state_bytes(inp, _s())
    # Optimizer2State.init_state: a uint8 code per element per moment and one fp32 absmax per block of 256; the
    # tables and every block linear are over 1e5 elements, so paged; the norms (65 x 4096) stay on the device.
    linears = sum(o * i for o, i in m.block_linear_shapes)
    paged = 2 * m.vocab_size * m.hidden_size + m.num_blocks * linears
    assert host == pytest.approx(2 * (1 + 4 / 256) * paged, rel=1e-4)
    assert 16.2 * GB < host < 16.4 * GB  # the 2 x 1 byte per parameter plus the scales
    assert device == 8 * (m.num_params - paged) < 3e6  # the 1-D tensors' state, counted at fp32 moments
    # One table's pages are on the device while it steps: 2 x 525M codes and their scales.
    assert working == low_bit_tensor_bytes("paged_adamw8bit", m.vocab_size * m.hidden_size) == pytest.approx(
        2 * (1 + 4 / 256) * m.vocab_size * m.hidden_size)
    assert device + host == pytest.approx(optimizer_state_bytes(inp, _s(), 1), rel=1e-3)
    # bitsandbytes keeps fp32 moments under 4096 elements (min_8bit_size), whatever the weights' dtype.
    assert low_bit_tensor_bytes("paged_adamw8bit", BNB_MIN_8BIT_NUMEL - 1) == 8 * (BNB_MIN_8BIT_NUMEL - 1)


def test_fsdp_states_put_the_pages_on_the_host_and_their_working_set_where_the_step_runs():
    inp = _inp(llama31_8b())
    device, host, working = paged_state_bytes(inp, _s())
    plain = fsdp_states(inp, _s("adamw8bit"))  # torchao's 8-bit state, all of it on the device
    for in_bwd in (True, False):
        st = fsdp_states(inp, _s(optimizer_in_backward=in_bwd))
        assert (st.optimizer, st.host) == (device, host)
        assert plain.optimizer > 16 * GB > st.optimizer
    in_bwd, at_step = fsdp_states(inp, _s()), fsdp_states(inp, _s(optimizer_in_backward=False))
    base = fsdp_states(inp, _s("none", optimizer_in_backward=True))
    assert in_bwd.backward_end_extra - base.backward_end_extra == pytest.approx(working)
    assert at_step.step_extra - fsdp_states(inp, _s("none", optimizer_in_backward=False)).step_extra == \
        pytest.approx(working)
    # CPU ranks: bitsandbytes does not page there; the state is device memory, which is the host.
    cpu = _inp(llama31_8b(), hw="cpu")
    assert paged_state_bytes(cpu, _s())[1:] == (0.0, 0.0) and paged_state_s(cpu, _s()) == 0.0


def test_paging_moves_the_state_both_ways_over_the_host_link_each_step():
    inp = _inp(llama31_8b())
    host = paged_state_bytes(inp, _s())[1]
    assert paged_state_s(inp, _s()) == pytest.approx(2 * host / PROFILES["rtx4090"].host_link_bw)
    terms = step_time_terms(inp, _s(), 0)
    no_paging = step_time_terms(inp, _s("adamw8bit"), 0)
    assert terms["offload"] - no_paging["offload"] == pytest.approx(paged_state_s(inp, _s()))
    assert terms["optimizer"] == 0.0  # stepped on the device by bitsandbytes' fused kernel
    assert paged_state_s(inp, _s("adamw8bit")) == 0.0


def test_the_8b_on_one_4090_steps_within_twice_torchtunes_published_time():
    # The torchtune recipe's settings: pure bf16, the step in backward, the paged 8-bit AdamW, activation
    # checkpointing, batch 2 x 2048. Within 2x of 2.48 s either way (the bar), and faster than the plan that
    # steps the state on the host's cores (FSDP2's CPU offload, the plan the issue saw at 15.3 s).
    inp = _inp(llama31_8b())
    paged = sum(step_time_terms(inp, _s(), 0).values())
    assert TORCHTUNE_8B_4090_S / 2 < paged < 2 * TORCHTUNE_8B_4090_S, paged
    cpu_offload = _s("none", pure_bf16=False, offload_optimizer="cpu", offload_params="cpu")
    assert sum(step_time_terms(inp, cpu_offload, 0).values()) > 2 * paged


def _request(m, **kw):
    base = dict(model=m, gpus_per_node=1, nodes=1, budget_bytes=24 * GB, seq_len=4096, global_batch_size=1,
                precision="bf16", optimizer="adamw", hardware=PROFILES["l4"], host_ram_per_node_bytes=128 * GB,
                allow_levers=EVERY_LEVER, max_grad_norm=1.0)
    base.update(kw)
    return PlanRequest(**base)


def llama32_3b():
    """Llama-3.2-3B's shapes (examples/llama-3b-24gb.yaml): 28 blocks, 8 KV heads, one tied 128k table."""
    h, inter, kv, vocab = 3072, 8192, 1024, 128256
    linears = [[h, h], [kv, h], [kv, h], [h, h], [inter, h], [inter, h], [h, inter]]
    block = sum(o * i for o, i in linears) + 2 * h
    n = 28 * block + vocab * h + h
    m = llama_stats(num_params=n, blocks=28, h=h, inter=inter, vocab=vocab)
    return dataclasses.replace(m, num_kv_heads=8, head_dim=128, block_linear_shapes=linears, tied_embeddings=True,
                               block_params=block, non_block_params=n - 28 * block)


def test_one_24gb_card_keeps_the_state_in_host_memory_where_the_device_cannot_hold_it():
    # A 3B full fine-tune on one 24 GB card at a 20 GB budget: Adam's state (26 GB) fits nowhere on it, torchao's 8-
    # or 4-bit state (6.5 / 3.3 GB) not beside the bf16 weights and activations even with the step in backward (at
    # 24 GB the 4-bit state does, issue 37 §3); the plan keeps the 8-bit state on the host and steps it on the GPU,
    # faster than DeepSpeed's CPU Adam.
    plan = make_plan(_request(llama32_3b(), budget_bytes=20 * GB))
    s = plan.strategy
    assert (s.low_memory_optimizer, s.pure_bf16) == ("paged_adamw8bit", True), plan.strategy.label
    assert plan.estimate.breakdown["optimizer"] < 2e6  # the norms' state; 6.5 GB of pages on the host
    assert plan.estimate.host_bytes_per_node > 6 * GB
    # bitsandbytes' kernel rounds the bf16 weights to nearest, not stochastically as pure bf16's other steps: said.
    note = next(n for n in plan.math_notes if n.startswith("pure bf16"))
    assert "paged_adamw8bit" in note and "to nearest" in note and "stochastic" not in note
    # Without the permission it steps the job's AdamW on the host, slower.
    held = make_plan(_request(llama32_3b(), budget_bytes=20 * GB, allow_levers=()))
    assert held.strategy.low_memory_optimizer == "none" and held.estimate.step_time_s > plan.estimate.step_time_s


def test_offered_on_one_rank_only_and_refused_pinned_on_more():
    from launcher.config.job import StrategyConfig
    from launcher.errors import ConfigError
    from launcher.levers import LOW_MEMORY_OPTIMIZER
    from launcher.planner.candidates import candidates

    m = llama32_3b()
    assert "paged_adamw8bit" in LOW_MEMORY_OPTIMIZER.values(_request(m))
    assert "paged_adamw8bit" not in LOW_MEMORY_OPTIMIZER.values(_request(m, gpus_per_node=2))
    # Its permission is adamw8bit's: the same 8-bit AdamW math, its state elsewhere.
    assert LOW_MEMORY_OPTIMIZER.permit_word("paged_adamw8bit") == "adamw8bit"
    pinned = _request(m, gpus_per_node=2, global_batch_size=2,
                      pins=StrategyConfig(low_memory_optimizer="paged_adamw8bit"))
    with pytest.raises(ConfigError, match="paged_adamw8bit .* one rank only, but the job has 2"):
        candidates(pinned)
    # Never with FSDP2's CPU offload (the step is on the host there) nor on DeepSpeed; on the plain engine's one rank.
    found = {(c.engine, c.layout.offload_params) for c in candidates(_request(m))
             if c.low_memory_optimizer == "paged_adamw8bit"}
    assert found == {("fsdp", "none"), ("plain", "none")}


def test_the_8b_example_plans_the_paged_state_on_the_plain_engine_within_twice_published(capsys):
    # Issue 37's done-when, unpinned: examples/llama-8b-24gb.yaml (every lossy lever allowed) on one 24 GB 4090 takes
    # the plain engine (no FSDP2 root or block beside 16 GB of bf16 weights) with the state in host memory, and the
    # plan says where the state is.
    from pathlib import Path

    from launcher.cli.main import main

    example = Path(__file__).resolve().parents[2] / "examples" / "llama-8b-24gb.yaml"
    assert main(["plan", str(example)]) == 0
    out = capsys.readouterr().out
    assert "plain single device" in out and "paged_adamw8bit's state in host memory, stepped on the device" in out
    step = float(out.split("step time   ")[1].split(" s predicted")[0])
    assert TORCHTUNE_8B_4090_S / 2 <= step <= 2 * TORCHTUNE_8B_4090_S
