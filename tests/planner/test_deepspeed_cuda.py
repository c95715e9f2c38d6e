"""DeepSpeed's CUDA paths in the memory model (docs/memory-model.md, "DeepSpeed on CUDA"): ZeRO-1/2 flattening
through host memory when the device lacks room, and ZeRO-3 stepping one optimizer sub-group at a time."""

import dataclasses

from launcher.engines.deepspeed.memory import cuda_init_bytes, deepspeed_states, sub_group_elems
from launcher.planner.buckets import size_buckets
from launcher.planner.hardware import PROFILES
from launcher.planner.memory import estimate_memory
from launcher.planner.plan import Strategy
from launcher.planner.scoring import memory_inputs
from launcher.planner.search import PlanRequest, make_plan
from launcher.units import GB
from tests.planner.conftest import llama_stats

LLAMA70B = llama_stats(num_params=68_976_648_192, blocks=80, h=8192, inter=28672)


def request(model, *, nodes, budget, **kw) -> PlanRequest:
    return PlanRequest(model=model, gpus_per_node=8, nodes=nodes, budget_bytes=int(budget), seq_len=2048,
                       global_batch_size=64 * nodes, precision="bf16", optimizer="adamw",
                       hardware=PROFILES["h100-80gb"], host_ram_per_node_bytes=10**13, **kw)


def strategy(stage, **kw) -> Strategy:
    base = dict(engine="deepspeed", zero_stage=stage, fsdp_reshard_after_forward=None, offload_optimizer="none",
                offload_params="none", micro_batch_size=1, grad_accum_steps=8, activation_checkpointing=True)
    return Strategy.from_json({**base, **kw})


def moments(req, s, buckets=None):
    return estimate_memory(memory_inputs(req), s, buckets or size_buckets(req)).moment_bytes


def test_7b_zero2_on_64_h100s_flattens_through_the_host_when_the_budget_has_no_room_for_the_copy():
    # Llama-2 7B (Ψ = 6.74e9), bf16, 64 ranks. Before: init counted the model and its flat copy on the device,
    # 2Ψ + 2Ψ = 26.95 GB (+ CUDA overhead: 29.94 GB), above the 18.11 GB step, so a 24 GB budget was refused.
    # stage_1_and_2.py flattens on the device only if available_memory() >= the flat buffer; here it cannot, so
    # the parameters go to the host, are flattened there and come back: the device holds 2Ψ = 13.48 GB.
    req = request(llama_stats(), nodes=8, budget=24 * GB)
    m = moments(req, strategy(2))
    # Then deepspeed.initialize's master partition and its zero gradient (2 x 4Ψ/64) join the model there.
    assert cuda_init_bytes(memory_inputs(req), strategy(2)) == 2 * llama_stats().num_params \
        + 2 * 4 * llama_stats().num_params / 64
    # Since the first GPU check each moment also holds 1.15 GB more outside the allocator (the kernels and
    # DeepSpeed's two NCCL communicators, launcher.planner.cuda_overhead): 13.48 GB + context, cuBLAS, kernels,
    # NCCL and allocator reserve; at init no cuBLAS workspace or kernels yet (cuda_overhead.absent_at: 0.22 GB);
    # with the master partition and its zero gradient (0.84 GB, and their allocator reserve).
    assert round(m["init"] / GB, 2) == 17.22
    assert round(m["step"] / GB, 2) == 19.26
    assert m["init"] < m["step"]
    plan = make_plan(dataclasses.replace(req, pins=dataclasses.replace(req.pins, zero_stage=2)))
    assert plan.strategy.layout.zero_stage == 2 and plan.estimate.peak_bytes <= plan.usable_bytes


def test_with_room_for_the_copy_deepspeed_flattens_on_the_device():
    # 80 GB: 26.95 GB + overhead fits, so DeepSpeed flattens on the device and the init moment holds both copies.
    req = request(llama_stats(), nodes=8, budget=80 * GB)
    # 29.94 + 1.15 GB outside the allocator, less the cuBLAS workspace and kernels not there yet at init (0.22 GB).
    assert round(moments(req, strategy(2))["init"] / GB, 2) == 30.87
    # The same for ZeRO-1 (the same optimizer class); a LoRA run's flat copy is only its adapters.
    assert round(moments(req, strategy(1))["init"] / GB, 2) == 30.87


def test_cpu_ranks_keep_the_measured_init():
    req = dataclasses.replace(request(llama_stats(), nodes=1, budget=400 * GB), hardware=PROFILES["cpu"])
    # Rank 0's fp32 build on the host, which is the device: 4Ψ (above 2Ψ + 2Ψ_t), as measured, whatever the room.
    assert moments(req, strategy(2))["init"] == 4 * llama_stats().num_params


def test_zero0_on_cuda_flattens_nothing_and_clones_fp32_masters():
    # engine.py: bf16 ZeRO-0 with torch's AdamW gets FP16_UnfusedOptimizer, which clones an fp32 copy per trainable
    # parameter; fp32 ZeRO-0 keeps the client optimizer as it is. Before: 2Ψ + 2Ψ_t (a flat copy) for both.
    req = request(llama_stats(), nodes=1, budget=80 * GB)
    psi = llama_stats().num_params
    assert cuda_init_bytes(memory_inputs(req), strategy(0)) == 2 * psi + 4 * psi
    fp32 = dataclasses.replace(req, precision="fp32")
    assert cuda_init_bytes(memory_inputs(fp32), strategy(0)) == 4 * psi


def test_70b_zero3_on_32_h100s_steps_one_sub_group_at_a_time():
    # Llama-2 70B (Ψ = 6.90e10) over 32 ranks: a 2.16e9-element partition. Before: three fp32 partition-sized
    # tensors, 3 x 4 x 2.16e9 = 25.9 GB at the step (66.83 GB in all). stage3.py step() prepares, steps and frees
    # one sub-group's fp32 gradient at a time: with DeepSpeed's 1e9 sub-groups, at most 1e9 + ceil(L/N) elements
    # (L = the 262M-element embedding, 8.2M per rank): 3 x 4 x 1.0082e9 = 12.10 GB, 51.96 GB in all.
    req = request(LLAMA70B, nodes=4, budget=80 * GB)
    buckets = size_buckets(req)
    assert buckets.sub_group_size == 1_000_000_000
    inp = memory_inputs(req)
    assert sub_group_elems(inp, buckets.sub_group_size) == 1_000_000_000 + 32000 * 8192 // 32
    st = deepspeed_states(inp, strategy(3), buckets)
    assert round(st.step_extra / GB, 2) == 12.10
    assert round(moments(req, strategy(3))["step"] / GB, 2) == 53.11  # 51.96 + 1.15 GB outside the allocator
    # The whole partition as one sub-group is what the model counted before: 3 x 4 x 2.156e9 = 25.87 GB.
    whole = dataclasses.replace(buckets, sub_group_size=10**12)
    assert round(deepspeed_states(inp, strategy(3), whole).step_extra / GB, 2) == 25.87
    assert round(moments(req, strategy(3), whole)["step"] / GB, 2) == 67.98


def test_a_partition_within_one_sub_group_counts_as_before():
    # The small CPU models the three fp32 tensors were measured on: their partition is one sub-group.
    m = llama_stats(num_params=1_350_000, blocks=2, h=64, inter=256, vocab=1024)
    req = dataclasses.replace(request(m, nodes=1, budget=1 * GB), gpus_per_node=2, hardware=PROFILES["cpu"],
                              global_batch_size=8)
    inp = memory_inputs(req)
    st = deepspeed_states(inp, strategy(3), size_buckets(req))
    assert st.step_extra == 3 * 4 * m.trainable_params / 2


def test_nvme_optimizer_swap_buffers_are_four_sub_groups():
    # OptimizerSwapper pins buffer_count (4) buffers of the largest sub-group, fp32; the 16-bit gradient partition
    # is in host memory too (stage3.py: self.device is "cpu" with the optimizer offloaded, NVMe included).
    req = request(LLAMA70B, nodes=4, budget=80 * GB)
    buckets = size_buckets(req)
    inp = memory_inputs(req)
    st = deepspeed_states(inp, strategy(3, offload_optimizer="nvme"), buckets)
    grads16 = 2 * LLAMA70B.trainable_params / 32
    assert st.host == 4 * 4 * sub_group_elems(inp, buckets.sub_group_size) + grads16


def one_gpu(model, **kw) -> PlanRequest:
    return dataclasses.replace(request(model, nodes=1, budget=80 * GB, **kw), gpus_per_node=1, global_batch_size=8)


def test_zero3_on_one_rank_gathers_nothing():
    # NoGatherHandle views the partition: no gathered weights at the backward start or at its end (GPU check 2).
    m = llama_stats()
    alone, pair = one_gpu(m), dataclasses.replace(request(m, nodes=1, budget=80 * GB), gpus_per_node=2)
    st1 = deepspeed_states(memory_inputs(alone), strategy(3), size_buckets(alone))
    st2 = deepspeed_states(memory_inputs(pair), strategy(3), size_buckets(pair))
    assert st1.backward_extra == 0 and st2.backward_extra > 0
    assert st1.backward_end_late < st2.backward_end_late


def test_the_init_moment_holds_deepspeeds_construction_and_no_cublas_workspace():
    from launcher.planner.cuda_overhead import cublas_workspace_bytes

    m = llama_stats(num_params=1_000_000_000, blocks=16, h=2048, inter=8192)
    req = one_gpu(m)
    inp, buckets = memory_inputs(req), size_buckets(req)
    hw = inp.hardware
    # ZeRO-0 in bf16: FP16_UnfusedOptimizer steps once in __init__, so init holds the step's tensors; less the
    # cuBLAS workspace and kernels, which no matmul has loaded yet.
    est = estimate_memory(inp, strategy(0, grad_accum_steps=8), buckets)
    assert est.moment_bytes["init"] == est.moment_bytes["step"] - cublas_workspace_bytes(hw) - int(hw.kernel_bytes)
    # ZeRO-3 with the optimizer offloaded: the weight load, then deepspeed.initialize's reduce bucket.
    off = strategy(3, offload_optimizer="cpu")
    st = deepspeed_states(inp, off, buckets)
    assert st.init_extra == st.buffers == 2 * buckets.reduce_bucket_size
    # Without offload the master partition too, and the larger of a sub-group's zero gradient and the bucket.
    st = deepspeed_states(inp, strategy(3), buckets)
    master = 4 * m.trainable_params
    assert st.init_extra == master + max(4 * sub_group_elems(inp, buckets.sub_group_size), st.buffers)
