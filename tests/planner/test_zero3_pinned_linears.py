"""ZeRO-3 under LoRA: torch's linear saves weight.t(), which keeps each frozen linear's gathered weight alive from its
forward to its backward, past DeepSpeed's live-parameter cap (engines.deepspeed.pinned_linear_elems)."""

import dataclasses

import pytest

from launcher.engines.deepspeed.memory import deepspeed_states, pinned_linear_elems
from launcher.planner.plan import Buckets
from tests.planner.conftest import llama_stats
from tests.planner.test_backward_end import ZERO3, inputs

# CURRENT_VALIDATION's 6-block Llama (h 192, 2 KV heads of 32, SwiGLU 512, vocab 6144), LoRA on q/v: the frozen
# linears of a block are q, k, v, o, gate, up, down.
SHAPES = [[192, 192], [64, 192], [64, 192], [192, 192], [512, 192], [512, 192], [192, 512]]
PER_BLOCK = 393_216
HEAD = 6144 * 192


def lora_llama6(lora=30_720):
    m = llama_stats(num_params=4_721_088, blocks=6, h=192, inter=512, vocab=6144, trainable=lora)
    return dataclasses.replace(m, block_linear_shapes=SHAPES)


def test_every_frozen_block_linear_and_the_head_are_pinned_without_checkpointing():
    assert sum(o * i for o, i in SHAPES) == PER_BLOCK
    assert pinned_linear_elems(lora_llama6(), ZERO3) == 6 * PER_BLOCK + HEAD


def test_checkpointed_blocks_pin_one_block_at_a_time():
    ac = dataclasses.replace(ZERO3, activation_checkpointing=True)
    assert pinned_linear_elems(lora_llama6(), ac) == PER_BLOCK + HEAD  # every block checkpointed: the recomputed one
    # Every 2nd block checkpointed (0, 2, 4): blocks 1, 3, 5 saved in forward, plus the one being recomputed.
    assert pinned_linear_elems(lora_llama6(), dataclasses.replace(ac, checkpoint_every=2)) == 4 * PER_BLOCK + HEAD


def test_a_full_fine_tune_pins_nothing():
    # The emitter gives it DeepSpeed's LinearFunctionForZeroStage3 (memory_efficient_linear true), which saves the
    # Parameter, freed by free_param.
    full = dataclasses.replace(lora_llama6(), trainable_params=4_721_088, lora_params=0)
    assert pinned_linear_elems(full, ZERO3) == 0


def test_the_backward_moment_counts_the_pins_where_they_exceed_the_cap():
    m = lora_llama6()
    cap = HEAD  # the emitter's stage3_max_live_parameters: the largest layer
    b = Buckets(reduce_bucket_size=10**6, allgather_bucket_size=10**6, stage3_prefetch_bucket_size=10**6,
                stage3_max_live_parameters=cap, stage3_param_persistence_threshold=1920)
    st = deepspeed_states(inputs(m), ZERO3, b)
    # Measured on the cell's rank 0: 14.04 MB gathered at the backward start (block 0's q/k/v, whose input needs no
    # gradient, pin nothing: 0.25 MB fewer than counted); the cap alone said 4.72 MB.
    assert st.backward_extra == 4 * (6 * PER_BLOCK + HEAD)
    assert st.backward_extra == pytest.approx(14.04e6, rel=0.02)
    big_cap = dataclasses.replace(b, stage3_max_live_parameters=10**8)  # the cap above every pin: the cap's count
    assert deepspeed_states(inputs(m), ZERO3, big_cap).backward_extra == 4 * m.num_params
