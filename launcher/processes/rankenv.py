"""The contract between the launcher and its ranks: the environment variables and the control file the launcher
sets, and the readers a rank (or a user's --script) gets them back through.

Light on purpose (errors only; the plan's dataclasses load inside load_plan), so the CLI, the session, the
backends and the sbatch emitter can name these without importing launcher.runtime (which pulls torch)."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

from launcher.errors import EXIT_OOM, ConfigError  # noqa: F401  (EXIT_OOM: re-exported for scripts)

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
HEAP_ENV = "LAUNCHER_HEAP_CHECK"
"""'1': CPU ranks also sample glibc's heap in use beside every tracked op (launcher.runtime.heap), an instrument
independent of the tracker, and report it beside the tracked peak (rank-K.json heap_check)."""
SNAPSHOT_ENV = "LAUNCHER_MEMORY_SNAPSHOT"
"""Set to 1 (launch --memory-snapshot): CUDA ranks record the allocator's history through their first step and
dump it to RUN_DIR/memory-snapshot/rank-K.pickle (open it at pytorch.org/memory_viz)."""
ATTEMPT_ENV = "LAUNCHER_ATTEMPT"
"""Which attempt (Slurm restart count) the ranks run; stamped on every step line."""
RDZV_ID_ENV = "LAUNCHER_RDZV_ID"
"""torchrun's rendezvous id; one per Slurm job attempt so a requeued job never joins its old rendezvous."""
AGENT_PID_ENV = "LAUNCHER_AGENT_PID"
"""The pid of the process that starts the ranks (launch, whose torchrun agent runs in-process): a rank whose
parent is already another one by the time it arms its parent-death signal was orphaned while it started."""
CONTROL_FILE = "checkpoint"
"""RUN_DIR/control/<this>: its presence asks every rank to checkpoint and stop at the next step."""
MICRO_BATCH_ENV = "LAUNCHER_MICRO_BATCH_SIZE"
"""--script runs: the plan's micro-batch per rank (a DataLoader's batch_size, TrainingArguments'
per_device_train_batch_size). accelerate and HF Trainer have no variable of their own for it."""
GRAD_ACCUM_ENV = "LAUNCHER_GRAD_ACCUM_STEPS"
"""--script runs: the plan's gradient accumulation steps (ACCELERATE_GRADIENT_ACCUMULATION_STEPS carries the same)."""
GRAD_CKPT_ENV = "LAUNCHER_GRADIENT_CHECKPOINTING"
"""--script runs: '1' when the plan counts on activation checkpointing, else '0'."""


EXPANDABLE_SEGMENTS = "expandable_segments:True"
"""PYTORCH_CUDA_ALLOC_CONF for CUDA ranks unless the user set one. The first GPU check (benchmarks/results/gpu.md,
one H100, default allocator) measured reserved - allocated at 10 % to 35 % of allocated (31 % on a 1.2B Llama with
op-level SAC): whole cached blocks that a new size cannot reuse. Expandable segments map pages into one segment as
it grows (PyTorch "CUDA semantics: memory management"; CUDACachingAllocator.cpp, 2 MiB pages), which is what
torchtitan and torchtune set for their runs and what PyTorch's own OOM message suggests. The planner's
allocator_reserve (8 %) is then an upper estimate, not yet measured (benchmarks/gpu/splits.py GPU_VALIDATION_1)."""

def plan_digest(data: bytes | str) -> str:
    """The hex sha256 of a plan.json's bytes, as the launcher puts it in PLAN_DIGEST_ENV."""
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def default_extensions_dir() -> Path:
    """Where compiled DeepSpeed ops are cached unless TORCH_EXTENSIONS_DIR says otherwise:
    <repo>/.cache/torch_extensions (repo = parent of launcher/), shared by the launcher's ranks and the tests."""
    return Path(__file__).resolve().parents[2] / ".cache" / "torch_extensions"


EXTENSIONS_ENV = "TORCH_EXTENSIONS_DIR"
"""Where torch's cpp_extension (DeepSpeed's op builder) compiles and finds ops."""


def extensions_dir() -> str:
    """The compiled-ops cache the ranks use: $TORCH_EXTENSIONS_DIR where the user chose one, else the default.
    The one place the rule lives: the launcher hands it to the ranks (session.prepare.rank_env) and a process that
    builds ops itself sets it (set_extensions_dir)."""
    return os.environ.get(EXTENSIONS_ENV, str(default_extensions_dir()))


def load_plan(path: str | os.PathLike | None = None):
    """The run's Plan, from ``path`` or from the file named by $LAUNCHER_PLAN."""
    from launcher.planner.plan import Plan

    path = path or os.environ.get(PLAN_ENV)
    if not path:
        raise ConfigError(
            f"${PLAN_ENV} is not set; start this script through the launcher, or export {PLAN_ENV}=RUN_DIR/plan.json"
        )
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{PLAN_ENV}={path}: no such file; point it at the run dir's plan.json") from None
    check_plan_digest(raw, path)
    return Plan.from_json(json.loads(raw))


def check_plan_digest(raw: bytes, path: str | os.PathLike) -> str:
    """The plan's sha256; ConfigError when $LAUNCHER_PLAN_SHA256 names another one. The launcher sets it to the
    plan.json it wrote for this attempt: a rank that read a file replaced since (another `launch plan --out`
    into the run dir, an edit) would train a plan the launcher neither checked nor reports."""
    got = plan_digest(raw)
    want = os.environ.get(PLAN_DIGEST_ENV, "").strip().lower()
    if want and got != want:
        raise ConfigError(
            f"{path}: this plan.json is not the one the launcher wrote for this run (sha256 {got[:12]}..., "
            f"${PLAN_DIGEST_ENV} says {want[:12]}...): it was replaced after the launch; nothing was trained. "
            "Relaunch (launch ... --run-dir DIR --overwrite) and do not write into a run dir while it runs")
    return got


def run_dir() -> Path | None:
    """The run dir the launcher gave this rank ($LAUNCHER_RUN_DIR); None outside a launched run."""
    d = os.environ.get(RUN_DIR_ENV)
    return Path(d) if d else None


def agent_pid() -> int | None:
    """The launcher's agent pid ($LAUNCHER_AGENT_PID); None when the ranks were started otherwise (torchrun by
    hand, an sbatch script)."""
    raw = os.environ.get(AGENT_PID_ENV, "").strip()
    return int(raw) if raw.isdigit() else None


def enforce_bytes() -> int | None:
    """The per-rank cap the launcher set with --enforce, bytes; None without one, ConfigError when unparsable."""
    raw = os.environ.get(ENFORCE_ENV, "").strip()
    if not raw:
        return None
    try:
        n = int(float(raw))
    except ValueError:
        raise ConfigError(f"{ENFORCE_ENV}={raw!r} is not a byte count; set it to an integer such as "
                          "16000000000") from None
    if n <= 0:
        raise ConfigError(f"{ENFORCE_ENV}={raw!r} must be positive; unset it to run without a cap")
    return n


def rank_info() -> tuple[int, int, int]:
    """(rank, local_rank, world_size) from torchrun's variables; (0, 0, 1) outside torchrun."""
    return int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def use_local_tools() -> None:
    """Put the running interpreter's bin directory first on this process's PATH, once, the rest kept after it.

    torch's cpp_extension builds DeepSpeed's ops with whichever ``ninja`` PATH finds first, and ninja versions hash
    commands differently in the cache's .ninja_log (apt's 1.11 against pip's 1.13, measured): a process that finds
    the other one rebuilds the op it finds, and the next process of the first kind rebuilds it back (~30 s each on 2
    cores). With the interpreter's own bin first, every launcher process and rank builds with the ninja installed
    beside the interpreter (pip's, a dependency of deepspeed), as set-up did. Called by every rank on its own node
    (launcher.worker.rank_entry, the worker's and a script's), by a process that builds ops (set_extensions_dir) and by
    the test process."""
    bin_dir = str(Path(sys.executable).parent)
    rest = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != bin_dir]
    os.environ["PATH"] = os.pathsep.join([bin_dir, *rest])


def set_extensions_dir() -> str:
    """Point TORCH_EXTENSIONS_DIR at the shared cache unless the user chose one, and put this interpreter's tools
    first on PATH (use_local_tools: the ninja the cache was built with); call before importing deepspeed."""
    os.environ[EXTENSIONS_ENV] = chosen = extensions_dir()
    use_local_tools()
    return chosen


RANK_MODULE = "launcher.worker.rank_entry"
"""What every rank runs: ``python -u -m launcher.worker.rank_entry RUN_DIR``, the interpreter as safe_python gives
it."""
SAFE_PATH_BOOTSTRAP = ("import runpy, sys; del sys.path[0]; i = sys.argv.index('-m'); m = sys.argv[i + 1]; "
                       "del sys.argv[1:i + 2]; runpy.run_module(m, run_name='__main__', alter_sys=True)")
"""Python 3.10's stand-in for -P: ``python -u -c BOOTSTRAP -u -m MODULE ARGS`` drops the working dir from sys.path,
then runs MODULE with ARGS as ``python -m`` would."""


def safe_python(python: str | None = None) -> list[str]:
    """The interpreter (default: this one) and the flags to which ``-u -m MODULE ARGS`` is appended, keeping the
    working dir off sys.path: ``-m`` puts it first, so a ``launcher/`` dir where a rank or a Slurm task starts
    would shadow the installed launcher. ``-P`` on Python 3.11+, SAFE_PATH_BOOTSTRAP on 3.10."""
    python = python or sys.executable
    return [python, "-P"] if sys.version_info >= (3, 11) else [python, "-u", "-c", SAFE_PATH_BOOTSTRAP]
