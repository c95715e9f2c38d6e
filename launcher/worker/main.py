"""The worker's main (``python -m launcher.worker.rank_entry RUN_DIR`` runs it): read the run dir, train, report,
exit with a code."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import yaml

from launcher.config.job import Job
from launcher.config.load import from_dict
from launcher.errors import EXIT_INTERRUPTED, ConfigError, LauncherError
from launcher.model.offline import OFFLINE_ENV
from launcher.planner.plan import Plan
from launcher.processes import rankenv
from launcher.processes.rankenv import EXPANDABLE_SEGMENTS
from launcher.runtime.probe import error_tail, is_oom, memory_probe

RANK_PROCESS_ENV = {**OFFLINE_ENV, "TOKENIZERS_PARALLELISM": "false",
                    "PYTORCH_CUDA_ALLOC_CONF": EXPANDABLE_SEGMENTS}
"""Defaults a rank process runs with unless its environment says otherwise: hubs offline, tokenizers quiet, CUDA's
caching allocator with expandable segments (before the first CUDA call reads it; CPU ranks ignore it)."""


def rank_process_env(run_dir: Path) -> None:
    """The one seam where a rank process sets its own environment, first thing in main() (importing this module
    changes nothing): the shared cache of compiled DeepSpeed ops (before deepspeed is imported),
    RANK_PROCESS_ENV (before huggingface_hub reads them at its import), and the run dir and plan the runtime's
    readers (launcher.processes.rankenv) find, as they would under the launcher."""
    rankenv.set_extensions_dir()
    for name, value in RANK_PROCESS_ENV.items():
        os.environ.setdefault(name, value)
    os.environ[rankenv.RUN_DIR_ENV] = str(run_dir)
    os.environ.setdefault(rankenv.PLAN_ENV, str(run_dir / "plan.json"))

USAGE = "usage: python -m launcher.worker.rank_entry RUN_DIR   (started by torchrun on every rank)"


def load_run_dir(run_dir: Path) -> tuple[Job, Plan, str]:
    """The job and plan in ``run_dir`` and the plan's sha256; relative data paths resolve against it. A plan.json
    other than the one the launcher wrote for this attempt is refused. (The engine reads its own config files:
    make_engine.)"""
    missing = [n for n in ("job.yaml", "plan.json") if not (run_dir / n).exists()]
    if missing:
        raise ConfigError(f"{run_dir}: no {' or '.join(missing)}; pass a run dir the launcher wrote")
    job = from_dict(Job, yaml.safe_load((run_dir / "job.yaml").read_text()))
    job.base_dir = str(run_dir)
    if not Path(job.data.path).is_absolute():
        job.data.path = str((run_dir / job.data.path).resolve())
    raw = (run_dir / "plan.json").read_bytes()
    digest = rankenv.check_plan_digest(raw, run_dir / "plan.json")
    plan = Plan.from_json(json.loads(raw))
    return job, plan, digest


def make_engine(plan: Plan, run_dir: Path, device: torch.device):
    """The rank-side Engine the plan's engine names (launcher.worker.engines.engine_class), built from the plan and
    its own config files in ``run_dir``."""
    from launcher.worker.engines import engine_class

    return engine_class(plan.strategy.engine).from_plan(plan, run_dir, device)


def init_distributed(engine, device: torch.device) -> None:
    """Form the process group through the engine: NCCL on CUDA (after choosing this rank's GPU), gloo on CPU."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    engine.init_process_group(backend)


def main(argv: list[str]) -> int:
    """A rank of the built-in worker on a run dir: load and check the plan, train, and always write the rank's
    memory report; the exit code (EXIT_OOM on out of memory)."""
    if len(argv) != 1:
        print(USAGE, file=sys.stderr)
        return 2
    run_dir = Path(argv[0]).resolve()
    rank_process_env(run_dir)
    from launcher.worker.loop import Trainer

    _, local_rank, _ = rankenv.rank_info()
    device = torch.device(f"cuda:{local_rank}") if torch.cuda.is_available() else torch.device("cpu")
    probe = memory_probe(device=device, run_dir=run_dir)
    status, code, error = "failed", 1, None
    try:
        job, plan, digest = load_run_dir(run_dir)
        probe.note(plan_sha256=digest)  # what this rank trains, for the report to compare with the launcher's
        if plan.precision == "fp16" and device.type != "cuda":
            raise ConfigError(
                "train.precision: 'fp16' needs CUDA (loss scaling and fp16 kernels); these ranks run on CPU; "
                "use bf16 or fp32"
            )
        engine = make_engine(plan, run_dir, device)
        init_distributed(engine, device)
        trainer = Trainer(job=job, plan=plan, engine=engine, run_dir=run_dir, device=device, probe=probe)
        trainer.prepare_data()
        with probe:
            status = trainer.run()
        code = 0
    except BaseException as e:  # noqa: BLE001 - every failure must leave a rank report behind
        error = error_tail(e)
        if is_oom(e):
            status, code = "oom", rankenv.EXIT_OOM
            probe.note(oom=probe.oom_details())
        elif isinstance(e, LauncherError):
            code, error = e.exit_code, str(e)
        elif isinstance(e, KeyboardInterrupt):
            code = EXIT_INTERRUPTED
        print(f"[rank {probe.rank}] {status}: {error}", file=sys.stderr, flush=True)
    finally:
        probe.stop()
    probe.write(status=status, error=error)
    if probe.step_log is not None:
        probe.step_log.close()
    if code == 0 and dist.is_initialized():
        dist.destroy_process_group()
    return code
