"""Emitters: pure functions from a plan (and the job) to the configs the engines read.

No I/O here; the caller writes the files. Each output is checked against golden files in tests/emit.
"""

from launcher.emit.deepspeed import ds_config
from launcher.emit.fsdp import fsdp_config, fsdp_yaml_text

__all__ = ["ds_config", "fsdp_config", "fsdp_yaml_text"]
