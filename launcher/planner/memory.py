"""Bytes per rank for one strategy: the memory model.

Sources, cited where each term is computed:
  [ZeRO]  Rajbhandari et al., arXiv:1910.02054, Table 1: (2 + 2 + K)Ψ with K = 12 for mixed-precision Adam.
  [DS]    DeepSpeed estimate_zero2/3_model_states_mem_needs (stage_1_and_2.py, stage3.py).
  [Kort]  Korthikanti et al., arXiv:2205.05198, eq. (1): sbh(34 + 5as/h) bytes per layer, 2sbh with full recompute.
  [ZInf]  ZeRO-Infinity, arXiv:2104.07857 §3: activation checkpoints 2·b·s·h·layers/ci bytes.

The peak is the largest of these moments, as measured on real ranks (benchmarks/accuracy):
  backward start  the states that persist through a micro-step plus every saved activation and the loss's
                  temporaries (gradients of this micro-step do not exist yet);
  gradient reduce ZeRO-1/2: the reduce bucket, allocated at the first gradient hook while the blocks'
                  activations are still saved; ZeRO-3 and FSDP2: the end of backward, the largest unit
                  gathered with its gradient;
  optimizer step  the states plus the full step's gradients and the optimizer's fp32 working copies;
  init            rank 0 loading the weights (launcher.worker.loading): on CPU ranks, where host memory is the
                  device, the whole checkpoint it reads counts, and a LoRA or short-sequence run can peak there;
  export          CPU ranks only: rank 0's host copy of the model written at the end (launcher.worker.export),
                  beside the state the step leaves.
Each engine's states, weight load and init bytes come from its spec (launcher.engines); this module turns
them into moments, a breakdown and a peak. All inputs are plain numbers; nothing here touches a device.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from launcher.engines import engine_spec
from launcher.levers import (
    ACTIVATION_OFFLOAD,
    CHECKPOINT_EVERY,
    CHECKPOINT_POLICY,
    CHUNKED_LOSS,
    RELEASE_FROZEN_WEIGHTS,
)
from launcher.levers.checkpoint_every import checkpoint_count, checkpointed
from launcher.levers.chunked_loss import chunked_head_bytes
from launcher.model.introspect import ModelStats
from launcher.planner.cuda_overhead import absent_at, cuda_overhead, overhead_total, verdict_basis
from launcher.planner.memo import spec_for
from launcher.planner.plan import Buckets, MemoryEstimate, Strategy
from launcher.planner.terms import (
    BYTES,
    MASTER_BYTES,
    NVME_PARAM_BUFFER_COUNT,
    ActivationConstants,
    MemoryInputs,
    States,
    nvme_param_buffer_elems,
)


def analytic_constants(m: ModelStats, precision: str, attention: str = "sdpa") -> ActivationConstants:
    """[Kort] eq. (1) scaled to this architecture and dtype; the score term only with eager attention
    (docs/memory-model.md#activations, "The paper")."""
    w = BYTES[precision]
    inner = m.intermediate_size * (1.5 if m.gated_mlp else 1.0)
    block = (8 * m.hidden_size + 2 * inner) * w + 2 * m.hidden_size
    if m.task == "causal_lm":
        head = 2 * m.hidden_size * w + m.vocab_size * (w + 12)
    else:
        head = 2 * m.hidden_size * w
    # [Kort] 5as²b at fp16: the scores' softmax output and its dropout output (w bytes each) and the dropout
    # mask (1 byte) per head per token pair. Fused kernels (sdpa, flash) keep only an s-sized logsumexp.
    scores = m.num_heads * (2 * w + 1) if attention == "eager" else 0.0
    causal = m.task == "causal_lm"
    return ActivationConstants(block_bytes_per_token=block, block_bytes_per_token_per_seq=scores,
                               ckpt_bytes_per_token=m.hidden_size * w, head_bytes_per_token=head,
                               head_ckpt_bytes_per_token=head, attention=attention,
                               head_logit_bytes_per_token=m.vocab_size * (w + 12) if causal else 0.0,
                               head_weight_grad_bytes=head_weight_grad_bytes(m.vocab_size, m.hidden_size, w,
                                                                             causal and not m.lora_params),
                               source=f"Korthikanti et al. 2022 ({attention} attention)")


def head_weight_grad_bytes(vocab_size: int, hidden_size: int, dtype_bytes: float, trainable: bool) -> float:
    """One gradient of the output embedding, V·h in the working dtype, if it trains (ActivationConstants)."""
    return float(vocab_size * hidden_size * dtype_bytes) if trainable else 0.0


PINNED_ROUNDING = 2
"""Host bytes per offloaded activation byte, at most: torch's CachingHostAllocator, which serves the pinned
tensors of save_on_cpu(pin_memory=True), rounds each request up to a power of two (at most twice the size)."""


def block_activations(c: ActivationConstants, num_blocks: int, micro_batch: int, seq_len: int,
                      checkpointing: bool, checkpoint_every: int = 1, policy: str = "full") -> tuple[int, int]:
    """(saved, live) bytes of the blocks for one micro-batch: what forward leaves for backward, and one block's
    whole forward (A + B·s per token), live again while a checkpointed block is recomputed.

    A checkpointed block keeps its input [Kort: 2sbh; ZInf], any other block all it saves. Under the op policy
    (``policy`` "ops", launcher.model.sac) a checkpointed block keeps its input and its saved ops' outputs
    (sac_bytes_per_token); its recompute rebuilds the rest, so the block is whole again, as under full recompute.
    """
    tokens = micro_batch * seq_len
    block = tokens * (c.block_bytes_per_token + c.block_bytes_per_token_per_seq * seq_len)
    if not checkpointing:
        return int(num_blocks * block), int(block)
    ckpt = tokens * (c.sac_bytes_per_token if policy == "ops" else c.ckpt_bytes_per_token)
    kept = checkpoint_count(num_blocks, checkpoint_every)
    return int(kept * ckpt + (num_blocks - kept) * block), int(block)


def activation_bytes(c: ActivationConstants, num_blocks: int, micro_batch: int, seq_len: int,
                     checkpointing: bool, checkpoint_every: int = 1, loss_chunks: int = 0,
                     policy: str = "full") -> tuple[int, int]:
    """(blocks, head) activation bytes of one micro-batch at the backward peak: the backward start, or the last
    block's recompute when it is checkpointed, chosen by the layout so the bytes stay linear in the constants
    (docs/memory-model.md#selective-checkpointings-memory-and-time). With ``loss_chunks`` the head's term is the
    chunked loss's (chunked_head_bytes). ``policy``: block_activations.
    """
    return activation_terms(c, num_blocks, micro_batch, seq_len, checkpointing, checkpoint_every, loss_chunks,
                            policy)[:2]


def activation_terms(c: ActivationConstants, num_blocks: int, micro_batch: int, seq_len: int, checkpointing: bool,
                     checkpoint_every: int = 1, loss_chunks: int = 0, policy: str = "full") -> tuple[int, int, int]:
    """activation_bytes' (blocks, head), and the blocks' saved bytes (block_activations' first) it is made of."""
    tokens = micro_batch * seq_len
    saved, live = block_activations(c, num_blocks, micro_batch, seq_len, checkpointing, checkpoint_every, policy)
    recompute_last = checkpointing and checkpointed(num_blocks - 1, checkpoint_every)
    head = c.head_ckpt_bytes_per_token if recompute_last else c.head_bytes_per_token
    head_bytes = chunked_head_bytes(c, head, tokens, loss_chunks) if loss_chunks else tokens * head
    # A mixed layout (block 0 checkpointed, the last not): the checkpointed layers' kwargs outlive the forward in
    # torch.utils.checkpoint's recompute closure; H, measured without checkpointing, lacks them (terms.py).
    kwargs = tokens * c.ckpt_kwargs_bytes_per_token if checkpointing and not recompute_last else 0
    return int(saved + kwargs + (live if recompute_last else 0)), int(head_bytes), saved


TRL_TOKEN_TILE = 4096
"""Tokens per tile of TRL's fused LM head (trl.kernels.chunked_logprob.TOKEN_CHUNK_SIZE)."""
TRL_VOCAB_TILE = 32768
"""Vocabulary columns per tile of TRL's fused LM head (trl.trainer.utils._CHUNKED_LOGPROB_CHUNK_SIZE)."""
LOSS_BYTES_PER_LOGIT = 12
"""The loss's fp32 bytes per logit at the head's backward (log-softmax output, its gradient, the logits' gradient):
what the probe's head_logit_bytes_per_token counts per vocabulary entry (launcher.model.activations)."""
TRL_HOST_BYTES_PER_LOGIT = 36.0
"""Bytes per tile logit at the backward of TRL's fused LM head where Triton is not (CPU ranks): its torch fallback
(_backward_tile) holds the tile and about eight fp32 copies of it at once (the transform, log-p, p, the gradient,
the target mask as float, the products). Measured with the probe's tracker on TRL 1.16: 35.3 bytes (fp32),
34.2 (bf16 autocast), with or without the entropy and top-1 outputs."""


def trl_head_bytes(m: ModelStats, precision: str, tokens: int, device_is_host: bool) -> float:
    """A causal LM's head at the backward peak as TRL's SFTTrainer runs it over ``tokens`` (those with a next
    token, micro-batch x (seq_len - 1)): one tile of its fused LM head, the head weight's and the hidden states'
    gradients in fp32
    (docs/memory-model.md#a-users-script-launch---script-what-its-libraries-hold-beyond-the-recipe)."""
    if m.task != "causal_lm":
        return 0.0
    w = BYTES[precision]
    tile = min(tokens, TRL_TOKEN_TILE) * min(m.vocab_size, TRL_VOCAB_TILE)
    grads = 0.0 if m.lora_params else m.vocab_size * m.hidden_size * (MASTER_BYTES + (w if w < MASTER_BYTES else 0))
    return tile * (TRL_HOST_BYTES_PER_LOGIT if device_is_host else w) + grads + MASTER_BYTES * tokens * m.hidden_size


def offloaded_activation_bytes(c: ActivationConstants, num_blocks: int, micro_batch: int, seq_len: int,
                               checkpointing: bool, checkpoint_every: int = 1,
                               loss_chunks: int = 0) -> tuple[int, int, int]:
    """(blocks on the device, head on the device, host) activation bytes with activation offload on CUDA: the device
    holds one block's backward beside the head's H', the host every saved tensor and the loss's whole H
    (docs/memory-model.md#activation-offload-activation_offload).
    """
    tokens = micro_batch * seq_len
    saved, live = block_activations(c, num_blocks, micro_batch, seq_len, checkpointing, checkpoint_every)
    device = live + (tokens * c.ckpt_bytes_per_token if checkpointing else 0.0)
    h = c.head_ckpt_bytes_per_token
    head = chunked_head_bytes(c, h, tokens, loss_chunks) if loss_chunks else tokens * h
    return int(device), int(head), int(saved + tokens * c.head_bytes_per_token)


def strategy_activations(c: ActivationConstants, s: Strategy, *, fp32_adapters: bool = False) -> ActivationConstants:
    """The constants this strategy's forward saves by: with ``fp32_adapters`` (EngineSpec.fp32_adapters) peft's fp32
    copies of the adapted linears' inputs, with release_frozen_weights every frozen linear's input, the head's unless
    the loss is chunked. See docs/memory-model.md#loras-adapters-the-dtype-they-compute-in-probe-versions-9-and-10
    and docs/memory-model.md#zero-3s-released-frozen-weights-release_frozen_weights-a-lever."""
    block = c.fp32_adapter_bytes_per_token if fp32_adapters else 0.0
    head = c.fp32_adapter_head_bytes_per_token if fp32_adapters else 0.0
    sac = c.fp32_adapter_sac_bytes_per_token if fp32_adapters and c.sac_bytes_per_token else 0.0
    if RELEASE_FROZEN_WEIGHTS.on(s):
        block += c.frozen_input_bytes_per_token + (c.fp32_adapter_frozen_input_bytes_per_token if fp32_adapters
                                                   else 0.0)
        if not CHUNKED_LOSS.on(s):
            head += c.frozen_head_input_bytes_per_token + (
                c.fp32_adapter_frozen_head_input_bytes_per_token if fp32_adapters else 0.0)
    if not (block or head or sac):
        return c
    return dataclasses.replace(c, block_bytes_per_token=c.block_bytes_per_token + block,
                               sac_bytes_per_token=c.sac_bytes_per_token + sac,
                               head_bytes_per_token=c.head_bytes_per_token + head,
                               head_ckpt_bytes_per_token=c.head_ckpt_bytes_per_token + head)


def rank_activations(inp: MemoryInputs, s: Strategy) -> ActivationConstants:
    """The constants this strategy's ranks save by for this request: strategy_activations with the engine's answer
    on LoRA's adapter dtype for the launcher's recipe or a user's script (EngineSpec.fp32_adapters), and for a
    script the head TRL's fused LM head may hold (script_head_activations)."""
    fp32_adapters = spec_for(inp, s).fp32_adapters(s, script=inp.script)
    c = strategy_activations(inp.activations, s, fp32_adapters=fp32_adapters)
    return script_head_activations(c, inp, s) if inp.script and not CHUNKED_LOSS.on(s) else c


def script_head_activations(c: ActivationConstants, inp: MemoryInputs, s: Strategy) -> ActivationConstants:
    """A user's script may compute a causal LM's loss as HF does (the full logits: the head terms as measured) or
    as TRL does (trl_head_bytes); the plan counts TRL's where it is the larger, which the model's shape decides
    (analytic bytes, not the constants, so the choice holds while launch calibrate scales them): on CPU ranks, and
    on GPUs where few tokens meet a large vocabulary x hidden. Then the head terms trade the loss's vocabulary part
    (head_logit_bytes_per_token, L) for TRL's, each part scaled by the constant it is made of: the tile by L (per
    logit L/V against the loss's 12 fp32 bytes), the head weight's gradient by head_weight_grad_bytes, the hidden
    states' by ckpt_bytes_per_token (h in the working dtype), so the terms stay linear in the constants."""
    m = inp.model
    if m.task != "causal_lm":
        return c
    tokens, shifted = s.micro_batch_size * inp.seq_len, s.micro_batch_size * (inp.seq_len - 1)
    host, w = inp.hardware.device_is_host, BYTES[inp.precision]
    if trl_head_bytes(m, inp.precision, shifted, host) <= tokens * m.vocab_size * (w + LOSS_BYTES_PER_LOGIT):
        return c
    tile = min(shifted, TRL_TOKEN_TILE) * min(m.vocab_size, TRL_VOCAB_TILE) * (TRL_HOST_BYTES_PER_LOGIT if host else w)
    per_logit = c.head_logit_bytes_per_token / (LOSS_BYTES_PER_LOGIT * m.vocab_size)
    grads = c.head_weight_grad_bytes * (MASTER_BYTES + (w if w < MASTER_BYTES else 0)) / w
    hidden = shifted * c.ckpt_bytes_per_token * MASTER_BYTES / w
    delta = (tile * per_logit + grads + hidden) / tokens - c.head_logit_bytes_per_token
    return dataclasses.replace(c, head_bytes_per_token=c.head_bytes_per_token + delta,
                               head_ckpt_bytes_per_token=c.head_ckpt_bytes_per_token + delta)


def init_bytes(inp: MemoryInputs, s: Strategy) -> float:
    """Rank 0's bytes while the weights load and the engine wraps them, before any forward (measured, init phase).

    Host-resident tensors count only where the host is the device (CPU ranks); on a GPU the same instant holds
    only the device parts, which are below training's. Ψ here is the base model: LoRA adapters come after.
    Each engine's spec says what it holds then (EngineSpec.init_bytes).
    """
    return engine_spec(s.engine).init_bytes(inp, s)


def export_host_bytes(m: ModelStats, precision: str) -> float:
    """Rank 0's extra host bytes when the run ends and writes RUN_DIR/model (launcher.worker.export, docs/export.md).

    The gathered model in the saved dtype (the run's working dtype: 2 bytes for bf16/fp16, 4 for fp32), plus the
    largest layer being gathered (host memory on CPU ranks). A LoRA run gathers its trainable tensors alone; with
    train.lora.merge it gathers the whole model, which this does not see (docs/export.md says so).
    """
    kept = m.trainable_params if m.lora_params else m.num_params
    return BYTES[precision] * (kept + m.largest_layer_params)


TRAINING_MOMENTS = ("backward", "backward_end", "step")
"""The moments inside a training step (the others: rank 0's weight load, and on CPU ranks its export)."""


def _overhead_terms(inp: MemoryInputs, comms: int) -> tuple[Callable[[float, float], int], int]:
    """The CUDA overheads' total as a function of (tensor bytes, pool bytes), sum(overhead_at(...).values()) but
    cheaper, and what the init moment lacks yet (cuda_overhead.absent_at: the same terms for any tensors). Both
    depend on the request and the communicator count alone: kept in the request's memo where the search set one."""
    memo = getattr(inp, "memo", None)
    key = ("cuda_overhead", comms)
    if memo is not None and key in memo:
        return memo[key]
    hw = inp.hardware
    total = overhead_total(hw, inp.world_size, comms)
    not_yet = sum(b for n, b in cuda_overhead(hw, 0.0, inp.world_size, comms).items() if n in absent_at("init"))
    if memo is not None:
        memo[key] = (total, not_yet)
    return total, not_yet


@dataclass(slots=True)
class Held:
    """What a strategy holds through a micro-step, before estimate_memory times its moments: the engine's states
    and the activation bytes (held_bytes)."""

    states: States
    """The engine's per-rank states (EngineSpec.states)."""
    consts: ActivationConstants
    """The constants its ranks save by (rank_activations)."""
    blocks: float
    """Device bytes of the blocks' activations at the backward peak."""
    head: float
    """Device bytes of the head's (the loss's) activations then."""
    blocks_saved: float
    """Device bytes the blocks' forward leaves saved for backward (0 with activation offload)."""
    pinned: float
    """Host bytes of pinned activation buffers (activation offload on CUDA ranks)."""

    @property
    def backward_bytes(self) -> float:
        """Tensor bytes at the backward start (estimate_memory's "backward" moment)."""
        st = self.states
        return (st.params + st.grads + st.optimizer + st.buffers + self.blocks + max(self.head, st.dequant_transient)
                + st.backward_extra)


def held_bytes(inp: MemoryInputs, s: Strategy, buckets: Buckets, like: Held | None = None) -> Held:
    """The states and activations of ``s``: estimate_memory's first half, which the search's floor
    (device_floor) reads before deciding to finish it. ``like``: held_bytes of ``s`` with other buckets, whose
    activations (which no bucket changes) are taken as they are."""
    m = inp.model
    st = spec_for(inp, s).states(inp, s, buckets)  # memoized per request where the search set inp.memo
    if like is not None:
        return Held(st, like.consts, like.blocks, like.head, like.blocks_saved, like.pinned)
    consts = rank_activations(inp, s)
    every, chunks, policy = CHECKPOINT_EVERY.of(s), CHUNKED_LOSS.of(s), CHECKPOINT_POLICY.of(s)
    mb, ac = s.micro_batch_size, s.activation_checkpointing
    if ACTIVATION_OFFLOAD.on(s) and not inp.hardware.device_is_host:
        # On CPU ranks the saved tensors are already in host memory and the offload hooks keep them where they
        # are (save_on_cpu's tensor.cpu() returns the tensor itself): the estimate stays as without offload.
        # On CUDA the device holds one block's backward whatever the share: nothing saved stays.
        blocks, head, saved = offloaded_activation_bytes(consts, m.num_blocks, mb, inp.seq_len, ac, every, chunks)
        return Held(st, consts, blocks, head, 0, PINNED_ROUNDING * saved)
    blocks, head, blocks_saved = activation_terms(consts, m.num_blocks, mb, inp.seq_len, ac, every, chunks, policy)
    return Held(st, consts, blocks, head, blocks_saved, 0)


FLOOR_ROUNDING_BYTES = 64
"""What device_floor leaves for the peak's rounding: estimate_memory truncates each breakdown category (and each
CUDA overhead term) to whole bytes, under a byte each."""


def device_floor(held: Held) -> float:
    """A lower bound of estimate_memory's peak_bytes for the strategy ``held`` is of: the backward moment's tensor
    bytes. The peak is the largest moment on the verdict basis, tensors plus overheads that are never negative
    (cuda_overhead), so at least this one, less the rounding of its categories (FLOOR_ROUNDING_BYTES)."""
    return held.backward_bytes - FLOOR_ROUNDING_BYTES


def estimate_memory(inp: MemoryInputs, s: Strategy, buckets: Buckets, held: Held | None = None) -> MemoryEstimate:
    """A strategy's predicted per-rank peak, bytes: its breakdown by category at the peak's moment (backward,
    backward end, step, init, and on CPU ranks the export), the CUDA overheads, and host and NVMe bytes per node.
    ``held``: held_bytes(inp, s, buckets), where the caller has it."""
    m = inp.model
    spec = spec_for(inp, s)  # memoized per request where the search set inp.memo
    held = held or held_bytes(inp, s, buckets)
    st, consts, blocks, head = held.states, held.consts, held.blocks, held.head
    blocks_saved, pinned = held.blocks_saved, held.pinned
    persistent = st.params + st.grads + st.optimizer + st.buffers
    tokens = s.micro_batch_size * inp.seq_len

    def held_at(share: float, at: str) -> float:
        """Activation bytes at an end-of-backward instant: ``share`` of the blocks' saved tensors, what they hold
        once (a recomputed block, checkpointed layers' kwargs) and, while a block's or the head's backward runs,
        what it holds beyond them (reduce_bytes_per_token: the gradient reduce of issue 36's tiny GPT-2, -5.1 %
        without it)."""
        blocks_held = share * blocks_saved + (blocks - blocks_saved) if share > 0 else 0.0
        return blocks_held + (tokens * consts.reduce_bytes_per_token if at == "blocks" else 0.0)

    # At the input embeddings' backward the gradient reaching them (the hidden states, a sentence_embedding example
    # two sequences), shown with the gradients: shape arithmetic, no activation constant, so the activation group
    # stays linear in the constants (launch calibrate's fit, launcher.calibrate.runs).
    hidden = tokens * m.hidden_size * BYTES[inp.precision] * (2 if m.task == "sentence_embedding" else 1)

    # The end of backward is its largest instant: by default the gradient reduce (with the blocks' activations where
    # reduce_with_blocks) and the last one, once every block's backward has run (States.backward_end_late); the
    # engine's own instants where it lists them (States.reduce_instants). The first of equal instants is shown.
    with_blocks = st.reduce_with_blocks
    instants = tuple((share, where, extra + (hidden if where == "embeddings" else 0.0))
                     for share, where, extra in st.reduce_instants) or (
        (1.0 if with_blocks else 0.0, "blocks" if with_blocks else "after", st.backward_end_extra),
        (0.0, "after", st.backward_end_late))
    at = [extra + held_at(share, where) for share, where, extra in instants]
    end = max(range(len(at)), key=at.__getitem__)
    end_extra, end_activations = instants[end][2], held_at(*instants[end][:2])
    moments = {
        "backward": held.backward_bytes,
        "step": persistent + st.step_extra - (st.buffers if st.step_frees_buffers else 0.0),
        "backward_end": persistent - st.buffers + at[end],
    }
    if inp.hardware.device_is_host:
        # Rank 0's export copy at the end of the run (launcher.worker.export) is host memory, and on CPU ranks the
        # host is what the rank is measured in: a moment of its own, beside the state that outlives the step --
        # the step's gradients and working copies are gone (zero_grad(set_to_none=True); measured on
        # EXPORT_VALIDATION: FSDP2's resident state there is the parameter shards and Adam's states, 55.2 MB), and
        # so are the working copies the step frees (FSDP2's resharded root).
        moments["export"] = persistent - (st.buffers if st.step_frees_buffers else 0.0) \
            + export_host_bytes(m, inp.precision)
        moments["step"] += st.host_step_extra
    # Offloaded state on CPU ranks is added to every training moment below (offloaded_on_device); the load is before it.
    loading = spec.init_bytes(inp, s)
    host_side = st.host if inp.hardware.device_is_host else 0.0
    if not inp.hardware.device_is_host:
        loading += st.init_extra
    if st.init_runs_step:
        loading = max(loading, moments["step"] + host_side)
    moments["init"] = loading - host_side
    hw = inp.hardware
    # CUDA ranks are judged on reserved plus context (what OOMs); CPU ranks on tensor bytes (MemTracker). The
    # side streams' cached blocks differ by moment (States.side_stream_cached), so the peak is the largest moment
    # on the verdict basis, not the largest tensor moment.
    comms = spec.nccl_communicators(s)
    offloaded_on_device = st.host if hw.device_is_host else 0.0  # bytes: CPU ranks measure the host they offload to
    pools = {} if hw.device_is_host else st.side_stream_cached

    def overhead_at(k: str, tensors: float) -> dict[str, int]:
        terms = cuda_overhead(hw, tensors, inp.world_size, comms, pools.get(k, 0.0))
        return {n: b for n, b in terms.items() if n not in absent_at(k)}

    total_overhead, not_yet = _overhead_terms(inp, comms)
    on_basis = {k: v + offloaded_on_device + total_overhead(v + offloaded_on_device, pools.get(k, 0.0))
                - (not_yet if k == "init" else 0) for k, v in moments.items()}
    moment = max(on_basis, key=on_basis.get)
    moment_bytes = {k: int(v) for k, v in on_basis.items()}

    def breakdown_at(moment: str) -> dict[str, float]:
        """Device bytes per category at ``moment`` (before the CUDA reserve)."""
        bd = {
            "params": st.params,
            "grads": st.grads + {"step": st.step_extra, "backward_end": end_extra}.get(moment, 0.0),
            "optimizer": st.optimizer,
            "buffers": 0.0,
            "activations": blocks if moment == "backward" else end_activations if moment == "backward_end" else 0.0,
            "logits": head if moment == "backward" else 0.0,
        }
        if not (moment == "backward_end" or (moment in ("step", "export") and st.step_frees_buffers)):
            bd[st.buffers_category] += st.buffers
        if moment == "backward":
            bd[st.backward_extra_category] += st.backward_extra + max(0.0, st.dequant_transient - head)
        if hw.device_is_host:
            # CPU ranks: "offloaded" state lives in the same memory the rank is measured in.
            bd["offloaded"] = st.host + (st.host_step_extra if moment == "step" else 0.0)
        if moment == "export":  # the gathered copy is parameters (categories.py), beside the training state
            bd["params"] += export_host_bytes(m, inp.precision)
        if moment == "init":  # the weights being loaded (on the host, where that is the device); nothing else yet
            bd = dict.fromkeys(bd, 0.0) | {"params": loading}
        return bd

    breakdown = breakdown_at(moment)
    # Where the peak is outside training (rank 0's load or export), training's own largest moment too: the OOM
    # ladder scales its categories by what a failed attempt measured (launcher.planner.fallback.Correction).
    training = max(TRAINING_MOMENTS, key=on_basis.get)
    training_breakdown = {} if moment in TRAINING_MOMENTS else breakdown_at(training)
    # The verdict's moment need not be the largest in tensors (a side-stream pool may lift another): that one's
    # tensor bytes too, for what counts no pool (MemoryEstimate.tensor_peak_bytes).
    tensor_moment = max(moments, key=moments.get)
    tensor_peak = sum(breakdown_at(tensor_moment).values()) if moments[tensor_moment] > moments[moment] else 0.0
    tensors = sum(breakdown.values())
    overhead = overhead_at(moment, tensors)
    breakdown["reserve"] = sum(overhead.values())
    breakdown = {k: int(v) for k, v in breakdown.items()}
    if training_breakdown:
        training_breakdown["reserve"] = sum(overhead_at(training, sum(training_breakdown.values())).values())
        training_breakdown = {k: int(v) for k, v in training_breakdown.items()}
    peak = sum(breakdown.values())
    ranks = inp.gpus_per_node
    # The weight load, as launcher.worker.loading does it: rank 0 alone builds the model on its host (one fp32
    # copy, 4Ψ, on one node) and the other ranks build on the meta device and receive it by broadcast (DeepSpeed
    # ZeRO-0/1/2) or as shards (FSDP2: fully_shard on meta, set_model_state_dict(broadcast_from_rank0)) [torchtitan's
    # meta-device init; PyTorch torch.distributed.checkpoint.state_dict]. ZeRO-3 builds inside zero.Init, each rank
    # copying in one parameter at a time [DS: "4nL·f with zero.Init", against 4nP·f without].
    load = spec.load_bytes_per_node(inp, s)
    # CPU ranks: every rank's training peak (rank 0's export copy is added once, below).
    training_peak = sum(training_breakdown.values()) if training_breakdown else peak
    host_bytes = ranks * training_peak if hw.device_is_host else ranks * (st.host + st.host_step_extra + pinned)
    # The export at the end (launcher.worker.export) adds rank 0's gathered copy to what the node holds then.
    host_bytes = max(host_bytes + export_host_bytes(m, inp.precision), load)
    return MemoryEstimate(breakdown=breakdown, peak_bytes=int(peak), host_bytes_per_node=int(host_bytes),
                          nvme_bytes_per_node=int(ranks * st.nvme), peak_moment=moment,
                          basis=verdict_basis(hw), overhead=overhead, moment_bytes=moment_bytes,
                          training_breakdown=training_breakdown,
                          moment_stream_pool_bytes={k: int(v) for k, v in pools.items() if k in moments and v > 0},
                          tensor_peak_bytes=int(tensor_peak))


def model_state_bytes(inp: MemoryInputs, s: Strategy, buckets: Buckets) -> int:
    """Model states per rank (no activations, no timing of the peak); for DeepSpeed, comparable with DeepSpeed's
    own estimators."""
    return int(engine_spec(s.engine).states(inp, s, buckets).model_states)


__all__ = ["TRAINING_MOMENTS", "BYTES", "FLOOR_ROUNDING_BYTES", "NVME_PARAM_BUFFER_COUNT", "ActivationConstants",
           "Held", "MemoryEstimate", "MemoryInputs", "States", "PINNED_ROUNDING", "activation_bytes",
           "activation_terms", "analytic_constants", "block_activations", "checkpointed", "chunked_head_bytes",
           "device_floor", "estimate_memory", "head_weight_grad_bytes", "held_bytes", "init_bytes",
           "model_state_bytes", "offloaded_activation_bytes", "rank_activations", "strategy_activations",
           "nvme_param_buffer_elems"]
