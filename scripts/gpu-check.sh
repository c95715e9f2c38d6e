#!/usr/bin/env bash
# The GPU check anyone can run (issue 18 §8). On a machine with CUDA:
#   1. pytest tests/gpu;
#   2. a real run per engine (DeepSpeed, FSDP2) on 1 GPU and, with 2+ GPUs, on 2, each with --enforce; the verdict
#      is on the plan's basis, on CUDA reserved plus context (cuda_reserved_plus_context); then the memory levers
#      (issue 21) pinned on 1 GPU: the exact ones per engine, and 8-bit AdamW, pure bf16 and QLoRA on FSDP2;
#   3. benchmarks/results/gpu.md: every run's verdict and predicted vs measured bytes per moment
#      (python -m benchmarks.gpu.report, which reuses benchmarks/accuracy's comparison).
# On a machine without CUDA it says so and exits 0. Exit 1 if a test, a run or the basis check failed.
# GPU_CHECK_RESULTS=path writes the page elsewhere; the run dirs go under runs/gpu-check-<time>/.
# On a lent machine that reaches no package index, run scripts/gpu-offline-env.sh first (it marks .venv as set up
# offline). GPU_CHECK_TESTS=0 skips step 1 (the device time of a lent machine is short; run pytest on its own);
# GPU_CHECK_RUNS=splits runs only the validation splits' runs (benchmarks/gpu/splits.py) before the page.
set -uo pipefail
cd "$(dirname "$0")/.."
if ! [ -f .venv/.launcher-offline ]; then bash scripts/setup.sh --test || exit 1; fi  # pytest for tests/gpu
PY=.venv/bin/python
gpus=$("$PY" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)') || exit 1
if [ "$gpus" -lt 1 ]; then
  echo "gpu-check: no CUDA device on this machine (torch.cuda.is_available() is False): nothing to check, exit 0"
  exit 0
fi
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$PWD/.cache/torch_extensions} HF_HUB_OFFLINE=1
results=${GPU_CHECK_RESULTS:-benchmarks/results/gpu.md}
runs=runs/gpu-check-$(date +%Y%m%d-%H%M%S)
mkdir -p "$runs"

tests_args=()
if [ "${GPU_CHECK_TESTS:-1}" != 0 ]; then
  "$PY" -m pytest -q -m gpu tests/gpu
  tests_args=(--tests-rc "$?")
fi

# Nine tenths of the card, as tests/gpu does: a budget the planner accepts on any GPU.
budget=$("$PY" -c 'import torch; print(int(0.9 * torch.cuda.get_device_properties(0).total_memory))')
machine=$("$PY" -c 'import torch; print(f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}")')
worlds=1
[ "$gpus" -ge 2 ] && worlds="1 2"
runs_args=()

# The memory levers (docs/levers.md) on 1 GPU, each pinned so its CUDA side runs: the exact ones together per
# engine, and each math-changing one allowed and pinned on FSDP2 (the engine that offers them).
lever_job() {  # name engine model strategy-extra train-extra [micro-batch, default 4: the global batch] [launch flag]
  cat > "$runs/$1.yaml" <<JOB
name: $1
model: $3
task: causal_lm
data: {path: $PWD/examples/data/causal.jsonl, max_seq_len: 512}
train: {global_batch_size: 4, precision: bf16, lr: 1.0e-4, max_steps: 4$5}
strategy: {engine: $2, micro_batch_size: ${6:-4}$4}
JOB
  echo "gpu-check: $1: launch --gpus 1 --budget $budget --enforce"
  .venv/bin/launch --gpus 1 --budget "$budget" "$runs/$1.yaml" --run-dir "$runs/$1" --enforce --quiet ${7:+"$7"}
  runs_args+=(--run "$runs/$1" "$?")
}
# First GPU_VALIDATION_8 (benchmarks/gpu/splits.py, named before it ran): the plain engine on one GPU, LoRA and
# QLoRA on the 1.2B Llama and a full fine-tune of GPT-2.
lora_llama=", lora: {r: 8, alpha: 16, target_modules: [q_proj, v_proj]}"
lever_job plain-lora-llama-1b plain llama-1b "" "$lora_llama"
lever_job plain-qlora-llama-1b plain llama-1b ", qlora: true" ", allow_levers: [qlora]$lora_llama"
lever_job plain-full-gpt2 plain gpt2-124m "" ""
# Then GPU_VALIDATION_3 and _4 (benchmarks/gpu/splits.py, named before they ran: the init moment, ZeRO-3 and QLoRA
# on one rank), then the runs of GPU_VALIDATION_1 and _2, so a short lease still judges them; then the exact levers, 8-bit
# AdamW and op-level SAC.
lever_job z3-1-gpt2 deepspeed gpt2-124m ", zero_stage: 3" ""
lever_job z2-init-gpt2 deepspeed gpt2-124m ", zero_stage: 2" ""  # GPU_VALIDATION_4
lever_job z0-init-llama-1b deepspeed llama-1b ", zero_stage: 0" "" 2
lever_job fsdp-lora-1 fsdp gpt2-124m "" ", lora: {r: 8, alpha: 16, target_modules: [c_attn]}"
lever_job qlora-1-llama-1b-ac fsdp llama-1b ", qlora: true, activation_checkpointing: true, checkpoint_policy: ops" \
  ", allow_levers: [qlora], lora: {r: 8, alpha: 16, target_modules: [q_proj, v_proj]}"
# QLoRA's NF4 base and pure bf16's AdamW with torchao's stochastic rounding (compiled on CUDA).
lever_job levers-qlora-fsdp fsdp llama-1b ", qlora: true" \
  ", allow_levers: [qlora], lora: {r: 8, alpha: 16, target_modules: [q_proj, v_proj]}"
lever_job levers-pure-bf16-fsdp fsdp gpt2-124m ", pure_bf16: true" ", allow_levers: [pure_bf16]"
# GPU_VALIDATION_5: pure bf16 with torchao's 8-bit AdamW (stochastically rounded, compiled on CUDA).
lever_job levers-pbf16-adamw8bit-fsdp fsdp gpt2-124m ", pure_bf16: true, low_memory_optimizer: adamw8bit" \
  ", allow_levers: [pure_bf16, adamw8bit]"
# GPU_VALIDATION_6 (issue 37): bitsandbytes' paged 8-bit AdamW with pure bf16 and the step in backward, as
# torchtune's single-device recipe runs it: its state in CUDA managed memory, evicted after each tensor's step.
lever_job levers-paged-adamw8bit-fsdp fsdp llama-1b \
  ", pure_bf16: true, optimizer_in_backward: true, low_memory_optimizer: paged_adamw8bit, activation_checkpointing: true" \
  ", allow_levers: [pure_bf16, adamw8bit], max_grad_norm: 0"
# GPU_VALIDATION_7 (issue 37): torchtune's low-memory single-device stack on FSDP2, the step in backward beside
# torchao's 8-bit AdamW under pure bf16 (compiled on CUDA, no clipping), and the chunked loss's in-place head gradient.
lever_job compose-stack-fsdp fsdp llama-1b ", pure_bf16: true, activation_checkpointing: true, loss_chunks: 8, \
optimizer_in_backward: true, activation_offload: true, low_memory_optimizer: adamw8bit" \
  ", max_grad_norm: 0, allow_levers: [pure_bf16, adamw8bit]"
lever_job chunked-inplace-fsdp fsdp llama-1b ", loss_chunks: 8, activation_checkpointing: true" ""
# ZeRO-3 with the optimizer on the host (DeepSpeedCPUAdam: JIT-compiled on first use). With the allocator's snapshot:
# its segments carry their stream, which measures the reduce_and_partition stream's pool (DEEPSPEED_COMMUNICATORS,
# launcher/engines/deepspeed/memory.py, says why).
lever_job zero3-offload-1 deepspeed gpt2-124m ", zero_stage: 3, offload_optimizer: cpu" "" 4 --memory-snapshot
# Then GPU_VALIDATION_2 (named before it ran): FSDP2's side-stream pools. A 1.2 B model whose fp32 gradient shards
# (4.9 GB) stay cached in the reduce-scatter stream's pool, and accumulation, where they are live at the backward start.
lever_job pool-llama-1b-ac-fsdp fsdp llama-1b ", activation_checkpointing: true" ""
lever_job pool-accum-fsdp fsdp gpt2-124m "" "" 2
# The rest: the exact levers, 8-bit AdamW, op-level SAC and each engine plain (skipped under GPU_CHECK_RUNS=splits,
# a short lease: the validation splits only, then the page).
other_runs() {
  exact=", activation_checkpointing: true, checkpoint_every: 2, loss_chunks: 8, activation_offload: true"
  lever_job levers-exact-deepspeed deepspeed gpt2-124m "$exact" ""
  lever_job levers-exact-fsdp fsdp gpt2-124m "$exact, optimizer_in_backward: true" ", max_grad_norm: 0"
  lever_job levers-adamw8bit-fsdp fsdp gpt2-124m ", low_memory_optimizer: adamw8bit" ", allow_levers: [adamw8bit]"
  lever_job levers-sac-ops-fsdp fsdp llama-1b ", activation_checkpointing: true, checkpoint_policy: ops" ""

  for engine in deepspeed fsdp; do
    for n in $worlds; do
      name=$engine-$n
      cat > "$runs/$name.yaml" <<JOB
name: $name
model: gpt2-124m
task: causal_lm
data: {path: $PWD/examples/data/causal.jsonl, max_seq_len: 512}
train: {global_batch_size: $((4 * n)), precision: bf16, lr: 1.0e-4, max_steps: 4}
strategy: {engine: $engine}
JOB
      echo "gpu-check: $name: launch --gpus $n --budget $budget --enforce"
      .venv/bin/launch --gpus "$n" --budget "$budget" "$runs/$name.yaml" --run-dir "$runs/$name" --enforce --quiet
      runs_args+=(--run "$runs/$name" "$?")
    done
  done
}
[ "${GPU_CHECK_RUNS:-all}" = splits ] || other_runs

"$PY" -m benchmarks.gpu.report --out "$results" "${tests_args[@]}" --machine "$machine" "${runs_args[@]}"
