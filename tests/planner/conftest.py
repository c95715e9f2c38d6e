import dataclasses

import pytest

from launcher.model.introspect import ModelStats
from launcher.planner.hardware import PROFILES
from launcher.planner.search import PlanRequest


def llama_stats(num_params=6_738_415_616, blocks=32, h=4096, inter=11008, vocab=32000, trainable=None) -> ModelStats:
    block = (num_params - 2 * vocab * h) // blocks
    return ModelStats(
        model_type="llama", task="causal_lm", num_params=num_params, trainable_params=trainable or num_params,
        lora_params=0 if trainable is None else trainable, largest_layer_params=vocab * h, num_blocks=blocks,
        block_params=block, block_class="LlamaDecoderLayer", non_block_params=num_params - blocks * block,
        hidden_size=h, num_heads=32, num_kv_heads=32, intermediate_size=inter, vocab_size=vocab, head_dim=h // 32,
        is_causal=True, gated_mlp=True, tied_embeddings=False,
    )


@pytest.fixture
def llama7b() -> ModelStats:
    return llama_stats()


@pytest.fixture
def request_for(llama7b):
    def make(**kw) -> PlanRequest:
        base = dict(model=llama7b, gpus_per_node=8, nodes=1, budget_bytes=80 * 10**9, seq_len=2048,
                    global_batch_size=64, precision="bf16", optimizer="adamw", hardware=PROFILES["a100-80gb"],
                    host_ram_per_node_bytes=10**12)
        base.update(kw)
        return PlanRequest(**base)

    return make


def replace(obj, **kw):
    return dataclasses.replace(obj, **kw)
