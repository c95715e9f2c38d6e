"""Communication buckets and ZeRO-3's optimizer sub-groups sized to the budget instead of DeepSpeed's defaults."""

from __future__ import annotations

from launcher.planner.plan import Buckets
from launcher.planner.request import PlanRequest

DS_DEFAULT_BUCKET = 500_000_000  # DeepSpeed's reduce/allgather default, elements (2 GB at fp32)
DS_DEFAULT_PREFETCH = 50_000_000  # DeepSpeed's stage3_prefetch_bucket_size default, elements (zero/config.py)
BUCKET_BUDGET_SHARE = 0.02  # share of the usable budget one communication bucket may take
MIN_BUCKET = 1_000_000
DS_DEFAULT_SUB_GROUP = 1_000_000_000  # DeepSpeed's sub_group_size default, elements (zero/config.py)
# ZeRO-3's step holds three fp32 tensors of one sub-group at a time (engines.deepspeed.memory.step_extra_bytes): they
# may take this share of the usable budget. DeepSpeed's default stays from 3 x 4 B x 1e9 / 0.2 = 60 GB usable
# on (80 GB cards); below, smaller sub-groups cost only more, shorter optimizer launches.
SUB_GROUP_BUDGET_SHARE = 0.2
SUB_GROUP_STEP_BYTES = 3 * 4
MIN_SUB_GROUP = 100_000_000  # the floor: 1.2 GB of step temporaries, a 70B partition over 32 ranks in 22 sub-groups


def size_buckets(req: PlanRequest, *, smallest: bool = False) -> Buckets:
    """Communication buffers sized to the budget instead of DeepSpeed's 5e8-element defaults.

    ``smallest`` gives the floor sizes, tried when a strategy misses the budget only by its buckets; that also
    keeps feasibility monotone in the budget (a larger budget never forces larger buckets).
    """
    m = req.model
    elem = 4
    by_budget = MIN_BUCKET if smallest else int(BUCKET_BUDGET_SHARE * req.usable_bytes / elem)
    bucket = max(MIN_BUCKET, min(DS_DEFAULT_BUCKET, by_budget, m.trainable_params))
    # HF's "auto" rules for ZeRO-3: prefetch 0.9·h², persistence 10·h; live params capped at the bucket.
    h2 = m.hidden_size * m.hidden_size
    # Capped at DeepSpeed's own default, which 0.9·h² passes from h ≈ 7.5k on.
    prefetch = max(MIN_BUCKET, min(bucket, int(0.9 * h2), DS_DEFAULT_PREFETCH))
    by_budget = int(SUB_GROUP_BUDGET_SHARE * req.usable_bytes / SUB_GROUP_STEP_BYTES)
    sub_group = MIN_SUB_GROUP if smallest else max(MIN_SUB_GROUP, min(DS_DEFAULT_SUB_GROUP, by_budget))
    return Buckets(
        reduce_bucket_size=bucket,
        allgather_bucket_size=bucket,
        stage3_prefetch_bucket_size=prefetch,
        stage3_max_live_parameters=max(bucket, m.largest_layer_params),
        stage3_param_persistence_threshold=10 * m.hidden_size,
        sub_group_size=sub_group,
    )
