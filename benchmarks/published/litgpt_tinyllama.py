"""Why the launcher over-predicts LitGPT's tiny-llama LoRA row (+71 %): both recipes measured the same way.

LitGPT's own recipe (litgpt.lora.GPT with config_hub/finetune/tiny-llama/lora.yaml's LoRA, bf16-true, the forward
and loss of litgpt/finetune/lora.py fit: ``model(ids, lm_head_chunk_size=128)`` then ``chunked_cross_entropy``)
and the launcher's (transformers' Llama with PEFT's LoRA on the same linears, transformers' loss), each at 8 x 512
tokens on fake tensors under the worker's tracker (launcher.runtime.tracker.PhaseMemTracker: torch's MemTracker
with frozen parameters handled). LitGPT is not a dependency; install it beside the project for this check:

    .venv/bin/python -m pip install --no-deps --target /tmp/litgpt_env litgpt==0.5.13 lightning lightning-utilities \
        "jsonargparse[signatures]<=4.41" torchmetrics docstring-parser typeshed-client
    .venv/bin/python -m benchmarks.published.litgpt_tinyllama litgpt [LAYERS]   # then: hf, hf-bf16 [LAYERS]

Results (2026-11-26) in benchmarks/published/run.py MISS_NOTES["litgpt-tinyllama-lora-all"].
"""

from __future__ import annotations

import json
import sys

LITGPT_ENV = "/tmp/litgpt_env"
BATCH, SEQ = 8, 512
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"]


def _tracker():
    import torch

    from launcher.runtime.tracker import PhaseMemTracker

    t = PhaseMemTracker()
    t.setup(torch.device("cpu"), None)
    return t


def _peak(tracker) -> dict[str, float]:
    peak = next(iter(tracker.get_tracker_snapshot("peak").values()))
    return {str(k).split(".")[-1]: round(v / 1e9, 3) for k, v in peak.items()}


def litgpt(layers: int) -> dict[str, float]:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    sys.path.insert(0, LITGPT_ENV)
    import litgpt.lora as lora
    from litgpt.utils import chunked_cross_entropy

    cfg = lora.Config.from_name("tiny-llama-1.1b", lora_r=32, lora_alpha=16, lora_dropout=0.05, lora_query=True,
                                lora_key=True, lora_value=True, lora_projection=True, lora_mlp=True, lora_head=True,
                                n_layer=layers)
    with FakeTensorMode():
        torch.set_default_dtype(torch.bfloat16)  # bf16-true: weights, adapters and activations
        model = lora.GPT(cfg)
        lora.mark_only_lora_as_trainable(model)
        model.max_seq_length = SEQ
        ids = torch.randint(0, cfg.vocab_size, (BATCH, SEQ))
        tracker = _tracker()
        tracker.track_external(model)
        with tracker:
            tracker.start_phase("forward")
            logits = model(ids, lm_head_chunk_size=128)
            logits[-1] = logits[-1][..., :-1, :]
            chunked_cross_entropy(logits, ids[..., 1:]).backward()
    return _peak(tracker)


def transformers_peft(layers: int, adapters_in_fp32: bool = True) -> dict[str, float]:
    """transformers' Llama with PEFT's LoRA. ``adapters_in_fp32``: get_peft_model's default (autocast_adapter_dtype),
    as launcher.model.lora.apply_lora builds the probe's model; False: the adapters in bf16, as the launcher's ranks
    run them (each engine computes every parameter in bf16: DeepSpeed's engine casts the module, FSDP2's
    MixedPrecisionPolicy gathers bf16)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from torch._subclasses.fake_tensor import FakeTensorMode
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=2048, num_hidden_layers=layers, num_attention_heads=32, num_key_value_heads=4,
                      intermediate_size=5632, vocab_size=32000, max_position_embeddings=2048,
                      tie_word_embeddings=False, attn_implementation="sdpa")
    with torch.device("meta"):  # peft cannot wrap fake parameters: built on meta, then made fake
        model = LlamaForCausalLM._from_config(cfg, dtype=torch.bfloat16)
    model.config.use_cache = False
    model = get_peft_model(model, LoraConfig(r=32, lora_alpha=16, lora_dropout=0.05, target_modules=TARGETS),
                           autocast_adapter_dtype=adapters_in_fp32)
    ids = torch.randint(0, 32000, (BATCH, SEQ))
    with FakeTensorMode(allow_non_fake_inputs=True):
        model.to_empty(device="cpu")
        model.train()
        tracker = _tracker()
        tracker.track_external(model)
        with tracker:
            tracker.start_phase("forward")
            model(input_ids=ids, labels=ids).loss.backward()
    return _peak(tracker)


def main() -> int:
    which = sys.argv[1]
    layers = int(sys.argv[2]) if len(sys.argv) > 2 else 22
    if which == "litgpt":
        peak = litgpt(layers)
    else:
        peak = transformers_peft(layers, adapters_in_fp32=which == "hf")
    print(json.dumps({"recipe": which, "layers": layers, "peak_GB_by_category": peak}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
