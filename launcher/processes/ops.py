"""DeepSpeed's compiled ops: which ones a plan loads, whether they are built, and building them once, saying so.

DeepSpeed JIT-compiles its C++ ops the first time a process loads one (torch.utils.cpp_extension into
$TORCH_EXTENSIONS_DIR/<op>/<op>.so), silently and for minutes on a small machine. So nothing builds an op a run
does not load (`bash scripts/demo.sh`'s FSDP2 plan loads none), and a run that loads one gets it built before its
ranks start, with a line that says which and for how long: `launch` (launcher.session.run.ensure_ops), a Slurm
task before its torchrun agent (launcher.backends.slurm_task), the `plan --sbatch` script before srun. The test
suite builds them all up front (scripts/test.sh). The one command:

    python -m launcher.processes.ops cpu_adam   # these ops; --all for every one; --plan RUN_DIR/plan.json for a plan's

Which ops a plan loads is the engine's to say (EngineSpec.native_ops); this module knows each op's builder and
its measured build time. deepspeed is imported only inside ``build``, so `launch plan` stays fast.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from launcher.processes.rankenv import extensions_dir, safe_python


@dataclass(frozen=True, slots=True)
class Op:
    """One DeepSpeed op the launcher's runs may load."""

    name: str
    """DeepSpeed's name for it: its directory and library in the extensions cache."""
    builder: str
    """The op builder's class name, as DeepSpeed's accelerator creates it (create_op_builder)."""
    build_s: float
    """Seconds one build takes on an idle 2-core machine, the figure the progress line and the Slurm time limit
    use: cpu_adam ~50 s (the set-up's builds, measured), async_io 157 s and deepspeed_shm_comm ~2 min (issue 36).
    Under load they stretch: cpu_adam took 436 s at a load of 12-16, pin_memory 122 s at 7-10 (30 s assumed idle;
    no plan loads it)."""
    loaded_by: str
    """What loads it, in words."""


OPS = {op.name: op for op in (
    Op(name="cpu_adam", builder="CPUAdamBuilder", build_s=50.0,
       loaded_by="ZeRO-Offload's CPU Adam (optimizer offload to CPU or NVMe)"),
    Op(name="async_io", builder="AsyncIOBuilder", build_s=160.0, loaded_by="ZeRO-Infinity's NVMe offload"),
    Op(name="deepspeed_shm_comm", builder="ShareMemCommBuilder", build_s=120.0,
       loaded_by="DeepSpeed's communication start on CPU ranks under accelerate or HF Trainer"),
    Op(name="pin_memory", builder="PinMemoryBuilder", build_s=30.0,
       loaded_by="DeepSpeed's native pinned memory (DS_PIN_MEMORY_BACKEND=native)"),
)}
"""Every op the launcher builds or names, by name."""


def plan_ops(plan) -> tuple[str, ...]:
    """The ops a run of ``plan`` (a launcher.planner.plan.Plan) loads, as its engine says."""
    from launcher.engines import engine_spec

    return engine_spec(plan.strategy.engine).native_ops(plan)


def built(name: str, ext_dir: str | os.PathLike | None = None) -> bool:
    """``name``'s library is in the extensions cache (``ext_dir``, default the one the ranks use)."""
    root = Path(ext_dir if ext_dir is not None else extensions_dir())
    return (root / name / f"{name}.so").is_file()


def missing(names: Iterable[str], ext_dir: str | os.PathLike | None = None) -> list[str]:
    """The ops of ``names`` not built yet, in order."""
    return [n for n in names if not built(n, ext_dir)]


def build_seconds(names: Iterable[str]) -> float:
    """The measured build time of ``names`` together, seconds."""
    return sum(OPS[n].build_s for n in names)


def progress_line(name: str, ext_dir: str) -> str:
    """What a process says before it builds ``name``."""
    return (f"building DeepSpeed's {name} op once into {ext_dir} (~{OPS[name].build_s:.0f} s on 2 cores; "
            f"later runs load it): {OPS[name].loaded_by}")


def build(names: Iterable[str], say: Callable[[str], None] = print) -> list[str]:
    """Build each op of ``names`` that is not built yet, in this process, saying each before and after; the
    failures, one line each (the op, DeepSpeed's reason). Call in a process of its own (``command``): it imports
    deepspeed and sets TORCH_EXTENSIONS_DIR and PATH (launcher.processes.rankenv.set_extensions_dir)."""
    from launcher.processes.rankenv import set_extensions_dir

    todo = missing(names)
    if not todo:
        return []
    where = set_extensions_dir()  # before deepspeed is imported: it reads the variable once
    from deepspeed.accelerator import get_accelerator

    acc, failed = get_accelerator(), []
    for name in todo:
        builder = acc.create_op_builder(OPS[name].builder)
        if builder is None or not builder.is_compatible(verbose=False):
            failed.append(f"{name}: DeepSpeed's compatibility check refuses it on this machine (a C++ compiler, "
                          "and libaio's headers for async_io, are needed)")
            continue
        say(progress_line(name, where))
        t0 = time.monotonic()
        try:
            builder.load(verbose=False)
        except Exception as e:  # any compiler or loader failure: reported as this op's, the others still built
            failed.append(f"{name}: the build failed ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})")
            continue
        say(f"built {name} in {time.monotonic() - t0:.0f} s")
    return failed


def command(names: Iterable[str]) -> list[str]:
    """The argv that builds ``names`` in a process of its own, with this interpreter (the working dir off sys.path)."""
    return [*safe_python(), "-m", "launcher.processes.ops", *names]


def ensure_built(plan_json: Path) -> str | None:
    """Before a run's ranks start (launcher.backends.local): build the ops the run dir's plan.json loads and this
    machine lacks, in a process of its own whose progress lines reach stderr. None when every op is there (no
    process started, deepspeed not imported), else why the run cannot start, in words."""
    import subprocess

    from launcher.planner.plan import read_plan

    try:
        todo = missing(plan_ops(read_plan(plan_json.parent)))
    except (OSError, ValueError):
        return None  # no readable plan here: the ranks' own check of plan.json names the problem
    if not todo:
        return None
    code = subprocess.run(command(todo), stdin=subprocess.DEVNULL).returncode
    if code == 0 and not missing(todo):
        return None
    loaded_by = "; ".join(OPS[n].loaded_by for n in todo)
    return (f"DeepSpeed's {', '.join(todo)} op(s), which this plan loads ({loaded_by}), did not build (the lines "
            "above say why); install a C++ compiler (g++), and libaio's headers for async_io (apt-get install "
            f"libaio-dev), then run again, or build them with python {' '.join(command(todo)[1:])}")


def main(argv: list[str] | None = None) -> int:
    """`python -m launcher.processes.ops`: build the named ops (or --all, or a plan's); exit 1 when one failed."""
    ap = argparse.ArgumentParser(prog="python -m launcher.processes.ops", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ops", nargs="*", metavar="OP", help=f"ops to build: {', '.join(OPS)}")
    ap.add_argument("--all", action="store_true", help="every op the launcher's runs and tests may load")
    ap.add_argument("--plan", type=Path, help="the ops this plan.json's run loads")
    a = ap.parse_args(argv)
    unknown = [n for n in a.ops if n not in OPS]
    if unknown:
        ap.error(f"{', '.join(map(repr, unknown))}: not an op the launcher builds; choose from {', '.join(OPS)}")
    names = list(OPS) if a.all else list(a.ops)
    if a.plan is not None:
        from launcher.planner.plan import Plan

        names += plan_ops(Plan.from_json(json.loads(a.plan.read_text())))
    if not os.environ.get("DS_ACCELERATOR"):
        # Without CUDA DeepSpeed picks its CPU accelerator anyway, after a warning that reads like a fault.
        import torch

        if not torch.cuda.is_available():
            os.environ["DS_ACCELERATOR"] = "cpu"
    failed = build(dict.fromkeys(names), say=lambda line: print(f"launch: {line}", file=sys.stderr, flush=True))
    for line in failed:
        print(f"launch: DeepSpeed op {line}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
