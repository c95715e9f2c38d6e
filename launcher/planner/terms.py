"""The vocabulary the memory and cost models share with the engine specs (launcher.engines).

Plain numbers and small records only: the generic models (launcher.planner.memory, launcher.planner.cost)
assemble these, the engine specs compute them, and neither imports the other through this module.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from launcher.levers import CHECKPOINT_EVERY, LOW_MEMORY_OPTIMIZER, OPTIMIZER_IN_BACKWARD, PURE_BF16
from launcher.levers.checkpoint_every import checkpoint_count
from launcher.levers.low_memory_optimizer import PAGED
from launcher.model.introspect import ModelStats
from launcher.model.qlora import dequant_transient_bytes
from launcher.planner.hardware import HardwareProfile
from launcher.planner.plan import Strategy

BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
# Optimizer state bytes per trainable parameter: Adam keeps fp32 momentum and variance, SGD one momentum.
# Read through optimizer_state_bytes only, which also knows the low-memory optimizers.
OPTIMIZER_STATE_BYTES = {"adamw": 8, "adam": 8, "sgd": 4}
LOW_BIT_STATE = {"adamw8bit": (1.0, 256), "adamw4bit": (0.5, 128), PAGED: (1.0, 256)}
"""Low-bit AdamW (torchao.optim, and bitsandbytes' paged one): bytes per element of one quantized moment, and the
block that shares one fp32 scale. OptimState8bit.zeros keeps a uint8 code per element and numel/block_size fp32
scales; OptimState4bit packs two codes per byte (torchao/optim/subclass_8bit.py, subclass_4bit.py); block 256
(AdamW8bit), 128 (AdamW4bit). bitsandbytes' Optimizer2State.init_state (optim/optimizer.py, 0.50) keeps state1 and
state2 as uint8 per element and absmax1/absmax2 as one fp32 per block of 256 (``blocksize = 256``, the last block
short), beside two shared 256-entry fp32 maps."""
PAGED_MIN_NUMEL = 100_000
"""bitsandbytes pages a state only for a tensor of at least this many elements (Optimizer8bit.get_state_buffer:
``if not self.is_paged or p.numel() < 1e5``: a plain device tensor); the others' state stays on the device."""
BNB_MIN_8BIT_NUMEL = 4096
"""bitsandbytes keeps fp32 moments (8 bytes per element whatever the parameter's dtype) for a tensor under this
many elements (Optimizer2State min_8bit_size, default 4096)."""
LOW_BIT_MIN_NUMEL = 4096
"""torchao adam.py _AdamBase._new_buffer quantizes a (local) tensor only with at least this many elements and a
size its block divides; any other keeps fp32 moments (8 bytes per element)."""
LOW_BIT_STEP_COPIES = 6
"""fp32 tensors the size of the parameter that torchao's single_param_adam holds at once when it runs eagerly
(CPU ranks, launcher.worker.engines.optimizers): p_f32, exp_avg_f32, exp_avg_sq_f32 and the denominator's
temporaries. Measured 6.0 for 8-bit, 4-bit and fp32-state tensors alike (MemTracker, torch 2.13, torchao 0.18).
bitsandbytes' CPU step (paged_adamw8bit on CPU ranks) is counted the same: down its source (backends/cpu/ops.py
_optimizer_update_8bit_blockwise_cpu) both moments dequantized to fp32, the scaled gradient, the denominator's
square root and quotient: 5 at once, 6 with a bf16 parameter's fp32 copy. MemTracker does not see them (they are
made inside the custom op's kernel, below the dispatch mode), so counted, not measured."""
ADAM_STEP_COPIES = 2
"""fp32 tensors the size of the parameter torch's single-tensor AdamW step holds at once (its denominator)."""
SCRIPT_STEP_COPIES = {True: 4.0, False: 2.0}
"""fp32 copies of the rank's whole trainable shard a user's script's Adam/AdamW step may hold at once, on the host
(True) or on CUDA: HF Trainer's default optim (adamw_torch_fused) and torch's foreach default step every tensor in
one multi-tensor call. Measured 3.6 on 2 CPU ranks (FSDP2 via accelerate, HF Trainer, MiniLM, clipping included);
CUDA's foreach holds the denominator's square root and quotient (2), fused none."""
LOW_BIT_CPU_STEP_RATIO = {"adamw8bit": 141.0, "adamw4bit": 80.0, PAGED: 21.0}
"""Eager low-bit AdamW's step over torch's single-tensor AdamW (foreach=False) on CPU, per optimizer: the median
ratio on one fp32 tensor of 2^20 and 2^22 elements, one thread, the fastest of repeated steps in each of 3 rounds
(benchmarks/lowbit_step/run.py, benchmarks/results/lowbit-step.md); checked on 2^21 and 2^23 within a median 24 %.
There AdamW streams its tensors from memory, as for a model's weights and `launch calibrate`'s rate; the eager
step dequantizes, updates and requantizes through fp32 temporaries at 0.2-1.1 us per element, 8-bit about twice
4-bit (its 256-code map against 16). Was 7 for both (6.4 and 7.4 measured on 2.4M parameters in 2026-11), which
priced every host-side low-bit step 11-20 times too cheap. bitsandbytes' 8-bit step on CPU (its registered
torch kernel, backends/cpu/ops.py _optimizer_update_8bit_blockwise_cpu: dequantize both moments to fp32, AdamW,
requantize; no paging off CUDA): 21, the median of the same fit cells (30.2, 29.9, 28.3 at 2^20; 14.5, 13.4, 11.2
at 2^22, one thread, best of 5 against best of 15 AdamW steps, 3 rounds, bitsandbytes 0.50.2); 2^21 read 12-24,
2^23 5-8, so it over-prices a large tensor's step, harmless on the CPU ranks it prices."""
TORCH_HOST_ADAM_RATIO = 8.6
"""torch's single-tensor AdamW (foreach=False, what FSDP2's CPU offload steps its host shards with:
launcher.worker.engines.base.build_optimizer) over DeepSpeed's CPU Adam (DeepSpeedCPUAdam, the vectorized step
ZeRO-Offload runs and ``cpu_adam_params_per_s`` rates: `launch calibrate` times it where it loads) on the same fp32
tensor, one thread each (the launcher's local ranks run with OMP_NUM_THREADS=1): the median of 7 interleaved rounds
on 2^22 elements, the fastest of 10 steps each (8.6, 10.8, 4.0, 9.2, 3.1, 12.9, 3.2; DeepSpeedCPUAdam 0.36-1.36e9
params/s, torch 0.10-0.31e9, a shared 2-core host at load 10-12; DeepSpeed 0.16+, torch 2.13). Issue 37 §4: the
host step priced from the implementation that runs it; was 1, which priced FSDP2's offloaded step as DeepSpeed's."""
SR_STEP_COPIES = 10.25
"""Pure bf16's stochastically rounded Adam/AdamW step (launcher.worker.engines.optimizers.stochastic_round_adam:
torchao adam.py single_param_adam with BF16_STOCHASTIC_ROUND) run eagerly: fp32-sized tensors of the parameter it
holds at once, beside the parameter, its gradient and the bf16 states. Counted down the source for a bf16 tensor:
p_f32, grad_f32, exp_avg_f32, exp_avg_sq_f32 and denom stay live to the end (5; the update's own peak is 7), and
quant_utils._fp32_to_bf16_sr then adds the int32 random bits, the low and the high halves (3), and inside
torch.where the bool condition (1/4), the rounded-up bits and the result (2): 10.25. Measured 10.25 (MemTracker,
2^20 elements, torch 2.13, torchao 0.18)."""
SR_CPU_STEP_RATIO = 9.0
"""The eager stochastically rounded step over torch's single-tensor AdamW on bf16 tensors, on CPU: measured 9.3
(2.1M elements in four tensors, one thread, best of 25 steps each; 11-17 on a loaded host)."""
MASTER_BYTES = 4  # fp32 master copy kept by mixed precision [ZeRO §3: "fp32 copy of parameters"]
PURE_BF16_BYTES = 2
"""Pure bf16 (Strategy.pure_bf16, LitGPT's "bf16-true"): the bytes per element of the kept parameters, their
gradients and each optimizer state. torch's AdamW allocates exp_avg / exp_avg_sq with zeros_like(param)
(torch/optim/adamw.py _init_group), so bf16 parameters get bf16 states: Adam's 8 state bytes become 4."""
# DeepSpeed's offload_param buffer_count default; the emitter writes it explicitly.
NVME_PARAM_BUFFER_COUNT = 5


def _table_rows(rows: int, ranks: int) -> tuple[int, ...]:
    """Rows of a dim-0 shard on the first and the last rank (torch.chunk, FSDP2's split: the last may be short)."""
    first = math.ceil(rows / ranks)
    return (first, max(0, rows - (ranks - 1) * first)) if ranks > 1 else (rows,)


def vocab_tables(m: ModelStats) -> int:
    """Vocabulary x hidden tables the model holds: the input embedding, and a causal LM's untied output head."""
    return 1 + (1 if m.task == "causal_lm" and not m.tied_embeddings else 0)


def _embedding_tables(m: ModelStats) -> int:
    """Trainable vocabulary x hidden tables (vocab_tables; none under LoRA, which freezes them)."""
    if m.lora_params or not m.vocab_size:
        return 0
    return vocab_tables(m)


def optimizer_state_bytes(inp: MemoryInputs, s: Strategy, shard_ranks: int) -> float:
    """Optimizer state bytes of one rank that steps 1/shard_ranks of the trainable parameters (fp32 masters apart),
    for every engine: OPTIMIZER_STATE_BYTES per parameter for the job's optimizer (half under pure bf16), a low-memory
    one's per its table row (docs/memory-model.md#low-memory-optimizers-low_memory_optimizer)."""
    m, n, opt = inp.model, shard_ranks, LOW_MEMORY_OPTIMIZER.of(s)
    if opt == "none":
        # Pure bf16: the states take the parameters' dtype, half of fp32's.
        k = OPTIMIZER_STATE_BYTES[inp.optimizer] * (PURE_BF16_BYTES / 4 if PURE_BF16.on(s) else 1)
        return k * m.trainable_params / n
    tables, h = _embedding_tables(m), max(1, m.hidden_size)
    rest = max(0, m.trainable_params - tables * m.vocab_size * h)
    if opt == "adafactor":
        return 4 * (tables * (_table_rows(m.vocab_size, n)[0] + h) + 2 * rest / h)
    code, block = LOW_BIT_STATE[opt]
    per_elem = 2 * (code + 4 / block)
    table = max(low_bit_tensor_bytes(opt, r * h, param_bytes=kept_param_bytes(PURE_BF16.on(s)))
                for r in _table_rows(m.vocab_size, n))
    return tables * table + per_elem * rest / n


def low_bit_tensor_bytes(opt: str, numel: int, *, param_bytes: int = MASTER_BYTES) -> float:
    """The two moments a low-bit AdamW keeps for one (local) tensor of ``numel`` elements, bytes: block-wise
    quantized (LOW_BIT_STATE) from its size threshold on, else in ``param_bytes`` (torchao: the parameter's dtype)
    or fp32 (bitsandbytes) (docs/memory-model.md#low-memory-optimizers-low_memory_optimizer)."""
    code, block = LOW_BIT_STATE[opt]
    if opt == PAGED:
        return 8.0 * numel if numel < BNB_MIN_8BIT_NUMEL else 2 * (numel * code + 4 * math.ceil(numel / block))
    quantized = numel >= LOW_BIT_MIN_NUMEL and numel % block == 0
    return numel * (2 * (code + 4 / block) if quantized else 2.0 * param_bytes)


def paged_state_bytes(inp: MemoryInputs, s: Strategy) -> tuple[float, float, float]:
    """paged_adamw8bit's state on its one rank, bytes: (on the device between steps, in host memory, the device
    working set of one tensor's step). States of PAGED_MIN_NUMEL elements or more page (CUDA managed memory), the
    largest one's the working set; none on CPU ranks (docs/memory-model.md#low-memory-optimizers-low_memory_optimizer).
    """
    m = inp.model
    total = optimizer_state_bytes(inp, s, 1)
    if inp.hardware.device_is_host:
        return total, 0.0, 0.0
    linears = [o * i for o, i in m.block_linear_shapes] or [m.block_params]
    paged_tensors = [n for n in linears if n >= PAGED_MIN_NUMEL]
    table = m.vocab_size * m.hidden_size if _embedding_tables(m) and m.vocab_size * m.hidden_size >= PAGED_MIN_NUMEL \
        else 0
    host = (m.num_blocks * sum(low_bit_tensor_bytes(PAGED, n) for n in paged_tensors)
            + _embedding_tables(m) * (low_bit_tensor_bytes(PAGED, table) if table else 0.0))
    small = max(0.0, m.trainable_params - m.num_blocks * sum(paged_tensors) - _embedding_tables(m) * table)
    working = low_bit_tensor_bytes(PAGED, max([table, *paged_tensors]))
    return min(total, 8.0 * small), host, working


def page_state(inp: MemoryInputs, s: Strategy, st: States) -> None:
    """Move paged_adamw8bit's paged states from ``st.optimizer`` to ``st.host`` and keep room for the working set
    (paged_state_bytes): at the step, or with the step in backward at backward's end, in the root's hook, where the
    largest tensor (a vocabulary table) steps; a block's tensors, stepped earlier, have smaller pages. Each engine
    that offers the optimizer calls it from its states(); nothing without it."""
    if LOW_MEMORY_OPTIMIZER.of(s) != PAGED:
        return
    st.optimizer, host, working = paged_state_bytes(inp, s)
    st.host += host
    if OPTIMIZER_IN_BACKWARD.on(s):
        st.backward_end_extra += working
        st.backward_end_late += working
    else:
        st.step_extra += working


def paged_state_s(inp: MemoryInputs, s: Strategy) -> float:
    """Seconds per step paged_adamw8bit's state spends on the host link: every paged state in before its tensor's
    step and out again when the device needs the room (paged_state_bytes), over hw.host_link_bw each way, not
    overlapped (the prefetch and the faults run on the compute stream). The plan offers it where the state does not
    fit on the device beside the rest, so the pages do not stay; 0 on CPU ranks and without the optimizer."""
    if LOW_MEMORY_OPTIMIZER.of(s) != PAGED or inp.hardware.device_is_host:
        return 0.0
    return 2.0 * paged_state_bytes(inp, s)[1] / inp.hardware.host_link_bw


def optimizer_step_temp_bytes(inp: MemoryInputs, s: Strategy, shard_ranks: int, on_host: bool) -> float:
    """Bytes the optimizer step holds beyond its state, for one tensor at a time: the largest local tensor's times
    the copies its step makes (LOW_BIT_STEP_COPIES and SR_STEP_COPIES eager on the host, none compiled on CUDA; a
    script's step over its whole shard, SCRIPT_STEP_COPIES). DeepSpeed counts its flat partitions' step apart
    (docs/memory-model.md#low-memory-optimizers-low_memory_optimizer)."""
    opt = LOW_MEMORY_OPTIMIZER.of(s)
    largest = 4 * math.ceil(inp.model.largest_layer_params / shard_ranks)
    # A low-bit AdamW stepping bf16 weights runs the same single_param_adam with BF16_STOCHASTIC_ROUND: p.float()
    # and grad.float() are copies now, then _fp32_to_bf16_sr's; measured SR_STEP_COPIES for 8- and 4-bit states
    # alike (2^20 elements, MemTracker, torch 2.13, torchao 0.18), as for bf16 states.
    if rounds_stochastically(inp, s):
        # Eager on the host; on CUDA torchao compiles single_param_adam into fused kernels, as for the low-bit
        # states, which hold none. The tensor stepped is a trainable one: under LoRA an adapter, not the largest
        # (frozen) module, so no more than the trainable parameters in all (10 fp32 copies of a frozen vocabulary
        # table would swamp a LoRA plan).
        trainable = min(inp.model.largest_layer_params, max(1, inp.model.trainable_params))
        return SR_STEP_COPIES * 4 * math.ceil(trainable / shard_ranks) if on_host else 0.0
    if opt == "none" and inp.optimizer in ("adam", "adamw") and inp.script:
        # A script's optimizer is its own (HF's fused AdamW, torch's foreach): the whole shard at once.
        whole = 4 * math.ceil(max(1, inp.model.trainable_params) / shard_ranks)
        return max(ADAM_STEP_COPIES * largest, SCRIPT_STEP_COPIES[on_host] * whole)
    if opt == "none":
        return ADAM_STEP_COPIES * largest if inp.optimizer in ("adam", "adamw") else 0.0
    if opt == "adafactor":
        return largest
    if opt in LOW_BIT_STATE and on_host:
        return LOW_BIT_STEP_COPIES * largest
    return 0.0


def optimizer_step_s(inp: MemoryInputs, s: Strategy, trainable_shard: float, on_host: bool) -> float:
    """Seconds a low-memory optimizer's step, or pure bf16's stochastically rounded one, adds over the job's AdamW
    on the device, for this rank's shard: on the host LOW_BIT_CPU_STEP_RATIO or SR_CPU_STEP_RATIO times torch's
    AdamW; 0 on CUDA (compiled) and for Adafactor (docs/step-time.md#the-low-bit-adamw-step-on-the-host)."""
    hw = inp.hardware
    if not on_host:
        return 0.0
    # The ratios are to torch's AdamW, TORCH_HOST_ADAM_RATIO times slower than the CPU Adam the rate is of.
    torch_adam_s = TORCH_HOST_ADAM_RATIO * trainable_shard * inp.gpus_per_node / hw.cpu_adam_params_per_s
    if stochastic_rounds(inp, s):
        return (SR_CPU_STEP_RATIO - 1) * torch_adam_s
    if LOW_MEMORY_OPTIMIZER.of(s) not in LOW_BIT_STATE:
        return 0.0
    return (LOW_BIT_CPU_STEP_RATIO[LOW_MEMORY_OPTIMIZER.of(s)] - 1) * torch_adam_s


def stochastic_rounds(inp: MemoryInputs, s: Strategy) -> bool:
    """Whether the plan's step is pure bf16's stochastically rounded Adam/AdamW (the rank side's build_optimizer):
    always under pure bf16 with the job's Adam or AdamW; SGD keeps torch's round-to-nearest step. A low-bit AdamW
    under pure bf16 rounds too, through the same single_param_adam: rounds_stochastically."""
    opt = LOW_MEMORY_OPTIMIZER
    return PURE_BF16.on(s) and opt.of(s) == opt.off and inp.optimizer in ("adam", "adamw")


def rounds_stochastically(inp: MemoryInputs, s: Strategy) -> bool:
    """Whether the plan's step is torchao's stochastically rounding single_param_adam, whose eager run holds
    SR_STEP_COPIES: pure bf16's Adam/AdamW (stochastic_rounds), or pure bf16 weights stepped by a low-bit AdamW
    (AdamW8bit / AdamW4bit with bf16_stochastic_round=True: launcher.worker.engines.optimizers.low_memory_optimizer,
    on the engines that pair them, EngineSpec.pure_bf16_optimizers). bitsandbytes' paged AdamW8bit rounds its bf16
    weights to nearest in its own kernel: not this step."""
    opt = LOW_MEMORY_OPTIMIZER.of(s)
    return stochastic_rounds(inp, s) or (PURE_BF16.on(s) and opt in LOW_BIT_STATE and opt != PAGED)


def nvme_param_buffer_elems(prefetch_bucket_elems: int, largest_layer_params: int, world_size: int) -> int:
    """Elements in one NVMe parameter swap buffer (DeepSpeed's offload_param.buffer_size).

    Each buffer must hold the largest parameter's shard, ceil(L / N) (partitioned_param_swapper.py asserts it),
    and is at least the prefetch bucket. The emitter writes this and the memory model counts
    NVME_PARAM_BUFFER_COUNT of them, so the two cannot disagree.
    """
    return max(prefetch_bucket_elems, math.ceil(largest_layer_params / world_size))


@dataclass(kw_only=True, slots=True)
class ActivationConstants:
    """Activation bytes per example-token (a sentence_embedding example is two sequences).

    Without checkpointing a block saves ``block_bytes_per_token + block_bytes_per_token_per_seq · s`` per token
    [Kort: sbh(34 + 5as/h) / (sb)]; with full recompute it keeps ``ckpt_bytes_per_token`` [Kort: 2sbh] and one
    block is live again during its backward. ``head_*`` is what lies outside the blocks at the peak:
    embeddings, the logits and the loss's temporaries (b·s·V·bytes, often the largest term).
    """

    block_bytes_per_token: float
    """Saved bytes per token per block that do not grow with the sequence."""
    block_bytes_per_token_per_seq: float
    """Saved bytes per token per block per token of sequence: attention scores without fused attention."""
    ckpt_bytes_per_token: float
    """Bytes per token per block kept by full activation checkpointing (the block input)."""
    head_bytes_per_token: float
    """Bytes per token outside the blocks at the peak (embeddings, logits, loss)."""
    head_ckpt_bytes_per_token: float
    """The same with checkpointing on (the model may recompute or keep different tensors)."""
    head_logit_bytes_per_token: float = 0.0
    """The part of the head terms that is the loss's vocabulary-sized tensors, bytes per token: what chunked
    cross-entropy divides by its chunk count (launcher.planner.memory.chunked_head_bytes). 0: unknown, no saving."""
    head_weight_grad_bytes: float = 0.0
    """Bytes of one gradient of the output embedding (V·h in the working dtype; 0 when it is frozen, as under
    LoRA), per micro-batch: with chunked cross-entropy two of them exist while the blocks' activations do."""
    sac_bytes_per_token: float = 0.0
    """Bytes per token per block kept by op-level selective checkpointing (Strategy.checkpoint_policy "ops",
    launcher.model.sac): the block input and the outputs of the ops its policy saves. 0: not measured (the paper's
    constants, an old cache), and the planner does not offer the policy."""
    ckpt_kwargs_bytes_per_token: float = 0.0
    """Bytes per token a layout whose last block is not checkpointed holds at the backward start beyond its blocks'
    and head's terms, once whatever the number of checkpointed blocks: the tensor kwargs of the checkpointed layers
    (transformers' causal mask, mb·s² bool, and cache_position), which non-reentrant torch.utils.checkpoint keeps in
    its recompute closure (checkpoint.py ``_checkpoint_without_reentrant_generator``: ``recompute_fn`` calls
    ``fn(*args, **kwargs)``) until the block's backward, where without checkpointing sdpa frees the mask with the
    forward. With every block checkpointed the head's checkpointed term holds them already. 0: not measured."""
    reduce_bytes_per_token: float = 0.0
    """Bytes per token the backward holds beyond the blocks' saved tensors once the first parameter's gradient is
    ready, where ZeRO-1/2 allocate their reduce bucket (the gradient-reduce moment): the last block's backward
    temporaries (an MLP activation's backward makes several intermediate-sized tensors) and what the head still
    holds. Parameter gradients are counted apart (the bucket takes them; a tied head's, buffered, in the engine's
    terms). 0: not measured (the paper's constants, an old cache)."""
    frozen_input_bytes_per_token: float = 0.0
    """Under LoRA, the bytes per token per block the frozen linears' inputs add when each linear saves its input
    (Strategy.release_frozen_weights: DeepSpeed's ZeRO-3 memory_efficient_linear); inputs saved already count 0.
    Measured beside adapters in the working dtype (fp32_adapter_frozen_input_bytes_per_token: beside fp32 ones)."""
    frozen_head_input_bytes_per_token: float = 0.0
    """The same outside the blocks, bytes per token (a causal LM's frozen head saving the final hidden states)."""
    fp32_adapter_bytes_per_token: float = 0.0
    """Under LoRA in bf16/fp16, the bytes per token per block fp32 adapters add over adapters in the working dtype
    (peft's default autocast_adapter_dtype makes them fp32 and casts each adapted linear's input to fp32 for them,
    a saved copy; EngineSpec.fp32_adapters says which engines keep them so). 0 in fp32 or without LoRA."""
    fp32_adapter_head_bytes_per_token: float = 0.0
    """The same outside the blocks, bytes per token."""
    fp32_adapter_sac_bytes_per_token: float = 0.0
    """The same for op-level selective checkpointing's kept bytes per token per block (sac_bytes_per_token)."""
    fp32_adapter_frozen_input_bytes_per_token: float = 0.0
    """What frozen_input_bytes_per_token grows by beside fp32 adapters, bytes per token per block: an input a
    working-dtype adapter saves already (the same tensor) is saved by no other op once the adapters cast it."""
    fp32_adapter_frozen_head_input_bytes_per_token: float = 0.0
    """The same for frozen_head_input_bytes_per_token (may be negative)."""
    frozen_inputs_measured: bool = False
    """The probe measured the two frozen-input terms (LoRA jobs); without them the planner does not offer
    release_frozen_weights (the paper's constants and caches from before it do not say)."""
    probe_seq_len: int = 0
    """Sequence length the numbers were measured at (0: derived from the paper)."""
    source: str = "Korthikanti et al. 2022"
    """Where the numbers came from."""
    attention: str = "sdpa"
    """The attention kernel assumed: eager saves the a·s² scores (block_bytes_per_token_per_seq), sdpa and
    flash_attention_2 do not."""
    probe_error: str = ""
    """Why the fake-tensor probe could not measure this model ('' when it did or was not asked to)."""


@dataclass(kw_only=True, slots=True)
class MemoryInputs:
    """Everything the memory model reads, as plain numbers."""

    model: ModelStats
    """Parameter counts and shapes of the model (counts in parameters, sizes in features)."""
    world_size: int
    """Data-parallel ranks in all, N."""
    gpus_per_node: int
    """Ranks per node (the hybrid FSDP2 shard group)."""
    nodes: int
    """Machines."""
    seq_len: int
    """Tokens per sequence."""
    precision: str
    """Working dtype: bf16, fp16 (2 bytes) or fp32 (4 bytes)."""
    optimizer: str
    """adamw, adam (8 state bytes per trainable parameter) or sgd (4)."""
    hardware: HardwareProfile
    """Device constants: context bytes, fragmentation share, whether device memory is host memory."""
    activations: ActivationConstants
    """Activation bytes per token (measured, calibrated or from the paper)."""
    overlap_comm: bool = False
    """DeepSpeed overlap_comm doubles the reduce bucket (the emitter turns it off at stages 1-2)."""
    device_room_bytes: int = 0
    """Device bytes a rank may fill, the usable budget: what DeepSpeed's ZeRO-1/2 flatten sees as room (the rank
    caps its available_memory check there); 0 reads the device's whole memory."""
    script: bool = False
    """The ranks run the user's own script (PlanRequest.script): LoRA's adapters as peft makes them by default
    (EngineSpec.fp32_adapters), where the launcher's recipes keep them in the working dtype."""
    memo: dict | None = field(default=None, init=False, compare=False, repr=False)
    """One request's memo of the engine terms (launcher.planner.memo); set by the search, None elsewhere. Not an
    init field, so dataclasses.replace never hands it to inputs with other values."""


@dataclass(slots=True)
class States:
    """Model states per rank, bytes: what persists through a micro-step, and what the optimizer step adds."""

    params: float = 0.0
    """Device bytes of the parameters (partition or full copy) between uses."""
    grads: float = 0.0
    """Device bytes of gradients that persist through a micro-step (accumulation, ZeRO-3's partition)."""
    optimizer: float = 0.0
    """Device bytes of optimizer state and fp32 master weights."""
    buffers: float = 0.0
    """Device bytes of engine buffers alive at the backward start (reduce bucket, FSDP2 unsharded copies)."""
    buffers_category: str = "buffers"
    """The breakdown category ``buffers`` is shown under (launcher.records.categories: gathered parameters are
    params)."""
    step_extra: float = 0.0
    """Bytes that exist only during the optimizer step (full-step gradients, fp32 working copies)."""
    backward_extra: float = 0.0
    """Bytes next to the saved activations at the backward start: ZeRO-3's gathered weights, or a ZeRO-1/2 reduce
    bucket kept from the previous micro-step."""
    backward_extra_category: str = "params"
    """The breakdown category backward_extra is shown under."""
    backward_end_extra: float = 0.0
    """Bytes at the gradient-reduce moment, when the reduce bucket or largest unit's gradient exists."""
    reduce_with_blocks: bool = False
    """The gradient-reduce moment comes while the blocks' activations are still saved (ZeRO-1/2)."""
    backward_end_late: float = 0.0
    """Bytes at the last instant of backward, once every block's activations are freed: ZeRO-2's final bucket
    flush, or a tied embedding's gradients meeting (tied_embedding_grad_bytes). The end-of-backward moment is the
    larger of this and backward_end_extra (with the blocks' activations where reduce_with_blocks)."""
    reduce_instants: tuple[tuple[float, str, float], ...] = ()
    """The end-of-backward moment instant by instant, in place of the two above where set: (share of the blocks
    whose saved activations are still held, where backward is: "blocks" (their or the head's), "embeddings" (the
    input embeddings') or "after", bytes beyond the persistent states less buffers). ZeRO-2's reduce hook by hook
    (launcher.engines.deepspeed.zero_flush)."""
    host: float = 0.0
    """Host bytes per rank: offloaded state and pinned staging or swap buffers."""
    host_step_extra: float = 0.0
    """Host bytes that exist only during the optimizer step (offloaded gradients)."""
    nvme: float = 0.0
    """NVMe bytes per rank: swapped-out optimizer state and parameters."""
    model_states: float = 0.0
    """Params, a full step's gradients and optimizer state all at once: what DeepSpeed's estimators count."""
    dequant_transient: float = 0.0
    """Bytes of one transient of the blocks' backward: the one frozen weight dequantized at a time (QLoRA's NF4
    base), or on CPU ranks the step in backward's working copies of one block tensor (FSDP2's hooks). It meets the
    saved activations in the blocks' backward, after the loss's temporaries are freed, so the backward moment
    counts the larger of the two."""
    init_extra: float = 0.0
    """GPU ranks: device bytes the engine's own construction allocates beside what its init_bytes counts for the
    weight load (DeepSpeed ZeRO-3's reduce bucket and device master partition). On CPU ranks the checkpoint read
    earlier is the larger instant and init_bytes says so."""
    init_runs_step: bool = False
    """The engine's construction runs one optimizer step on zero gradients (DeepSpeed's FP16_UnfusedOptimizer,
    initialize_optimizer_states): the init moment holds at least the step moment's tensors."""
    step_frees_buffers: bool = False
    """The engine frees its buffers before the optimizer step (FSDP2 reshards its unsharded working copies
    before stepping on the shards, measured)."""
    side_stream_cached: dict[str, float] = field(default_factory=dict)
    """CUDA only: bytes per moment (backward, backward_end, step) that the engine's side streams keep reserved in
    the caching allocator without holding them then, from the second step on (FSDP2's reduce-scatter and
    all-gather pools; launcher.planner.cuda_overhead [POOL]). Not tensors: MemTracker and max_memory_allocated
    never see them, max_memory_reserved does."""


@dataclass(kw_only=True, slots=True, frozen=True)
class Traffic:
    """What one rank sends per optimizer step, by link."""

    intra_node_bytes: float
    """Bytes over the node's own link (NVLink), ring factor included."""
    inter_node_bytes: float
    """Bytes over the network between nodes, ring factor included."""
    calls: int
    """Collective calls, each paying the link's fixed latency."""


def ring(ranks: int) -> float:
    """Share of the payload each rank sends in a ring all-gather or reduce-scatter [ZeRO §7]."""
    return (ranks - 1) / ranks if ranks > 1 else 0.0


def over_links(inp: MemoryInputs, volume: float, calls: int) -> Traffic:
    """A collective volume over all ranks: on the node's link on one node; a group that spans nodes runs at the
    network's speed, so it all counts as inter-node traffic once nodes > 1."""
    if inp.nodes == 1:
        return Traffic(intra_node_bytes=volume * ring(inp.world_size), inter_node_bytes=0.0, calls=calls)
    return Traffic(intra_node_bytes=0.0, inter_node_bytes=volume * ring(inp.world_size), calls=calls)


def optimizer_offload_s(inp: MemoryInputs, trainable_shard: float, nvme: bool, *, torch_adam: bool = False) -> float:
    """Seconds per step of an optimizer on the host over this rank's shard: gradients down and updated
    parameters up over PCIe, CPU Adam on the node's cores (``torch_adam``: torch's AdamW, TORCH_HOST_ADAM_RATIO
    times DeepSpeed's), and with NVMe the state swapped out and back [ZeRO-Offload, arXiv:2101.06840]."""
    hw, w = inp.hardware, BYTES[inp.precision]
    pcie = 2 * w * trainable_shard / hw.host_link_bw  # grads down, updated params up
    adam = trainable_shard * inp.gpus_per_node / hw.cpu_adam_params_per_s * (TORCH_HOST_ADAM_RATIO if torch_adam
                                                                              else 1.0)
    seconds = pcie + adam
    if nvme:
        seconds += 2 * 16 * trainable_shard * inp.gpus_per_node / hw.nvme_bw
    return seconds


def kept_param_bytes(pure_bf16: bool) -> int:
    """Bytes per element of the parameters an engine keeps and steps (FSDP2's shards): fp32, or bf16 when pure."""
    return PURE_BF16_BYTES if pure_bf16 else MASTER_BYTES


def tied_embedding_grad_bytes(m: ModelStats, w: float) -> float:
    """Bytes of the three vocabulary x hidden gradients alive at once when a causal LM's input embedding runs its
    backward and its output head is tied to it (GPT-2), in the working dtype w; 0 when untied or frozen (LoRA): the
    head's, the embedding's and their sum, which autograd cannot add in place
    (docs/memory-model.md#the-peak-is-the-largest-of-the-moments)."""
    if m.task != "causal_lm" or not m.tied_embeddings or m.lora_params or not m.vocab_size:
        return 0.0
    return 3 * w * m.vocab_size * m.hidden_size


def input_embedding_params(m: ModelStats) -> int:
    """Parameters of the input embedding modules, the last whose backward runs: the token table and, for absolute
    positions (GPT-2, BERT), the position table. A rotary model (Llama) has none, though its max_positions is set
    (max_position_embeddings): the table is counted only where the parameters outside the blocks hold it beside
    the vocabulary tables (GPT-2's wpe, BERT's position_embeddings; Llama's hold only the final norm there)."""
    table = m.vocab_size * m.hidden_size
    positions = (m.max_positions or 0) * m.hidden_size
    return table + (positions if m.non_block_params - vocab_tables(m) * table >= positions else 0)


def gloo_reduce_scatter_copies(device_is_host: bool) -> int:
    """Extra full copies of its input a reduce-scatter holds: 1 on CPU ranks (gloo clones it), 0 on CUDA ranks (NCCL
    takes it as it is; docs/memory-model.md#zero-3-and-zero-1-at-the-end-of-backward)."""
    return 1 if device_is_host else 0


def untied_head_bytes(m: ModelStats) -> float:
    """A random init of a causal LM with tied embeddings also allocates the output head before tying it to the
    input embedding (nn.Linear's own weight, replaced by post_init's tie_weights): 4Vh for a moment (measured,
    GPT-2)."""
    return 4 * m.vocab_size * m.hidden_size if (
        m.task == "causal_lm" and m.tied_embeddings and not m.checkpoint_bytes) else 0.0


def nf4_dequant_s(inp: MemoryInputs, s: Strategy, nf4: list[int]) -> float:
    """Seconds per step LinearNF4 spends dequantizing QLoRA's NF4 weights (``nf4``: one block's, elements) in
    forward, again in backward and in the recompute of checkpointed blocks: each of get_original_weight's
    temporaries written once and read once, over the device's memory bandwidth. 0 where the profile has no
    bandwidth (CPU)."""
    hw = inp.hardware
    if not nf4 or not hw.memory_bw:
        return 0.0
    # The recompute dequantizes again only in the checkpointed blocks (every checkpoint_every-th).
    n = inp.model.num_blocks
    recomputed = checkpoint_count(n, CHECKPOINT_EVERY.of(s)) if s.activation_checkpointing else 0
    passes = 2 + recomputed / max(n, 1)
    touched = 2 * sum(dequant_transient_bytes(e, BYTES[inp.precision]) for e in nf4) * n
    return s.grad_accum_steps * passes * touched / hw.memory_bw
