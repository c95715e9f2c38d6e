"""The contract between the launcher and its ranks: environment variable names and the control file's name.

Defined here, in a module that imports nothing of the launcher's (hashlib only), so the CLI, the session, the backends and the sbatch emitter can
name them without importing launcher.runtime (which pulls torch)."""

import hashlib
import os
from pathlib import Path

PLAN_ENV = "LAUNCHER_PLAN"
"""Path of the run's plan.json."""
PLAN_DIGEST_ENV = "LAUNCHER_PLAN_SHA256"
"""sha256 of the plan.json the launcher wrote for this attempt; a rank that reads another plan.json refuses to
start (something replaced the file after the launch: another `launch plan --out`, an edit)."""
RUN_DIR_ENV = "LAUNCHER_RUN_DIR"
"""The run directory: ranks/, steps/, checkpoint/ and control/ live under it."""
DS_CONFIG_ENV = "LAUNCHER_DS_CONFIG"
"""Path of the emitted ds_config.json (DeepSpeed plans only)."""
ENFORCE_ENV = "LAUNCHER_ENFORCE_BYTES"
"""Per-rank byte cap set by --enforce; crossing it raises torch.OutOfMemoryError."""
TRACK_ENV = "LAUNCHER_TRACK_CATEGORIES"
"""'1' tracks tensors by category with MemTracker on CUDA too (always on for CPU ranks; slows CUDA runs)."""
SNAPSHOT_ENV = "LAUNCHER_MEMORY_SNAPSHOT"
"""Set to 1 (launch --memory-snapshot): CUDA ranks record the allocator's history through their first step and
dump it to RUN_DIR/memory-snapshot/rank-K.pickle (open it at pytorch.org/memory_viz)."""
ATTEMPT_ENV = "LAUNCHER_ATTEMPT"
"""Which attempt (Slurm restart count) the ranks run; stamped on every step line."""
RDZV_ID_ENV = "LAUNCHER_RDZV_ID"
"""torchrun's rendezvous id; one per Slurm job attempt so a requeued job never joins its old rendezvous."""
CONTROL_FILE = "checkpoint"
"""RUN_DIR/control/<this>: its presence asks every rank to checkpoint and stop at the next step."""
MICRO_BATCH_ENV = "LAUNCHER_MICRO_BATCH_SIZE"
"""--script runs: the plan's micro-batch per rank (a DataLoader's batch_size, TrainingArguments'
per_device_train_batch_size). accelerate and HF Trainer have no variable of their own for it."""
GRAD_ACCUM_ENV = "LAUNCHER_GRAD_ACCUM_STEPS"
"""--script runs: the plan's gradient accumulation steps (ACCELERATE_GRADIENT_ACCUMULATION_STEPS carries the same)."""
GRAD_CKPT_ENV = "LAUNCHER_GRADIENT_CHECKPOINTING"
"""--script runs: '1' when the plan counts on activation checkpointing, else '0'."""


def plan_digest(data: bytes | str) -> str:
    """The hex sha256 of a plan.json's bytes, as the launcher puts it in PLAN_DIGEST_ENV."""
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def default_extensions_dir() -> Path:
    """Where compiled DeepSpeed ops are cached unless TORCH_EXTENSIONS_DIR says otherwise:
    <repo>/.cache/torch_extensions (repo = parent of launcher/), shared by the launcher's ranks and the tests."""
    return Path(__file__).resolve().parents[1] / ".cache" / "torch_extensions"


EXTENSIONS_ENV = "TORCH_EXTENSIONS_DIR"
"""Where torch's cpp_extension (DeepSpeed's op builder) compiles and finds ops."""


def extensions_dir() -> str:
    """The compiled-ops cache the ranks use: $TORCH_EXTENSIONS_DIR where the user chose one, else the default.
    The one place the rule lives: the launcher hands it to the ranks (session.prepare.rank_env) and a process that
    builds ops itself sets it (runtime.env.set_extensions_dir)."""
    return os.environ.get(EXTENSIONS_ENV, str(default_extensions_dir()))
