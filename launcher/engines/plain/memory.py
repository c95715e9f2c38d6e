"""The plain engine's memory terms: the whole model on every rank, with no sharding wrapper; over several ranks torch
DDP's gradient buckets.

The rank side (launcher.worker.engines.plain) keeps the model in the working dtype: at bf16/fp16 every parameter
is cast to it and the optimizer steps fp32 master copies of the trainable ones (DeepSpeed ZeRO-0's
FP16_UnfusedOptimizer and [ZeRO §3]'s mixed precision: 2Ψ + 2Ψ_t + 12Ψ_t for Adam), under pure bf16 the bf16
parameters themselves, at fp32 the fp32 parameters.

DDP (torch/nn/parallel/distributed.py) with ``gradient_as_bucket_view=True``: the Reducer allocates its buckets,
``bucket_cap_mb`` (25 MiB) each, when DDP is built, and every parameter's ``.grad`` is then a view of its bucket
("gradients will be views pointing to different offsets of allreduce communication buckets ... the saved memory
size will be equal to the total gradients size"). So the working-dtype gradients exist whole from construction on
and zero_grad(set_to_none=True) frees nothing: they are persistent state. On one rank the gradients exist from
their backward to the step.
"""

from __future__ import annotations

from launcher.levers import OPTIMIZER_IN_BACKWARD, PURE_BF16, QLORA
from launcher.model.qlora import block_nf4, nf4_bytes, quantize_transient_bytes
from launcher.planner.plan import Strategy
from launcher.planner.terms import (
    BYTES,
    MASTER_BYTES,
    MemoryInputs,
    States,
    optimizer_state_bytes,
    optimizer_step_temp_bytes,
    page_state,
    tied_embedding_grad_bytes,
)

DDP_BUCKET_CAP_BYTES = 25 * 2**20
"""torch DDP's default bucket_cap_mb, 25 MiB (distributed.py _DEFAULT_BUCKET_CAP_MB): the rank side keeps it; the
cost model counts one all-reduce per bucket."""


def qlora_blocks(inp: MemoryInputs, s: Strategy) -> list[int]:
    """Element counts of one block's frozen linear weights stored in NF4 (none without qlora); whole, one rank."""
    return block_nf4(inp.model.block_linear_shapes, 1) if QLORA.on(s) else []


def working_bytes(inp: MemoryInputs, s: Strategy) -> int:
    """Bytes per element of the model the ranks compute with and of its gradients: the working dtype (bf16 under
    pure bf16); a user's script (accelerate's mixed precision) keeps fp32 parameters and autocasts."""
    return MASTER_BYTES if inp.script else BYTES[inp.precision]


def has_masters(inp: MemoryInputs, s: Strategy) -> bool:
    """The optimizer steps fp32 master copies of the trainable parameters: bf16/fp16 without pure bf16."""
    return inp.precision != "fp32" and not PURE_BF16.on(s) and not inp.script


def param_bytes(inp: MemoryInputs, s: Strategy) -> float:
    """The model on one rank: every parameter in the working dtype, QLoRA's block linears in NF4."""
    m, w = inp.model, working_bytes(inp, s)
    nf4 = qlora_blocks(inp, s)
    return w * (m.num_params - m.num_blocks * sum(nf4)) + m.num_blocks * sum(nf4_bytes(e, BYTES[inp.precision])
                                                                              for e in nf4)


def plain_states(inp: MemoryInputs, s: Strategy) -> States:
    """Parameters, gradients and optimizer state whole on the rank (plus fp32 masters under mixed precision); under
    DDP the gradient buckets persist; the step adds the masters' fp32 gradients and the optimizer's temporaries."""
    m, w = inp.model, working_bytes(inp, s)
    ddp = s.layout.ddp
    masters = MASTER_BYTES * m.trainable_params if has_masters(inp, s) else 0.0
    grads_all = w * m.trainable_params
    st = States(params=param_bytes(inp, s), optimizer=optimizer_state_bytes(inp, s, 1))
    page_state(inp, s, st)  # paged_adamw8bit: its large states in host memory, paged in at the step
    st.optimizer += masters
    # DDP's buckets are the gradients from construction on; one rank keeps them between micro-steps only.
    st.grads = grads_all if ddp or s.grad_accum_steps > 1 else 0.0
    temps = optimizer_step_temp_bytes(inp, s, 1, on_host=inp.hardware.device_is_host)
    if OPTIMIZER_IN_BACKWARD.on(s):
        # One rank only (PlainSpec.lever_values): each parameter's hook copies its gradient to the master (fp32),
        # steps it and drops both, while backward runs: one tensor's worth at a time, beside the activations.
        largest = min(m.largest_layer_params, max(1, m.trainable_params))
        st.backward_extra = (w + (MASTER_BYTES if masters else 0)) * largest + temps
        st.backward_extra_category = "grads"
    else:
        # At the step every master's fp32 gradient is made from the working one before those are dropped (the
        # rank side converts all, then frees: (w + 4)Ψ_t at once), then the optimizer's per-tensor temporaries.
        st.step_extra = grads_all - st.grads + (MASTER_BYTES * m.trainable_params if masters else 0.0) + temps
    # The last instant of backward: the input embedding's, every gradient made; a tied table's three copies meet
    # (terms.tied_embedding_grad_bytes), of which one is the table's own gradient where it lands in .grad; under
    # DDP all three are outside the bucket until the sum is copied in.
    tied = tied_embedding_grad_bytes(m, w)
    tied_extra = tied if ddp else max(0.0, tied - w * m.vocab_size * m.hidden_size)
    made = 0.0 if OPTIMIZER_IN_BACKWARD.on(s) else grads_all - st.grads
    st.backward_end_late = made + tied_extra
    st.model_states = st.params + grads_all + st.optimizer
    return st


def init_bytes(inp: MemoryInputs, s: Strategy) -> float:
    """Rank 0 while the weights load: CPU ranks build the fp32 model on the host (the device there), copy the
    trainable fp32 masters and cast the parameters one at a time; a GPU receives the masters, then the cast model,
    then DDP's buckets. QLoRA first quantizes each block linear on the device, one at a time (launcher.worker.qlora
    .quantize: the weight in the working dtype and to_nf4's temporaries beside the NF4 weights made before it)."""
    m = inp.model
    masters = MASTER_BYTES * m.trainable_params if has_masters(inp, s) else 0.0
    buckets = working_bytes(inp, s) * m.trainable_params if s.layout.ddp else 0.0
    on_device = param_bytes(inp, s) + masters + buckets
    nf4 = qlora_blocks(inp, s)
    quantizing = quantize_transient_bytes(max(nf4), BYTES[inp.precision]) if nf4 else 0.0
    if inp.hardware.device_is_host:
        return max(4.0 * m.num_params + max(masters, quantizing), on_device)
    nf4_made = m.num_blocks * sum(nf4_bytes(e, BYTES[inp.precision]) for e in nf4)
    return max(nf4_made + quantizing, on_device)
