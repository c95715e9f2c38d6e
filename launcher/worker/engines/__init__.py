"""Training engines behind one small interface: forward, backward, step, save, load.

``DeepSpeedEngine`` wraps deepspeed.initialize (ZeRO 0-3, offload as ds_config.json says);
``FsdpEngine`` wraps FSDP2's fully_shard. The loop in launcher.worker.loop drives either.
"""

from launcher.worker.engines.base import Engine, build_optimizer, lr_lambda

__all__ = ["Engine", "build_optimizer", "lr_lambda"]
