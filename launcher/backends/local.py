"""Run the ranks on this node through torch.distributed.run (torchrun's own parser and elastic agent)."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import uuid

from launcher.backends.base import Backend, LaunchSpec, Outcome, RankFailure
from launcher.rundir import RunDir


def torchrun_argv(run: RunDir, spec: LaunchSpec) -> list[str]:
    argv = ["--nproc-per-node", str(spec.gpus_per_node), "--max-restarts", "0", "--monitor-interval", "0.2"]
    if spec.nodes == 1 and not spec.rdzv_endpoint:
        argv += ["--standalone"]
    else:
        if not spec.rdzv_endpoint:
            raise ValueError("a multi-node run needs rdzv_endpoint")
        argv += ["--nnodes", str(spec.nodes), "--node-rank", str(spec.node_rank), "--rdzv-backend", "c10d",
                 "--rdzv-endpoint", spec.rdzv_endpoint, "--rdzv-id", _run_id(run)]
    argv += ["-m", "launcher.rank_entry", str(run.path)]
    if spec.script:
        argv += ["--script", spec.script, "--", *spec.script_args]
    return argv


def _run_id(run: RunDir) -> str:
    return os.environ.get("LAUNCHER_RDZV_ID") or uuid.uuid5(uuid.NAMESPACE_URL, str(run.path)).hex[:16]


class Watchdog(threading.Thread):
    """Ends the run when no rank has written a step or a memory file for ``timeout_s``.

    Collectives that never complete leave every rank silent; the ranks that did reach the step are named by
    their step files, so the message names the one that did not arrive.
    """

    def __init__(self, run: RunDir, world_size: int, timeout_s: float):
        super().__init__(daemon=True)
        self.run_dir, self.world_size, self.timeout_s = run, world_size, timeout_s
        self.fired: str | None = None
        self._stop_event = threading.Event()

    def stop(self) -> None:
        self._stop_event.set()

    def _progress(self) -> dict[int, tuple[float, int]]:
        out = {}
        for r in range(self.world_size):
            p = self.run_dir.steps / f"rank-{r}.jsonl"
            hb = self.run_dir.path / "heartbeat" / f"rank-{r}"
            stamps = [f.stat().st_mtime for f in (p, hb) if f.exists()]
            steps = sum(1 for _ in p.open()) if p.exists() else 0
            out[r] = (max(stamps) if stamps else 0.0, steps)
        return out

    def run(self) -> None:
        start = time.time()
        while not self._stop_event.wait(1.0):
            prog = self._progress()
            newest = max([start] + [t for t, _ in prog.values()])
            if time.time() - newest < self.timeout_s:
                continue
            most = max(s for _, s in prog.values())
            behind = [r for r, (_, s) in prog.items() if s < most] or [
                r for r, (t, _) in prog.items() if t == min(t for t, _ in prog.values())]
            self.fired = (f"no progress for {self.timeout_s:.0f} s (watchdog); rank(s) {behind} did not arrive at "
                          f"step {most + 1 if behind else most}")
            os.kill(os.getpid(), signal.SIGTERM)
            return


class LocalBackend(Backend):
    name = "local"

    def run(self, run: RunDir, spec: LaunchSpec) -> Outcome:
        from torch.distributed.elastic.multiprocessing.api import SignalException
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
        from torch.distributed.run import parse_args
        from torch.distributed.run import run as torchrun

        os.environ.update(spec.env)
        args = parse_args(torchrun_argv(run, spec))
        watchdog = None
        if spec.hang_timeout_s > 0:
            watchdog = Watchdog(run, spec.gpus_per_node * spec.nodes, spec.hang_timeout_s)
            watchdog.start()
        try:
            torchrun(args)
        except ChildFailedError as e:
            failures = [RankFailure(rank=rank, exitcode=f.exitcode, host=os.uname().nodename)
                        for rank, f in e.failures.items()]
            return Outcome(ok=False, failures=failures)
        except SignalException as e:
            if watchdog is not None and watchdog.fired:
                return Outcome(ok=False, message=watchdog.fired)
            return Outcome(ok=False, interrupted=True, message=f"interrupted by {e.sigval.name}")
        finally:
            if watchdog is not None:
                watchdog.stop()
            sys.stdout.flush()
        return Outcome(ok=True)
