"""LoRA as both the planner and the worker see it: one rule for which modules get adapters, one peft wrap.

The planner wraps its meta-device model with ``apply_lora`` and counts what requires grad; the worker wraps its
real model with the same call. So the planner's trainable count is what peft really trains, adapters and the
seq_cls head that peft keeps trainable beside them (``modules_to_save``) alike.
"""

from __future__ import annotations

import fnmatch

from launcher.config.job import LoraConfig
from launcher.errors import ConfigError

PEFT_TASK = {"causal_lm": "CAUSAL_LM", "seq_cls": "SEQ_CLS", "sentence_embedding": "FEATURE_EXTRACTION"}
"""peft TaskType per recipe task: SEQ_CLS also trains the classifier head in full."""


def is_adaptable(module) -> bool:
    """A layer LoRA can wrap: nn.Linear, or transformers' Conv1D (GPT-2's transposed linear)."""
    import torch.nn as nn

    return isinstance(module, nn.Linear) or type(module).__name__ == "Conv1D"


def matches(name: str, pattern: str) -> bool:
    """Whether the module at dotted ``name`` is what ``pattern`` asks for.

    A pattern is a leaf name (q_proj), a dotted suffix (attention.self.query) or an fnmatch pattern over the
    leaf or the whole name (*_proj, encoder.layer.0.*).
    """
    leaf = name.rsplit(".", 1)[-1]
    return (leaf == pattern or name == pattern or name.endswith("." + pattern) or fnmatch.fnmatchcase(leaf, pattern)
            or fnmatch.fnmatchcase(name, pattern))


def _skipped(name: str, task: str) -> bool:
    # Mean pooling never calls BERT's pooler: adapters there would get no gradient, and DDP / ZeRO would wait
    # for one.
    return task == "sentence_embedding" and (name == "pooler" or name.startswith("pooler."))


def adaptable_names(model, task: str) -> list[str]:
    """Leaf names of the layers LoRA could target, for the message when a target matches none."""
    return sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if is_adaptable(m) and not _skipped(n, task)})


def lora_targets(model, lora: LoraConfig, task: str) -> list[str]:
    """Full dotted names of the modules that get adapters; ConfigError when a target matches no layer."""
    found: list[str] = []
    used: set[str] = set()
    for name, mod in model.named_modules():
        if not name or not is_adaptable(mod) or _skipped(name, task):
            continue
        hit = [t for t in lora.target_modules if matches(name, t)]
        if hit:
            found.append(name)
            used.update(hit)
    missing = [t for t in lora.target_modules if t not in used]
    if missing:
        model_type = getattr(getattr(model, "config", None), "model_type", type(model).__name__)
        raise ConfigError(
            f"train.lora.target_modules: {missing!r} match no linear layer of this {model_type} model; "
            f"use some of {adaptable_names(model, task)}"
        )
    return found


def apply_lora(model, lora: LoraConfig, task: str, *, fp32_adapters: bool = True):
    """Wrap with peft so only the adapters (and, for seq_cls, the classifier head) train.

    ``fp32_adapters``: peft's default (get_peft_model's ``autocast_adapter_dtype``), as a user's script has it:
    adapters on a bf16/fp16 base are made fp32, and peft casts each adapted linear's input to their dtype, an fp32
    copy saved per adapter. The worker passes False: the adapters take the base's dtype, fp32 where the engine casts
    the model afterwards (ZeRO-0/1/2; FSDP2 gathers in the working dtype) and the working dtype under ZeRO-3's
    zero.Init, so every engine computes them in the working dtype with an fp32 master. The activation probe
    measures both (launcher.model.activations; EngineSpec.fp32_adapters says where a script's are fp32).
    """
    from peft import LoraConfig as PeftLoraConfig
    from peft import TaskType, get_peft_model

    targets = lora_targets(model, lora, task)
    modules = dict(model.named_modules())
    cfg = PeftLoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        # Full names: peft's own matching (exact or dotted suffix) then wraps exactly what lora_targets chose.
        target_modules=targets,
        # Conv1D keeps its weight transposed; said up front, peft does not warn on every rank that it fixed it.
        fan_in_fan_out=all(type(modules[n]).__name__ == "Conv1D" for n in targets),
        task_type=getattr(TaskType, PEFT_TASK[task]),
    )
    return get_peft_model(model, cfg, autocast_adapter_dtype=fp32_adapters)


def trainable_counts(model) -> tuple[int, int]:
    """(parameters that require grad, of which LoRA adapters); a shared tensor counts once."""
    seen: set[int] = set()
    trainable = adapters = 0
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in seen or not p.requires_grad:
            continue
        seen.add(id(p))
        trainable += p.numel()
        adapters += p.numel() if "lora_" in name else 0
    return trainable, adapters


LORA_RANK = 8


def lora_suggestion(m, r: int = LORA_RANK) -> tuple[list[str], int]:
    """The attention query and value projections of this model family, by their module names, and the adapter
    parameters LoRA of rank ``r`` adds on them [Hu et al., arXiv:2106.09685 §4.2: W_q and W_v; r·(d_in + d_out)
    per adapted matrix]. ``m`` is the model's launcher.model.introspect.ModelStats (not imported: introspect
    imports this module).
    """
    h = m.hidden_size
    kv = m.num_kv_heads * m.head_dim
    if m.model_type == "gpt2":
        # GPT-2 fuses Q, K and V into one Conv1D (h -> 3h); peft adapts the whole of it.
        return ["c_attn"], r * (h + 3 * h) * m.num_blocks
    if m.model_type in ("bert", "roberta", "xlm-roberta", "camembert", "electra", "ernie", "megatron-bert"):
        return ["query", "value"], 2 * r * (h + h) * m.num_blocks
    if m.model_type == "distilbert":
        return ["q_lin", "v_lin"], 2 * r * (h + h) * m.num_blocks
    if m.model_type in ("gpt_neox", "falcon", "bloom", "persimmon"):
        # One fused query_key_value projection, h -> 3h (falcon's GQA variants narrower; 3h bounds it).
        return ["query_key_value"], r * (h + 3 * h) * m.num_blocks
    if m.model_type in ("phi3", "phimoe"):
        # Phi-3 fuses Q, K and V into qkv_proj: h -> h + 2 * the key/value heads' width.
        return ["qkv_proj"], r * (h + h + 2 * kv) * m.num_blocks
    # llama and its kin (mistral, qwen2, ...): q_proj h -> h, v_proj h -> the key/value heads' width (GQA).
    return ["q_proj", "v_proj"], r * ((h + h) + (h + kv)) * m.num_blocks
