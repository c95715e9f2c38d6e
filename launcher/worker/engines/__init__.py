"""Training engines behind one small interface: forward, backward, step, save, load.

``DeepSpeedEngine`` wraps deepspeed.initialize (ZeRO 0-3, offload as ds_config.json says);
``FsdpEngine`` wraps FSDP2's fully_shard. The loop in launcher.worker.loop drives either.
"""

import importlib

from launcher.engines import engine_spec
from launcher.worker.engines.base import Engine, build_optimizer, lr_lambda


def engine_class(name: str) -> type:
    """The rank-side Engine of the engine registered as ``name``: the class its spec names
    (launcher.engines.EngineSpec.rank_engine) in launcher.worker.engines.<name>, imported only when a rank asks."""
    return getattr(importlib.import_module(f"launcher.worker.engines.{name}"), engine_spec(name).rank_engine)


__all__ = ["Engine", "build_optimizer", "engine_class", "lr_lambda"]
