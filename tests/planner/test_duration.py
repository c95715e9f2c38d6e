"""The predicted total training time: step time x steps, from max_steps or epochs, and the warning threshold."""

import pytest

from launcher.planner.duration import total_time
from launcher.worker.data import Stream
from launcher.worker.data import total_steps as worker_total_steps


def test_max_steps_gives_the_total():
    t = total_time(step_time_s=2.6e3, max_steps=1000, epochs=None, train_examples=None, unknown_why="",
                   world_size=8, samples_per_step=1, warn_after_h=72)
    assert t.total_steps == 1000 and t.total_s == pytest.approx(2.6e6)
    assert t.too_long and "30.1 days" in t.warning() and "train.warn_total_time_h (72 h)" in t.warning()
    assert "30.1 days predicted (2.6e+03 s/step x 1000 steps" in t.describe()


@pytest.mark.parametrize("examples,world,mbs,accum,epochs", [(324, 2, 8, 1, 3), (1001, 4, 2, 3, 1.5), (10, 3, 1, 1, 2)])
def test_epochs_count_the_steps_the_ranks_will_run(examples, world, mbs, accum, epochs):
    t = total_time(step_time_s=1.0, max_steps=None, epochs=epochs, train_examples=examples, unknown_why="",
                   world_size=world, samples_per_step=mbs * accum, warn_after_h=72)
    stream = Stream(num_examples=examples, micro_batch_size=mbs, grad_accum_steps=accum, world_size=world, rank=0,
                    seed=0)
    assert t.total_steps == worker_total_steps(max_steps=None, epochs=epochs, steps_per_epoch=stream.steps_per_epoch)
    assert f"{examples} training examples" in t.basis and not t.too_long


def test_unknown_says_why_and_never_warns():
    t = total_time(step_time_s=1e6, max_steps=None, epochs=1, train_examples=None, unknown_why="data.packing: ...",
                   world_size=1, samples_per_step=1, warn_after_h=1)
    assert t.total_s is None and not t.too_long and t.describe() == "not predicted: data.packing: ..."


def test_null_threshold_never_warns():
    t = total_time(step_time_s=1e6, max_steps=10**6, epochs=None, train_examples=None, unknown_why="",
                   world_size=1, samples_per_step=1, warn_after_h=None)
    assert not t.too_long and t.warning() is None
