"""What runs on every rank: the plan, the memory probe, checkpoint requests.

Users' own training scripts can call these too::

    from launcher.runtime import load_plan, memory_probe
    plan = load_plan()            # $LAUNCHER_PLAN
    probe = memory_probe()        # $LAUNCHER_RUN_DIR, $LAUNCHER_ENFORCE_BYTES
    with probe:
        with probe.phase("forward"):
            ...
    report = probe.write()        # RUN_DIR/ranks/rank-K.json; a launcher.records.rankreport.RankReport
"""

from launcher.processes.rankenv import (
    DS_CONFIG_ENV,
    ENFORCE_ENV,
    EXIT_OOM,
    PLAN_ENV,
    RUN_DIR_ENV,
    TRACK_ENV,
    load_plan,
    set_extensions_dir,
)
from launcher.runtime.control import CheckpointRequests
from launcher.runtime.files import JsonlLog, atomic_write_json, read_jsonl
from launcher.runtime.probe import TRAINING_PHASES, MemoryProbe, memory_probe

__all__ = [
    "DS_CONFIG_ENV",
    "ENFORCE_ENV",
    "EXIT_OOM",
    "PLAN_ENV",
    "RUN_DIR_ENV",
    "TRACK_ENV",
    "TRAINING_PHASES",
    "CheckpointRequests",
    "JsonlLog",
    "MemoryProbe",
    "atomic_write_json",
    "load_plan",
    "memory_probe",
    "read_jsonl",
    "set_extensions_dir",
]
