"""No-fit advice is re-planned: each suggestion, applied to the request, plans with the strategy and peak it
names; no budget past the card, no sequence past the model's context, more nodes when a node is not enough."""

import dataclasses
import re

import pytest

from launcher.config.job import StrategyConfig
from launcher.errors import NoPlanError
from launcher.model.lora import LORA_RANK, lora_suggestion
from launcher.planner.hardware import PROFILES
from launcher.planner.search import make_plan
from launcher.units import format_bytes, parse_bytes
from tests.planner.conftest import llama_stats

LLAMA_405B = llama_stats(num_params=405_853_388_800, blocks=126, h=16384, inter=53248, vocab=128256)


def suggestions(req) -> list[str]:
    with pytest.raises(NoPlanError) as e:
        make_plan(req)
    return e.value.suggestions


def change_of(line: str, req) -> dict:
    """The request change a suggestion line names, read from the flag it gives."""
    for pattern, field, conv in [(r"\(--budget (\S+)\)", "budget_bytes", parse_bytes),
                                 (r"\(--gpus (\d+)\)", "gpus_per_node", int), (r"\(--nodes (\d+)\)", "nodes", int),
                                 (r"\(--seq-len (\d+)\)", "seq_len", int),
                                 (r"more host RAM per node: (.+?) \(", "host_ram_per_node_bytes", parse_bytes)]:
        hit = re.search(pattern, line)
        if hit:
            return {field: conv(hit.group(1).replace(" ", ""))}
    if line.startswith("NVMe offload"):
        return {"nvme_free_bytes": 10**15}
    if line.startswith("LoRA"):
        _, lora = lora_suggestion(req.model, LORA_RANK)
        return {"model": dataclasses.replace(req.model, trainable_params=lora, lora_params=lora)}
    raise AssertionError(f"no change read from {line!r}")


def check_replans(req, lines):
    assert lines and not any(ln.startswith("nothing within reach") for ln in lines)
    for line in lines:
        change = change_of(line, req)
        plan = make_plan(dataclasses.replace(req, **change))
        assert plan.strategy.label() in line and f"peak {format_bytes(plan.estimate.peak_bytes)} per GPU" in line
        assert f"{plan.estimate.step_time_s:.3g} s/step" in line
    return lines


def test_every_suggestion_plans_as_it_says(request_for):
    req = request_for(gpus_per_node=2, budget_bytes=20 * 10**9, seq_len=4096, host_ram_per_node_bytes=50 * 10**9)
    lines = check_replans(req, suggestions(req))
    budget = next(ln for ln in lines if ln.startswith("a budget of"))
    asked = change_of(budget, req)["budget_bytes"]
    assert req.budget_bytes < asked <= PROFILES["a100-80gb"].memory_bytes
    with pytest.raises(NoPlanError):  # and it is the smallest that fits, within the search's 1 %
        make_plan(dataclasses.replace(req, budget_bytes=int(asked * 0.98)))
    assert any("(--nodes " in ln for ln in lines) and any(ln.startswith("more host RAM") for ln in lines)


def test_no_budget_past_the_card(request_for):
    # 405B on one 8-GPU node: not even the whole of an 80 GB card holds it, so no budget is offered.
    req = request_for(model=LLAMA_405B, budget_bytes=70 * 10**9, seq_len=4096, host_ram_per_node_bytes=2 * 10**12)
    lines = check_replans(req, suggestions(req))
    assert not any(ln.startswith("a budget of") for ln in lines)
    nodes = next(ln for ln in lines if "(--nodes " in ln)  # more nodes, each with its own host RAM
    assert change_of(nodes, req)["nodes"] > 1


def test_a_budget_that_fails_on_host_ram_is_not_offered(request_for):
    # One 40 GB card cannot hold 7B without offload, and offload is short of host RAM (40 GB holds the weight load,
    # 27 GB, not the offloaded optimizer): no budget within the card
    # fits, so none is offered (a budget judged on the device alone would be); more GPUs or host RAM would.
    req = request_for(gpus_per_node=1, global_batch_size=8, budget_bytes=20 * 10**9,
                      host_ram_per_node_bytes=40 * 10**9, hardware=PROFILES["a100-40gb"])
    lines = check_replans(req, suggestions(req))
    assert not any(ln.startswith("a budget of") for ln in lines)
    assert any("(--gpus 8)" in ln for ln in lines) and any(ln.startswith("more host RAM") for ln in lines)


def test_a_shorter_sequence_stays_within_the_context(request_for):
    m = dataclasses.replace(llama_stats(num_params=1_300_000_000, blocks=16, h=2048, inter=5504), max_positions=4096,
                            position_key="max_position_embeddings")
    # The exact levers stay off: with chunked loss or selective checkpointing this job fits at 4096 tokens.
    levers_off = StrategyConfig(loss_chunks=0, checkpoint_every=1, activation_offload=False, optimizer_in_backward=False)
    req = request_for(model=m, gpus_per_node=1, global_batch_size=8, budget_bytes=26 * 10**9, seq_len=4096,
                      hardware=PROFILES["a100-40gb"], host_ram_per_node_bytes=8 * 10**9, pins=levers_off)
    # Unpinning the levers is a suggestion of its own (asserted below); the others are re-planned here.
    lines = check_replans(req, [ln for ln in suggestions(req) if not ln.startswith("unpinning ")])
    seqs = [change_of(ln, req)["seq_len"] for ln in lines if "(--seq-len " in ln]
    assert seqs and all(s <= 4096 for s in seqs)
    unpin = next(ln for ln in suggestions(req) if ln.startswith("unpinning "))
    assert "loss_chunks" in unpin and "chunked loss" in unpin
    assert make_plan(dataclasses.replace(req, pins=StrategyConfig())).strategy.label() in unpin
