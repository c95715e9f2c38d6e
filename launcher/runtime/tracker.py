"""Tensor-memory trackers built on torch.distributed._tools (MemTracker, FSDPMemTracker).

They add what the probe needs and the upstream classes lack: a peak per phase,
the category breakdown at that peak, relabelling of tensors the tracker saw
under the wrong role (engine buffers created during init), and a byte cap that
raises ``torch.OutOfMemoryError`` at the op that crosses it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from copy import deepcopy
from dataclasses import dataclass

import torch
from torch.distributed._tools.mem_tracker import _TOTAL_KEY, MemTracker, _UpdateType

from launcher.records.categories import MEASURED as CATEGORIES
from launcher.units import format_bytes

# The raw MemTracker/FSDPMemTracker names map onto our seven categories (launcher.records.categories: one vocabulary
# with the planner's breakdown; gathered parameters are params on both sides).
_CATEGORY_OF_RAW = {
    "Parameter": "params",
    "Sharded Param": "params",
    "Unsharded Param": "params",
    "Buffer": "buffers",
    "Gradient": "grads",
    "Sharded Grad": "grads",
    "Unsharded Grad": "grads",
    "Activation": "activations",
    "Inputs": "activations",
    "Temp": "temp",
    # FSDP2's communication buffers live only around one collective: temp by nature.
    "All Gather": "temp",
    "Reduce Scatter": "temp",
    "Optstate": "optimizer",
    "OptState": "optimizer",
    "Other": "other",
}
# Raw member names per category, first match wins (FSDPMemTracker's enum has no PARAM, GRAD or OTH).
_RAW_OF_CATEGORY = {
    "params": ("PARAM", "SHARDED_PARAM"),
    "grads": ("GRAD", "SHARDED_GRAD"),
    "optimizer": ("OPT",),
    "activations": ("ACT",),
    "temp": ("TEMP",),
    "buffers": ("BUFFER",),
    "other": ("OTH", "TEMP"),
}


def raw_name(key: object) -> str:
    """The name of a tracker's memory type: an enum member's value, else str of the key."""
    return getattr(key, "value", str(key))


def by_category(dev_snap: dict | None) -> dict[str, int]:
    """A raw per-device snapshot as bytes per category (all seven keys, zeros included)."""
    out = dict.fromkeys(CATEGORIES, 0)
    for key, n in (dev_snap or {}).items():
        if key == _TOTAL_KEY:
            continue
        out[_CATEGORY_OF_RAW.get(raw_name(key), "other")] += int(n)
    return out


def raw_breakdown(dev_snap: dict | None) -> dict[str, int]:
    """A raw per-device snapshot as bytes per tracker memory type (its total left out)."""
    return {raw_name(k): int(v) for k, v in (dev_snap or {}).items() if k != _TOTAL_KEY}


@dataclass(kw_only=True, slots=True)
class HeapCheck:
    """The tracker's total beside glibc's heap in use (launcher.runtime.heap), over the phases sampled.

    The heap also holds what is not a tensor (libraries, Python), which mostly settles before training: the heap
    counts on the tracker's basis once that part, as it stood at the first sample, is taken away. What training
    adds beyond tensors (gloo's buffer for a collective while it runs, MKL's packed weights, autograd's nodes)
    then reads as heap above the tracked total (docs/testing.md)."""

    untracked_bytes: int | None = None
    """Heap in use less the tracked total at the first sample, bytes."""
    tracked_peak_bytes: int = 0
    """The largest tracked total sampled, bytes."""
    heap_peak_bytes: int = 0
    """The largest heap sampled less ``untracked_bytes``, bytes."""
    heap_at_tracked_peak_bytes: int = 0
    """The heap less ``untracked_bytes`` when the tracked total was largest, bytes."""

    def sample(self, tracked: int, heap: int) -> None:
        """One reading of both instruments."""
        if self.untracked_bytes is None:
            self.untracked_bytes = heap - tracked
        on_basis = heap - self.untracked_bytes
        self.heap_peak_bytes = max(self.heap_peak_bytes, on_basis)
        if tracked >= self.tracked_peak_bytes:
            self.tracked_peak_bytes = tracked
            self.heap_at_tracked_peak_bytes = on_basis


class _NoHandle:
    def remove(self) -> None:
        pass


_NO_HANDLE = _NoHandle()


class _PhasePeaks:
    """Mixin over a MemTracker class: per-phase peaks, relabelling and a byte cap.

    Peaks use ">=": a later step that reaches the same total replaces the snapshot,
    so the breakdown shows the steady state after relabelling, not the first step's guesses.
    """

    def setup(self, device: torch.device, cap_bytes: int | None, heap: Callable[[], int | None] | None = None,
              heap_phases: tuple[str, ...] = ()) -> None:
        self.watch_device = device
        self.cap_bytes = cap_bytes
        self.phase = "init"
        self.phase_peak_bytes: dict[str, int] = {}
        self.phase_peak_snap: dict[str, dict] = {}
        self.peak_bytes = 0
        self.peak_snap: dict = {}
        self.peak_phase = "init"
        self.over_cap: tuple[int, str] | None = None
        self.heap = heap if heap is not None and heap() is not None else None
        self.heap_phases = heap_phases
        self.heap_check = HeapCheck()

    def total_bytes(self) -> int:
        snap = self._curr_mem_snap.get(self.watch_device)
        return int(snap[_TOTAL_KEY]) if snap else 0

    def current_snap(self) -> dict:
        return deepcopy(self._curr_mem_snap.get(self.watch_device, {}))

    def start_phase(self, name: str) -> None:
        self.phase = name
        self._note(self.total_bytes())

    def _note(self, total: int) -> None:
        if total >= self.phase_peak_bytes.get(self.phase, -1):
            self.phase_peak_bytes[self.phase] = total
            self.phase_peak_snap[self.phase] = deepcopy(self._curr_mem_snap.get(self.watch_device, {}))
            if total >= self.peak_bytes:
                self.peak_bytes = total
                self.peak_snap = self.phase_peak_snap[self.phase]
                self.peak_phase = self.phase

    def _track_module_params_and_buffers(self, module, install_grad_hooks: bool = True):
        # MemTracker hooks every parameter, and register_hook raises on frozen ones (LoRA, frozen poolers);
        # a placeholder handle makes it skip them.
        for p in module.parameters():
            if not p.requires_grad and p not in self._param_to_grad_hook_handles:
                self._param_to_grad_hook_handles[p] = (_NO_HANDLE, _NO_HANDLE)
        return super()._track_module_params_and_buffers(module, install_grad_hooks)

    def _pre_fw_hook(self, module, inputs) -> None:
        # MemTracker refuses a root module's second forward ("multiple iterative calls") unless
        # reset_mod_stats() ran in between; its per-module stats are not used here, so reset for it.
        if module in self.memory_tracking and not self._mod_tracker.is_bw:
            name = self._mod_tracker.get_known_fqn(module)
            if set(self._mod_tracker.parents) - {name} == {"Global"}:
                self.reset_mod_stats()
        super()._pre_fw_hook(module, inputs)

    def _track(self, reftype, t: torch.Tensor) -> None:
        # Nothing runs a forward during init, so what it allocates is not activations: engine and model
        # state, labelled precisely once the engine exists (label()); until then it counts as "other".
        if self.phase == "init" and reftype == self._reftype("activations"):
            reftype = self._reftype("other")
        super()._track(reftype, t)

    def _update_peak_stats(self, peak_state) -> None:
        # The global peak only (MemTracker._update_peak_stats's second half). Its first half walks every tracked
        # module at every op to keep per-module peaks, which nothing here reads: measured at over half of the
        # fake-tensor probe's time, and it runs on every op of every rank's step too.
        for dev, dev_snap in self._curr_mem_snap.items():
            if self._peak_mem.get(dev, 0) < dev_snap[_TOTAL_KEY]:
                self._peak_mem[dev] = dev_snap[_TOTAL_KEY]
                self._peak_mem_snap[dev] = deepcopy(dev_snap)
        total = self.total_bytes()
        if self.heap is not None and self.phase in self.heap_phases:
            self.heap_check.sample(total, self.heap())
        self._note(total)
        if self.cap_bytes is not None and total > self.cap_bytes and self.over_cap is None:
            self.over_cap = (total, self.phase)
            raise torch.OutOfMemoryError(
                f"tracked tensors reached {format_bytes(total)} in phase {self.phase!r}, over the enforced cap of "
                f"{format_bytes(self.cap_bytes)} (LAUNCHER_ENFORCE_BYTES)"
            )

    def _reftype(self, category: str):
        members = self._ref_class.__members__
        return next(members[n] for n in _RAW_OF_CATEGORY[category] if n in members)

    def label(self, tensors: Iterable[torch.Tensor | None], category: str) -> None:
        """Track ``tensors`` (again) under ``category``; untracked ones are added to the totals."""
        reftype = self._reftype(category)
        for t in tensors:
            if isinstance(t, torch.Tensor):
                self._update_and_maybe_create_winfos(t, reftype)
        self._note(self.total_bytes())

    def relabel(self, old: str, new: str) -> int:
        """Move every live tensor in category ``old`` to ``new``; returns the bytes moved."""
        old_t, new_t = self._reftype(old), self._reftype(new)
        moved = 0
        for winfo, _ in list(self._WINFO.values()):
            if winfo.reftype == old_t and old_t != new_t:
                winfo.reftype = new_t
                self._update_snap(_UpdateType.REF, winfo, old_reftype=old_t)
                moved += winfo.mem_consumed
        return moved


class PhaseMemTracker(_PhasePeaks, MemTracker):
    """MemTracker with phases; for plain modules and DeepSpeed engines."""


def fsdp_tracker(root: torch.nn.Module, optimizer: torch.optim.Optimizer | None):
    """An FSDPMemTracker with phases: it tells sharded/unsharded params and grads and collective buffers apart."""
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

    class PhaseFSDPMemTracker(_PhasePeaks, FSDPMemTracker):
        pass

    return PhaseFSDPMemTracker(root, optimizer)
