"""The host RAM the weight load needs is what launcher.worker.loading does: one fp32 copy on rank 0's node, not
one per rank (ZeRO-3: one largest layer per rank inside zero.Init)."""

import pytest

from launcher.planner.hardware import PROFILES
from launcher.planner.memory import MemoryInputs, analytic_constants, estimate_memory, export_host_bytes
from launcher.planner.plan import Strategy
from launcher.planner.search import PlanRequest, make_plan, size_buckets
from tests.planner.test_advice import LLAMA_405B


def load_host_bytes(engine, stage, gpus=8):
    m = LLAMA_405B
    inp = MemoryInputs(model=m, world_size=gpus * 4, gpus_per_node=gpus, nodes=4, seq_len=4096, precision="bf16",
                       optimizer="adamw", hardware=PROFILES["h100-80gb"], activations=analytic_constants(m, "bf16"))
    s = Strategy.from_json(dict(engine=engine, zero_stage=stage,
                                fsdp_reshard_after_forward=True if engine == "fsdp" else None, offload_optimizer="none",
                                offload_params="none", micro_batch_size=1, grad_accum_steps=1,
                                activation_checkpointing=True))
    req = PlanRequest(model=m, gpus_per_node=gpus, nodes=4, budget_bytes=80 * 10**9, seq_len=4096,
                      global_batch_size=32 * gpus, precision="bf16", optimizer="adamw", hardware=PROFILES["h100-80gb"])
    return estimate_memory(inp, s, size_buckets(req)).host_bytes_per_node


@pytest.mark.parametrize(("engine", "stage"), [("deepspeed", 0), ("deepspeed", 2), ("fsdp", None)])
def test_405b_loads_one_copy_per_node_not_one_per_rank(engine, stage):
    one_copy = 4 * LLAMA_405B.num_params  # 1.62 TB: rank 0's fp32 model
    assert load_host_bytes(engine, stage) == one_copy  # was 8 x that (13 TB) for ZeRO-0/1/2
    assert load_host_bytes(engine, stage, gpus=4) == one_copy  # does not grow with ranks per node


def test_zero3_loads_one_layer_per_rank_inside_zero_init():
    # The load holds one layer per rank (8 x 4 x largest layer, 67 GB); the export at the end of the run holds rank
    # 0's bf16 copy of the whole model (816 GB), which is the node's host peak (tests/planner/test_export_host_ram).
    load = 8 * 4 * LLAMA_405B.largest_layer_params
    assert load_host_bytes("deepspeed", 3) == max(load, export_host_bytes(LLAMA_405B, "bf16")) > load


def test_405b_fsdp_plans_on_8_gpu_nodes_with_2tb_of_host_ram():
    req = PlanRequest(model=LLAMA_405B, gpus_per_node=8, nodes=16, budget_bytes=80 * 10**9, seq_len=4096,
                      global_batch_size=128, precision="bf16", optimizer="adamw", hardware=PROFILES["h100-80gb"],
                      host_ram_per_node_bytes=2 * 10**12)
    plan = make_plan(req)
    assert plan.estimate.host_bytes_per_node <= 2 * 10**12
