"""Exact model statistics from a meta-device build: no weights, no network.

The result is plain data (``ModelStats``) so the planner stays pure and the
CLI can cache it on disk: building a 405B model on meta costs seconds of
imports, reading the cache costs milliseconds.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from launcher.config.bounds import SAFETENSORS_HEADER_BYTES
from launcher.config.job import InlineArch, Job
from launcher.errors import ConfigError


@dataclass(kw_only=True, slots=True)
class ModelStats:
    """A model's sizes and shape as the planner needs them (parameters, trainable, largest layer, blocks, widths,
    checkpoint bytes), read on the meta device (introspect), cached or shipped in bundled_stats.json."""

    model_type: str
    """transformers model_type: gpt2, llama, bert, ..."""
    task: str
    num_params: int
    """All parameters, shared ones counted once."""
    trainable_params: int
    """Parameters with gradients: all (less a frozen pooler), or what peft trains under LoRA: the adapters, plus
    the classifier head for seq_cls."""
    lora_params: int
    """Adapter parameters added by LoRA (0 without LoRA)."""
    largest_layer_params: int
    """Largest module's own parameters (DeepSpeed's L: max over modules of parameters(recurse=False))."""
    num_blocks: int
    """Transformer blocks (the FSDP / checkpointing unit)."""
    block_params: int
    """Parameters of the largest block."""
    block_class: str
    """Class name of the blocks, e.g. LlamaDecoderLayer."""
    non_block_params: int
    """Parameters outside the blocks (embeddings, final norm, head)."""
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    """MLP width, features; for a mixture of experts the width a token runs through (top-k experts, shared ones)."""
    vocab_size: int
    head_dim: int
    is_causal: bool
    gated_mlp: bool
    """SwiGLU-style MLP with 3 matrices (llama) instead of 2."""
    tied_embeddings: bool
    num_labels: int = 0
    per_block_params: list[int] = field(default_factory=list)
    trainable_tensors: int = 0
    """Parameter tensors with gradients, each counted once: the optimizer step in backward runs one optimizer per
    tensor (launcher.planner.cost)."""
    num_experts: int = 0
    """Mixture of experts: routed experts per MoE layer (0 for a dense model)."""
    experts_per_token: int = 0
    """Mixture of experts: experts the router picks per token, its top-k (0 for a dense model)."""
    expert_params: int = 0
    """Parameters of all routed experts of all layers (shared experts and routers not included)."""
    max_positions: int | None = None
    """Longest sequence the position table holds, tokens (None: relative positions, no table)."""
    position_key: str | None = None
    """The config key that sets max_positions: max_position_embeddings, n_positions, ..."""
    rope_scaling: str | None = None
    """The config's RoPE scaling when it is not the default one, as written in config.json (None without)."""
    block_linear_shapes: list[list[int]] = field(default_factory=list)
    """(out, in) features of each frozen nn.Linear weight of the largest block (under LoRA: the adapted layers'
    base weights and the untouched linears): what QLoRA may store in NF4 (launcher.model.qlora)."""
    checkpoint_bytes: int = 0
    """Bytes of tensors in the model dir's weight files, which rank 0 reads whole into host memory while loading
    (0: no weight files, the model starts from a random init)."""
    chunk_problem: str = ""
    """causal_lm: why the head cannot compute a chunked loss (launcher.model.chunked_loss); "" when it can."""
    grad_layout: list[list[int]] = field(default_factory=list)
    """[elements, block index or -1 outside the blocks] of each trainable tensor, in parameters() order (shared ones
    once): the order DeepSpeed's ZeRO-1/2 flatten them and cut the flat buffer into partitions, and the reverse of
    their gradients' order (launcher.engines.deepspeed.zero_flush). Empty: not known (stats built by hand)."""

    @property
    def active_params(self) -> int:
        """Parameters one token runs through: everything but the routed experts, plus top-k of E of those
        [Shazeer et al., arXiv:1701.06538; Mixtral, arXiv:2401.04088 §2: 13B active of 47B]."""
        if not self.num_experts or not self.experts_per_token:
            return self.num_params
        return self.num_params - self.expert_params + self.expert_params * self.experts_per_token // self.num_experts

    def to_json(self) -> dict:
        """The stats as plain data for the cache (from_json reads it back)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> ModelStats:
        """Stats read from the cache or bundled_stats.json; TypeError when a field is missing (the caller rebuilds)."""
        missing = {f.name for f in dataclasses.fields(cls)} - set(d)
        if missing:  # written before these fields existed: the caller rebuilds it
            raise TypeError(f"model stats lack {sorted(missing)}")
        return cls(**d)


def _cfg(config, *names, default=None):
    for n in names:
        v = getattr(config, n, None)
        if v is not None:
            return v
    return default


def find_blocks(model, *, fix: str = "the planner needs one (a ModuleList of layers)"):
    """The transformer's stack of blocks as (name, ModuleList): the ModuleList of one repeated class holding the most
    parameters. The one finder for the planner's introspection and FSDP2's per-block sharding; ``fix`` ends the
    message when there is none."""
    import torch.nn as nn

    best = None
    for name, mod in model.named_modules():
        if isinstance(mod, nn.ModuleList) and len(mod) > 0 and len({type(m) for m in mod}) == 1:
            n = sum(p.numel() for p in mod.parameters())
            if best is None or n > best[2]:
                best = (name, mod, n)
    if best is None:
        raise ConfigError(f"model: no stack of repeated blocks (nn.ModuleList) found in {type(model).__name__}; {fix}")
    return best[0], best[1]


EXPERT_COUNT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
TOP_K_KEYS = ("num_experts_per_tok", "moe_topk", "num_selected_experts", "top_k")
POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")


def expert_stats(model, config) -> tuple[int, int, int]:
    """(experts per layer, top-k, parameters of every routed expert) of a mixture of experts, (0, 0, 0) if dense.

    Routed experts live in modules named ``experts`` (transformers' Mixtral, Qwen2-MoE, DeepSeek, ...: fused 3-D
    weights or a ModuleList); a shared expert (``shared_expert``) runs for every token and stays active.
    """
    num = int(_cfg(config, *EXPERT_COUNT_KEYS, default=0) or 0)
    top_k = int(_cfg(config, *TOP_K_KEYS, default=0) or 0)
    if num <= 1 or not 0 < top_k <= num:
        return 0, 0, 0
    seen: set[int] = set()
    total = 0
    for name, mod in model.named_modules():
        if name.rsplit(".", 1)[-1] != "experts":
            continue
        for p in mod.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                total += p.numel()
    return (num, top_k, total) if total else (0, 0, 0)


def position_limit(config) -> tuple[int | None, str | None, str | None]:
    """(longest sequence, the key that sets it, the RoPE scaling if not the default) of a config."""
    limit = key = None
    for k in POSITION_KEYS:
        v = getattr(config, k, None)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            limit, key = v, getattr(config, "attribute_map", {}).get(k, k)  # GPT-2 calls it n_positions
            break
    rope = getattr(config, "rope_scaling", None)
    if isinstance(rope, dict) and rope.get("rope_type", rope.get("type", "default")) == "default":
        rope = None  # transformers 5 reports every RoPE model's theta here; only a real scaling is news
    return limit, key, (str(rope) if rope else None)


def checkpoint_bytes(model_dir: Path | None) -> int:
    """Tensor bytes in a model dir's weight files: safetensors headers (8-byte length, then JSON with each tensor's
    data_offsets), else the size of pytorch_model*.bin files; 0 without weights."""
    if model_dir is None:
        return 0
    total = 0
    for f in sorted(model_dir.glob("*.safetensors")):
        with f.open("rb") as fh:
            length = int.from_bytes(fh.read(8), "little")
            if length > min(SAFETENSORS_HEADER_BYTES, f.stat().st_size - 8):  # before reading that much
                raise ConfigError(f"model: {str(f)!r} says its safetensors header is {length} bytes, more than the "
                                  f"file holds or safetensors allows ({SAFETENSORS_HEADER_BYTES}); the file is "
                                  "damaged or no safetensors file: fetch the model again")
            header = json.loads(fh.read(length))
        total += sum(v["data_offsets"][1] - v["data_offsets"][0] for k, v in header.items() if k != "__metadata__")
    if total:
        return total
    return sum(f.stat().st_size for f in model_dir.glob("*.bin"))


def introspect(job: Job, num_labels: int | None = None) -> ModelStats:
    """Build the job's model on the meta device and measure it."""
    from launcher.model.build import build_model, model_config, planning_attention, resolve_model_dir

    config = planning_attention(model_config(job))
    if job.task == "seq_cls":
        num_labels = num_labels or job.data.num_labels or 2
    model = build_model(job, config, device="meta", num_labels=num_labels)
    params = {id(p): p for p in model.parameters()}  # shared (tied) weights counted once
    num_params = sum(p.numel() for p in params.values())
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    _, blocks = find_blocks(model)
    per_block = [sum(p.numel() for p in b.parameters()) for b in blocks]
    frozen = 0
    if job.task == "sentence_embedding" and getattr(model, "pooler", None) is not None:
        # Mean pooling never calls BERT's pooler; the recipe freezes it (launcher.worker.model.build).
        frozen = sum(p.numel() for p in model.pooler.parameters())
    trainable = num_params - frozen
    frozen_ids = {id(p) for p in model.pooler.parameters()} if frozen else set()
    lora_params = 0
    trained = model
    if job.train.lora is not None:
        from launcher.model.lora import apply_lora, trainable_counts

        # The worker's own wrap, on meta: what peft trains (adapters, and the head it keeps for seq_cls) is
        # counted, not re-derived. It raises the ConfigError for targets that match nothing.
        trained = apply_lora(model, job.train.lora, job.task)
        trainable, lora_params = trainable_counts(trained)
    tensors = sum(1 for p in trained.parameters() if p.requires_grad and id(p) not in frozen_ids)
    # Block membership by identity: peft injects its adapters into the same block modules, so they count in them.
    block_of = {id(p): k for k, b in enumerate(blocks) for p in b.parameters()}
    layout = [[p.numel(), block_of.get(id(p), -1)] for p in trained.parameters()
              if p.requires_grad and id(p) not in frozen_ids]
    import torch.nn as nn

    largest_block = blocks[per_block.index(max(per_block))]
    linear_shapes = [list(m.weight.shape) for m in largest_block.modules()
                     if isinstance(m, nn.Linear) and not m.weight.requires_grad] if job.train.lora is not None else []
    chunking = ""
    if job.task == "causal_lm":
        from launcher.model.chunked_loss import chunk_problem

        chunking = chunk_problem(trained)
    h = int(_cfg(config, "hidden_size", "n_embd"))
    heads = int(_cfg(config, "num_attention_heads", "n_head"))
    inter = _cfg(config, "intermediate_size", "n_inner") or 4 * h
    model_type = config.model_type
    num_experts, top_k, experts = expert_stats(model, config)
    if num_experts:
        # The MLP width a token runs through, which the activation terms scale with: top-k routed experts and any
        # shared expert (Qwen2-MoE: moe_intermediate_size per expert, shared_expert_intermediate_size beside).
        per_expert = _cfg(config, "moe_intermediate_size", default=inter)
        inter = top_k * per_expert + (_cfg(config, "shared_expert_intermediate_size", default=0) or 0)
    max_positions, position_key, rope_scaling = position_limit(config)
    return ModelStats(
        model_type=model_type,
        task=job.task,
        num_params=num_params,
        trainable_params=trainable,
        lora_params=lora_params,
        largest_layer_params=largest,
        num_blocks=len(per_block),
        block_params=max(per_block),
        block_class=type(blocks[0]).__name__,
        non_block_params=num_params - sum(per_block),
        hidden_size=h,
        num_heads=heads,
        num_kv_heads=int(_cfg(config, "num_key_value_heads", default=heads)),
        intermediate_size=int(inter),
        vocab_size=int(config.vocab_size),
        head_dim=int(_cfg(config, "head_dim", default=h // heads)),
        is_causal=job.task == "causal_lm",
        gated_mlp=any("gate_proj" in n for n, _ in blocks[0].named_modules()),
        tied_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
        num_labels=int(num_labels or 0),
        per_block_params=per_block,
        trainable_tensors=tensors,
        num_experts=num_experts,
        experts_per_token=top_k,
        expert_params=experts,
        max_positions=max_positions,
        position_key=position_key,
        rope_scaling=rope_scaling,
        block_linear_shapes=linear_shapes,
        chunk_problem=chunking,
        grad_layout=layout,
        checkpoint_bytes=checkpoint_bytes(None if isinstance(job.model, InlineArch)
                                          else resolve_model_dir(job.model, job.base_dir)),
    )
