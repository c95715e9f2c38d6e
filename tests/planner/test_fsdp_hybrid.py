"""FSDP2 hybrid sharding (HSDP): shard within a node, replicate across nodes."""


import pytest

from launcher.config.job import StrategyConfig
from launcher.engines.fsdp.memory import fsdp_states
from launcher.errors import ConfigError
from launcher.planner.cost import communication
from launcher.planner.hardware import PROFILES
from launcher.planner.memory import MemoryInputs, analytic_constants, estimate_memory
from launcher.planner.plan import Plan, Strategy
from launcher.planner.search import candidates, make_plan, size_buckets


def fsdp(sharding: str, reshard: bool = True, offload: str = "none", accum: int = 1) -> Strategy:
    return Strategy.from_json(dict(engine="fsdp", zero_stage=None, fsdp_reshard_after_forward=reshard,
                                   fsdp_sharding=sharding, offload_optimizer=offload, offload_params=offload,
                                   micro_batch_size=1, grad_accum_steps=accum, activation_checkpointing=True))


def inputs(model, gpus: int, nodes: int) -> MemoryInputs:
    return MemoryInputs(model=model, world_size=gpus * nodes, gpus_per_node=gpus, nodes=nodes, seq_len=2048,
                        precision="bf16", optimizer="adamw", hardware=PROFILES["a100-80gb"],
                        activations=analytic_constants(model, "bf16"))


@pytest.mark.parametrize("reshard", [True, False])
@pytest.mark.parametrize("offload", ["none", "cpu"])
@pytest.mark.parametrize("accum", [1, 4])
def test_hybrid_states_are_full_shard_at_world_gpus_per_node(request_for, reshard, offload, accum):
    m = request_for().model
    buckets = size_buckets(request_for())
    hybrid = estimate_memory(inputs(m, gpus=8, nodes=4), fsdp("hybrid", reshard, offload, accum), buckets)
    one_node = estimate_memory(inputs(m, gpus=8, nodes=1), fsdp("full", reshard, offload, accum), buckets)
    tensors = {k: v for k, v in hybrid.breakdown.items() if k != "reserve"}
    assert tensors == {k: v for k, v in one_node.breakdown.items() if k != "reserve"}
    assert hybrid.host_bytes_per_node == one_node.host_bytes_per_node
    # Outside the allocator the 2-D mesh's replicate and shard groups are two more NCCL communicators.
    extra = 2 * inputs(m, gpus=8, nodes=4).hardware.nccl_extra_comm_bytes
    assert hybrid.overhead["nccl_communicators"] - one_node.overhead["nccl_communicators"] == extra > 0
    assert hybrid.peak_bytes - one_node.peak_bytes == extra
    # ... and not what full sharding over all 32 ranks holds.
    full = estimate_memory(inputs(m, gpus=8, nodes=4), fsdp("full", reshard, offload, accum), buckets)
    if offload == "none":
        # The shards (the breakdown's params also hold the gathered copies, which do not shrink with the world).
        sharded = {name: fsdp_states(inputs(m, gpus=8, nodes=4), fsdp(name, reshard, offload, accum)).params
                   for name in ("full", "hybrid")}
        assert sharded["full"] * 4 == pytest.approx(sharded["hybrid"], abs=4)
        assert full.breakdown["params"] < hybrid.breakdown["params"]
    else:
        assert full.host_bytes_per_node < hybrid.host_bytes_per_node


def test_hybrid_is_never_a_candidate_on_one_node(request_for):
    assert {c.layout.fsdp_sharding for c in candidates(request_for()) if c.engine == "fsdp"} == {"full"}
    two = {c.layout.fsdp_sharding for c in candidates(request_for(nodes=2)) if c.engine == "fsdp"}
    assert two == {"full", "hybrid"}
    assert all(not hasattr(c.layout, "fsdp_sharding")
               for c in candidates(request_for(nodes=2)) if c.engine == "deepspeed")
    with pytest.raises(ConfigError, match="strategy.fsdp_sharding: 'hybrid' .* runs on 1 node"):
        candidates(request_for(pins=StrategyConfig(fsdp_sharding="hybrid")))


def test_pinning_the_sharding_pins_fsdp(request_for):
    cands = candidates(request_for(nodes=2, pins=StrategyConfig(fsdp_sharding="hybrid")))
    assert cands and all(c.engine == "fsdp" and c.layout.fsdp_sharding == "hybrid" for c in cands)


def test_search_picks_hybrid_where_it_wins_and_full_where_only_it_fits(request_for):
    pins = StrategyConfig(engine="fsdp")
    roomy = make_plan(request_for(nodes=2, pins=pins, budget_bytes=80 * 10**9, global_batch_size=16))
    # The same bytes cross the network either way at 1/N, but hybrid sends only a 1/8 shard of the gradients
    # over it and gathers over NVLink: 7B on 2 x 8 A100s at one sequence per rank, where full sharding's
    # collectives outlast the compute they hide behind (with more compute both hide them: a tie).
    assert roomy.strategy.layout.fsdp_sharding == "hybrid", roomy.strategy.label()
    rejected_full = [r for r in roomy.rejected if "hybrid" not in r.label]
    assert rejected_full and all(r.step_time_s > roomy.estimate.step_time_s for r in rejected_full)

    # Hybrid holds twice full sharding's states at 2 nodes: a budget between the two leaves only full.
    tight_budget = 15 * 10**9
    tight = make_plan(request_for(nodes=2, pins=pins, budget_bytes=tight_budget))
    assert tight.strategy.layout.fsdp_sharding == "full", tight.strategy.label()
    with pytest.raises(Exception, match="no plan fits"):
        make_plan(request_for(nodes=2, pins=StrategyConfig(engine="fsdp", fsdp_sharding="hybrid",
                                                           offload_params="none", offload_optimizer="none"),
                              budget_bytes=tight_budget))


def test_hybrid_moves_only_a_gradient_shard_between_nodes(request_for):
    m = request_for().model
    inp = inputs(m, gpus=8, nodes=4)
    hybrid, full = communication(inp, fsdp("hybrid"), 10**6), communication(inp, fsdp("full"), 10**6)
    w = 2
    # One all-reduce (2·(N-1)/N) of this rank's 1/8 shard of the bf16 gradients, across the 4 nodes.
    assert hybrid.inter_node_bytes == pytest.approx(2 * (3 / 4) * w * m.trainable_params / 8)
    # Inside the node: gather forward and backward, reduce-scatter: 3 payloads at (g-1)/g.
    assert hybrid.intra_node_bytes == pytest.approx(3 * w * m.num_params * 7 / 8)
    # Full sharding spans the nodes with all of it.
    assert full.intra_node_bytes == 0
    assert full.inter_node_bytes == pytest.approx(3 * w * m.num_params * 31 / 32)
    assert hybrid.calls > full.calls  # the cross-node all-reduce is one more collective per unit


def test_plan_json_carries_the_sharding_and_old_plans_load(request_for):
    plan = make_plan(request_for(nodes=2, pins=StrategyConfig(engine="fsdp", fsdp_sharding="hybrid")))
    d = plan.to_json()
    assert d["fsdp_sharding"] == "hybrid" and "hybrid" in d["label"]
    assert Plan.from_json(d).strategy == plan.strategy
    old = {k: v for k, v in d.items() if k != "fsdp_sharding"}  # a plan.json from before the key existed
    assert Plan.from_json(old).strategy == Strategy.from_json(plan.strategy.to_json() | dict(fsdp_sharding=None))
