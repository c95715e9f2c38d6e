"""The init moment (rank 0 loading the weights), worked by hand on round numbers; the measured cells each term came
from are named beside it."""

from dataclasses import replace

import pytest

from launcher.model.introspect import ModelStats
from launcher.planner.hardware import PROFILES
from launcher.planner.memory import ActivationConstants, MemoryInputs, estimate_memory, init_bytes
from launcher.planner.plan import Buckets, Strategy

BUCKETS = Buckets(reduce_bucket_size=10**3, allgather_bucket_size=10**3, stage3_prefetch_bucket_size=10**3,
                  stage3_max_live_parameters=10**3, stage3_param_persistence_threshold=0)


def stats(**kw) -> ModelStats:
    """1M parameters: 4 blocks of 100k, a 600k root whose largest layer is a 500 x 1000 embedding."""
    base = dict(model_type="bert", task="seq_cls", num_params=1_000_000, trainable_params=1_000_000, lora_params=0,
                largest_layer_params=500_000, num_blocks=4, block_params=100_000, block_class="BertLayer",
                non_block_params=600_000, hidden_size=1000, num_heads=10, num_kv_heads=10, intermediate_size=4000,
                vocab_size=500, head_dim=100, is_causal=False, gated_mlp=False, tied_embeddings=False)
    return ModelStats(**{**base, **kw})


def consts(block=0.0, head=0.0, ckpt=0.0) -> ActivationConstants:
    return ActivationConstants(block_bytes_per_token=block, block_bytes_per_token_per_seq=0.0,
                               ckpt_bytes_per_token=ckpt, head_bytes_per_token=head, head_ckpt_bytes_per_token=head)


def inputs(m: ModelStats, *, world=2, precision="fp32", hardware="cpu", c=None, seq=10) -> MemoryInputs:
    return MemoryInputs(model=m, world_size=world, gpus_per_node=world, nodes=1, seq_len=seq, precision=precision,
                        optimizer="adamw", hardware=PROFILES[hardware], activations=c or consts())


def strategy(engine="deepspeed", stage=3, reshard=None, ac=False, mb=1) -> Strategy:
    return Strategy.from_json(dict(engine=engine, zero_stage=stage if engine == "deepspeed" else None,
                    fsdp_reshard_after_forward=reshard, offload_optimizer="none", offload_params="none",
                    micro_batch_size=mb, grad_accum_steps=1, activation_checkpointing=ac))


def test_zero3_rank0_holds_the_checkpoint_its_partition_and_one_gathered_layer():
    # transformers reads the whole checkpoint on rank 0 (4 MB here) and copies it in a gathered layer at a time:
    # 4_000_000 + 4 · 1_000_000 / 2 + 4 · 500_000 = 8_000_000. MiniLM, 2 ranks: 90.87 + 45.43 + 46.88 = 183.18 MB
    # measured to the kB (z3-minilm-cls-fp32-noac-mb2-s64-r2-lora).
    m = stats(checkpoint_bytes=4_000_000)
    assert init_bytes(inputs(m), strategy()) == 8_000_000
    # On a GPU the checkpoint stays in host RAM: the device holds the partition and the gathered layer.
    assert init_bytes(inputs(m, hardware="a100-80gb"), strategy()) == 4_000_000
    # A random init reads no checkpoint.
    assert init_bytes(inputs(stats()), strategy()) == 4_000_000


def test_zero012_rank0_builds_in_fp32_then_flattens_what_trains_in_the_working_dtype():
    # fp32: the 4 MB build and deepspeed.initialize's flat copy of the trainable parameters, 4 + 4 MB (MiniLM
    # ZeRO-2 fp32: 2 x 90.86 MB measured). bf16: max(4 MB build, 2 + 2 MB after the cast on the host) = 4 MB.
    assert init_bytes(inputs(stats()), strategy(stage=2)) == 8_000_000
    assert init_bytes(inputs(stats(), precision="bf16"), strategy(stage=1)) == 4_000_000
    lora = stats(trainable_params=10_000, lora_params=10_000)
    assert init_bytes(inputs(lora, precision="bf16"), strategy(stage=1)) == 4_000_000
    # A GPU holds only what reaches it: the model and the adapters' flat copy (2_020_000), then the master
    # partition and its zero gradient (2 x 4 x 10_000 / 2 ranks) beside the model: the larger.
    assert init_bytes(inputs(lora, precision="bf16", hardware="a100-80gb"), strategy(stage=1)) == 2_040_000


def test_a_random_tied_causal_lm_allocates_its_output_head_before_tying_it():
    # nn.Linear(h, V) makes its own weight before post_init ties it to the embedding: 4Vh = 2 MB for a moment
    # (GPT-2 124M, ZeRO-1 bf16 LoRA: 497.76 + 154.39 = 652.15 MB measured at init).
    tied = stats(task="causal_lm", tied_embeddings=True, trainable_params=10_000, lora_params=10_000)
    assert init_bytes(inputs(tied, precision="bf16"), strategy(stage=1)) == 4_000_000 + 2_000_000
    # Loaded from a checkpoint it is built on meta first: no such moment.
    assert init_bytes(inputs(replace(tied, checkpoint_bytes=4_000_000), precision="bf16"), strategy(stage=1)) == \
        4_000_000


def test_fsdp2_rank0_keeps_its_build_as_the_state_dict_beside_its_shards():
    # 4 MB state dict + 4 MB / 2 shards (MiniLM FSDP2 fp32, 2 ranks: 90.86 + 45.43 = 136.3 MB measured).
    s = strategy(engine="fsdp", reshard=True)
    assert init_bytes(inputs(stats()), s) == 6_000_000
    # On a GPU the shards, and one whole tensor of rank 0's fp32 state being broadcast into them (the largest
    # module's: _state_dict_utils.py _broadcast_tensors, one tensor at a time).
    assert init_bytes(inputs(stats(), hardware="a100-80gb"), s) == 2_000_000 + 4 * stats().largest_layer_params


def test_a_lora_zero3_run_on_cpu_ranks_peaks_while_loading_and_says_so():
    m = stats(checkpoint_bytes=4_000_000, trainable_params=10_000, lora_params=10_000)
    est = estimate_memory(inputs(m, c=consts(block=10.0, head=10.0)), strategy(), BUCKETS)
    assert est.peak_moment == "init"
    assert est.peak_bytes == est.moment_bytes["init"] == 8_000_000
    assert est.breakdown["params"] == 8_000_000 and sum(est.breakdown.values()) == est.peak_bytes
    # Long sequences move the peak back into training.
    est = estimate_memory(inputs(m, c=consts(block=2e5, head=10.0)), strategy(), BUCKETS)
    assert est.peak_moment == "backward"


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_the_init_moment_never_decides_a_gpu_plan_of_a_full_fine_tune(stage):
    est = estimate_memory(inputs(stats(checkpoint_bytes=4_000_000), hardware="a100-80gb"), strategy(stage=stage),
                          BUCKETS)
    assert est.peak_moment != "init"


def test_the_plan_says_when_loading_the_weights_is_the_peak():
    from launcher.config.job import StrategyConfig
    from launcher.planner.search import make_plan
    from tests.planner.conftest import PlanRequest

    # A 40 MB checkpoint against ~10 MB of training (ZeRO-3's 1e6-element bucket floor and gathered weights).
    lora = stats(checkpoint_bytes=40_000_000, trainable_params=10_000, lora_params=10_000)
    req = dict(model=lora, gpus_per_node=2, nodes=1, budget_bytes=10**9, seq_len=10, global_batch_size=2,
               precision="fp32", optimizer="adamw", hardware=PROFILES["cpu"], host_ram_per_node_bytes=10**12,
               activations=consts(block=10.0, head=10.0), pins=StrategyConfig(engine="deepspeed", zero_stage=3))
    plan = make_plan(PlanRequest(**req))
    assert any(r.startswith("the peak is rank 0 loading the weights") for r in plan.reasons), plan.reasons
    # Without the checkpoint (a random init) training is the peak again, and nothing is said.
    plan = make_plan(PlanRequest(**{**req, "model": replace(lora, checkpoint_bytes=0)}))
    assert not any("loading the weights" in r for r in plan.reasons)
