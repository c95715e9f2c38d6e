"""The job's records (launcher.worker.sources), a fixed train/eval split, and each rank's deterministic stream of
micro-batches.

Every sequence is padded to the plan's seq_len: fixed shapes make activation
memory the same at every step, so the measured peak is the one the planner predicted.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from launcher.errors import ConfigError
from launcher.planner.duration import epoch_steps
from launcher.planner.duration import steps_per_epoch as steps_in_epoch
from launcher.worker.sources import read_records

__all__ = ["Stream", "column", "eval_batches", "read_records", "shard_order", "split", "total_steps"]

SPLIT_SEED = 1234
"""The eval split does not depend on train.seed, so runs with different seeds evaluate on the same rows."""


def column(rows: list[dict], name: str, path: str, key: str) -> list:
    """The ``name`` field of every row; a missing one names the row and the key to set."""
    out = []
    for i, row in enumerate(rows):
        if name not in row or row[name] is None:
            raise ConfigError(
                f"{key}: row {i + 1} of {path} has no field {name!r} (fields: {', '.join(map(str, row))}); "
                f"set {key} to the field holding it"
            )
        out.append(row[name])
    return out


def split(rows: list, eval_fraction: float) -> tuple[list, list]:
    """(train, eval): a fixed shuffle, the first round(n * eval_fraction) rows held out (at least 1 if > 0)."""
    order = list(range(len(rows)))
    random.Random(SPLIT_SEED).shuffle(order)
    n_eval = eval_count(len(rows), eval_fraction)
    return [rows[i] for i in order[n_eval:]], [rows[i] for i in order[:n_eval]]


def eval_count(n: int, eval_fraction: float) -> int:
    """Rows ``split`` holds out of ``n`` for evaluation."""
    n_eval = 0 if eval_fraction <= 0 else max(1, round(n * eval_fraction))
    return min(n_eval, n - 1)


def shard_order(n: int, *, epoch: int, seed: int, world_size: int, rank: int, shuffle: bool = True) -> list[int]:
    """DistributedSampler's rule: permute with seed + epoch, pad by wrapping to a multiple of world_size, stride."""
    if shuffle:
        import torch  # here: the launcher's data check splits rows without torch

        g = torch.Generator()
        g.manual_seed(seed + epoch)
        order = torch.randperm(n, generator=g).tolist()
    else:
        order = list(range(n))
    pad = (-n) % world_size
    order += (order * math.ceil(pad / max(n, 1)))[:pad]
    return order[rank::world_size]


@dataclass(kw_only=True, slots=True)
class Stream:
    """One rank's training micro-batches, as an endless, restartable sequence of example indices.

    A step takes ``samples_per_step`` = micro_batch_size * grad_accum_steps examples from the rank's
    shard; an epoch is the whole steps that fit, so resuming at step s only needs s.
    """

    num_examples: int
    """Training examples (all ranks)."""
    micro_batch_size: int
    """Sequences per forward, per rank."""
    grad_accum_steps: int
    """Micro-batches per optimizer step."""
    world_size: int
    """Data-parallel ranks."""
    rank: int
    """This rank."""
    seed: int
    """Shuffle seed; epoch e uses seed + e."""
    _cache: tuple[int, list[int]] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.steps_per_epoch < 1:
            raise ConfigError(
                f"data.path: {self.num_examples} training examples over {self.world_size} ranks give "
                f"{self.shard_size} per rank, fewer than one step needs "
                f"({self.micro_batch_size} micro-batch x {self.grad_accum_steps} accumulation); "
                "add data, lower train.global_batch_size or lower data.eval_fraction"
            )

    @property
    def shard_size(self) -> int:
        """Examples in each rank's shard (the sampler pads the last ones)."""
        return math.ceil(self.num_examples / self.world_size)

    @property
    def samples_per_step(self) -> int:
        """Examples one optimizer step takes per rank: micro-batch x accumulation."""
        return self.micro_batch_size * self.grad_accum_steps

    @property
    def steps_per_epoch(self) -> int:
        """Whole optimizer steps in one pass over the rank's shard."""
        # The planner's total-time prediction counts epochs with the same rule.
        return steps_in_epoch(self.num_examples, world_size=self.world_size, samples_per_step=self.samples_per_step)

    def micro_batch(self, step: int, micro: int) -> list[int]:
        """Example indices of micro-batch ``micro`` (0-based) of optimizer step ``step`` (0-based)."""
        epoch, k = divmod(step, self.steps_per_epoch)
        order = self._order(epoch)
        start = k * self.samples_per_step + micro * self.micro_batch_size
        return order[start : start + self.micro_batch_size]

    def _order(self, epoch: int) -> list[int]:
        if self._cache is None or self._cache[0] != epoch:
            order = shard_order(
                self.num_examples, epoch=epoch, seed=self.seed, world_size=self.world_size, rank=self.rank
            )
            self._cache = (epoch, order)
        return self._cache[1]


def eval_batches(n: int, *, micro_batch_size: int, world_size: int, rank: int) -> list[list[int]]:
    """This rank's eval micro-batches; every rank gets the same count, the last batch wrapped to full size."""
    if n == 0:
        return []
    order = shard_order(n, epoch=0, seed=0, world_size=world_size, rank=rank, shuffle=False)
    n_batches = math.ceil(len(order) / micro_batch_size)
    full = (order * math.ceil(n_batches * micro_batch_size / len(order)))[: n_batches * micro_batch_size]
    return [full[i * micro_batch_size : (i + 1) * micro_batch_size] for i in range(n_batches)]


def eval_counted(n: int, *, micro_batch_size: int, world_size: int, rank: int) -> list[list[bool]]:
    """For each of eval_batches' batches, which entries are an example's one counted occurrence: the padding that
    evens the shards (a wrap of the first examples) and the wrap that fills the last batch repeat examples, and a
    metric counted over them (accuracy) would count those twice. Unshuffled, shard position j of ``rank`` is
    global position j * world_size + rank, real when below ``n``."""
    if n == 0:
        return []
    shard = len(shard_order(n, epoch=0, seed=0, world_size=world_size, rank=rank, shuffle=False))
    flags = [j * world_size + rank < n for j in range(shard)]
    n_batches = math.ceil(shard / micro_batch_size)
    flags += [False] * (n_batches * micro_batch_size - shard)
    return [flags[i * micro_batch_size : (i + 1) * micro_batch_size] for i in range(n_batches)]


def total_steps(*, max_steps: int | None, epochs: float | None, steps_per_epoch: int) -> int:
    """The run's optimizer steps: train.max_steps, else train.epochs over the data (rounded up); ConfigError when
    neither is given or one is out of range."""
    if max_steps is not None:
        if max_steps < 1:
            raise ConfigError(f"train.max_steps: {max_steps} must be at least 1")
        return max_steps
    if epochs is None:
        raise ConfigError("train: give max_steps or epochs; e.g. train.max_steps: 100")
    if epochs <= 0:
        raise ConfigError(f"train.epochs: {epochs} must be positive")
    return epoch_steps(epochs, steps_per_epoch)
