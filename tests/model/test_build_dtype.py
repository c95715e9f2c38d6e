"""The model is built in fp32 whatever dtype its config or checkpoint names: the engines cast to the plan's precision
and keep the fp32 master it counts. transformers 5 builds from_config in config.dtype and from_pretrained defaults
to dtype="auto", so a Llama config ("torch_dtype": "bfloat16") gave FSDP2 bf16 trainable shards, a pure-bf16 run
nobody allowed (seen on an H100, benchmarks/results/gpu.md)."""

import json

import pytest
import torch

from launcher.config.job import Job
from launcher.config.load import from_dict
from launcher.model.build import build_model, model_config

TINY_LLAMA_BF16 = {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                   "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128,
                   "max_position_embeddings": 64, "torch_dtype": "bfloat16"}


def job_for(model_dir) -> Job:
    return from_dict(Job, {"name": "t", "model": str(model_dir), "task": "causal_lm", "data": {"path": "x.jsonl"},
                           "train": {"global_batch_size": 2, "max_steps": 1, "precision": "bf16"}})


@pytest.mark.parametrize("weights", [False, True], ids=["config-only", "bf16-checkpoint"])
@pytest.mark.parametrize("device", ["meta", "cpu"])
def test_built_in_fp32_whatever_the_config_or_checkpoint_dtype(tmp_path, weights, device):
    (tmp_path / "config.json").write_text(json.dumps(TINY_LLAMA_BF16))
    job = job_for(tmp_path)
    if weights:
        from transformers import AutoConfig, AutoModelForCausalLM

        saved = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tmp_path), dtype=torch.bfloat16)
        saved.save_pretrained(tmp_path)
        assert {p.dtype for p in saved.parameters()} == {torch.bfloat16}
    model = build_model(job, model_config(job), device=device)
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    if weights and device == "cpu":  # the checkpoint's values, upcast: nothing re-initialised
        assert torch.equal(model.lm_head.weight, saved.lm_head.weight.float())
