"""The one place the launcher switches the Hugging Face libraries off the network in a running process.

huggingface_hub reads HF_HUB_OFFLINE once, at its import, into huggingface_hub.constants.HF_HUB_OFFLINE, and
datasets reads HF_DATASETS_OFFLINE the same way; by the time a job is read transformers has usually imported the
hub already. So ``hub_offline`` sets the variables (for the processes this one starts, and for peft, which reads
the variable per call) and, where the hub is offline, the hub's constant for this process: without it even a
local_files_only load asks the Hub for its agent registry. An explicit HF_HUB_OFFLINE=0 is left alone.
A process the launcher starts gets OFFLINE_ENV, the one set: the ranks' environment (launcher.session.prepare), a
rank process's own defaults (launcher.worker.main.rank_process_env) and the sbatch script's exports.
tests/model/test_offline.py holds every other module to not patching these.
"""

from __future__ import annotations

import os

OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
"""The Hugging Face offline switches, each on: huggingface_hub, datasets, and transformers' older name for the hub's."""
OFFLINE_VARS = tuple(OFFLINE_ENV)
_TRUE = {"1", "ON", "YES", "TRUE"}


def hub_offline() -> None:
    """Keep huggingface_hub and datasets off the network in this process and the ones it starts."""
    for var, value in OFFLINE_ENV.items():
        os.environ.setdefault(var, value)
    if os.environ["HF_HUB_OFFLINE"].strip().upper() in _TRUE:
        from huggingface_hub import constants

        constants.HF_HUB_OFFLINE = True
