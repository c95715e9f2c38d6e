"""The CUDA-only terms (context, allocator reserve, cuBLAS workspace, NCCL buffers) and the basis of a peak."""

import dataclasses

import pytest

from launcher.planner.cuda_overhead import (
    CUBLAS_WORKSPACE_HOPPER_BYTES,
    CUBLAS_WORKSPACE_OLDER_BYTES,
    NCCL_BUFFSIZE_BYTES,
    OUTSIDE_ALLOCATOR,
    cuda_overhead,
    overhead_total,
    peak_on_basis,
    verdict_basis,
)
from launcher.planner.hardware import PROFILES
from launcher.planner.memory import MemoryInputs, analytic_constants, estimate_memory
from launcher.planner.plan import Buckets, Strategy
from launcher.units import KiB, MiB
from tests.planner.conftest import llama_stats


def estimate(profile: str, gpus: int = 8):
    m = llama_stats()
    inp = MemoryInputs(model=m, world_size=gpus, gpus_per_node=gpus, nodes=1, seq_len=2048, precision="bf16",
                       optimizer="adamw", hardware=PROFILES[profile], activations=analytic_constants(m, "bf16"))
    s = Strategy.from_json(dict(engine="fsdp", zero_stage=None, fsdp_reshard_after_forward=True,
                                offload_optimizer="none", offload_params="none", micro_batch_size=1, grad_accum_steps=1,
                                activation_checkpointing=True))
    b = Buckets(reduce_bucket_size=int(1e6), allgather_bucket_size=int(1e6), stage3_prefetch_bucket_size=0,
                stage3_max_live_parameters=0, stage3_param_persistence_threshold=0)
    return estimate_memory(inp, s, b)


def test_cpu_ranks_count_tensor_bytes_only():
    est = estimate("cpu")
    assert est.basis == "cpu_tensor_bytes"
    assert est.overhead == {} and est.breakdown["reserve"] == 0
    assert est.peak_bytes == sum(v for k, v in est.breakdown.items() if k != "reserve")


def test_cuda_ranks_are_predicted_on_reserved_plus_context():
    est = estimate("h100-80gb")
    hw = PROFILES["h100-80gb"]
    assert est.basis == "cuda_reserved_plus_context"
    tensors = est.peak_bytes - est.breakdown["reserve"]
    assert est.overhead == {
        "cublas_workspace": 2 * 32 * MiB,  # Hopper: PyTorch's ":4096:8", compute and communication streams
        "allocator_reserve": int(hw.fragmentation * tensors),
        "stream_pools": est.moment_stream_pool_bytes[est.peak_moment],  # FSDP2's side streams (test_stream_pools)
        "cuda_context": hw.context_bytes,
        "cuda_kernels": hw.kernel_bytes,
        "nccl_communicators": hw.nccl_comm_bytes,  # FSDP2 on one 1-D mesh: the default group only
        "nccl_buffers": 4 * MiB * 16 * 2,  # NCCL_BUFFSIZE x 16 NVLink channels x 2 ring neighbours
    }
    assert est.breakdown["reserve"] == sum(est.overhead.values())


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_the_moments_total_is_the_sum_of_the_terms(profile):
    """estimate_memory totals each moment with overhead_total: it must be the terms' sum, to the byte, for every
    profile, world size, communicator count, tensor size and side-stream pool (a term that comes to grow with
    either and is left out of it fails here)."""
    hw = PROFILES[profile]
    for world, comms in ((1, 1), (8, 1), (64, 2), (1024, 3)):
        total = overhead_total(hw, world, comms)
        for tensors in (0.0, 1.0, 12345.678, 7.3e9, 8.1e10, 1e13 / 3):
            assert total(tensors) == sum(cuda_overhead(hw, tensors, world, comms).values())
            for pool in (0.0, 0.75, 2.5e8 + 0.5, 3e9):
                assert total(tensors, pool) == sum(cuda_overhead(hw, tensors, world, comms, pool).values())


def test_workspace_follows_the_gpu_generation():
    assert CUBLAS_WORKSPACE_HOPPER_BYTES == 32 * MiB
    assert CUBLAS_WORKSPACE_OLDER_BYTES == 8 * MiB + 128 * KiB
    assert cuda_overhead(PROFILES["a100-80gb"], 0, 1)["cublas_workspace"] == 2 * CUBLAS_WORKSPACE_OLDER_BYTES
    assert cuda_overhead(PROFILES["h100-80gb"], 0, 1)["cublas_workspace"] == 2 * CUBLAS_WORKSPACE_HOPPER_BYTES


def test_nccl_buffers_need_a_peer_and_scale_with_channels():
    assert cuda_overhead(PROFILES["h100-80gb"], 0, 1)["nccl_buffers"] == 0
    assert cuda_overhead(PROFILES["l4"], 0, 2)["nccl_buffers"] == NCCL_BUFFSIZE_BYTES * 2 * 2  # PCIe: 2 channels


def test_the_context_is_the_profiles_and_moves_the_peak_one_for_one():
    base = estimate("h100-80gb")
    bigger = dataclasses.replace(PROFILES["h100-80gb"], context_bytes=PROFILES["h100-80gb"].context_bytes + 10**9)
    PROFILES["h100-bigger-ctx"] = bigger
    try:
        assert estimate("h100-bigger-ctx").peak_bytes - base.peak_bytes == 10**9
    finally:
        del PROFILES["h100-bigger-ctx"]


def test_peak_on_each_basis_drops_the_terms_that_basis_does_not_count():
    over = {"cublas_workspace": 10, "allocator_reserve": 100, "cuda_context": 1000, "nccl_buffers": 10000}
    assert peak_on_basis(5, over, "cuda_reserved_plus_context") == 11115
    assert peak_on_basis(5, over, "cuda_reserved") == 115
    assert peak_on_basis(5, over, "cuda_allocated") == 15
    assert peak_on_basis(5, over, "cpu_tensor_bytes") == 5
    with pytest.raises(ValueError, match="basis"):
        peak_on_basis(5, over, "nvidia_smi")


def test_verdict_basis_by_profile():
    assert verdict_basis(PROFILES["cpu"]) == "cpu_tensor_bytes"
    assert all(verdict_basis(p) == "cuda_reserved_plus_context" for n, p in PROFILES.items() if n != "cpu")


def test_overhead_terms_by_hand_on_round_profile_numbers():
    # The test above compares the allocator reserve and context with the profile's own fields, the way the code
    # computes them; here round values give numbers worked by hand: 10% of 1e10 tensor bytes = 1e9 reserve;
    # context 5e8 as set; cuBLAS 2 streams x 32 MiB (Hopper) = 67_108_864; NCCL 4 MiB x 16 NVLink channels x 2 ring
    # neighbours = 134_217_728 (H100's 450 GB/s NVLink is above the 100 GB/s NVLink threshold).
    # Kernels 1e8 as set; one communicator 5e8, each further one 4e8: DeepSpeed's two, 9e8.
    hw = dataclasses.replace(PROFILES["h100-80gb"], fragmentation=0.1, context_bytes=500_000_000,
                             kernel_bytes=100_000_000, nccl_comm_bytes=500_000_000, nccl_extra_comm_bytes=400_000_000)
    assert cuda_overhead(hw, 10**10, 8) == {"cublas_workspace": 67_108_864, "allocator_reserve": 1_000_000_000,
                                            "cuda_context": 500_000_000, "cuda_kernels": 100_000_000,
                                            "nccl_communicators": 500_000_000, "nccl_buffers": 134_217_728}
    assert cuda_overhead(hw, 10**10, 8, communicators=2)["nccl_communicators"] == 900_000_000
    assert cuda_overhead(hw, 10**10, 8, communicators=3)["nccl_communicators"] == 1_300_000_000
    # Twice the tensors, twice the reserve; nothing else moves.
    doubled = cuda_overhead(hw, 2 * 10**10, 8)
    assert doubled["allocator_reserve"] == 2_000_000_000 and doubled["cuda_context"] == 500_000_000


def test_the_cublas_workspace_follows_the_generation_not_the_name():
    """The GPU generation lives in the profile (compute_capability): a renamed or calibrated copy keeps it."""
    import dataclasses

    renamed = dataclasses.replace(PROFILES["h100-80gb"], name="my-cluster-gpu")
    assert cuda_overhead(renamed, 0, 1)["cublas_workspace"] == 2 * CUBLAS_WORKSPACE_HOPPER_BYTES
    assert PROFILES["b200"].hopper_or_later and not PROFILES["a100-80gb"].hopper_or_later
    assert not PROFILES["mi300x"].hopper_or_later and PROFILES["cpu"].compute_capability is None


def test_each_engine_counts_the_nccl_communicators_its_rank_creates():
    """DeepSpeed adds its clone of the world group (groups._clone_world_group); FSDP2's hybrid 2-D mesh its replicate
    and shard groups; a 1-D mesh reuses the default group. On CPU ranks nothing lies outside the tensors."""
    from launcher.engines import engine_spec

    s = Strategy.from_json(dict(engine="fsdp", zero_stage=None, fsdp_reshard_after_forward=True,
                                offload_optimizer="none", offload_params="none", micro_batch_size=1, grad_accum_steps=1,
                                activation_checkpointing=False))
    assert engine_spec("fsdp").nccl_communicators(s) == 1
    assert engine_spec("fsdp").nccl_communicators(Strategy.from_json(s.to_json() | dict(fsdp_sharding="hybrid"))) == 3
    ds = Strategy.from_json(s.to_json() | dict(engine="deepspeed", zero_stage=2, fsdp_reshard_after_forward=None))
    assert engine_spec("deepspeed").nccl_communicators(ds) == 2
    hw = PROFILES["h100-80gb"]
    # The first GPU check's one-rank runs: FSDP2 held 1.402 GB outside the allocator, DeepSpeed 1.806 GB.
    outside = {n: sum(cuda_overhead(hw, 0, 1, k)[t] for t in OUTSIDE_ALLOCATOR) for n, k in (("fsdp", 1), ("ds", 2))}
    assert outside["ds"] - outside["fsdp"] == hw.nccl_extra_comm_bytes
    assert cuda_overhead(PROFILES["cpu"], 10**9, 8, 3) == {}
