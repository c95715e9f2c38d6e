"""Check a DeepSpeed config with DeepSpeed's own parser (deepspeed.runtime.config.DeepSpeedConfig) at plan time.

DeepSpeedConfig reads the world size from torch.distributed, and answers 1 when no process group exists; the
batch rule it enforces (train_batch_size == micro-batch x accumulation x world size) then fails for any plan
over more than one rank. So the data-parallel world size is handed over through the ``mpu`` argument
DeepSpeedConfig reads it from (Megatron's model-parallel unit interface), and the one rank query made before
it is answered for the duration of the call (``rank_query_answered``, the one patch of DeepSpeed the planning
side makes): no process group is created. deepspeed is imported here only, so `launch plan` without --out stays
fast.
"""

from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Iterator

from launcher.errors import LauncherError


class DeepSpeedRefused(LauncherError):
    """DeepSpeed's parser refused a config the emitter wrote: a launcher bug, not bad input (exit 1)."""


class _DataParallel:
    """The part of the mpu interface DeepSpeedConfig reads: the data-parallel world size."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size

    def get_data_parallel_world_size(self) -> int:
        return self.world_size

    def get_data_parallel_rank(self) -> int:
        return 0


@contextlib.contextmanager
def rank_query_answered() -> Iterator[None]:
    """While inside, deepspeed.comm.get_rank answers 0 without a process group; the real one is back on leaving
    (on an error too). DeepSpeedConfig asks get_rank before it reads the mpu, and on the assertion get_rank
    raises without a group it drops the mpu's world size for 1 (deepspeed/runtime/config.py)."""
    from deepspeed import comm

    real = comm.get_rank
    comm.get_rank = lambda *a, **k: 0
    try:
        yield
    finally:
        comm.get_rank = real


def check_ds_config(config: dict, world_size: int) -> object:
    """DeepSpeedConfig(config) as a ``world_size``-rank run would build it; raises DeepSpeedRefused with
    DeepSpeed's own message."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        # DeepSpeed announces its accelerator on import; the plan's output is not the place for it.
        from deepspeed.runtime.config import DeepSpeedConfig
        from deepspeed.utils import logger as ds_logger
    level = ds_logger.level
    ds_logger.setLevel(logging.ERROR)
    try:
        with rank_query_answered():
            return DeepSpeedConfig(config, mpu=_DataParallel(world_size))
    except Exception as e:  # DeepSpeed reports with AssertionError, ValueError and pydantic's errors alike
        raise DeepSpeedRefused(f"ds_config.json: DeepSpeed's parser refuses it ({type(e).__name__}: "
                               f"{' '.join(str(e).split())[:600]}); this is a launcher bug, please report it") from None
    finally:
        ds_logger.setLevel(level)
