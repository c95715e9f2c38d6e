"""`launch export RUN_DIR`: the Hugging Face model dir from a checkpoint, in one process, no ranks.

The engine that saved the checkpoint reads it back on the host (Engine.read_checkpoint, launcher.worker.engines),
having checked its files first (Engine.checkpoint_problem, launcher.worker.ckpt_check):
  DeepSpeed ZeRO-1/2/3  deepspeed.utils.zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint (the fp32 masters,
                        frozen parameters included), then cast to the saved dtype.
  DeepSpeed ZeRO-0      the module file (mp_rank_00_model_states.pt) holds the whole model.
  FSDP2                 the DCP dir's "model" entries (torch.distributed.checkpoint, no process group).
"""

from __future__ import annotations

import json
from pathlib import Path

from safetensors import SafetensorError

from launcher.engines import flat_layout
from launcher.errors import ConfigError, LauncherError
from launcher.model.build import first_line
from launcher.worker import checkpoint
from launcher.worker.ckpt_check import check_tag, damaged
from launcher.worker.export import export_dtype, out_problem, write_export


def pick_tag(root: Path, step: int | None) -> str:
    """The complete checkpoint to export: ``step``'s, or the latest. ConfigError naming what exists."""
    complete = sorted(p.name for p in root.glob("step-*") if (p / "trainer_state.json").is_file())
    if step is None:
        tag = checkpoint.latest_tag(root)
        if tag is None:
            raise ConfigError(f"{root}: no complete checkpoint (a run writes one every train.checkpoint_every_steps, "
                              "on a checkpoint request and at its end); nothing to export")
        return tag
    tag = checkpoint.tag_for(step)
    if tag not in complete:
        have = ", ".join(str(int(t.removeprefix("step-"))) for t in complete) or "none"
        raise ConfigError(f"--step {step}: no complete checkpoint {root / tag}; steps available: {have}")
    return tag


def check_out(out: Path) -> None:
    """--out must be new, empty, or an earlier export (launcher.worker.export.out_problem), which is replaced."""
    problem = out_problem(out)
    if problem:
        raise ConfigError(problem)


def export_checkpoint(run_dir: Path, *, step: int | None, merge: bool, out: Path | None) -> tuple[Path, dict]:
    """Write the export of RUN_DIR's checkpoint (``step`` or the latest) into ``out`` (default RUN_DIR/model)."""
    from launcher.worker.data import read_records
    from launcher.worker.engines import engine_class
    from launcher.worker.main import load_run_dir
    from launcher.worker.model import build, tokenizer_for
    from launcher.worker.recipes import make_recipe

    run_dir = run_dir.resolve()
    if not run_dir.is_dir():
        raise ConfigError(f"{run_dir}: no such run dir; give the run dir a launch run wrote")
    job, plan = load_run_dir(run_dir)[:2]
    out = (out or run_dir / "model").resolve()
    if merge and job.train.lora is None:
        raise ConfigError("--merge: this run trained no LoRA adapters (train.lora is not set); drop --merge")
    check_out(out)
    root = run_dir / "checkpoint"
    tag = pick_tag(root, step)
    check_tag(root, tag, plan)  # a damaged tag is one line naming it, before anything is loaded
    state = json.loads((root / tag / "trainer_state.json").read_text())
    recipe = make_recipe(job.task, job.data)
    if job.task == "seq_cls":
        recipe.fit_labels(read_records(job.data.path))
    try:  # the engine that saved the checkpoint reads it (DeepSpeed's zero_to_fp32, FSDP2's DCP dir)
        sd = engine_class(plan.strategy.engine).read_checkpoint(root, tag, plan)
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001 - damage check_tag cannot see (a shard's bytes): the engines' readers say it
        raise damaged(root, tag, plan, first_line(e)) from None
    merge = merge or bool(job.train.lora is not None and job.train.lora.merge)
    dtype = export_dtype(plan.precision)
    if job.train.lora is not None and not merge:
        # The adapter alone: the frozen base is not held (peft saves what requires grad).
        wanted = {n for n, p in build(job, recipe, seq_len=1, hf_checkpointing=False, on_meta=True)
                  .named_parameters() if p.requires_grad}
        sd = {k: v for k, v in sd.items() if k in wanted}
    sd = {k: v.to(dtype) if v.is_floating_point() else v for k, v in sd.items()}
    info = {"source": f"checkpoint {tag}", "step": int(state["global_step"]), "engine": state["engine"],
            "zero_stage": flat_layout(plan.strategy.layout)["zero_stage"], "precision": plan.precision}
    try:
        record = write_export(out, job=job, recipe=recipe, sd=sd, dtype=dtype, tokenizer=tokenizer_for(job),
                              merge=merge, info=info)
    # A full disk or a dir gone read-only (safetensors reports its own write errors as SafetensorError): the
    # staged dir is gone and the old export untouched.
    except (OSError, SafetensorError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise LauncherError(f"export: writing {str(out)!r} failed ({why}); it is as it was and nothing was left "
                            "beside it; free space there (or give another --out) and run launch export again") from None
    return out, record
