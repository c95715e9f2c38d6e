"""Checkpoint layout, RNG state and the data position, common to both engines.

RUN_DIR/checkpoint/
    step-00000012/          one tag per saved step; the engine writes its own files here
        rng/rank-K.pt       torch, python and numpy RNG states of rank K
        trainer_state.json  global step, data position, first loss (rank 0)
    latest                  the tag of the newest complete checkpoint; written last, after a barrier

A tag without ``latest`` pointing at it is incomplete (a kill during the save) and is ignored.
"""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from launcher.errors import ConfigError
from launcher.files.fsutil import atomic_write
from launcher.files.rundir import LATEST, latest_checkpoint_tag
from launcher.runtime.files import atomic_write_json


@dataclass(kw_only=True, slots=True)
class TrainerState:
    """trainer_state.json: where training stands at a checkpoint (steps, data position, world) and which engine's
    files the tag holds."""

    global_step: int
    """Optimizer steps completed."""
    micro_steps: int
    """Micro-batches consumed per rank (global_step * grad_accum_steps)."""
    samples_per_rank: int
    """Training examples consumed per rank; with the seed this fixes the data position."""
    world_size: int
    """Ranks that wrote the checkpoint."""
    samples_per_step_per_rank: int
    """micro_batch_size * grad_accum_steps; resuming needs the same value to map steps to data."""
    engine: str
    """deepspeed or fsdp: which engine's files the tag holds."""
    first_loss: float | None = None
    """Loss of step 1, kept so the rank report of a resumed run still shows it."""


def tag_for(step: int) -> str:
    """The checkpoint tag of a step: step-00000012."""
    return f"step-{step:08d}"


def rng_state() -> dict:
    """This rank's torch, Python, numpy (and CUDA) RNG states, for its checkpoint."""
    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    """Restore RNG states saved by rng_state (CUDA's only where both have CUDA)."""
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def latest_tag(root: Path) -> str | None:
    """The newest checkpoint the ranks can load: the one ``latest`` names, if its trainer state is there."""
    tag = latest_checkpoint_tag(root)
    if not tag or not (root / tag / "trainer_state.json").exists():
        return None
    return tag


def save(engine, root: Path, state: TrainerState) -> str:
    """Collective: every rank writes its part, then rank 0 marks the tag complete and drops older tags."""
    tag = tag_for(state.global_step)
    rank = dist.get_rank()
    engine.save(root, tag)
    (root / tag / "rng").mkdir(parents=True, exist_ok=True)
    torch.save(rng_state(), root / tag / "rng" / f"rank-{rank}.pt")
    dist.barrier()
    if rank == 0:
        atomic_write_json(root / tag / "trainer_state.json", asdict(state))
        atomic_write(root / LATEST, tag + "\n")
        for old in root.glob("step-*"):
            if old.name != tag and old.is_dir():
                shutil.rmtree(old, ignore_errors=True)
    dist.barrier()
    return tag


def load(engine, root: Path, tag: str, *, world_size: int, samples_per_step_per_rank: int) -> TrainerState:
    """Restore the engine (model, optimizer, scheduler), this rank's RNG, and return the trainer state."""
    state = TrainerState(**json.loads((root / tag / "trainer_state.json").read_text()))
    if state.world_size != world_size or state.samples_per_step_per_rank != samples_per_step_per_rank:
        raise ConfigError(
            f"checkpoint {root / tag}: saved with {state.world_size} ranks x {state.samples_per_step_per_rank} "
            f"examples per step, this run has {world_size} x {samples_per_step_per_rank}; resume with the same "
            "world size and micro-batch x accumulation, or move the checkpoint dir away to start fresh"
        )
    engine.load(root, tag)
    rng_file = root / tag / "rng" / f"rank-{dist.get_rank()}.pt"
    if rng_file.exists():
        set_rng_state(torch.load(rng_file, weights_only=False))
    return state
