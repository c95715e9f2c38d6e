"""Chunked cross-entropy (launcher.model.chunked_loss): the same loss and gradients as transformers' own."""

from __future__ import annotations

import pytest
import torch

from launcher.errors import ConfigError
from launcher.model.chunked_loss import ChunkedLossHead, enable_chunked_loss, output_head
from launcher.model.loss import task_loss


def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=97, n_positions=64,
                                      attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0))


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, vocab_size=101,
                                        max_position_embeddings=64, tie_word_embeddings=False))


def _batch(vocab: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (3, 13), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0  # padding
    labels = ids.masked_fill(mask == 0, -100)
    labels[0, :5] = -100  # a prompt that is not trained on
    labels[2, 7] = -100
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def _loss_and_grads(model, batch, chunks: int):
    model.zero_grad(set_to_none=True)
    loss = task_loss("causal_lm", model, batch, loss_chunks=chunks)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("make", [_gpt2, _llama], ids=["gpt2-tied", "llama-untied"])
@pytest.mark.parametrize("chunks", [1, 3, 8, 64])
def test_chunked_loss_and_grads_equal_transformers(make, chunks):
    torch.manual_seed(0)
    model = make().float().train()
    batch = _batch(model.config.vocab_size)
    ref_loss, ref_grads = _loss_and_grads(model, batch, 0)
    enable_chunked_loss(model, chunks)
    assert type(output_head(model)) is ChunkedLossHead
    loss, grads = _loss_and_grads(model, batch, chunks)
    # 3 x 13 = 39 tokens in 64 pieces: empty pieces are skipped, the mean is still over all trained tokens.
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=1e-6)
    assert grads.keys() == ref_grads.keys()
    for name, g in grads.items():
        torch.testing.assert_close(g, ref_grads[name], rtol=1e-5, atol=1e-6, msg=name)


def test_chunked_head_without_labels_returns_logits_and_keeps_names():
    torch.manual_seed(0)
    model = _gpt2().eval()
    names = [n for n, _ in model.named_parameters()]
    ids = torch.randint(0, 97, (2, 5))
    ref = model(input_ids=ids).logits
    enable_chunked_loss(model, 4)
    torch.testing.assert_close(model(input_ids=ids).logits, ref)  # eval/generation without labels: logits
    assert [n for n, _ in model.named_parameters()] == names
    assert model.lm_head.weight is model.transformer.wte.weight  # still tied


def test_chunked_loss_with_lora_matches():
    from launcher.config.job import LoraConfig
    from launcher.model.lora import apply_lora

    torch.manual_seed(0)
    model = apply_lora(_llama(), LoraConfig(r=4, alpha=8, target_modules=["q_proj", "v_proj"]), "causal_lm")
    batch = _batch(101)
    ref_loss, ref_grads = _loss_and_grads(model, batch, 0)
    enable_chunked_loss(model, 8)
    loss, grads = _loss_and_grads(model, batch, 8)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=1e-6)
    assert ref_grads and grads.keys() == ref_grads.keys()
    for name, g in grads.items():
        torch.testing.assert_close(g, ref_grads[name], rtol=1e-5, atol=1e-6, msg=name)


def test_task_loss_refuses_chunks_on_a_plain_head():
    model = _gpt2()
    with pytest.raises(RuntimeError, match="no ChunkedLossHead"):
        task_loss("causal_lm", model, _batch(97), loss_chunks=8)


def test_refuses_heads_it_cannot_chunk():
    from launcher.config.job import LoraConfig
    from launcher.model.lora import apply_lora

    model = _llama()
    model.config.final_logit_softcapping = 30.0
    with pytest.raises(ConfigError, match=r"\(final_logit_softcapping = 30.0\); pin strategy.loss_chunks: 0"):
        enable_chunked_loss(model, 8)
    lora_head = apply_lora(_llama(), LoraConfig(r=4, alpha=8, target_modules=["lm_head"]), "causal_lm")
    with pytest.raises(ConfigError, match="needs an nn.Linear lm_head"):
        enable_chunked_loss(lora_head, 8)


@pytest.mark.parametrize("vocab,hidden,tokens,chunks", [(8192, 256, 16, 2), (8192, 256, 16, 4), (4096, 64, 1024, 4)],
                         ids=["weight-grads", "weight-grads-4", "logits"])
def test_the_memory_term_is_what_torch_holds_for_a_chunked_head(vocab, hidden, tokens, chunks):
    """launcher.planner.memory.chunked_head_bytes against MemTracker on the real implementation: one piece's logits
    beside the one head weight gradient every piece adds into in place (issue 37 §7). Autograd's own sum of the
    pieces' weight gradients held three of them at its first, out-of-place sum (3G, 25.2 MB in "weight-grads")."""
    from torch.distributed._tools.mem_tracker import MemTracker

    from launcher.model.chunked_loss import chunked_causal_lm_loss
    from launcher.planner.memory import chunked_head_bytes, head_weight_grad_bytes
    from launcher.planner.terms import ActivationConstants

    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(vocab, hidden))
    x = torch.randn(1, tokens, hidden, requires_grad=True)
    y = torch.randint(0, vocab, (1, tokens))
    tracker = MemTracker()
    tracker.track_external(w, x)
    with tracker:
        chunked_causal_lm_loss(x, y, w, None, chunks).backward()
    peak = next(iter(tracker.get_tracker_snapshot("peak").values()))
    measured = sum(v for k, v in peak.items() if str(k).split(".")[-1] in ("ACT", "TEMP"))
    logits = 12.0 * vocab
    c = ActivationConstants(block_bytes_per_token=0, block_bytes_per_token_per_seq=0, ckpt_bytes_per_token=0,
                            head_bytes_per_token=logits, head_ckpt_bytes_per_token=logits,
                            head_logit_bytes_per_token=logits,
                            head_weight_grad_bytes=head_weight_grad_bytes(vocab, hidden, 4, True))
    predicted = chunked_head_bytes(c, logits, tokens, chunks)
    # What the term leaves out is hidden-sized (the pieces' input gradients): under 3 % here.
    assert predicted == pytest.approx(measured, rel=0.03), (predicted, measured)
    g = c.head_weight_grad_bytes
    if tokens * logits / chunks < g:  # where the weight gradient dominates: one of it, not the 3G of a sum
        assert measured < 1.2 * g, (measured, g)
