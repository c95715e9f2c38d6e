"""FSDP2's side-stream pools on CUDA (launcher.planner.cuda_overhead [POOL]): the gradient shards' blocks cached by the
reduce-scatter stream and the all-gather outputs' by the copy-in stream count on the reserved basis, per moment."""

import dataclasses
import json

import pytest

from launcher.planner.cuda_overhead import peak_on_basis
from launcher.planner.hardware import PROFILES
from launcher.planner.memory import MemoryInputs, analytic_constants, estimate_memory
from launcher.planner.plan import Buckets, Strategy
from tests.planner.conftest import llama_stats

BUCKETS = Buckets(reduce_bucket_size=int(1e6), allgather_bucket_size=int(1e6), stage3_prefetch_bucket_size=0,
                  stage3_max_live_parameters=0, stage3_param_persistence_threshold=0)
M = llama_stats()



def lift_backward_pool(monkeypatch) -> None:
    """FSDP2's states with a 50 GB side-stream pool at the backward moment, large enough to make it the peak."""
    import launcher.engines.fsdp.spec as fsdp

    real = fsdp.fsdp_states

    def lifted(inp, s):
        st = real(inp, s)
        st.side_stream_cached = {"backward": 50e9}
        return st

    monkeypatch.setattr(fsdp, "fsdp_states", lifted)

def plan(profile="h100-80gb", gpus=8, **kw):
    inp = MemoryInputs(model=M, world_size=gpus, gpus_per_node=gpus, nodes=1, seq_len=2048, precision="bf16",
                       optimizer="adamw", hardware=PROFILES[profile], activations=analytic_constants(M, "bf16"))
    base = dict(engine="fsdp", zero_stage=None, fsdp_reshard_after_forward=True, offload_optimizer="none",
                offload_params="none", micro_batch_size=1, grad_accum_steps=1, activation_checkpointing=True)
    return estimate_memory(inp, Strategy.from_json(base | kw), BUCKETS)


def ag_pool(gpus: int) -> float:
    """The root's all-gather output (embeddings and head, bf16) beside the first block's: the pool's size."""
    return 0.0 if gpus == 1 else 2 * max(M.non_block_params, M.block_params) + 2 * M.block_params


def test_backward_starts_with_every_gradient_shard_cached_on_the_reduce_scatter_stream():
    est = plan()
    grads = 4 * M.num_params / 8  # fp32 shards (reduce_dtype), none allocated after zero_grad(set_to_none=True)
    pools = est.moment_stream_pool_bytes
    # the last block's all-gather output is live at the backward start (States.buffers): the rest of the pool cached
    assert pools["backward"] == pytest.approx(grads + ag_pool(8) - 2 * M.block_params, rel=1e-9)
    assert pools["step"] == pytest.approx(ag_pool(8), rel=1e-9)  # the gradients are live: their blocks are allocated
    assert est.overhead["stream_pools"] == pools[est.peak_moment]
    # in reserved, not allocated: the allocated basis leaves it out, the reserved one keeps it
    tensors = est.peak_bytes - est.breakdown["reserve"]
    allocated = peak_on_basis(tensors, est.overhead, "cuda_allocated")
    assert peak_on_basis(tensors, est.overhead, "cuda_reserved") - allocated == (
        est.overhead["allocator_reserve"] + est.overhead["stream_pools"])


def test_the_peak_is_the_largest_moment_on_the_verdict_basis(monkeypatch):
    est = plan()
    assert est.peak_moment == max(est.moment_bytes, key=est.moment_bytes.get)
    assert est.peak_bytes == est.moment_bytes[est.peak_moment]
    # A pool large enough to lift the backward moment above the tensor peak (the end of backward here) moves the
    # peak there: the moment is chosen on the verdict basis, not by tensors alone.
    lift_backward_pool(monkeypatch)
    est = plan()
    assert est.peak_moment == "backward" and est.overhead["stream_pools"] == int(50e9)
    assert est.peak_bytes == est.moment_bytes["backward"] == max(est.moment_bytes.values())


def test_accumulation_keeps_the_gradients_live_and_caches_one_units_shard():
    est = plan(grad_accum_steps=4)
    unit = max(M.non_block_params, M.block_params)
    for moment in ("backward", "backward_end", "step"):
        live_ag = 2 * M.block_params if moment == "backward" else 0
        assert est.moment_stream_pool_bytes[moment] == pytest.approx(4 * unit / 8 + ag_pool(8) - live_ag, rel=1e-9)


def test_one_rank_has_no_all_gather_pool_and_cpu_offload_keeps_no_gradients_on_the_device():
    one = plan(gpus=1)
    assert one.moment_stream_pool_bytes["backward"] == pytest.approx(4 * M.num_params, rel=1e-9)
    off = plan(offload_params="cpu")
    shards = 4 * (M.non_block_params + M.block_params) / 8  # the root's and one block's transient outputs
    assert off.moment_stream_pool_bytes["step"] == pytest.approx(shards + ag_pool(8), rel=1e-9)


def test_cpu_ranks_and_deepspeed_have_none():
    assert plan("cpu").moment_stream_pool_bytes == {} and "stream_pools" not in plan("cpu").overhead
    ds = plan(engine="deepspeed", zero_stage=2, fsdp_reshard_after_forward=False)
    assert ds.moment_stream_pool_bytes == {} and "stream_pools" not in ds.overhead


def test_plan_json_round_trips_the_pools():
    from launcher.planner.plan import Estimate

    est = plan()
    e = Estimate.of(est, {"compute": 1.0})
    fields = {f.name for f in dataclasses.fields(e)}
    assert "moment_stream_pool_bytes" in fields and e.moment_stream_pool_bytes == est.moment_stream_pool_bytes


def test_a_basis_without_the_pool_is_predicted_at_the_largest_tensor_moment(monkeypatch):
    # A GPU plan read on CPU ranks (tensor bytes) or by allocated bytes counts no pool: where the pool made the
    # backward moment the verdict's peak, those bases still peak where the tensors do (the end of backward here).
    from launcher.planner.plan import Estimate, Plan
    from launcher.records.report import predicted_on_basis
    from tests.records.test_report import plan_of

    base = plan()
    assert base.peak_moment == "backward_end"  # also the largest tensor moment (no pool lifts another)
    tensors_at_end = base.peak_bytes - base.breakdown["reserve"]
    lift_backward_pool(monkeypatch)
    est = plan()
    assert est.peak_moment == "backward" and est.peak_bytes - est.breakdown["reserve"] < tensors_at_end
    p = dataclasses.replace(plan_of(10**12, est.peak_bytes, est.breakdown, basis=est.basis, overhead=est.overhead),
                            estimate=Estimate.of(est, {"compute": 1.0}))
    p = Plan.from_json(json.loads(json.dumps(p.to_json())))  # plan.json keeps it
    assert predicted_on_basis(p, "cpu_tensor_bytes") == tensors_at_end
    assert predicted_on_basis(p, "cuda_allocated") == tensors_at_end + est.overhead["cublas_workspace"]
    assert predicted_on_basis(p, est.basis) == est.peak_bytes
    assert est.tensor_peak_bytes == tensors_at_end and base.tensor_peak_bytes == 0
