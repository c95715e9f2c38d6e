"""Run a user's training script (launch --script) inside a memory probe, so a script with no launcher import
gets the same rank report, and so the same verdict, as the built-in worker.

What is counted is the built-in worker's basis (launcher.runtime.probe): on CUDA the allocator's peak reserved
bytes plus what lives outside it (CUDA context, NCCL buffers); on CPU every tensor the probe's MemTracker sees
allocated by a torch op while the script runs (a TorchDispatchMode: process-wide, whatever module made the
tensor). Not counted on CPU: memory that never was a torch tensor made by an op (Python objects, tokenizers,
datasets, a safetensors file mapped by from_pretrained until its tensors are copied); the report's
peak_rss_bytes gives the process's high-water mark beside it. The whole script is one phase, "script": a
foreign script marks no forward/backward/optimizer phases. Steps are counted by a global optimizer-step hook
(torch.optim's register_optimizer_step_post_hook) and written to steps/rank-K.jsonl without loss or tokens/s;
a script with several optimizers counts each one's step.

A script that makes its own MemoryProbe (launcher.runtime.memory_probe) takes over: the wrapper stops
measuring and leaves the rank report to the script, writing its own only if the script wrote none.
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from launcher.errors import EXIT_INTERRUPTED
from launcher.rankenv import EXIT_OOM
from launcher.runtime import probe as probe_mod
from launcher.runtime.probe import error_tail, memory_probe

SCRIPT_PHASE = "script"
"""The one phase a foreign script's peak is reported under."""


def _is_oom(exc: BaseException | None) -> bool:
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, torch.OutOfMemoryError):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def run_script(script: str, args: list[str]) -> int:
    """Run ``script`` as __main__ with ``args`` on this rank; write RUN_DIR/ranks/rank-K.json; the exit code."""
    probe = memory_probe()
    steps = 0

    def on_step(optimizer, *_args, **_kwargs) -> None:
        nonlocal steps
        if probe_mod.OUTER is not probe:
            return
        steps += 1
        if probe.is_cuda:
            probe._note_cuda(SCRIPT_PHASE)
        probe.step_done(steps, None, None)

    sys.argv = [script, *args]
    sys.path.insert(0, str(Path(script).resolve().parent))
    status, code, error = "failed", 1, None
    hook = register_optimizer_step_post_hook(on_step)
    probe_mod.OUTER = probe
    try:
        probe.start()
        with probe.phase(SCRIPT_PHASE):
            runpy.run_path(script, run_name="__main__")
        status, code = "completed", 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        status = "completed" if code == 0 else "failed"
        if code:
            error = f"the script exited with {e.code!r}"
    except BaseException as e:  # noqa: BLE001 - every failure must leave a rank report behind
        error = error_tail(e)
        if _is_oom(e):
            status, code = "oom", EXIT_OOM
            probe.record(oom=probe.oom_details())
        elif isinstance(e, KeyboardInterrupt):
            code = EXIT_INTERRUPTED
        print(f"[rank {probe.rank}] {status}: {error}", file=sys.stderr, flush=True)
    finally:
        hook.remove()
        probe.stop()
    took_over = probe_mod.OUTER is not probe
    probe_mod.OUTER = None
    own = probe.run_dir / "ranks" / f"rank-{probe.rank}.json" if probe.run_dir else None
    if own is not None and not (took_over and own.is_file()):
        probe.record(script=os.path.abspath(script), steps_counted_by="optimizer_step_hook")
        probe.write(status=status, error=error)
    if probe.step_log is not None:
        probe.step_log.close()
    return code
