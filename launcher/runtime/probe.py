"""The per-rank memory probe: peaks per phase, the category breakdown at the peak, the rank report.

On CPU ranks every tensor is counted by a MemTracker (the rank's "device" is host
memory, so the tracked total is the number compared with the budget): basis
"cpu_tensor_bytes". On CUDA the verdict judges what actually OOMs, basis
"cuda_reserved_plus_context": the allocator's max_memory_reserved per phase plus
what lives outside the allocator (CUDA context, NCCL buffers), measured as
total - free - reserved from torch.cuda.mem_get_info (the rank's GPU is its own).
max_memory_allocated is reported beside it. The MemTracker breakdown is added on
CUDA only when $LAUNCHER_TRACK_CATEGORIES=1 because it runs Python on every op.
"""

from __future__ import annotations

import dataclasses
import os
import resource
import socket
import time
import traceback
import typing
from contextlib import contextmanager
from pathlib import Path

import torch

from launcher.processes import rankenv
from launcher.records.rankreport import OomDetails, RankReport, RankStatus
from launcher.records.steprow import StepRow
from launcher.runtime.files import JsonlLog, atomic_write_json
from launcher.runtime.heap import heap_in_use_bytes
from launcher.runtime.tracker import PhaseMemTracker, by_category, fsdp_tracker, raw_breakdown
from launcher.units import format_bytes

REPORT_FIELDS = frozenset(f.name for f in dataclasses.fields(RankReport)) - {"extra", "schema"}
"""The rank report's fields by name: what MemoryProbe.note accepts."""
TRAINING_PHASES = ("forward", "backward", "optimizer_step")
"""The phases whose peak the planner predicts; init, eval and checkpoint are reported beside them."""


def peak_rss_bytes() -> int:
    """This process's peak resident set size, bytes (Linux: ru_maxrss is in KiB)."""
    # Linux reports ru_maxrss in KiB.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


_OUTER: MemoryProbe | None = None
"""The probe launch --script runs a foreign script in (launcher.runtime.script); a probe the script starts
itself takes over from it (the script knows its phases and steps). Written only by hold_outer, release_outer and
a probe's start()."""


def hold_outer(probe: MemoryProbe) -> None:
    """A --script run measures in ``probe`` from now on, until a probe the script starts itself takes over."""
    global _OUTER
    _OUTER = probe


def outer_probe() -> MemoryProbe | None:
    """The probe a --script run measures in now (the runner's, or the script's own that took over); None outside."""
    return _OUTER


def release_outer(probe: MemoryProbe) -> bool:
    """The --script run is over: no outer probe from now on; True when a probe the script started took over from
    ``probe``."""
    global _OUTER
    took_over, _OUTER = _OUTER is not probe, None
    return took_over

SNAPSHOT_MAX_ENTRIES = 200_000
"""Allocation events kept by --memory-snapshot (PyTorch's memory_viz reads them)."""


class MemoryProbe:
    """Measures one rank. Use ``with probe:`` around the work, ``probe.phase(name)`` around each part.

    Example (a user's own loop)::

        probe = memory_probe()
        with probe:
            for step in range(n):
                with probe.phase("forward"):
                    loss = model(batch).loss
                with probe.phase("backward"):
                    loss.backward()
                with probe.phase("optimizer_step"):
                    opt.step(); opt.zero_grad()
                probe.step_done(step + 1, loss.item(), tokens=batch_tokens)
        probe.write()
    """

    def __init__(
        self,
        *,
        device: torch.device | str | None = None,
        run_dir: str | os.PathLike | None = None,
        enforce_bytes: int | None = None,
        track_categories: bool | None = None,
    ):
        self.rank, self.local_rank, self.world_size = rankenv.rank_info()
        if device is None:
            device = f"cuda:{self.local_rank}" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        self.is_cuda = self.device.type == "cuda"
        if track_categories is None:
            track_categories = not self.is_cuda or os.environ.get(rankenv.TRACK_ENV) == "1"
        self.track_categories = track_categories
        self.check_heap = not self.is_cuda and os.environ.get(rankenv.HEAP_ENV) == "1"
        """Sample glibc's heap beside the tracker (launcher.runtime.heap): $LAUNCHER_HEAP_CHECK=1 on a CPU rank."""
        self.enforce_bytes = enforce_bytes
        self.run_dir = Path(run_dir) if run_dir else None
        self.tracker = None
        self.phase_name = "other"
        self.step = 0
        self.fields: dict[str, object] = {}
        self.losses: list[float] = []
        self.cuda_phase_peaks: dict[str, int] = {}
        self.cuda_max_allocated = 0
        self.cuda_max_reserved = 0
        self.cuda_phase_reserved: dict[str, int] = {}
        self.cuda_outside_bytes = 0
        """Device bytes outside the caching allocator (CUDA context, NCCL buffers), the largest seen."""
        self._oom_raised = False
        self._capped = False
        """--enforce has set the allocator's fraction (CUDA): sample_outside_allocator then keeps it current."""
        self.after_step_snap: dict | None = None
        self._t_step = time.perf_counter()
        self.snapshot = self.is_cuda and os.environ.get(rankenv.SNAPSHOT_ENV) == "1" and self.run_dir is not None
        """Record the CUDA allocator's history from start() through the first step (launch --memory-snapshot)."""
        self.step_log = JsonlLog(self.run_dir / "steps" / f"rank-{self.rank}.jsonl") if self.run_dir else None

    # -- lifecycle -------------------------------------------------------------------------------------------
    def __enter__(self) -> MemoryProbe:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        """Start measuring: take over from an outer probe, sample the CUDA context, apply the --enforce cap and the
        snapshot recording on CUDA, and enter the category tracker where it is on."""
        global _OUTER
        if _OUTER is not None and _OUTER is not self:
            _OUTER.stop()  # one MemTracker at a time: the script's own probe measures from here
            _OUTER = self
        if self.is_cuda:
            self.sample_outside_allocator()
        if self.is_cuda and self.enforce_bytes:
            self._cap_allocator()
        if self.snapshot:
            # A bounded ring of allocation events: one step of a large model stays well inside it.
            torch.cuda.memory._record_memory_history(max_entries=SNAPSHOT_MAX_ENTRIES)
        if self.track_categories and self.tracker is None:
            self._enter(PhaseMemTracker())

    def _enter(self, tracker) -> None:
        cap = None if self.is_cuda else self.enforce_bytes
        tracker.setup(self.device, cap, heap_in_use_bytes if self.check_heap else None, TRAINING_PHASES)
        tracker.start_phase(self.phase_name)
        tracker.__enter__()
        self.tracker = tracker

    def stop(self) -> None:
        """Leave the category tracker, if one is active."""
        if self.tracker is not None and self.tracker._depth > 0:
            self.tracker.__exit__(None, None, None)

    def use_fsdp_tracker(self, root: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
        """Swap to FSDPMemTracker once the model is fully_shard-ed; the peaks measured so far are kept."""
        if not self.track_categories:
            return
        old = self.tracker
        self.stop()
        new = fsdp_tracker(root, optimizer)
        self._enter(new)
        if old is not None:
            for name in ("phase_peak_bytes", "phase_peak_snap", "peak_bytes", "peak_snap", "peak_phase", "heap_check"):
                setattr(new, name, getattr(old, name))
            new.start_phase(self.phase_name)

    # -- attribution ------------------------------------------------------------------------------------------
    def track(self, *external, **categories) -> None:
        """Count objects made before tracking began (MemTracker.track_external), then label tensors by category.

        ``categories`` maps a category (params, grads, optimizer, activations, temp, buffers, other) to tensors.
        """
        if self.tracker is None:
            return
        if external:
            self.tracker.track_external(*external)
        for category, tensors in categories.items():
            self.tracker.label(tensors, category)

    def relabel(self, old: str, new: str) -> int:
        """Move every live tensor labelled ``old`` to category ``new``; the bytes moved (0 without a tracker)."""
        return self.tracker.relabel(old, new) if self.tracker is not None else 0

    # -- phases -----------------------------------------------------------------------------------------------
    @contextmanager
    def phase(self, name: str):
        """Context manager: measure the enclosed code as phase ``name`` (its own peak), then return to the outer phase
        and check the cap."""
        prev = self.phase_name
        self.phase_name = name
        if self.tracker is not None:
            self.tracker.start_phase(name)
            if name in ("forward", "eval"):
                # MemTracker refuses a second root forward in one tracked "iteration".
                self.tracker.reset_mod_stats()
        if self.is_cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        ok = False
        try:
            yield self
            ok = True
        finally:
            if self.is_cuda:
                self._note_cuda(name)
            self.phase_name = prev
            if self.tracker is not None:
                # No peak note here: the state at a phase's end belongs to that phase, not to the outer one.
                self.tracker.phase = prev
        if ok:
            self.check_cap()

    def _note_cuda(self, name: str) -> None:
        alloc = torch.cuda.max_memory_allocated(self.device)
        reserved = torch.cuda.max_memory_reserved(self.device)
        self.cuda_phase_peaks[name] = max(self.cuda_phase_peaks.get(name, 0), alloc)
        self.cuda_phase_reserved[name] = max(self.cuda_phase_reserved.get(name, 0), reserved)
        self.cuda_max_allocated = max(self.cuda_max_allocated, alloc)
        self.cuda_max_reserved = max(self.cuda_max_reserved, reserved)
        self.sample_outside_allocator()

    def sample_outside_allocator(self) -> int:
        """Device bytes in use outside PyTorch's allocator now: the CUDA context, NCCL's buffers, other libraries'
        cudaMalloc. mem_get_info is device-wide, so this assumes the rank has its GPU to itself."""
        free, total = torch.cuda.mem_get_info(self.device)
        outside = max(0, total - free - torch.cuda.memory_reserved(self.device))
        grew = outside > self.cuda_outside_bytes
        self.cuda_outside_bytes = max(self.cuda_outside_bytes, outside)
        if grew and self.enforce_bytes and self._capped:
            self._cap_allocator()
        return outside

    def _cap_allocator(self) -> None:
        """--enforce on CUDA: the cap is on the verdict's basis, so the allocator gets the budget less what lives
        outside it. That part grows after the start (the first GPU check: kernels load at first use, NCCL's
        communicators at their first collective, 0.8 GB together on an H100), so the cap follows it at every
        phase instead of keeping the room seen at the start."""
        total = torch.cuda.get_device_properties(self.device).total_memory
        room = max(0, self.enforce_bytes - self.cuda_outside_bytes)
        torch.cuda.set_per_process_memory_fraction(min(1.0, room / total), self.device)
        self._capped = True

    def check_cap(self) -> None:
        """Raise OutOfMemoryError if the tracked bytes crossed the cap and nobody has seen it raised yet."""
        t = self.tracker
        if t is not None and t.over_cap is not None and not self._oom_raised:
            self._oom_raised = True
            total, phase = t.over_cap
            raise torch.OutOfMemoryError(
                f"tracked tensors reached {format_bytes(total)} in phase {phase!r}, over the enforced cap of "
                f"{format_bytes(t.cap_bytes)}"
            )

    # -- numbers ----------------------------------------------------------------------------------------------
    def current_bytes(self) -> int:
        """Bytes in use now: allocated on CUDA, tracked tensors on CPU."""
        if self.is_cuda:
            return torch.cuda.memory_allocated(self.device)
        return self.tracker.total_bytes() if self.tracker is not None else 0

    @property
    def basis(self) -> str:
        """What the peaks count (launcher.planner.cuda_overhead.Basis)."""
        return "cuda_reserved_plus_context" if self.is_cuda else "cpu_tensor_bytes"

    def phase_peaks(self) -> dict[str, int]:
        """Peak per phase on the verdict's basis: reserved plus outside-allocator bytes on CUDA, tensors on CPU."""
        if self.is_cuda:
            return {p: r + self.cuda_outside_bytes for p, r in self.cuda_phase_reserved.items()}
        return dict(self.tracker.phase_peak_bytes) if self.tracker is not None else {}

    def peak_bytes(self) -> int:
        """The highest phase peak so far on the verdict's basis, bytes."""
        peaks = self.phase_peaks()
        return max(peaks.values(), default=0)

    def step_done(self, step: int, loss: float | None, tokens: int | None, **extra) -> StepRow:
        """Log one optimizer step (one JSON line under RUN_DIR/steps/, a launcher.records.steprow.StepRow) and start the
        next iteration; returns the row.

        ``loss`` and ``tokens`` (summed over ranks) are None on a step that is not a log step (the worker reads
        them only every train.log_every_steps): the line then has no loss and no tokens_per_s. ``extra``: the
        row's other fields (lr, grad_norm, attempt, ...); a name StepRow does not list is kept in its ``extra``.
        """
        now = time.perf_counter()
        dt = max(now - self._t_step, 1e-9)
        self._t_step = now
        self.step = step
        if loss is not None:
            self.losses.append(float(loss))
        row = StepRow.from_json({
            "step": step, "loss": None if loss is None else float(loss),
            "tokens_per_s": None if tokens is None else tokens / dt, "step_time_s": dt,
            "mem_current_bytes": self.current_bytes(), "mem_peak_bytes": self.peak_bytes(), "time": time.time(),
            **extra,
        })
        if self.step_log is not None:
            self.step_log.append(row.to_json())
        if self.tracker is not None:
            self.after_step_snap = self.tracker.current_snap()
            self.tracker.reset_mod_stats()
        if self.snapshot:
            self.dump_snapshot()
        return row

    def dump_snapshot(self) -> Path:
        """RUN_DIR/memory-snapshot/rank-K.pickle: every allocation from start() through this step, with stacks."""
        path = self.run_dir / "memory-snapshot" / f"rank-{self.rank}.pickle"
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.cuda.memory._dump_snapshot(str(path))
        torch.cuda.memory._record_memory_history(enabled=None)
        self.snapshot = False
        self.note(memory_snapshot=str(path))
        return path

    def restart_step_clock(self) -> None:
        """Start the step timer now, just before the first training step, so that step's time leaves out the setup
        and baseline evaluation before it."""
        self._t_step = time.perf_counter()

    def record(self, **fields) -> None:
        """Fields for the rank report from a user's script: a RankReport field takes its value, any other name is
        kept in the report's ``extra``. The launcher's own code uses note()."""
        self.fields.update(fields)

    def note(self, **fields) -> None:
        """The launcher's own fields for the rank report: each names a RankReport field (TypeError otherwise), so a
        misspelled one fails where it is written rather than landing in ``extra``."""
        unknown = sorted(set(fields) - REPORT_FIELDS)
        if unknown:
            raise TypeError(f"MemoryProbe.note: {', '.join(unknown)} not a field of "
                            "launcher.records.rankreport.RankReport")
        self.fields.update(fields)

    def report(self, *, status: RankStatus, error: str | None = None) -> RankReport:
        """The rank's memory report (ranks/rank-K.json): phase peaks, peak by category, CUDA figures, the recorded
        fields, status and error; ValueError for a status RankStatus does not list."""
        if status not in typing.get_args(RankStatus):
            raise ValueError(f"rank report: {status!r} is not a rank status ({', '.join(typing.get_args(RankStatus))})")
        peaks = self.phase_peaks()
        t = self.tracker
        out = RankReport(
            rank=self.rank,
            local_rank=self.local_rank,
            host=socket.gethostname(),
            device=self.device.type,
            world_size=self.world_size,
            status=status,
            basis=self.basis,
            phases=peaks,
            measured_peak_bytes=max(peaks.values(), default=0),
            training_peak_bytes=max((peaks.get(p, 0) for p in TRAINING_PHASES), default=0),
            peak_phase=max(peaks, key=peaks.get) if peaks else None,
            peak_by_category=by_category(t.peak_snap) if t is not None else None,
            peak_by_category_raw=raw_breakdown(t.peak_snap) if t is not None else None,
            phase_breakdown={p: by_category(s) for p, s in t.phase_peak_snap.items()} if t is not None else None,
            # What stays live between steps (params, grads if kept, optimizer states, engine buffers).
            after_step_by_category=by_category(self.after_step_snap) if self.after_step_snap is not None else None,
            peak_rss_bytes=peak_rss_bytes(),
            enforce_bytes=self.enforce_bytes,
            first_loss=self.losses[0] if self.losses else None,
            final_loss=self.losses[-1] if self.losses else None,
            steps_done=self.step,
            error=error,
        )
        if t is not None and t.heap is not None and t.heap_check.untracked_bytes is not None:
            out.heap_check = dataclasses.asdict(t.heap_check)
        if self.is_cuda:
            out.max_memory_allocated_bytes = self.cuda_max_allocated
            out.max_memory_reserved_bytes = self.cuda_max_reserved
            out.outside_allocator_bytes = self.cuda_outside_bytes
            out.phases_allocated = dict(self.cuda_phase_peaks)
        out.record(self.fields)
        return out

    def oom_details(self) -> OomDetails:
        """Where an OOM struck and what was live: for the rank report."""
        d = OomDetails(phase=self.phase_name, step=self.step + 1)
        t = self.tracker
        if t is not None:
            d.current_bytes = t.total_bytes()
            d.current_by_category = by_category(t.current_snap())
            if t.over_cap is not None:
                d.phase = t.over_cap[1]
                d.crossed_at_bytes = t.over_cap[0]
        if self.is_cuda:
            d.memory_summary = torch.cuda.memory_summary(self.device)
        return d

    def write(self, path: str | os.PathLike | None = None, *, status: RankStatus = "completed",
              error: str | None = None) -> RankReport:
        """Write the rank report (atomically) to ``path`` or RUN_DIR/ranks/rank-K.json."""
        if path is None:
            if self.run_dir is None:
                raise ValueError("memory probe has no run dir; pass write(path) or set $LAUNCHER_RUN_DIR")
            path = self.run_dir / "ranks" / f"rank-{self.rank}.json"
        data = self.report(status=status, error=error)
        atomic_write_json(path, data.to_json())
        return data


def error_tail(exc: BaseException, max_chars: int = 4000) -> str:
    """The end of an exception's formatted traceback, at most ``max_chars``: for a rank report's error field."""
    text = "".join(traceback.format_exception(exc))
    return text[-max_chars:]


def is_oom(exc: BaseException | None) -> bool:
    """OutOfMemoryError anywhere in the exception's chain (autograd, DeepSpeed and a script's own handlers may wrap
    it): the one rule by which a rank, the worker's or a --script's, ends as oom."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, torch.OutOfMemoryError):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def memory_probe(
    *,
    device: torch.device | str | None = None,
    run_dir: str | os.PathLike | None = None,
    enforce_bytes: int | None = None,
    track_categories: bool | None = None,
) -> MemoryProbe:
    """A probe for this rank; the run dir and cap default to $LAUNCHER_RUN_DIR and $LAUNCHER_ENFORCE_BYTES."""
    return MemoryProbe(
        device=device,
        run_dir=run_dir if run_dir is not None else rankenv.run_dir(),
        enforce_bytes=enforce_bytes if enforce_bytes is not None else rankenv.enforce_bytes(),
        track_categories=track_categories,
    )
