"""Selective activation checkpointing and activation offload on the rank side (issue 21, levers 2 and 3)."""

import torch
import torch.distributed as dist
from torch import nn

from launcher.config.job import Job
from launcher.config.load import from_dict
from launcher.model.introspect import find_blocks
from launcher.runtime import memory_probe
from launcher.worker.engines.fsdp import FsdpEngine
from launcher.worker.model import build
from launcher.worker.offload import _pack, offload_activations
from launcher.worker.recipes import make_recipe
from tests.worker.run_dirs import tiny_gpt2_job


def _job(examples_data, layers: int) -> Job:
    data = tiny_gpt2_job(str(examples_data / "causal.jsonl"))
    data["model"]["num_layers"] = layers
    return from_dict(Job, data)


def test_deepspeed_path_has_transformers_checkpoint_every_kth_block(examples_data):
    job = _job(examples_data, 4)
    recipe = make_recipe(job.task, job.data)
    for every, want in ((1, [True] * 4), (2, [True, False, True, False]), (4, [True, False, False, False])):
        model = build(job, recipe, seq_len=32, hf_checkpointing=True, checkpoint_every=every)
        _, blocks = find_blocks(model, fix="")
        assert [b.gradient_checkpointing for b in blocks] == want


def test_deepspeed_path_gives_transformers_checkpointing_the_op_policy(examples_data):
    """checkpoint_policy "ops" off FSDP2: transformers' checkpoint function carries launcher.model.sac's context_fn,
    so each checkpointed block saves the policy's op outputs (measured: SAC_DS_DEV / SAC_DS_VALIDATION)."""
    from launcher.model.sac import sac_context

    job = _job(examples_data, 4)
    recipe = make_recipe(job.task, job.data)
    for policy, want in (("full", None), ("ops", sac_context)):
        model = build(job, recipe, seq_len=32, hf_checkpointing=True, checkpoint_every=2, checkpoint_policy=policy)
        _, blocks = find_blocks(model, fix="")
        funcs = {b._gradient_checkpointing_func for b in blocks}
        assert len(funcs) == 1 and funcs.pop().keywords.get("context_fn") is want
        assert [b.gradient_checkpointing for b in blocks] == [True, False, True, False]
    # Checkpointed with the policy, the loss and gradients are those of the plain model (the policy only chooses what
    # is saved; dropout off so the recompute is the forward).
    ids = torch.randint(3, 1024, (2, 32))
    grads = []
    for ac in (False, True):
        torch.manual_seed(0)
        model = build(job, recipe, seq_len=32, hf_checkpointing=ac, checkpoint_policy="ops").train()
        for m in model.modules():
            if isinstance(m, nn.Dropout):
                m.p = 0.0
        model(input_ids=ids, labels=ids).loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for n in grads[0]:
        torch.testing.assert_close(grads[1][n], grads[0][n], rtol=1e-5, atol=1e-6)


def _grads(engine: FsdpEngine, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    engine.backward(engine.forward(input_ids=ids, labels=ids).loss)
    # checkpoint_wrapper adds a level to the names of the blocks it wraps.
    return {n.replace("_checkpoint_wrapped_module.", ""): p.grad.full_tensor().clone()
            for n, p in engine.model.named_parameters()}


def test_fsdp_wraps_every_kth_block_and_the_gradients_are_exact(single_rank, examples_data):
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    dist.init_process_group("gloo")
    job = _job(examples_data, 4)
    recipe = make_recipe(job.task, job.data)
    ids = torch.randint(3, 1024, (2, 32))
    grads = {}
    for ac, every in ((False, 1), (True, 2)):
        torch.manual_seed(0)
        model = build(job, recipe, seq_len=32, hf_checkpointing=False)
        model.config.attn_pdrop = model.config.resid_pdrop = model.config.embd_pdrop = 0.0
        for m in model.modules():
            if isinstance(m, nn.Dropout):
                m.p = 0.0
        engine = FsdpEngine(reshard_after_forward=True, offload_params="none", offload_optimizer="none",
                            activation_checkpointing=ac, checkpoint_every=every, precision="fp32",
                            grad_accum_steps=1, device=torch.device("cpu"))
        engine.setup(model, job.train, memory_probe(device="cpu", track_categories=False))
        wrapped = [isinstance(b, CheckpointWrapper) for b in model.transformer.h]
        assert wrapped == ([True, False, True, False] if ac else [False] * 4)
        grads[ac] = _grads(engine, ids)
    assert grads[False].keys() == grads[True].keys()
    for name in grads[False]:
        torch.testing.assert_close(grads[True][name], grads[False][name], msg=name)


def test_offload_hooks_keep_host_tensors_and_parameters_where_they_are():
    # CPU ranks: host memory is the device, nothing is copied (save_on_cpu's tensor.cpu() is the tensor itself).
    t = torch.randn(3)
    assert _pack(t) is t
    # Parameters, and views of them (F.linear saves weight.t()), stay where they are on any device: the model
    # holds them anyway (a meta tensor that is no parameter would be copied into pinned memory).
    p = nn.Parameter(torch.empty(4, 4, device="meta"))
    view = p.t()
    assert _pack(p) is p and _pack(view) is view


def test_training_under_the_offload_hooks_gives_the_same_gradients():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 2))
    x = torch.randn(5, 8)
    model(x).square().sum().backward()
    want = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    with offload_activations(True):
        out = model(x).square().sum()
    out.backward()
    for g, w in zip((p.grad for p in model.parameters()), want, strict=True):
        torch.testing.assert_close(g, w)


def test_an_adapter_export_keeps_the_adapters_of_checkpoint_wrapped_blocks():
    """FSDP2 wraps every k-th block in checkpoint_wrapper; the state dict's names leave the wrapper out, so the
    adapter export must name its tensors the same way (found by the lever validation split: LoRA + every-2nd
    block exported nothing from the wrapped blocks)."""
    from peft import LoraConfig, get_peft_model
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper
    from transformers import GPT2Config, GPT2LMHeadModel

    from launcher.worker.export import kept_names

    model = get_peft_model(GPT2LMHeadModel(GPT2Config(n_layer=4, n_embd=32, n_head=2, vocab_size=64)),
                           LoraConfig(r=2, target_modules=["c_attn"]))
    blocks = model.base_model.model.transformer.h
    for i in (0, 2):
        blocks[i] = checkpoint_wrapper(blocks[i], checkpoint_impl=CheckpointImpl.NO_REENTRANT)
    adapters = {k for k in model.state_dict() if "lora_" in k}
    assert len(adapters) == 8 and kept_names(model) == adapters


def _llama_job(examples_data) -> Job:
    data = tiny_gpt2_job(str(examples_data / "causal.jsonl"))
    data["model"] = {"family": "llama", "hidden_size": 64, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2,
                     "intermediate_size": 128, "vocab_size": 1024, "max_position_embeddings": 128}
    return from_dict(Job, data)


def test_fsdp_op_policy_recomputes_only_the_unsaved_ops_and_the_gradients_are_exact(single_rank, examples_data):
    """checkpoint_policy ops (launcher.model.sac): the same gradients as no checkpointing, and its recompute in
    backward re-runs only every second aten.mm of a block (a Llama block: k, o, up of q, k, v, o, gate, up, down),
    where full recompute re-runs them all."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class CountMm(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.mm = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.mm += func == torch.ops.aten.mm.default
            return func(*args, **(kwargs or {}))

    dist.init_process_group("gloo")
    job = _llama_job(examples_data)
    recipe = make_recipe(job.task, job.data)
    ids = torch.randint(3, 1024, (2, 32))
    grads, backward_mm = {}, {}
    for ac, policy in ((False, "full"), (True, "full"), (True, "ops")):
        torch.manual_seed(0)
        model = build(job, recipe, seq_len=32, hf_checkpointing=False)
        engine = FsdpEngine(reshard_after_forward=True, offload_params="none", offload_optimizer="none",
                            activation_checkpointing=ac, checkpoint_policy=policy, precision="fp32",
                            grad_accum_steps=1, device=torch.device("cpu"))
        engine.setup(model, job.train, memory_probe(device="cpu", track_categories=False))
        loss = engine.forward(input_ids=ids, labels=ids).loss
        with CountMm() as count:
            engine.backward(loss)
        backward_mm[(ac, policy)] = count.mm
        grads[(ac, policy)] = {n.replace("_checkpoint_wrapped_module.", ""): p.grad.full_tensor().clone()
                               for n, p in engine.model.named_parameters()}
    base = grads[(False, "full")]
    for key in ((True, "full"), (True, "ops")):
        assert grads[key].keys() == base.keys()
        for name in base:
            torch.testing.assert_close(grads[key][name], base[name], msg=f"{key} {name}", rtol=0, atol=0)
    # Two blocks: full recompute re-runs 2 x 6 forward matmuls in backward (not down_proj: non-reentrant
    # checkpoint stops once the last tensor backward needs is rebuilt), the op policy 2 x 3 (k, o, up).
    assert backward_mm[(True, "full")] - backward_mm[(False, "full")] == 12
    assert backward_mm[(True, "ops")] - backward_mm[(False, "full")] == 6
