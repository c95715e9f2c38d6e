"""Run the ranks on this node through torch.distributed.run (torchrun's own parser and elastic agent)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from launcher.backends.base import Backend, LaunchSpec
from launcher.files.fsutil import atomic_write
from launcher.files.ranklog import wait_settled
from launcher.files.rundir import RunDir
from launcher.processes.environ import patched_environ
from launcher.processes.ops import ensure_built
from launcher.processes.procs import ProcessRef
from launcher.processes.rankenv import AGENT_PID_ENV, RANK_MODULE, RDZV_ID_ENV, safe_python
from launcher.records.runreport import RankFailure, RunOutcome

CPU_PROGRESS_S = 0.1
"""CPU seconds a rank must burn between two watchdog polls to count as busy (gloo waits burn ~0)."""
MONITOR_INTERVAL_S = 0.05
"""How often the elastic agent looks at its ranks; a finished run waits up to this long to be noticed (torchrun's
default is 0.1 s; the poll is a waitpid per rank)."""
TORCHELASTIC_DIR_PREFIX = "launcher-torchelastic-"
"""This node's torchrun agent keeps its error files during the run in ``$TMPDIR/launcher-torchelastic-XXXXXXXX``
(0700; not in the run dir, whose every dir is 0700, since torchrun makes its own dirs under it 0755)."""
DUMP_WAIT_S = 5.0
"""How long the watchdog waits for the ranks it aborted to write their stacks and exit."""


def torchrun_argv(run: RunDir, spec: LaunchSpec, *, signals_to_handle: str | None = None,
                  log_dir: Path | None = None) -> list[str]:
    """torchrun's arguments for this node: standalone on one node, else c10d rendezvous at spec.rdzv_endpoint; then the
    rank entry module (or the user's --script) on the run dir."""
    argv = ["--nproc-per-node", str(spec.gpus_per_node), "--max-restarts", "0",
            "--monitor-interval", str(MONITOR_INTERVAL_S)]
    if log_dir is not None:
        argv += ["--log-dir", str(log_dir)]
    if signals_to_handle:
        argv += ["--signals-to-handle", signals_to_handle]
    if spec.nodes == 1 and not spec.rdzv_endpoint:
        argv += ["--standalone"]
    else:
        if not spec.rdzv_endpoint:
            raise ValueError("a multi-node run needs rdzv_endpoint")
        argv += ["--nnodes", str(spec.nodes), "--node-rank", str(spec.node_rank), "--rdzv-backend", "c10d",
                 "--rdzv-endpoint", spec.rdzv_endpoint, "--rdzv-id", _run_id(run)]
    # --no-python: torchrun's own `python -u -m` would put the rank's working dir first on sys.path.
    argv += ["--no-python", *safe_python(), "-u", "-m", RANK_MODULE, str(run.path)]
    if spec.script:
        argv += ["--script", spec.script, "--", *spec.script_args]
    return argv


def _run_id(run: RunDir) -> str:
    return os.environ.get(RDZV_ID_ENV) or uuid.uuid5(uuid.NAMESPACE_URL, str(run.path)).hex[:16]


def rank_processes() -> dict[int, object]:
    """This node's rank processes (psutil.Process) by global rank: torchrun starts them as our children."""
    import psutil

    out = {}
    for child in psutil.Process().children(recursive=False):
        try:
            if RANK_MODULE not in " ".join(child.cmdline()):
                continue
            rank = child.environ().get("RANK")
        except (psutil.Error, OSError):
            continue
        if rank is not None and rank.isdigit():
            out[int(rank)] = child
    return out


class RankRecorder(threading.Thread):
    """Records this node's rank processes (pid and start time) in state.json once torchrun has started them all:
    what tells later whether a rank still runs (launcher.records.runstate), however its launch ended."""

    def __init__(self, run: RunDir, ranks: int, poll_s: float = 0.2):
        super().__init__(daemon=True, name="launcher-rank-recorder")
        self.run_dir, self.count, self.poll_s = run, ranks, poll_s
        self._stop_event = threading.Event()

    def stop(self) -> None:
        """Stop looking (the ranks ended) and wait for the thread."""
        self._stop_event.set()
        self.join(timeout=5)

    def run(self) -> None:
        """The thread: poll until every rank of this node is up, then record them once."""
        while not self._stop_event.wait(self.poll_s):
            procs = rank_processes()
            if len(procs) >= self.count:
                refs = [ProcessRef.of(p.pid) for _, p in sorted(procs.items())]
                self.run_dir.set_state(self.run_dir.run_state().state or "running", ranks=refs)
                return


def alive(proc) -> bool:
    """True while a psutil process exists and is not a zombie (checked without reaping it)."""
    import psutil

    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _cpu_seconds(proc) -> float:
    """CPU time of a rank and everything it started (DataLoader workers, compilers)."""
    import psutil

    total = 0.0
    try:
        for p in [proc, *proc.children(recursive=True)]:
            t = p.cpu_times()
            total += t.user + t.system
    except psutil.Error:
        pass
    return total


@dataclass(kw_only=True, slots=True)
class RankStack:
    """Where one rank's main thread was when the watchdog stopped it (from its faulthandler dump)."""

    rank: int
    frames: list[tuple[str, int, str]] = field(default_factory=list)
    """(file, line, function), innermost first."""

    def collective(self) -> str | None:
        """The torch.distributed call this rank was waiting in, if any."""
        for path, _, func in self.frames:
            if "torch/distributed/distributed_c10d.py" in path or "deepspeed/comm/" in path:
                return func
        return None

    def where(self) -> str:
        """The innermost frame outside torch, for a person to look at."""
        for path, line, func in self.frames:
            if "/site-packages/torch/" not in path and "/site-packages/deepspeed/" not in path:
                return f"{path}:{line} in {func}"
        return "(no frame outside torch)" if self.frames else "(no Python frame)"


_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')


def parse_fault_dump(text: str, rank: int) -> RankStack | None:
    """The main thread's frames from the last faulthandler dump in a rank log, or None without one."""
    start = text.rfind("Fatal Python error:")
    if start < 0:
        return None
    threads: list[list[tuple[str, int, str]]] = []
    for line in text[start:].splitlines()[1:]:
        if line.startswith(("Thread 0x", "Current thread 0x")):
            threads.append([])
        elif threads and (m := _FRAME.match(line)):
            threads[-1].append((m.group(1), int(m.group(2)), m.group(3)))
    # Other threads end in threading.py's _bootstrap; the main thread ends in the rank's entry module.
    main = [t for t in threads if t and not t[-1][0].endswith("threading.py")]
    return RankStack(rank=rank, frames=main[0] if main else [])


class Watchdog(threading.Thread):
    """Ends the run when no rank has progressed for ``timeout_s``, and says which rank did not arrive.

    Progress is what a rank leaves behind: a line in steps/rank-K.jsonl, a new ranks/rank-K.json, a touch of
    heartbeat/rank-K (any script can do that), or output in logs/rank-K.log. CPU time counts too where the ranks
    run on CPU (gloo blocks without spinning) and, on GPUs, only before a rank's first step: importing and
    building print nothing, while a GPU rank blocked in an NCCL collective can spin a core.

    When it fires it aborts this node's ranks with SIGABRT: PYTHONFAULTHANDLER (set by the launcher) makes each
    write its Python stack into its log first. A rank waiting inside a torch.distributed collective arrived; one
    that is elsewhere did not. Without the stacks (another node's ranks) the step files decide: the ranks behind
    the others did not arrive.
    """

    def __init__(self, run: RunDir, world_size: int, timeout_s: float, *, cpu_is_progress: bool,
                 stop_run: Callable[[], None]):
        super().__init__(daemon=True, name="launcher-watchdog")
        self.run_dir, self.world_size, self.timeout_s = run, world_size, timeout_s
        self.cpu_is_progress = cpu_is_progress
        self.stop_run = stop_run
        self.triggered = threading.Event()
        """Set the moment the watchdog decides the run hangs (before it aborts anything)."""
        self.done = threading.Event()
        """Set once ``fired`` holds the message."""
        self.fired: str | None = None
        self._stop_event = threading.Event()
        self._seen: dict[int, tuple] = {}
        self._cpu: dict[int, float] = {}

    def stop(self) -> None:
        """Stop watching (the run ended); after firing, this also calls off its own stop of the run."""
        self._stop_event.set()

    def _file_signals(self, r: int) -> tuple:
        out = []
        for p in (self.run_dir.steps / f"rank-{r}.jsonl", self.run_dir.ranks / f"rank-{r}.json",
                  self.run_dir.path / "heartbeat" / f"rank-{r}", self.run_dir.rank_log(r)):
            try:
                st = p.stat()
                out.append((st.st_size, st.st_mtime_ns))
            except OSError:
                out.append(None)
        return tuple(out)

    def steps_done(self, r: int) -> int:
        """Step lines rank ``r`` has written to steps/rank-K.jsonl so far (0 when there is no file)."""
        p = self.run_dir.steps / f"rank-{r}.jsonl"
        try:
            with p.open("rb") as f:
                return sum(1 for ln in f if ln.strip())
        except OSError:
            return 0

    def poll(self, now: float, last: dict[int, float]) -> None:
        """Update each rank's last-progress time."""
        procs = rank_processes()
        for r in range(self.world_size):
            sig = self._file_signals(r)
            if self._seen.get(r) != sig:
                self._seen[r] = sig
                last[r] = now
            proc = procs.get(r)
            if proc is None:
                continue
            cpu = _cpu_seconds(proc)
            if cpu - self._cpu.get(r, 0.0) >= CPU_PROGRESS_S and (self.cpu_is_progress or self.steps_done(r) == 0):
                last[r] = now
            self._cpu[r] = cpu

    def run(self) -> None:
        """The thread: poll every second until stopped, and fire once no rank has progressed for timeout_s."""
        start = time.time()
        last: dict[int, float] = {}
        while not self._stop_event.wait(1.0):
            now = time.time()
            self.poll(now, last)
            newest = max([start, *last.values()])
            if now - newest >= self.timeout_s:
                self.fire(now - newest)
                return

    def fire(self, idle_s: float) -> None:
        """Declare a hang: abort this node's ranks for their stacks, set ``fired`` to the message naming the rank that
        did not arrive, and stop the run if the agent does not within 10 s."""
        self.triggered.set()
        steps = {r: self.steps_done(r) for r in range(self.world_size)}
        stacks = self.dump_stacks()
        self.fired = hang_message(self.timeout_s, idle_s, steps, stacks, self.run_dir)
        self.done.set()
        # The elastic agent sees the aborted ranks fail and stops the rest; if it does not (ranks on another
        # node, or a rank that ignored SIGABRT), stop the run ourselves.
        if not self._stop_event.wait(10.0):
            self.stop_run()

    def dump_stacks(self) -> dict[int, RankStack]:
        """SIGABRT this node's ranks (no core files), wait for their faulthandler dumps, and parse the main
        thread's stack from each log; ranks without a dump are left out."""
        import psutil

        procs = rank_processes()
        for proc in procs.values():
            try:
                proc.rlimit(psutil.RLIMIT_CORE, (0, 0))  # SIGABRT would leave a core file in the working dir
                proc.send_signal(signal.SIGABRT)
            except (psutil.Error, OSError):
                pass
        # Wait without reaping (psutil.wait_procs would waitpid() them, and the elastic agent, whose children
        # they are, would then read exit code 0 for every rank).
        deadline = time.monotonic() + DUMP_WAIT_S
        while time.monotonic() < deadline and any(alive(p) for p in procs.values()):
            time.sleep(0.1)
        stacks = {}
        for r in procs:
            wait_settled(self.run_dir.rank_log(r))  # the dump may still be on its way through the log's redactor
            try:
                text = self.run_dir.rank_log(r).read_text(errors="replace")
            except OSError:
                continue
            stack = parse_fault_dump(text, r)
            if stack is not None:
                stacks[r] = stack
        return stacks


def hang_message(timeout_s: float, idle_s: float, steps: dict[int, int], stacks: dict[int, RankStack],
                 run: RunDir) -> str:
    """One line: how long nothing moved, which rank(s) did not arrive and where each rank was."""
    head = f"hang: no rank made progress for {idle_s:.0f} s (--hang-timeout {timeout_s:g})"
    waiting = {r: s.collective() for r, s in stacks.items() if s.collective()}
    elsewhere = sorted(r for r, s in stacks.items() if not s.collective())
    if waiting and elsewhere:
        calls = ", ".join(sorted(set(waiting.values())))
        where = "; ".join(f"rank {r} was at {stacks[r].where()}" for r in elsewhere)
        body = (f"rank(s) {elsewhere} did not arrive at the collective ({calls}) that rank(s) {sorted(waiting)} "
                f"waited in; {where}")
    elif stacks:
        body = "every rank stopped was " + ("in a collective" if waiting else "outside any collective") + ": " + \
            "; ".join(f"rank {r} at {s.where()}" + (f" (in {s.collective()})" if s.collective() else "")
                      for r, s in sorted(stacks.items()))
        body += "; no rank can be named as the one that did not arrive"
    else:
        most = max(steps.values(), default=0)
        behind = sorted(r for r, n in steps.items() if n < most)
        if behind:
            body = f"rank(s) {behind} did not arrive at step {most} (by the step files; no stacks)"
        else:
            body = (f"every rank finished {most} step(s) and then stopped; no stacks were written, so no rank can "
                    "be named")
    return f"{head}; {body}; stacks in {run.logs}/rank-K.log"


class InterruptCheckpoint:
    """SIGINT/SIGTERM ask the ranks to checkpoint (RUN/control/checkpoint) and waits up to ``grace_s`` for them.

    A second signal, or the grace running out, stops the ranks the usual way (the elastic agent's shutdown).
    Installed only for --checkpoint-on-interrupt; torchrun is told not to install its own handlers for these
    two signals (its --signals-to-handle), so this one stays in charge.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, run: RunDir, grace_s: float):
        self.run_dir, self.grace_s = run, grace_s
        self.requested: signal.Signals | None = None
        self.immediate = False
        self._previous: dict[int, object] = {}
        self._timer: threading.Timer | None = None

    def install(self) -> None:
        """Take over SIGINT and SIGTERM, keeping the previous handlers for restore()."""
        for sig in self.SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)

    def restore(self) -> None:
        """Cancel the grace timer and put the previous signal handlers back."""
        if self._timer is not None:
            self._timer.cancel()
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def stop_now(self) -> None:
        """From any thread: end the run without waiting for a checkpoint."""
        self.immediate = True
        os.kill(os.getpid(), signal.SIGTERM)

    def _handle(self, signum: int, frame) -> None:
        from torch.distributed.elastic.multiprocessing.api import SignalException

        sig = signal.Signals(signum)
        if self.immediate or self.requested is not None:
            raise SignalException(f"Process {os.getpid()} got signal: {sig}", sigval=sig)
        self.requested = sig
        control = self.run_dir.control
        control.mkdir(parents=True, exist_ok=True)
        atomic_write(control / "checkpoint", f"{sig.name} at {time.time():.0f}\n")
        print(f"launch: {sig.name}: asked the ranks to checkpoint at the next step (waiting up to "
              f"{self.grace_s:g} s; send it again to stop now)", file=sys.stderr, flush=True)
        self._timer = threading.Timer(self.grace_s, self.stop_now)
        self._timer.daemon = True
        self._timer.start()


class LocalBackend(Backend):
    """The ranks on this machine through torchrun (one node, or this node's part of a multi-node rendezvous), with the
    hang watchdog and checkpoint-on-interrupt."""

    name = "local"

    def run(self, run: RunDir, spec: LaunchSpec) -> RunOutcome:
        """The ranks inherit this process's environment plus spec.env, which is taken back afterwards: the
        next attempt of a fallback ladder, or whatever runs in this process next, starts from a clean one."""
        # The ranks' parent is this process (torchrun's agent runs here); torchrun also exports its signal list, which
        # the next attempt must not inherit.
        env = {**spec.env, AGENT_PID_ENV: str(os.getpid())}
        with patched_environ(env, also=["TORCHELASTIC_SIGNALS_TO_HANDLE"]):
            try:  # DeepSpeed's ops this plan loads, built once before any rank starts (with a line saying so)
                unbuilt = ensure_built(run.path / "plan.json")
            except KeyboardInterrupt:
                return RunOutcome(ok=False, interrupted=True, message="interrupted while building DeepSpeed's ops; "
                                  "no rank started")
            if unbuilt:
                return RunOutcome(ok=False, message=unbuilt)
            return self._run(run, spec)

    def _run(self, run: RunDir, spec: LaunchSpec) -> RunOutcome:
        from torch.distributed.elastic.multiprocessing.api import SignalException
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
        from torch.distributed.run import parse_args
        from torch.distributed.run import run as torchrun

        interrupt = None
        if spec.checkpoint_on_interrupt_s > 0:
            interrupt = InterruptCheckpoint(run, spec.checkpoint_on_interrupt_s)
            interrupt.install()
        # torchrun's agent keeps its per-rank error files under --log-dir; left to itself it makes a /tmp/torchelastic_*
        # dir per run and never removes it. A private one of this launch's, removed when torchrun returns.
        log_dir = Path(tempfile.mkdtemp(prefix=TORCHELASTIC_DIR_PREFIX))
        # With the checkpoint handler in charge of SIGINT/SIGTERM, torchrun keeps only its handlers for the others.
        args = parse_args(torchrun_argv(run, spec, signals_to_handle="SIGHUP,SIGQUIT" if interrupt else None,
                                        log_dir=log_dir))
        stop_run = interrupt.stop_now if interrupt else (lambda: os.kill(os.getpid(), signal.SIGTERM))
        watchdog = None
        if spec.hang_timeout_s > 0:
            cpu_ranks = not _cuda_visible()
            watchdog = Watchdog(run, spec.gpus_per_node * spec.nodes, spec.hang_timeout_s, cpu_is_progress=cpu_ranks,
                                stop_run=stop_run)
            watchdog.start()
        # Node 0's launch owns state.json; a rank that outlives it (it should not: launcher.worker.rank_entry) is found.
        recorder = RankRecorder(run, spec.gpus_per_node) if spec.node_rank == 0 else None
        if recorder is not None:
            recorder.start()
        self.started()
        try:
            torchrun(args)
        except ChildFailedError as e:
            if watchdog is not None and watchdog.triggered.is_set():
                watchdog.done.wait(DUMP_WAIT_S + 10)
                return RunOutcome(ok=False, message=watchdog.fired or "hang: the watchdog stopped the ranks")
            failures = [RankFailure(rank=rank, exitcode=f.exitcode, host=os.uname().nodename)
                        for rank, f in e.failures.items()]
            return RunOutcome(ok=False, failures=failures)
        except SignalException as e:
            if watchdog is not None and watchdog.triggered.is_set():
                watchdog.done.wait(DUMP_WAIT_S + 10)
                return RunOutcome(ok=False, message=watchdog.fired or "hang: the watchdog stopped the ranks")
            how = "" if interrupt is None or interrupt.requested is None else \
                f" (no checkpoint within {spec.checkpoint_on_interrupt_s:g} s, or asked again)"
            return RunOutcome(ok=False, interrupted=True, message=f"interrupted by {e.sigval.name}{how}")
        finally:
            if recorder is not None:
                recorder.stop()
            if watchdog is not None:
                watchdog.stop()
            if interrupt is not None:
                interrupt.restore()
            shutil.rmtree(log_dir, ignore_errors=True)
            sys.stdout.flush()
        world_size = spec.gpus_per_node * spec.nodes
        if interrupt is not None and interrupt.requested is not None \
                and "checkpointed" in run.rank_statuses(world_size).values():
            tag = run.latest_checkpoint
            return RunOutcome(ok=True, interrupted=True,
                           message=f"interrupted by {interrupt.requested.name}; the ranks saved checkpoint {tag}")
        return RunOutcome(ok=True)


def _cuda_visible() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # torch without CUDA support: CPU ranks
        return False


__all__ = ["LocalBackend", "Watchdog", "InterruptCheckpoint", "parse_fault_dump", "hang_message"]
