"""ZeRO-1/2's flatten check sees the plan's usable budget, not the whole GPU (launcher.worker.engines.deepspeed)."""

import contextlib

import torch

from launcher.worker.engines.deepspeed import DeepSpeedEngine, flatten_room


def test_deepspeeds_available_memory_is_capped_at_the_room_left_and_restored():
    from deepspeed.accelerator import get_accelerator

    acc = get_accelerator()  # the real accelerator object stage_1_and_2.py asks
    real = acc.available_memory()
    assert real > 10_000
    used = [3_000]
    with flatten_room(acc, 10_000, lambda: used[0]):
        # 10_000 of room, 3_000 in use: DeepSpeed sees 7_000 free, so a larger flat buffer goes through the host.
        assert acc.available_memory() == 7_000
        used[0] = 20_000
        assert acc.available_memory() == 0  # never negative
    assert "available_memory" not in vars(acc)  # the class's own method again
    assert acc.available_memory() > 10_000


def test_the_cap_applies_only_to_zero12_on_a_gpu():
    ds = {"zero_optimization": {"stage": 2}}

    assert isinstance(DeepSpeedEngine(ds, usable_bytes=10**9)._flatten_room(None), contextlib.nullcontext)  # CPU
    gpu = DeepSpeedEngine(ds, device=torch.device("cuda", 0), usable_bytes=10**9)
    assert not isinstance(gpu._flatten_room(None), contextlib.nullcontext)
    z3 = DeepSpeedEngine({"zero_optimization": {"stage": 3}}, device=torch.device("cuda", 0), usable_bytes=10**9)
    assert isinstance(z3._flatten_room(None), contextlib.nullcontext)
