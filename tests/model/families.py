"""Small configs built from transformers' own config classes, one per architecture family, saved as model dirs."""

from __future__ import annotations

from pathlib import Path

SMALL = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "vocab_size": 320, "max_position_embeddings": 256}
ENCODER = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128,
           "vocab_size": 320, "max_position_embeddings": 256}

# family -> (config class name, kwargs, LoRA targets that name its attention projections)
DECODERS = {
    "mistral": ("MistralConfig", SMALL, ["q_proj", "v_proj"]),
    "qwen2": ("Qwen2Config", SMALL, ["q_proj", "v_proj"]),
    "gemma": ("GemmaConfig", {**SMALL, "head_dim": 16}, ["q_proj", "v_proj"]),
    "phi3": ("Phi3Config", {**SMALL, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}, ["qkv_proj"]),
    "mixtral": ("MixtralConfig", {**SMALL, "num_local_experts": 4, "num_experts_per_tok": 2}, ["q_proj", "v_proj"]),
    "qwen2_moe": ("Qwen2MoeConfig", {**SMALL, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 64,
                                     "num_experts": 4, "num_experts_per_tok": 2}, ["q_proj", "v_proj"]),
    "gpt_neox": ("GPTNeoXConfig", {k: v for k, v in SMALL.items() if k != "num_key_value_heads"},
                 ["query_key_value"]),
}
ENCODERS = {
    "bert": ("BertConfig", ENCODER, ["query", "value"]),
    "roberta": ("RobertaConfig", {**ENCODER, "max_position_embeddings": 258}, ["query", "value"]),
    "distilbert": ("DistilBertConfig", {"dim": 64, "n_layers": 2, "n_heads": 4, "hidden_dim": 128,
                                        "vocab_size": 320, "max_position_embeddings": 256}, ["q_lin", "v_lin"]),
}
ENCODER_DECODERS = {
    "t5": ("T5Config", {"d_model": 64, "d_ff": 128, "num_layers": 2, "num_heads": 4, "d_kv": 16,
                        "vocab_size": 320}, ["q", "v"]),
    "bart": ("BartConfig", {"d_model": 64, "encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 4,
                            "decoder_attention_heads": 4, "encoder_ffn_dim": 128, "decoder_ffn_dim": 128,
                            "vocab_size": 320, "max_position_embeddings": 256}, ["q_proj", "v_proj"]),
}
ALL = {**DECODERS, **ENCODERS, **ENCODER_DECODERS}


def make_config(family: str, **over):
    import transformers

    cls_name, kwargs, _ = ALL[family]
    return getattr(transformers, cls_name)(**{**kwargs, **over})


def save_model_dir(family: str, root: Path, **over) -> Path:
    """A model dir with only config.json: the launcher builds it with random weights."""
    d = root / family
    make_config(family, **over).save_pretrained(str(d))
    return d
