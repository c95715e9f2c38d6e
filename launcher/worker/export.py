"""The model out: a Hugging Face model directory, at the end of a run or from a checkpoint (docs/export.md).

RUN_DIR/model/              the full model (config.json, generation_config.json, *.safetensors [+ index], tokenizer)
                            or, for LoRA, the PEFT adapter (adapter_config.json, adapter_model.safetensors, tokenizer)
RUN_DIR/model/merged/       LoRA with train.lora.merge (or export --merge): base + adapter merged, a full model
RUN_DIR/model/export.json   what was exported: step, source, engine, dtype, format (written last)
RUN_DIR/model/.launcher-export  the marker, written first: an export dir holding it may be replaced by a new export

A dir is written beside its place under a temporary's name made exclusively (.model.XXXXXXXX.launcher-tmp), then
renamed in; every failure (a full disk included) removes it. Only a dir holding the marker, or RUN/model of a run
dir launch made, is ever replaced; an --out dir holding anything else is refused before any work.

Gathering (collective, every rank calls; rank 0 alone keeps host copies):
  DeepSpeed ZeRO-3  one module's own parameters at a time (zero.GatheredParameters), copied to rank 0's host.
  FSDP2             one tensor all-gathered at a time (DTensor.full_tensor), cast on rank 0 into its host copy.
  ZeRO-0/1/2        the module is replicated: rank 0 copies its own parameters to the host.
Offline (``launch export``): one process reads the checkpoint files, no ranks: DeepSpeed's
get_fp32_state_dict_from_zero_checkpoint (ZeRO-1/2/3), DCP's loader for FSDP2's ``dcp/`` dir.
The saved dtype is the plan's working dtype (bf16/fp16) or fp32 (export_dtype).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from launcher.engines import flat_layout
from launcher.errors import ConfigError
from launcher.files.fsutil import atomic_write, has_marker, made_dirs, replace_dir, stage_dir, write_marker
from launcher.files.rundir import contents, few, is_marked, refuse_protected
from launcher.worker.engines.base import WORK_DTYPES

MARKER = ".launcher-export"
"""Written first into every export dir: only a dir holding it (a regular file, not a link) may be replaced by a
new export."""
RECORD = "export.json"
"""What was exported (step, source, engine, dtype, format), written last."""
MERGED = "merged"
MAX_SHARD_SIZE = "5GB"
"""safetensors files are split past this size (transformers' default), with model.safetensors.index.json."""


def export_dtype(precision: str) -> torch.dtype:
    """bf16/fp16 runs save their working dtype (the weights the run evaluated with, half the bytes); fp32 runs
    save fp32."""
    return WORK_DTYPES.get(precision, torch.float32)


def is_lora_model(model: nn.Module) -> bool:
    """True for a peft model (LoRA adapters on a base)."""
    return hasattr(model, "peft_config")


def _wanted(name: str, p: nn.Parameter, adapter_only: bool) -> bool:
    # An adapter export needs what peft saves: the trainable adapters and modules_to_save (seq_cls head).
    return not adapter_only or p.requires_grad


def gather_zero3(model: nn.Module, dtype: torch.dtype, adapter_only: bool) -> dict[str, torch.Tensor] | None:
    """ZeRO-3: every rank gathers one module's own parameters at a time; rank 0 copies them to its host."""
    import deepspeed

    rank0 = dist.get_rank() == 0
    out: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for prefix, module in model.named_modules():
        own = [(n, p) for n, p in module.named_parameters(recurse=False)
               if id(p) not in seen and _wanted(n, p, adapter_only)]
        if not own:
            continue
        seen.update(id(p) for _, p in own)
        with deepspeed.zero.GatheredParameters([p for _, p in own], modifier_rank=None):
            if rank0:
                for n, p in own:
                    out[f"{prefix}.{n}" if prefix else n] = p.data.detach().to("cpu", dtype, copy=True)
    for prefix, module in model.named_modules():
        for n, b in module.named_buffers(recurse=False):
            if rank0 and n not in module._non_persistent_buffers_set and not adapter_only:
                out[f"{prefix}.{n}" if prefix else n] = b.detach().to("cpu", copy=True)
    return out if rank0 else None


def gather_fsdp(model: nn.Module, dtype: torch.dtype, adapter_only: bool) -> dict[str, torch.Tensor] | None:
    """FSDP2: one tensor at a time all-gathered (DTensor.full_tensor, a collective every rank joins in the same
    order) and cast at once into rank 0's host copy in the saved dtype.

    Rank 0 holds the saved model plus one gathered tensor in the kept dtype (docs/export.md; the planner's
    export_host_bytes). DCP's get_model_state_dict(full_state_dict, cpu_offload) would first gather the whole model
    in the kept dtype (fp32 shards: 4 bytes per parameter) and cast after, the saved copy beside it. Tied weights
    (one Parameter under two names) are gathered once; an adapter-only export gathers the adapter alone."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import _CHECKPOINT_PREFIX
    from torch.distributed.tensor import DTensor

    keep = kept_names(model) if adapter_only else None
    # Which Parameter object each state-dict name is: the same on every rank, so every rank skips the same
    # tied duplicates and the gathers stay matched.
    owner = {n.replace(_CHECKPOINT_PREFIX, ""): id(p) for n, p in model.named_parameters(remove_duplicate=False)}
    rank0 = dist.get_rank() == 0
    out: dict[str, torch.Tensor] = {}
    first: dict[int, str] = {}
    with torch.no_grad():
        for key, value in model.state_dict().items():
            name = key.replace(_CHECKPOINT_PREFIX, "")
            if keep is not None and name not in keep:
                continue
            pid = owner.get(name)
            if pid is not None and pid in first:
                if rank0:
                    out[name] = out[first[pid]]
                continue
            if pid is not None:
                first[pid] = name
            full = value.full_tensor() if isinstance(value, DTensor) else value
            if rank0:
                out[name] = _cast(full, dtype)
            del full
    return out if rank0 else None


def kept_names(model: nn.Module) -> set[str]:
    """The state-dict names of an adapter-only export's tensors (the trainable ones).

    named_parameters() spells a checkpoint-wrapped block's parameters with checkpoint_wrapper's
    ``_checkpoint_wrapped_module.`` inside the name, which state dicts (the wrapper's own hooks, DCP's
    get_model_state_dict) leave out: FSDP2 wraps the blocks it checkpoints (every k-th with checkpoint_every).
    """
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import _CHECKPOINT_PREFIX

    return {n.replace(_CHECKPOINT_PREFIX, "") for n, p in model.named_parameters() if _wanted(n, p, True)}


def gather_replicated(model: nn.Module, dtype: torch.dtype, adapter_only: bool) -> dict[str, torch.Tensor] | None:
    """ZeRO-0/1/2: every rank holds the whole module; rank 0 copies its state dict to the host."""
    if dist.get_rank() != 0:
        return None
    keep = kept_names(model) if adapter_only else None
    return {k: _cast(v, dtype) for k, v in model.state_dict().items() if keep is None or k in keep}


def _cast(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    t = t.detach()
    if hasattr(t, "get_original_weight"):
        # QLoRA's NF4 base (torchao NF4Tensor): a merged or full export holds its dequantized weights, the base
        # the adapter was trained against.
        t = t.get_original_weight()
    return t.to("cpu", dtype, copy=True) if t.is_floating_point() else t.to("cpu", copy=True)


# -- writing (rank 0, or the one process of `launch export`) -------------------------------------------------------
def host_model(job, recipe, sd: dict[str, torch.Tensor], dtype: torch.dtype, adapter_only: bool) -> nn.Module:
    """The job's model (LoRA-wrapped if the job has LoRA) built on meta and given ``sd``'s tensors (no copy).

    ``adapter_only``: ``sd`` holds the trainable tensors alone; the frozen base stays on meta (allocating nothing)
    and only the adapter is saved from it."""
    from launcher.worker.model import build

    # The plain Hugging Face head: a chunked loss (Strategy.loss_chunks) is training's, never the saved model's.
    model = build(job, dataclasses.replace(recipe, loss_chunks=0), seq_len=1, hf_checkpointing=False, on_meta=True)
    missing = [k for k, _ in model.named_parameters() if k not in sd]
    # Tied weights (GPT-2's head is its input embedding) appear once; tie_weights() restores the other name.
    model.load_state_dict(sd, strict=False, assign=True)
    inner = model.get_base_model() if is_lora_model(model) else model
    if hasattr(inner, "tie_weights"):
        inner.tie_weights()
    still = [k for k, p in model.named_parameters() if p.is_meta and (p.requires_grad or not adapter_only)]
    if still:
        raise RuntimeError(f"export: the gathered state dict lacks {len(still)} parameter(s), e.g. {still[0]} "
                           f"(missing before tying: {missing[:3]})")
    return model.to(dtype)


def _fix_config(out: Path, dtype: torch.dtype) -> None:
    # The saved dtype under both names transformers versions read; and the KV cache the worker turned off for
    # training (launcher.worker.model.build) back on, for generation.
    cfg = out / "config.json"
    if cfg.exists():
        data = json.loads(cfg.read_text())
        if "use_cache" in data:
            data["use_cache"] = True
        name = str(dtype).removeprefix("torch.")
        data["torch_dtype"] = name
        if "dtype" in data:
            data["dtype"] = name
        cfg.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def save_tokenizer(tokenizer, out: Path) -> bool:
    """Save the tokenizer's files into ``out``; False when it has none (the byte tokenizer)."""
    if tokenizer is None or not hasattr(tokenizer, "save_pretrained"):
        return False  # the byte tokenizer of random-weight runs has no files (launcher.worker.tokenizer)
    tokenizer.save_pretrained(str(out))
    return True


@contextmanager
def zero3_off():
    """transformers off its ZeRO-3 paths while rank 0 alone builds and saves the host copy: with the run's
    HfDeepSpeedConfig alive, from_config would enter zero.Init and tie_weights would gather, both collectives the
    other ranks never join (a hang)."""
    try:
        from transformers.integrations import deepspeed as hf_ds
    except ImportError:
        yield
        return
    saved = hf_ds._hf_deepspeed_config_weak_ref
    hf_ds._hf_deepspeed_config_weak_ref = None
    try:
        yield
    finally:
        hf_ds._hf_deepspeed_config_weak_ref = saved


@contextmanager
def deepspeed_unloaded():
    """save_pretrained without importing DeepSpeed where the run has not: its unwrap (accelerate's
    extract_model_from_parallel) imports deepspeed, when installed, only to test the model against DeepSpeedEngine,
    about 0.26 s of CPU on a plain or FSDP2 rank 0 (benchmarks/results/startup.md). The host model written here is
    never one, so while deepspeed is not loaded the test is skipped; a process that loaded it keeps the real one."""
    try:
        from accelerate.utils import other
    except ImportError:
        yield
        return
    if sys.modules.get("deepspeed") is not None or not hasattr(other, "is_deepspeed_available"):
        yield
        return
    real = other.is_deepspeed_available
    other.is_deepspeed_available = lambda: False
    try:
        yield
    finally:
        other.is_deepspeed_available = real


def write_export(out: Path, *, job, recipe, sd: dict[str, torch.Tensor], dtype: torch.dtype, tokenizer,
                 merge: bool, info: dict) -> dict:
    """Write the HF dir for ``sd`` into ``out`` (replaced atomically: built beside it, then renamed)."""
    with zero3_off(), deepspeed_unloaded():
        return _write_export(out, job=job, recipe=recipe, sd=sd, dtype=dtype, tokenizer=tokenizer, merge=merge,
                             info=info)


def out_problem(out: Path) -> str | None:
    """Why an export may not be written to ``out``, or None: it must be new, empty, a dir an export made
    (MARKER), or ``model`` at the top of a run dir launch made (an end-of-run export from before the marker)."""
    if out.exists() and not out.is_dir():
        return f"--out {str(out)!r}: is a file; give a directory path"
    if out.exists():
        try:
            refuse_protected(out, flag="--out", by="launch export")  # replaced whole, whatever marker it holds
        except ConfigError as e:
            return str(e)
    if has_marker(out, MARKER) or (out.name == "model" and is_marked(out.parent)):
        return None
    try:
        names = contents(out)
    except OSError as e:
        return f"--out {str(out)!r}: cannot be read ({e.strerror}); give a directory you can write"
    if not names:
        return None
    return (f"--out {str(out)!r}: not empty and not made by launch export (no {MARKER} in it; it holds "
            f"{few(names)}); launch export replaces only a dir it made; give a new or empty directory")


def _write_export(out: Path, *, job, recipe, sd, dtype, tokenizer, merge: bool, info: dict) -> dict:
    model = host_model(job, recipe, sd, dtype, adapter_only=job.train.lora is not None and not merge)
    problem = out_problem(out)
    if problem:
        raise ConfigError(problem)
    with made_dirs(out.parent):  # a failure removes the parents it made
        tmp = stage_dir(out, mode=0o777)  # the mode a plain mkdir gives: colleagues may read an export
        try:
            write_marker(tmp, MARKER, "launch export")  # first: the staged dir is marked as export's own
            record = _save(tmp, model, job=job, dtype=dtype, tokenizer=tokenizer, merge=merge, info=info)
            replace_dir(tmp, out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return record


def _save(tmp: Path, model, *, job, dtype, tokenizer, merge: bool, info: dict) -> dict:
    lora = is_lora_model(model)
    model.save_pretrained(str(tmp), safe_serialization=True, max_shard_size=MAX_SHARD_SIZE)
    has_tok = save_tokenizer(tokenizer, tmp)
    if not lora:
        _fix_config(tmp, dtype)
    merged = False
    if lora and merge:
        full = model.merge_and_unload()
        full.save_pretrained(str(tmp / MERGED), safe_serialization=True, max_shard_size=MAX_SHARD_SIZE)
        save_tokenizer(tokenizer, tmp / MERGED)
        _fix_config(tmp / MERGED, dtype)
        merged = True
    record = {**info, "format": "lora_adapter" if lora else "full", "merged": merged,
              "dtype": str(dtype).removeprefix("torch."), "tokenizer": has_tok, "task": job.task,
              "exported_at": time.time()}
    atomic_write(tmp / RECORD, json.dumps(record, indent=2) + "\n")
    return record


# -- at the end of a run -----------------------------------------------------------------------------------------
def export_at_end(trainer, out: Path | None = None) -> None:
    """Collective: gather the trained model and write RUN_DIR/model (rank 0). Called by the loop after training."""
    job, plan = trainer.job, trainer.plan
    dtype = export_dtype(plan.precision)
    lora = job.train.lora
    merge = bool(lora is not None and lora.merge)
    out = out or trainer.run_dir / "model"
    with trainer.probe.phase("export"):
        sd = trainer.engine.gather_weights(dtype, adapter_only=lora is not None and not merge)
        if trainer.rank == 0:
            info = {"source": "end of run", "step": trainer.probe.step, "engine": trainer.engine.name,
                    "zero_stage": flat_layout(plan.strategy.layout)["zero_stage"], "precision": plan.precision}
            record = write_export(out, job=job, recipe=trainer.recipe, sd=sd, dtype=dtype,
                                  tokenizer=trainer.tokenizer, merge=merge, info=info)
            del sd
            trainer.probe.note(export=str(out), export_format=record["format"])
        dist.barrier()

