"""A checkpoint tag checked before `launch export` loads it: what DCP or DeepSpeed will read parses, and every
shard it names is there with the bytes it should hold. A damaged tag (a copy cut short, a garbage .metadata)
is then one line naming the step, what is wrong and the steps that can be exported, not a traceback."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

from launcher.errors import ConfigError
from launcher.model.build import first_line


def dcp_problem(path: Path) -> str | None:
    """Why torch.distributed.checkpoint cannot read the DCP dir ``path`` (its .metadata, then each shard's
    length against the offsets the metadata gives), or None."""
    meta = path / ".metadata"
    if not meta.is_file():
        return f"{path.name}/.metadata is missing"
    import torch.distributed.checkpoint as dcp

    try:
        md = dcp.FileSystemReader(str(path)).read_metadata()
        need: dict[str, int] = {}
        for info in md.storage_data.values():
            need[info.relative_path] = max(need.get(info.relative_path, 0), int(info.offset) + int(info.length))
    except Exception as e:  # noqa: BLE001 - a damaged pickle raises UnpicklingError, EOFError, AttributeError, ...
        return f"{path.name}/.metadata cannot be read ({first_line(e)})"
    for name, end in sorted(need.items()):
        shard = path / name
        if not shard.is_file():
            return f"{path.name}/{name} is missing"
        size = shard.stat().st_size
        if size < end:
            return f"{path.name}/{name} holds {size} bytes, fewer than the {end} its .metadata indexes (cut short)"
    return None


def torch_file_problem(path: Path) -> str | None:
    """Why a torch.save file cannot be read: empty, or a zip archive (torch's format) whose directory is gone
    (the end of the file cut off), or None."""
    size = path.stat().st_size
    if size == 0:
        return f"{path.name} is empty"
    if zipfile.is_zipfile(path):
        try:
            with zipfile.ZipFile(path) as z:
                z.infolist()
        except (zipfile.BadZipFile, OSError) as e:
            return f"{path.name} is damaged ({first_line(e)})"
        return None
    with path.open("rb") as f:
        head = f.read(4)
    if head == b"PK\x03\x04":  # a zip archive's start without its directory at the end
        return f"{path.name} is damaged: a zip archive whose end is missing (cut short)"
    if head[:1] != b"\x80":  # neither a zip archive nor torch's legacy pickle: no torch.save file
        return f"{path.name} is no torch.save file (it holds neither a zip archive nor a pickle)"
    return None


def deepspeed_problem(tag_dir: Path, zero_stage: int, world_size: int) -> str | None:
    """Why DeepSpeed's readers cannot read the tag: a model-states file missing, ZeRO-1/2/3's partitions fewer
    than the ranks that saved, or one of them damaged (torch_file_problem); None when all are there."""
    models = sorted(tag_dir.glob("*model_states.pt"))
    if not models:
        return "no mp_rank_00_model_states.pt (the engine's module file) in it"
    files = models
    if zero_stage:
        optim = sorted(tag_dir.glob("*optim_states.pt"))
        if len(optim) < world_size:
            return (f"{len(optim)} optimizer partition(s) (*optim_states.pt) for the {world_size} rank(s) that "
                    "saved it")
        files = models + optim
    for f in files:
        problem = torch_file_problem(f)
        if problem:
            return problem
    return None


def tag_problem(root: Path, tag: str, plan) -> str | None:
    """Why the checkpoint tag ``root/tag`` of a run of ``plan`` (launcher.planner.plan.Plan) cannot be exported:
    its trainer state, then the files of the engine that saved it (Engine.checkpoint_problem)."""
    from launcher.worker.engines import engine_class

    try:
        state = json.loads((root / tag / "trainer_state.json").read_text())
        world = int(state.get("world_size") or 1)
    except (OSError, ValueError, TypeError, AttributeError) as e:
        return f"trainer_state.json cannot be read ({first_line(e)})"
    return engine_class(plan.strategy.engine).checkpoint_problem(root / tag, plan, world)


def readable_steps(root: Path, plan) -> list[int]:
    """The steps of the complete tags (trainer_state.json written) whose files pass tag_problem."""
    tags = sorted(p.name for p in root.glob("step-*") if (p / "trainer_state.json").is_file())
    return [int(t.removeprefix("step-")) for t in tags if tag_problem(root, t, plan) is None]


def damaged(root: Path, tag: str, plan, why: str) -> ConfigError:
    """The one-line refusal of a tag that cannot be read: the step, what is wrong, and what can be done."""
    steps = [s for s in readable_steps(root, plan) if f"step-{s:08d}" != tag]
    fix = (f"export a readable step instead (--step {steps[-1]}; readable: {', '.join(map(str, steps))})" if steps
           else "no other checkpoint here is readable: copy the checkpoint again from where it was written, or "
                "train again")
    return ConfigError(f"checkpoint {tag} in {root} cannot be read: {why}; {fix}")


def check_tag(root: Path, tag: str, plan) -> None:
    """ConfigError (damaged) when the tag's files would not load; nothing is read whole here."""
    why = tag_problem(root, tag, plan)
    if why:
        raise damaged(root, tag, plan, why)
