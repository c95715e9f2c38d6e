"""Communication buckets: sized to the budget, never above DeepSpeed's defaults."""

import dataclasses

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from launcher.errors import NoPlanError
from launcher.planner.buckets import (
    BUCKET_BUDGET_SHARE,
    DS_DEFAULT_BUCKET,
    DS_DEFAULT_PREFETCH,
    DS_DEFAULT_SUB_GROUP,
    MIN_BUCKET,
    MIN_SUB_GROUP,
    SUB_GROUP_BUDGET_SHARE,
    SUB_GROUP_STEP_BYTES,
    size_buckets,
)
from launcher.planner.search import make_plan
from tests.planner.conftest import llama_stats

FP32 = 4  # the bucket share is taken at fp32, DeepSpeed's largest gradient element

models = st.builds(
    lambda h, blocks, vocab: llama_stats(num_params=blocks * 12 * h * h + 2 * vocab * h, blocks=blocks, h=h,
                                         inter=4 * h, vocab=vocab),
    h=st.sampled_from([64, 256, 1024, 4096, 8192, 16384]), blocks=st.integers(2, 126),
    vocab=st.sampled_from([1024, 32000, 128256]),
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(model=models, budget_bytes=st.integers(16 * 10**6, 200 * 10**9), smallest=st.booleans())
def test_buckets_fit_the_budget_and_never_exceed_deepspeed_defaults(request_for, model, budget_bytes, smallest):
    req = request_for(model=model, budget_bytes=budget_bytes)
    b = size_buckets(req, smallest=smallest)
    for elems in (b.reduce_bucket_size, b.allgather_bucket_size):
        assert MIN_BUCKET <= elems <= DS_DEFAULT_BUCKET
        # Within the budget's share, unless that share is below the floor.
        assert elems * FP32 <= max(BUCKET_BUDGET_SHARE * req.usable_bytes, MIN_BUCKET * FP32)
        assert elems * FP32 <= req.usable_bytes
    assert MIN_BUCKET <= b.stage3_prefetch_bucket_size <= DS_DEFAULT_PREFETCH
    assert b.stage3_prefetch_bucket_size <= b.reduce_bucket_size
    # ZeRO-3's sub-group: its three fp32 step tensors within their share, never above DeepSpeed's default.
    assert MIN_SUB_GROUP <= b.sub_group_size <= DS_DEFAULT_SUB_GROUP
    assert b.sub_group_size * SUB_GROUP_STEP_BYTES <= max(SUB_GROUP_BUDGET_SHARE * req.usable_bytes,
                                                          MIN_SUB_GROUP * SUB_GROUP_STEP_BYTES)
    if smallest:
        assert b.reduce_bucket_size == MIN_BUCKET
        assert b.sub_group_size == MIN_SUB_GROUP


def test_defaults_are_reached_only_with_room_for_them(request_for):
    roomy = size_buckets(request_for(model=llama_stats(num_params=405_853_388_800, blocks=126, h=16384,
                                                       inter=53248, vocab=128256), budget_bytes=200 * 10**9))
    assert roomy.reduce_bucket_size == DS_DEFAULT_BUCKET
    # HF's 0.9·h² rule would ask for 2.4e8 here; DeepSpeed's default caps it.
    assert roomy.stage3_prefetch_bucket_size == DS_DEFAULT_PREFETCH
    tight = size_buckets(request_for(budget_bytes=4 * 10**9))
    # Worked by hand: 4 GB budget, 5 % safety margin -> 3.8e9 usable; a 2 % share is 7.6e7 bytes, at 4 bytes per
    # fp32 element 1.9e7 elements (under the 5e8 default and above the 1e6 floor).
    assert tight.reduce_bucket_size == 19_000_000


def test_the_caps_are_deepspeeds_own_defaults():
    # The caps are taken from DeepSpeed's config schema itself, not restated: a drift in either shows here.
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    fields = DeepSpeedZeroConfig.model_fields
    assert DS_DEFAULT_BUCKET == fields["reduce_bucket_size"].default == fields["allgather_bucket_size"].default
    assert DS_DEFAULT_PREFETCH == fields["prefetch_bucket_size"].default
    assert DS_DEFAULT_SUB_GROUP == fields["sub_group_size"].default


def test_sub_groups_keep_deepspeeds_default_on_an_80_gb_card_and_shrink_below(request_for):
    # 80 GB budget, 5 % margin: 76 GB usable; a 20 % share over 12 B per element is 1.27e9, capped at the default.
    assert size_buckets(request_for(budget_bytes=80 * 10**9)).sub_group_size == DS_DEFAULT_SUB_GROUP
    # 24 GB: 22.8e9 usable x 0.2 / 12 = 3.8e8 elements (4.56 GB of step temporaries at most).
    assert size_buckets(request_for(budget_bytes=24 * 10**9)).sub_group_size == 380_000_000


def test_a_bucket_never_outgrows_the_gradients(request_for):
    small = dataclasses.replace(llama_stats(), trainable_params=3_000_000, lora_params=3_000_000)
    assert size_buckets(request_for(model=small)).reduce_bucket_size == 3_000_000
    tiny = dataclasses.replace(llama_stats(), trainable_params=1000, lora_params=1000)
    assert size_buckets(request_for(model=tiny)).reduce_bucket_size == MIN_BUCKET


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(model=models, budget_gb=st.floats(1, 80))
def test_plans_use_the_checked_sizes(request_for, model, budget_gb):
    # A plan carries the budget-sized buckets or, when only they missed, the floor: both checked above.
    req = request_for(model=model, budget_bytes=int(budget_gb * 1e9), global_batch_size=8)
    try:
        plan = make_plan(req)
    except NoPlanError:
        return
    assert plan.buckets in (size_buckets(req), size_buckets(req, smallest=True))
    assert plan.estimate.peak_bytes <= plan.usable_bytes
