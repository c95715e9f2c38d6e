"""Run a user's training script (launch --script) inside a memory probe, so a script with no launcher import
gets the same rank report, and so the same verdict, as the built-in worker.

What is counted is the built-in worker's basis (launcher.runtime.probe): on CUDA the allocator's peak reserved
bytes plus what lives outside it (CUDA context, NCCL buffers); on CPU every tensor the probe's MemTracker sees
allocated by a torch op while the script runs (a TorchDispatchMode: process-wide, whatever module made the
tensor). Not counted on CPU: memory that never was a torch tensor made by an op (Python objects, tokenizers,
datasets, a safetensors file mapped by from_pretrained until its tensors are copied); the report's
peak_rss_bytes gives the process's high-water mark beside it. The whole script is one phase, "script": a
foreign script marks no forward/backward/optimizer phases.

The plan reaches the script where HF Trainer, TRL and accelerate build their arguments (launcher.runtime.script_args:
each value it replaced is in the rank's log and report). Steps are counted by a global optimizer-step hook
(torch.optim's register_optimizer_step_post_hook; a script with several optimizers counts each one's step) and written
to steps/rank-K.jsonl without loss or tokens/s; while an HF Trainer trains, its own steps make the lines instead, with
the loss, learning rate and tokens/s it logs. The first optimizer step fails the rank when the script's process
group does not span the plan's ranks (each rank would train alone).

A script that makes its own MemoryProbe (launcher.runtime.memory_probe) takes over: the wrapper stops
measuring and leaves the rank report to the script, writing its own only if the script wrote none.
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

from torch.optim.optimizer import register_optimizer_step_post_hook

from launcher.errors import EXIT_INTERRUPTED
from launcher.processes.rankenv import EXIT_OOM
from launcher.runtime.probe import error_tail, hold_outer, is_oom, memory_probe, outer_probe, release_outer

SCRIPT_PHASE = "script"
"""The one phase a foreign script's peak is reported under."""


class ScriptSteps:
    """A --script run's step lines: one per optimizer step (torch's global hook), or while an HF Trainer trains one
    per Trainer step, with the loss, learning rate and tokens/s it logs (launcher.runtime.script_args installs its
    callback). The first optimizer step also checks that the script trains over all the plan's ranks."""

    def __init__(self, probe):
        self.probe = probe
        self.steps = 0
        self.counted_by = "optimizer_step_hook"
        self.trainer = False
        self.checked = False
        self.pending: tuple[int, int] | None = None  # (Trainer step, its tokens) not written yet
        self.tokens_seen = 0

    def optimizer_step(self, *_args, **_kwargs) -> None:
        """torch's global optimizer-step hook: the world check at the first, then a line unless a Trainer counts."""
        if outer_probe() is not self.probe:
            return
        if not self.checked:
            self.checked = True
            problem = world_problem(self.probe.world_size)
            if problem:
                raise ScriptWorldError(problem)
        if not self.trainer:
            self.steps += 1
            self.write(self.steps, None, None)

    def write(self, step: int, loss: float | None, tokens: int | None, **extra) -> None:
        """One step line (MemoryProbe.step_done), the CUDA peaks noted first; none once the script's own probe
        took over (it writes its own lines)."""
        if outer_probe() is not self.probe:
            return
        if self.probe.is_cuda:
            self.probe._note_cuda(SCRIPT_PHASE)
        self.probe.step_done(step, loss, tokens or None, **extra)

    def trainer_begin(self, max_steps: int) -> None:
        """A Trainer starts training ``max_steps`` steps: its steps, not the optimizer hook's, make the lines; the
        first step's time starts now, not at the script's start; the rank file says the total (the live view's,
        status's: the script's count, not the job's train.max_steps)."""
        self.trainer, self.counted_by = True, "trainer_global_step"
        self.probe.restart_step_clock()
        if outer_probe() is self.probe and self.probe.run_dir is not None and max_steps > 0:
            self.probe.note(total_steps=int(max_steps))
            self.probe.write(status="running")

    def trainer_step(self, step: int, tokens_seen: int) -> None:
        """The Trainer's optimizer step ``step`` ended (``tokens_seen``: its running count over all ranks)."""
        self._flush()
        self.pending = (step, max(0, int(tokens_seen) - self.tokens_seen))
        self.tokens_seen = int(tokens_seen)

    def trainer_log(self, step: int, logs: dict) -> None:
        """The Trainer logged: a training loss for the pending step makes its line a log step."""
        if self.pending and self.pending[0] == step and isinstance(logs.get("loss"), (int, float)):
            lr = logs.get("learning_rate")
            self.write(step, float(logs["loss"]), self.pending[1],
                       **({"lr": float(lr)} if isinstance(lr, (int, float)) else {}))
            self.pending = None

    def trainer_end(self) -> None:
        """The Trainer stopped training: its last line, then the optimizer hook counts on from its step."""
        self._flush()
        self.trainer = False
        self.steps = max(self.steps, self.probe.step)

    def _flush(self) -> None:
        if self.pending:
            self.write(*self.pending[:1], None, self.pending[1])
            self.pending = None


class ScriptWorldError(RuntimeError):
    """The script trains on fewer ranks than the plan: each rank would run its own training."""


def world_problem(world_size: int) -> str | None:
    """Why the script's training does not span the plan's ``world_size`` ranks, with the fix; None when it does."""
    if world_size < 2:
        return None
    import torch.distributed as dist

    got = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    if got == world_size:
        return None
    return (f"the script trains on {got} of the plan's {world_size} ranks: at its first optimizer step "
            + ("no process group is initialized" if got == 1 else f"its process group has {got} ranks")
            + ", so each rank would run its own training and the plan's memory would not hold. Start one process "
            "group over all ranks before training: torch.distributed.init_process_group('gloo') on CPU ranks "
            "('nccl' on GPUs) in a plain torch script, Accelerator(cpu=True) or "
            "Accelerator(kwargs_handlers=[InitProcessGroupKwargs(backend='gloo')]) in an accelerate script on CPU")


def run_script(script: str, args: list[str]) -> int:
    """Run ``script`` as __main__ with ``args`` on this rank, the plan applied where HF and accelerate build their
    arguments (launcher.runtime.script_args); write RUN_DIR/ranks/rank-K.json; the exit code."""
    from launcher.runtime.script_args import Seam, script_plan

    probe = memory_probe()
    steps = ScriptSteps(probe)
    sys.argv = [script, *args]
    sys.path.insert(0, str(Path(script).resolve().parent))
    status, code, error, seam = "failed", 1, None, None
    hook = register_optimizer_step_post_hook(steps.optimizer_step)
    hold_outer(probe)
    try:
        plan = script_plan()
        seam = Seam(plan=plan, steps=steps).install() if plan is not None else None
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
        if is_oom(e):
            status, code = "oom", EXIT_OOM
            probe.note(oom=probe.oom_details())
        elif isinstance(e, KeyboardInterrupt):
            code = EXIT_INTERRUPTED
        print(f"[rank {probe.rank}] {status}: {error}", file=sys.stderr, flush=True)
    finally:
        hook.remove()
        if steps.trainer:
            steps.trainer_end()
        if seam is not None:
            seam.remove()
        probe.stop()
    took_over = release_outer(probe)
    own = probe.run_dir / "ranks" / f"rank-{probe.rank}.json" if probe.run_dir else None
    if own is not None and not (took_over and own.is_file()):
        probe.note(script=os.path.abspath(script), steps_counted_by=steps.counted_by,
                     **({"script_overrides": list(seam.overrides)} if seam is not None and seam.overrides else {}))
        probe.write(status=status, error=error)
    if probe.step_log is not None:
        probe.step_log.close()
    return code
