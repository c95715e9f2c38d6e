"""The other tools' figures for the same configuration: DeepSpeed's estimators and `accelerate estimate-memory`.

Both count model states only (no activations, batch 1); that is what users compare `launch plan` with.

DeepSpeed: ``estimate_zero{2,3}_model_states_mem_needs_all_cold`` only print a table; each row comes from
``estimate_zero2_model_states_mem_needs`` / ``estimate_zero3_model_states_mem_needs``, which return
(cpu, gpu[, largest layer]) bytes. We call those with the row's options: ZeRO-1 and ZeRO-2 use the ZeRO-2
row (DeepSpeed has no ZeRO-1 estimator and its docs point stage 1 users to it), ZeRO-3 the zero_init=1 row.
FSDP2 has no DeepSpeed estimator; the closest rows stand in (full-shard ~ ZeRO-3, grad-op-shard ~ ZeRO-2) and
are marked as analogues.

accelerate: ``accelerate.commands.estimate.estimate_training_usage`` on ``calculate_maximum_sizes`` of the
model built on the meta device (what `accelerate estimate-memory` does after fetching the config; we build
from the local config, no network). Its "Training using Adam" column is the largest value of that dict; for
the job's bf16 mixed precision that is 2x the fp32 load size (8 bytes/param); the float32 row (4x, the figure
usually quoted) is kept in the JSON as ``accelerate_fp32_bytes``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
from dataclasses import dataclass
from functools import cache

from benchmarks.accuracy.cells import Cell

ACCELERATE_DTYPE = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


@dataclass(kw_only=True, slots=True)
class External:
    deepspeed_bytes: int
    deepspeed_row: str
    """Which estimator row: e.g. 'zero3 offload_optimizer=cpu zero_init=1'; '(analogue)' for FSDP."""
    accelerate_bytes: int
    accelerate_fp32_bytes: int
    total_params: int
    largest_layer_params: int


@cache
def _meta_model_sizes(cell: Cell) -> tuple[int, int, int]:
    """(params, largest layer params, accelerate's total load bytes) of the cell's model on the meta device."""
    from accelerate.utils import calculate_maximum_sizes

    from launcher.config.jobfile import job_from_data
    from launcher.model.build import build_model, model_config

    job = job_from_data(cell.job(), ".")
    model = build_model(job, model_config(job), device="meta")
    total_params = sum(p.numel() for p in model.parameters())  # parameters() yields a tied weight once
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    total_size, _ = calculate_maximum_sizes(model)
    return total_params, largest, int(total_size)


def deepspeed_gpu_bytes(sharding: str, total_params: int, largest_layer_params: int, ranks: int) -> tuple[int, str]:
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    analogue = " (analogue)" if sharding.startswith("fsdp") else ""
    with contextlib.redirect_stdout(io.StringIO()):  # the estimators print as they go
        if sharding in ("z1", "z2", "fsdp-noreshard"):
            _, gpu = estimate_zero2_model_states_mem_needs(total_params, num_gpus_per_node=ranks, num_nodes=1,
                                                          cpu_offload=False)
            return int(gpu), "zero2 offload_optimizer=none" + analogue
        offload = sharding == "z3off"
        _, gpu, _ = estimate_zero3_model_states_mem_needs(
            total_params, largest_layer_params, num_gpus_per_node=ranks, num_nodes=1, cpu_offload=offload,
            cpu_offload_params=False, zero_init=True)
        return int(gpu), f"zero3 offload_optimizer={'cpu' if offload else 'none'} zero_init=1" + analogue


def accelerate_training_bytes(load_bytes: int, precision: str) -> int:
    from accelerate.commands.estimate import estimate_training_usage

    sizes = estimate_training_usage(load_bytes, ACCELERATE_DTYPE[precision])
    return int(max(sizes.values()))  # the "Training using Adam" column


def external(cell: Cell, precision: str = "bf16") -> External:
    total, largest, load = _meta_model_sizes(dataclasses.replace(cell, sharding="z2"))
    ds, row = deepspeed_gpu_bytes(cell.sharding, total, largest, cell.ranks)
    return External(deepspeed_bytes=ds, deepspeed_row=row, accelerate_bytes=accelerate_training_bytes(load, precision),
                    accelerate_fp32_bytes=accelerate_training_bytes(load, "fp32"), total_params=total,
                    largest_layer_params=largest)
