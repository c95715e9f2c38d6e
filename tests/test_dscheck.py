"""The one patch of DeepSpeed at plan time (launcher.engines.deepspeed.check.rank_query_answered) is undone on
leaving."""

import pytest

from launcher.engines.deepspeed.check import DeepSpeedRefused, check_ds_config, rank_query_answered


def test_get_rank_answers_zero_inside_and_is_the_real_one_after_an_error_too():
    from deepspeed import comm

    real = comm.get_rank
    with pytest.raises(AssertionError):
        real()  # no process group: DeepSpeed's own answer is an assertion
    with pytest.raises(RuntimeError, match="inside"), rank_query_answered():
        assert comm.get_rank() == 0
        raise RuntimeError("inside")
    assert comm.get_rank is real


def test_checking_a_config_leaves_deepspeed_as_it_was():
    from deepspeed import comm

    real = comm.get_rank
    good = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2}
    assert check_ds_config(good, 4).world_size == 4  # the mpu's world size, not the 1 a failed get_rank gives
    with pytest.raises(DeepSpeedRefused):
        check_ds_config(good, 3)
    assert comm.get_rank is real and not comm.is_initialized()
