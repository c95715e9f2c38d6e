"""Validation splits for the CUDA side of the memory model: runs of scripts/gpu-check.sh named before they ran.

GPU_VALIDATION_1 was committed on 2026-11-26, after the first GPU check (benchmarks/results/gpu.md, one H100) and
before the CUDA overhead terms it led to (cuda_kernels, nccl_communicators; launcher.planner.cuda_overhead) and
before expandable segments on CUDA ranks. Those terms come from benchmarks/gpu/context.py's stage-by-stage
measurement and the first check's FSDP2 vs DeepSpeed runs; none of these three runs had run on a GPU then (the
pure-bf16 one was cut off by the time limit before its first step). The next lent GPU judges them.

GPU_VALIDATION_2 was committed on 2026-11-26 (stop 26, no GPU lent), before the side-stream pool term
(``stream_pools``: FSDP2's reduce-scatter and all-gather streams keep their own cached segments,
launcher.planner.cuda_overhead [POOL]). What led to it: the first check's FSDP2 runs (reserved - allocated 0.56 GB
on GPT-2, whose fp32 gradients are 0.50 GB; 6.52 GB on llama-1b's 4.94 GB) and torchtitan's two published Llama 3.1
8B tables (benchmarks/results/published.md). Neither of its runs had run anywhere: a larger model where the pool is
most of the reserve, and gradient accumulation, where the gradients are live at the backward start and the pool
adds only one unit's transient shard.
"""

from __future__ import annotations

GPU_VALIDATION_1 = ("levers-qlora-fsdp", "levers-pure-bf16-fsdp", "zero3-offload-1")
"""gpu-check run names. Criteria: what lies outside the allocator within 5 % of measured; the verdict-basis peak
within 10 %; the allocated-basis moments within 5 % (the CPU-rank bar)."""

GPU_VALIDATION_2 = ("pool-llama-1b-ac-fsdp", "pool-accum-fsdp")
"""gpu-check run names. Criteria: GPU_VALIDATION_1's, and reserved - allocated (predicted allocator_reserve +
stream_pools at the peak, less what the largest tensor moment exceeds the peak's tensors by where a pool made the
peak another moment: the measured maxima come from those two moments; benchmarks/gpu/report.py run_row) within
RESERVE_TOLERANCE."""

GPU_VALIDATION_3 = ("z3-1-gpt2", "z0-init-llama-1b", "fsdp-lora-1", "qlora-1-llama-1b-ac")
"""gpu-check run names, committed on 2026-11-26 (stop 30) before any of them ran, with the terms the second GPU
check led to (benchmarks/results/gpu-validation.md, docs/memory-model.md "Measured on a GPU, second check"): the
init moment (FSDP2's one whole tensor beside its shards; no cuBLAS workspace or kernels yet; ZeRO-3's bucket, master
partition and zero gradient at initialize; ZeRO-0's step at initialize), ZeRO-3 gathering nothing on one rank, and
QLoRA's NF4 base outside FSDP2 on one rank. Shapes the checks did not run: ZeRO-3 without offload on GPT-2, ZeRO-0
in bf16 on the 1.2B Llama, FSDP2 LoRA on GPT-2 (a frozen base: the init tensor in bf16), QLoRA on the 1.2B Llama with
op-level checkpointing. Criteria: GPU_VALIDATION_1's, with each measured phase judged by the largest moment
predicted in it (benchmarks/gpu/report.py phase_errors), the init phase included."""

GPU_VALIDATION_4 = ("z2-init-gpt2",)
"""gpu-check run names, committed on 2026-11-26 (stop 30) before it ran, after GPU_VALIDATION_3, with the ZeRO-1/2
init term written after that split (deepspeed.cuda_init_bytes: after the flattening, the master partition and
initialize_optimizer_states' zero gradient beside the model). ZeRO-2 on one GPU, GPT-2 bf16. Criteria:
GPU_VALIDATION_3's."""

GPU_VALIDATION_5 = ("levers-pbf16-adamw8bit-fsdp",)
"""gpu-check run name, committed on 2026-11-27 (stop 33, no GPU lent) before it ran anywhere: FSDP2's pure bf16 with
8-bit AdamW (torchao's AdamW8bit with bf16_stochastic_round, compiled on CUDA; its quantized moments with an fp32
appearance, launcher.worker.engines.optimizers._fp32_appearance), whose CUDA step the plan counts with no working
copies (terms.optimizer_step_temp_bytes). GPT-2 124M, bf16, one GPU. Criteria: GPU_VALIDATION_3's."""

GPU_VALIDATION_6 = ("levers-paged-adamw8bit-fsdp",)
"""gpu-check run name, committed on 2026-11-29 (issue 37 §4, no GPU lent) before it ran anywhere: bitsandbytes'
PagedAdamW8bit on one FSDP2 rank with pure bf16 and the step in backward (Llama 3.2 1B shapes, bf16, one GPU): its
large states in CUDA managed memory, paged in for each tensor's step and evicted after it
(launcher.worker.engines.optimizers._evict), which the plan counts as host bytes and one tensor's working set
(terms.page_state). Criteria: GPU_VALIDATION_3's; the outside-allocator one is where resident pages would show."""

GPU_VALIDATION_7 = ("compose-stack-fsdp", "chunked-inplace-fsdp")
"""gpu-check run names, committed on 2026-11-29 (issue 37) before they ran anywhere: torchtune's low-memory
single-device stack on FSDP2 (pure bf16, full checkpointing, chunked loss, the optimizer step in backward with one
torchao AdamW8bit per parameter, compiled on CUDA, activation offload), whose CUDA hooks the plan counts with no
working copies (engines.fsdp.memory.hook_step_copies); and the chunked loss alone with the head's weight gradient
accumulated in place (one piece's logits and one gradient, levers.chunked_loss.chunked_head_bytes). Llama 1.2B
(128k vocabulary), bf16, one GPU, 4 x 512 tokens. Criteria: GPU_VALIDATION_3's."""

GPU_VALIDATION_8 = ("plain-lora-llama-1b", "plain-qlora-llama-1b", "plain-full-gpt2")
"""gpu-check run names, committed on 2026-11-29 (issue 37 §5) before the plain engine ran on any GPU: one GPU with
no sharding wrapper (launcher.engines.plain: the model in bf16 with fp32 masters of the trainable parameters, nothing
gathered, no side stream). LoRA and QLoRA on the 1.2B Llama (the single-GPU plans the engine was added for: no FSDP2
root or block), and a full fine-tune of GPT-2 124M (masters, AdamW's states and the step's fp32 gradients whole).
Criteria: GPU_VALIDATION_3's."""

RESERVE_TOLERANCE = 0.25
"""Reserved minus allocated at the peak: the 8 % fragmentation share is an assumption (no GPU measured it with
expandable segments), the pool is from the source; relative."""

OUTSIDE_TOLERANCE = 0.05
"""Outside-allocator bytes: predicted (cuda_context + cuda_kernels + nccl_communicators + nccl_buffers) vs device
used - reserved, relative."""
PEAK_TOLERANCE = 0.10
"""The verdict-basis peak (reserved plus outside), relative."""
MOMENT_TOLERANCE = 0.05
"""Each allocated-basis moment against its phase, relative."""
