"""Measure a model's activation memory on fake tensors: exact bytes, no compute, any size, no GPU.

The model is rebuilt with 1 and 2 blocks and run forward and backward through the task's own loss under
FakeTensorMode while torch's MemTracker counts activation and temporary bytes at the peak. Two block counts
separate the per-block cost from what lies outside the blocks (embeddings, logits, loss); two sequence lengths
separate the per-token cost from the attention-score cost that grows with the sequence. The result feeds the
planner's activation term as plain numbers (launcher.planner.memory.ActivationConstants).
"""

from __future__ import annotations

import copy
import dataclasses
import gc
import logging
import warnings

from launcher.config.job import Job
from launcher.planner.memory import ActivationConstants, head_weight_grad_bytes

_LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers")
PROBE_VERSION = 12
"""Part of the cache key: bump when what the probe measures changes (7: the frozen linears' inputs under LoRA; 8: the
checkpointed layers' kwargs in a mixed layout; 9: LoRA's adapters in the working dtype, fp32 ones as differences;
10: the frozen linears' inputs beside working-dtype adapters, and what fp32 ones add to them; 11: what the gradient
reduce holds beyond the blocks, reduce_bytes_per_token; 12: the cyclic collector held off during each fake run)."""


def _with_blocks(config, blocks: int):
    cfg = copy.deepcopy(config)
    for key in _LAYER_KEYS:
        if hasattr(cfg, key):
            setattr(cfg, key, blocks)
    return cfg


def _saving_linear():
    """torch.nn.functional.linear as DeepSpeed's ZeRO-3 ``memory_efficient_linear`` runs it: an autograd Function
    that saves its input, the Parameter and the bias whatever needs a gradient (deepspeed/runtime/zero/linear.py,
    LinearFunctionForZeroStage3.setup_context: ``ctx.save_for_backward(input, weight, bias)``), where at::linear
    saves only what the gradients need: weight.t() for the input's, the input for the weight's (none when frozen).
    The same forward (addmm for 2-D input with a bias, else matmul and add); tests/model check its saved tensors
    against DeepSpeed's own."""
    import torch

    class SavingLinear(torch.autograd.Function):
        @staticmethod
        def forward(ctx, input, weight, bias=None):
            ctx.save_for_backward(input, weight, bias)
            if input.dim() == 2 and bias is not None:
                return torch.addmm(bias, input, weight.t())
            out = input.matmul(weight.t())
            if bias is not None:
                out += bias
            return out

        @staticmethod
        def backward(ctx, grad_output):
            input, weight, bias = ctx.saved_tensors
            grad_input = grad_output.matmul(weight) if ctx.needs_input_grad[0] else None
            grad_weight = grad_bias = None
            if ctx.needs_input_grad[1]:
                grad_weight = grad_output.reshape(-1, grad_output.shape[-1]).t().matmul(
                    input.reshape(-1, input.shape[-1]))
            if bias is not None and ctx.needs_input_grad[2]:
                grad_bias = grad_output.reshape(-1, grad_output.shape[-1]).sum(0)
            return grad_input, grad_weight, grad_bias

    def linear(input, weight, bias=None):
        return SavingLinear.apply(input, weight, bias)

    return linear


def _peak_activation_bytes(job: Job, config, *, seq_len: int, examples: int, checkpointing: bool,
                           dtype, loss_chunks: int = 0, policy: str = "full", saving_linear: bool = False,
                           checkpoint_every: int = 1, fp32_adapters: bool = False, at_reduce: bool = False) -> int:
    """Activation and temporary bytes at the fake run's peak, or with ``at_reduce`` at their largest once the first
    parameter gradient is ready (_fake_run)."""
    import torch

    from launcher.model.build import model_class

    # Inputs stay real (a few integers): the loss reads its token count from them.
    vocab = int(config.vocab_size)
    ids = torch.randint(0, vocab, (examples, seq_len))
    batch = {"input_ids": ids, "attention_mask": torch.ones(examples, seq_len, dtype=torch.long)}
    if job.task == "seq_cls":
        batch["labels"] = torch.zeros(examples, dtype=torch.long)
    if job.task == "sentence_embedding":
        batch["pair_input_ids"] = ids.clone()
        batch["pair_attention_mask"] = batch["attention_mask"].clone()
    # Built on the meta device (LoRA included: peft cannot move fake parameters), then materialized as
    # fake tensors, which replaces each parameter instead of swapping it.
    with torch.device("meta"):
        model = model_class(job.task, config).from_config(config, dtype=dtype)
    if hasattr(model.config, "use_cache"):
        model.config.use_cache = False
    if checkpointing:
        kwargs: dict = {"use_reentrant": False}
        if policy == "ops":  # op-level selective checkpointing, the worker's policy (launcher.model.sac)
            from launcher.model.sac import sac_context

            kwargs["context_fn"] = sac_context
        # every k-th block from the first, as the worker asks transformers (launcher.worker.model.build)
        every = {"every_n_layers": checkpoint_every} if checkpoint_every != 1 else {}
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs, **every)
    if job.train.lora is not None:
        # Frozen weights need no saved inputs for their gradients: LoRA changes what a block keeps.
        from launcher.model.lora import apply_lora

        model = apply_lora(model, job.train.lora, job.task, fp32_adapters=fp32_adapters)
    if loss_chunks:
        from launcher.model.chunked_loss import enable_chunked_loss

        enable_chunked_loss(model, loss_chunks)
    # An op without a fake-tensor rule makes torch log a traceback before raising; the caller falls back to the
    # paper's constants and says so in the plan, so the log would only bury the user's output.
    quiet = logging.getLogger("torch._subclasses.fake_tensor")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)
    functional = torch.nn.functional
    linear = functional.linear
    if saving_linear:  # nn.Linear.forward looks F.linear up at each call, as DeepSpeed's zero.Init relies on
        functional.linear = _saving_linear()
    # The peak must not depend on when the cyclic collector runs, which depends on everything the process allocated
    # before (its imports): garbage is collected first and the collector is held off during the run, so what a
    # reference cycle keeps alive counts, as it would until a collection on a rank.
    collecting = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        return _fake_run(job, model, batch, loss_chunks, at_reduce)
    finally:
        if collecting:
            gc.enable()
        functional.linear = linear
        quiet.setLevel(level)


def _fake_run(job: Job, model, batch, loss_chunks: int = 0, at_reduce: bool = False) -> int:
    """One fake forward and backward under the tracker: activation and temporary bytes at the peak, or with
    ``at_reduce`` their largest from the first parameter gradient's hook on (where DeepSpeed's ZeRO-1/2 allocate
    their reduce bucket: grad_handling_hook -> setup_buckets), parameter gradients left out (the bucket takes them)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from launcher.model.loss import task_loss
    from launcher.runtime.tracker import PhaseMemTracker, raw_name

    class ReduceTracker(PhaseMemTracker):
        """Keeps the largest activation and temporary bytes of the "reduce" phase, op by op."""

        reduce_bytes = 0

        def note_reduce(self) -> None:
            snap = self._curr_mem_snap.get(self.watch_device, {})
            held = sum(v for k, v in snap.items() if raw_name(k) in ("Activation", "Temp"))
            self.reduce_bytes = max(self.reduce_bytes, held)

        def _update_peak_stats(self, peak_state) -> None:
            super()._update_peak_stats(peak_state)
            if self.phase == "reduce":
                self.note_reduce()

    with FakeTensorMode(allow_non_fake_inputs=True), warnings.catch_warnings():
        # A module made inside forward and gone by backward (seq_cls's loss: transformers builds a CrossEntropyLoss
        # per call) leaves MemTracker's backward hooks a dead weakref; it says so with a UserWarning per hook and
        # skips that module's snapshot, while the tensors are still counted. Noise on a planning run.
        warnings.filterwarnings("ignore", message=r"Module is None\. Skipping (PRE|POST)_BW hook", category=UserWarning)
        model.to_empty(device="cpu")
        model.train()
        # The worker's tracker: it also handles frozen parameters (LoRA), which plain MemTracker cannot hook.
        tracker = ReduceTracker()
        tracker.setup(torch.device("cpu"), None)
        tracker.track_external(model)

        def first_gradient(_param) -> None:
            if tracker.phase != "reduce":
                tracker.start_phase("reduce")
                tracker.note_reduce()

        hooks = [p.register_post_accumulate_grad_hook(first_gradient) for p in model.parameters()
                 if p.requires_grad and at_reduce]
        with tracker:
            tracker.start_phase("forward")
            loss = task_loss(job.task, model, batch, loss_chunks=loss_chunks)
            loss.backward()
        for hook in hooks:
            hook.remove()
        peak = next(iter(tracker.get_tracker_snapshot("peak").values()))
    if at_reduce:
        return tracker.reduce_bytes
    return sum(v for k, v in peak.items() if str(k).split(".")[-1] in ("ACT", "TEMP"))


def probe_activations(job: Job, *, seq_len: int, precision: str) -> ActivationConstants:
    """Activation constants of this model and task, measured on fake tensors (bytes per example-token)."""
    import torch

    from launcher.model.build import attention_implementation, model_config, planning_attention

    dtype = torch.float32 if precision == "fp32" else torch.bfloat16
    config = model_config(job)
    attention = attention_implementation(config)
    config = planning_attention(config)  # flash-attn needs CUDA and its package; sdpa saves the same tensors
    if job.task == "seq_cls":
        config.num_labels = job.data.num_labels or 2
        if getattr(config, "pad_token_id", None) is None:
            config.pad_token_id = 0  # as the worker sets it (launcher.worker.model.build); any id shapes alike
    s_long = seq_len
    s_short = max(8, seq_len // 2)
    # Enough tokens that saved activations, not the one-off dense embedding gradient (V·h), make the peak.
    h = getattr(config, "hidden_size", None) or getattr(config, "n_embd", 768)
    tokens = max(s_long, 4 * int(config.vocab_size) // 16, 64 * h // 16)
    examples = -(-tokens // s_long)

    def peak(blocks: int, s: int, ac: bool, policy: str = "full", saving_linear: bool = False,
             every: int = 1, fp32_adapters: bool = False, at_reduce: bool = False) -> float:
        """Activation bytes per example-token of a ``blocks``-block model at sequence length ``s``; LoRA's adapters
        in the working dtype unless ``fp32_adapters``; from the first parameter gradient on with ``at_reduce``."""
        n = examples * s_long // s
        total = _peak_activation_bytes(job, _with_blocks(config, blocks), seq_len=s, examples=n,
                                       checkpointing=ac, dtype=dtype, policy=policy, saving_linear=saving_linear,
                                       checkpoint_every=every, fp32_adapters=fp32_adapters, at_reduce=at_reduce)
        return total / (n * s)

    # P(L, s) = L·(a + b·s) + head per token; the per-block cost per token is a + b·s.
    per_block_long = peak(2, s_long, False) - peak(1, s_long, False)
    if s_short != s_long:
        per_block_short = peak(2, s_short, False) - peak(1, s_short, False)
        b = max(0.0, (per_block_long - per_block_short) / (s_long - s_short))
    else:
        b = 0.0
    a = per_block_long - b * s_long
    head = peak(1, s_long, False) - per_block_long
    # Q(L, s) = L·c + (a + b·s) + head': a checkpoint per block, one block recomputed, the head.
    q1, q2 = peak(1, s_long, True), peak(2, s_long, True)
    ckpt = q2 - q1
    head_ckpt = q1 - ckpt - per_block_long
    # The same with the op policy (launcher.model.sac): per block its input and the outputs of the saved ops.
    sac = peak(2, s_long, True, "ops") - peak(1, s_long, True, "ops")
    # A mixed layout, block 0 checkpointed and block 1 not: its backward start holds D + (A + B·s) + H and the
    # checkpointed layer's kwargs, kept by torch.utils.checkpoint's recompute closure (terms.ActivationConstants),
    # alike under both policies. Measured with the op policy: its D, unlike C, is the backward start's own (C comes
    # out 0 where the 1- and 2-block runs with full recompute peak at one moment beyond the blocks, tests/model).
    kwargs_held = max(0.0, peak(2, s_long, True, "ops", every=2) - (sac + per_block_long + head))
    # Under LoRA the runs above hold the adapters in the working dtype, as the launcher's ranks compute them on every
    # engine. What peft's default fp32 adapters add (an fp32 copy of each adapted linear's input, saved), which a
    # user's script keeps at ZeRO-3 (EngineSpec.fp32_adapters), is measured as a difference, per block, outside the
    # blocks and under the op policy.
    fp32_block = fp32_head = fp32_sac = 0.0
    block32, head32 = per_block_long, head
    frozen_block = frozen_head = 0.0
    if job.train.lora is not None and precision != "fp32":
        f1 = peak(1, s_long, False, fp32_adapters=True)
        block32 = peak(2, s_long, False, fp32_adapters=True) - f1
        head32 = f1 - block32
        fp32_block, fp32_head = max(0.0, block32 - per_block_long), max(0.0, head32 - head)
        sac32 = (peak(2, s_long, True, "ops", fp32_adapters=True)
                 - peak(1, s_long, True, "ops", fp32_adapters=True))
        fp32_sac = max(0.0, sac32 - sac)
    # Under LoRA, what the frozen linears' inputs add when they run DeepSpeed's linear (Strategy.release_frozen_weights,
    # ZeRO-3's memory_efficient_linear): per block per token, and outside the blocks (a causal LM's frozen head). An
    # input another op saves already is the same tensor and adds nothing (a working-dtype adapter's, with no dropout);
    # beside fp32 adapters, which save their own fp32 copy, it does: measured there too, as the difference.
    fp32_frozen_block = fp32_frozen_head = 0.0
    if job.train.lora is not None:
        def frozen(fp32_adapters: bool, block: float, head: float) -> tuple[float, float]:
            saving_1 = peak(1, s_long, False, saving_linear=True, fp32_adapters=fp32_adapters)
            saving_block = peak(2, s_long, False, saving_linear=True, fp32_adapters=fp32_adapters) - saving_1
            return max(0.0, saving_block - block), max(0.0, (saving_1 - saving_block) - head)

        frozen_block, frozen_head = frozen(False, per_block_long, head)
        if precision != "fp32":
            block_f, head_f = frozen(True, block32, head32)
            fp32_frozen_block, fp32_frozen_head = block_f - frozen_block, head_f - frozen_head
    # What chunked cross-entropy divides (launcher.planner.memory.chunked_head_bytes), from the loss's source
    # (transformers' ForCausalLMLoss, launcher.model.chunked_loss): three fp32 values per logit at the head's
    # backward peak, the log-softmax output, its gradient and the logits' gradient.
    causal = job.task == "causal_lm"
    vocab = int(config.vocab_size)
    # The gradient reduce (ZeRO-1/2's bucket, allocated at the first gradient hook): what the 1-block run holds from
    # then on beyond its block's saved tensors, per token. Parameter gradients are left out, a tied head's too: the
    # fake copy of the model does not keep the tie (the same bytes tied or untied, tests/model), and the engine's
    # terms count the buffered V x h table a tied head keeps on real ranks (launcher.engines.zero_flush).
    reduce = max(0.0, peak(1, s_long, False, at_reduce=True) - per_block_long)
    return ActivationConstants(
        head_logit_bytes_per_token=12.0 * vocab if causal else 0.0,
        head_weight_grad_bytes=head_weight_grad_bytes(vocab, int(h), 4 if precision == "fp32" else 2,
                                                      causal and job.train.lora is None),
        reduce_bytes_per_token=reduce,
        block_bytes_per_token=a,
        block_bytes_per_token_per_seq=b,
        ckpt_bytes_per_token=ckpt,
        sac_bytes_per_token=sac,
        ckpt_kwargs_bytes_per_token=kwargs_held,
        fp32_adapter_bytes_per_token=fp32_block,
        fp32_adapter_head_bytes_per_token=fp32_head,
        fp32_adapter_sac_bytes_per_token=fp32_sac,
        frozen_input_bytes_per_token=frozen_block,
        fp32_adapter_frozen_input_bytes_per_token=fp32_frozen_block,
        fp32_adapter_frozen_head_input_bytes_per_token=fp32_frozen_head,
        frozen_head_input_bytes_per_token=frozen_head,
        frozen_inputs_measured=job.train.lora is not None,
        head_bytes_per_token=head,
        head_ckpt_bytes_per_token=head_ckpt,
        probe_seq_len=seq_len,
        source=f"measured on fake tensors ({job.task}, {precision}, seq {seq_len}, {attention} attention"
               + (", probed as sdpa" if attention == "flash_attention_2" else "") + ")",
        attention=attention,
    )


def on_device(c: ActivationConstants, device_is_host: bool) -> ActivationConstants:
    """The probe's constants for the device the plan targets. The probe runs CPU kernels: there sdpa falls back
    to the math path whenever attention dropout is on (GPT-2, BERT), saving scores and mask (a·s² per block,
    measured on real CPU ranks). On CUDA, sdpa's flash / memory-efficient kernels and flash_attention_2 take
    dropout and a causal mask in the kernel and save only an s-sized logsumexp, so the a·s² term goes."""
    if device_is_host or c.attention == "eager" or not c.block_bytes_per_token_per_seq:
        return c
    return dataclasses.replace(c, block_bytes_per_token_per_seq=0.0,
                               source=c.source + "; a·s² term dropped: CUDA's fused kernels save no scores")


def moe_constants(job: Job, stats) -> ActivationConstants:
    """A mixture of experts routes each token by its values (torch.where / nonzero over the router's choice), an
    output shape fake tensors cannot know: its activations come from the paper, with the MLP width of the top-k
    experts a token runs through (ModelStats.intermediate_size), by design rather than as a failed probe."""
    from launcher.model.build import attention_implementation, model_config
    from launcher.planner.memory import analytic_constants

    constants = analytic_constants(stats, job.train.precision, attention_implementation(model_config(job)))
    constants.source += (f" with top-{stats.experts_per_token} experts' MLP width (MoE routing is data-dependent: "
                         "no fake-tensor probe)")
    return constants


def probe_fallback(job: Job, stats, error: BaseException) -> ActivationConstants:
    """The paper's constants when the probe cannot run the model, saying so on stderr and in the plan."""
    import sys

    from launcher.planner.memory import analytic_constants

    try:
        from launcher.model.build import attention_implementation, model_config

        attention = attention_implementation(model_config(job))
    except Exception:  # the config itself is what failed: the job's own choice, else transformers' default
        attention = job.train.attn_implementation or "sdpa"
    constants = analytic_constants(stats, job.train.precision, attention)
    detail = f"{type(error).__name__}: {str(error).splitlines()[0][:200] if str(error) else ''}".rstrip(": ")
    constants.probe_error = detail
    constants.source += f" (fake-tensor probe failed: {detail})"
    print(f"launch: warning: the fake-tensor activation probe failed for this model ({detail}); planning with "
          f"Korthikanti et al.'s per-layer constants, {attention} attention, which may be off", file=sys.stderr)
    return constants
