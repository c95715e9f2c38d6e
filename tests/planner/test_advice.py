"""No-fit advice is re-planned: each suggestion, applied to the request, plans with the strategy and peak it
names; no budget past the card, no sequence past the model's context, more nodes when a node is not enough."""

import dataclasses

import pytest

from launcher.config.job import StrategyConfig
from launcher.errors import NoPlanError
from launcher.planner.advice import Suggestion
from launcher.planner.hardware import PROFILES
from launcher.planner.search import make_plan
from tests.planner.conftest import llama_stats

LLAMA_405B = llama_stats(num_params=405_853_388_800, blocks=126, h=16384, inter=53248, vocab=128256)


def suggestions(req) -> list[Suggestion]:
    with pytest.raises(NoPlanError) as e:
        make_plan(req)
    return e.value.no_fit.suggestions


# The request field each change sets, and the Suggestion value it is set to (None: the change is not a number).
CHANGED = {"budget": "budget_bytes", "gpus": "gpus_per_node", "nodes": "nodes", "seq_len": "seq_len",
           "host_ram": "host_ram_per_node_bytes", "nvme": None, "unpin": None, "micro_batch": None, "lora": None}


def check_replans(req, sugs):
    """Each suggestion, applied as it says, plans with the strategy, peak and step time it names."""
    assert sugs
    for s in sugs:
        field = CHANGED[s.change]
        assert list(s.replan) == ([field] if field else list(s.replan))
        if field:
            assert s.replan[field] == s.value
        plan = make_plan(dataclasses.replace(req, **s.replan))
        assert (plan.strategy.label(), plan.estimate.peak_bytes, plan.estimate.step_time_s) == \
            (s.label, s.peak_bytes, s.step_time_s)
    return sugs


def of(sugs, change):
    return [s for s in sugs if s.change == change]


def test_every_suggestion_plans_as_it_says(request_for):
    req = request_for(gpus_per_node=2, budget_bytes=20 * 10**9, seq_len=4096, host_ram_per_node_bytes=50 * 10**9)
    sugs = check_replans(req, suggestions(req))
    (budget,) = of(sugs, "budget")
    asked = budget.value
    assert req.budget_bytes < asked <= PROFILES["a100-80gb"].memory_bytes
    assert (budget.card, budget.card_bytes) == ("a100-80gb", PROFILES["a100-80gb"].memory_bytes)
    with pytest.raises(NoPlanError):  # and it is the smallest that fits, within the search's 1 %
        make_plan(dataclasses.replace(req, budget_bytes=int(asked * 0.98)))
    assert of(sugs, "nodes") and of(sugs, "host_ram")


def test_no_budget_past_the_card(request_for):
    # 405B on one 8-GPU node: not even the whole of an 80 GB card holds it, so no budget is offered.
    req = request_for(model=LLAMA_405B, budget_bytes=70 * 10**9, seq_len=4096, host_ram_per_node_bytes=2 * 10**12)
    sugs = check_replans(req, suggestions(req))
    assert not of(sugs, "budget")
    (nodes,) = of(sugs, "nodes")  # more nodes, each with its own host RAM
    assert nodes.value > 1 and nodes.world_size == nodes.value * req.gpus_per_node


def test_a_budget_that_fails_on_host_ram_is_not_offered(request_for):
    # One 40 GB card cannot hold 7B without offload, and offload is short of host RAM (40 GB holds the weight load,
    # 27 GB, not the offloaded optimizer): no budget within the card
    # fits, so none is offered (a budget judged on the device alone would be); more GPUs or host RAM would.
    req = request_for(gpus_per_node=1, global_batch_size=8, budget_bytes=20 * 10**9,
                      host_ram_per_node_bytes=40 * 10**9, hardware=PROFILES["a100-40gb"])
    sugs = check_replans(req, suggestions(req))
    assert not of(sugs, "budget")
    assert [s.value for s in of(sugs, "gpus")] == [8] and of(sugs, "host_ram")


def test_a_shorter_sequence_stays_within_the_context(request_for):
    m = dataclasses.replace(llama_stats(num_params=1_300_000_000, blocks=16, h=2048, inter=5504), max_positions=4096,
                            position_key="max_position_embeddings")
    # The exact levers stay off: with chunked loss or selective checkpointing this job fits at 4096 tokens.
    levers_off = StrategyConfig(loss_chunks=0, checkpoint_every=1, activation_offload=False,
                                optimizer_in_backward=False)
    # 28 GB: ZeRO-3 fits at 2048 tokens (FSDP2's one-rank plans carry their 5.2 GB of cached gradient blocks).
    req = request_for(model=m, gpus_per_node=1, global_batch_size=8, budget_bytes=28 * 10**9, seq_len=4096,
                      hardware=PROFILES["a100-40gb"], host_ram_per_node_bytes=8 * 10**9, pins=levers_off)
    # Unpinning the levers is a suggestion of its own (asserted below); the others are re-planned here.
    sugs = check_replans(req, [s for s in suggestions(req) if s.change != "unpin"])
    seqs = [s.value for s in of(sugs, "seq_len")]
    assert seqs and all(s <= 4096 for s in seqs)
    (unpin,) = of(suggestions(req), "unpin")
    assert "loss_chunks" in unpin.names and "chunked loss" in unpin.label
    assert make_plan(dataclasses.replace(req, pins=StrategyConfig())).strategy.label() == unpin.label
