"""Build the recipe's model the way the planner counted it (launcher.model.build), then adapt it for training."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from launcher.config.job import InlineArch, Job
from launcher.errors import ConfigError
from launcher.model.build import build_model, model_config, resolve_model_dir
from launcher.model.chunked_loss import enable_chunked_loss
from launcher.model.lora import apply_lora
from launcher.worker.recipes import Recipe
from launcher.worker.tokenizer import load_tokenizer

__all__ = ["apply_lora", "build", "count_params", "model_dir", "to_device", "tokenizer_for"]


def model_dir(job: Job) -> Path | None:
    """The job's local model directory (resolve_model_dir); None for an inline architecture."""
    return None if isinstance(job.model, InlineArch) else resolve_model_dir(job.model, job.base_dir)


def tokenizer_for(job: Job):
    """The job's tokenizer: the model dir's own, else a byte tokenizer over the model's vocabulary."""
    return load_tokenizer(model_dir(job), model_config(job).vocab_size)


def build(job: Job, recipe: Recipe, *, seq_len: int, hf_checkpointing: bool, checkpoint_every: int = 1,
          checkpoint_policy: str = "full", on_meta: bool = False) -> nn.Module:
    """The model on CPU (or partitioned, under ZeRO-3's zero.Init); the engine moves or shards it.

    ``hf_checkpointing`` with ``checkpoint_every`` k: transformers checkpoints every k-th block from the first
    (its every_n_layers, ``layer_index % k == 0``), the blocks launcher.planner.memory.checkpointed counts;
    ``checkpoint_policy`` "ops" hands torch.utils.checkpoint the op policy's context_fn (launcher.model.sac):
    transformers passes its checkpointing kwargs to torch.utils.checkpoint.checkpoint for every checkpointed layer
    (modeling_utils.py _activation_checkpointing_enable: functools.partial(checkpoint, **kwargs)).

    ``recipe.loss_chunks`` makes the head compute the chunked loss (launcher.model.chunked_loss); an export builds
    with a recipe whose loss_chunks is 0, so the saved model is the plain Hugging Face one.

    ``on_meta`` builds the same model, wrappers included, on the meta device: a rank that receives its weights from
    rank 0 (launcher.worker.loading) allocates nothing here.
    """
    config = model_config(job)
    max_pos = getattr(config, "max_position_embeddings", None)
    if max_pos is not None and seq_len > max_pos:
        raise ConfigError(
            f"data.max_seq_len: {seq_len} tokens exceed the model's max_position_embeddings ({max_pos}); "
            f"set data.max_seq_len to {max_pos} or less"
        )
    if recipe.task == "seq_cls" and getattr(config, "pad_token_id", None) is None:
        # A decoder's classifier reads the last token that is not padding; without a pad id transformers refuses
        # any batch over one (Mistral, Llama ship none). Our tokenizer's pad id is what the batches hold.
        config.pad_token_id = tokenizer_for(job).pad_token_id
    model = build_model(job, config, device="meta" if on_meta else "cpu", num_labels=recipe.num_labels)
    if recipe.task == "seq_cls" and recipe.label_ids:
        # The data's label names, so the exported model's predictions read "positive", not "LABEL_2". Every id up
        # to num_labels is named (transformers counts the labels by id2label); integer labels keep their number.
        names = {i: name for name, i in recipe.label_ids.items()}
        model.config.id2label = {i: names.get(i, f"LABEL_{i}") for i in range(recipe.num_labels)}
        model.config.label2id = {name: i for i, name in model.config.id2label.items()}
    if hasattr(model.config, "use_cache"):
        # A KV cache is for generation; in training it only holds memory the plan does not count.
        model.config.use_cache = False
    if recipe.task == "sentence_embedding" and getattr(model, "pooler", None) is not None:
        # Mean pooling never calls BERT's pooler; frozen, it gets no gradient or optimizer state.
        model.pooler.requires_grad_(False)
    if hf_checkpointing:
        every = {"every_n_layers": checkpoint_every} if checkpoint_every != 1 else {}
        kwargs: dict = {"use_reentrant": False}
        if checkpoint_policy == "ops":
            from launcher.model.sac import sac_context

            kwargs["context_fn"] = sac_context  # a fresh policy context per checkpointed call, as FSDP2's wrapper
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs, **every)
    if job.train.lora is not None:
        # Adapters in the base's dtype, not peft's fp32 (launcher.model.lora.apply_lora): bf16 under ZeRO-3, whose
        # engine would otherwise compute them in fp32 alone of the engines, saving an fp32 copy of each adapted input.
        model = apply_lora(model, job.train.lora, recipe.task, fp32_adapters=False)
    if recipe.loss_chunks:
        # After LoRA: peft must see the plain nn.Linear head (and a LoRA-wrapped head is refused there).
        enable_chunked_loss(model, recipe.loss_chunks)
    return model


def count_params(model: nn.Module) -> tuple[int, int]:
    """(all, trainable) parameters; ZeRO-3 partitioned params count by their full size."""
    total = trainable = 0
    for p in model.parameters():
        n = getattr(p, "ds_numel", None) or p.numel()
        total += n
        trainable += n if p.requires_grad else 0
    return total, trainable


def to_device(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    """A batch's tensors copied to ``device`` (non-blocking)."""
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}
