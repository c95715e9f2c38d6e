import pytest
import torch
from deepspeed.runtime.zero.stage3 import model_to_params

from launcher.config.job import Job
from launcher.config.load import from_dict
from launcher.errors import ConfigError
from launcher.model.build import build_model, model_config
from launcher.model.introspect import introspect

LLAMA_TINY = {"family": "llama", "hidden_size": 64, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2,
              "intermediate_size": 96, "vocab_size": 512}


def job(model, task="causal_lm", lora=None, **data):
    return from_dict(Job, {"name": "t", "model": model, "task": task, "data": {"path": "x.jsonl", **data},
                           "train": {"global_batch_size": 2, "max_steps": 1, "lora": lora}})


@pytest.mark.parametrize("model,task", [
    ({"family": "gpt2", "hidden_size": 64, "num_layers": 2, "num_heads": 4, "vocab_size": 1024}, "causal_lm"),
    (LLAMA_TINY, "causal_lm"),
    ({"family": "bert", "hidden_size": 64, "num_layers": 2, "num_heads": 4, "vocab_size": 1000}, "seq_cls"),
    ("all-MiniLM-L6-v2", "sentence_embedding"),
])
def test_counts_equal_the_instantiated_model(model, task):
    j = job(model, task)
    stats = introspect(j)
    real = build_model(j, model_config(j), device="cpu", num_labels=2 if task == "seq_cls" else None)
    total, largest = model_to_params(real)  # DeepSpeed's own count: shared weights once, L = largest layer
    assert stats.num_params == total
    assert stats.largest_layer_params == largest
    assert stats.num_blocks == 2 or stats.num_blocks == 6


def test_minilm_is_the_real_22_7m_bert():
    s = introspect(job("all-MiniLM-L6-v2", "sentence_embedding"))
    assert (s.model_type, s.num_params, s.hidden_size, s.num_blocks, s.block_class) == (
        "bert", 22_713_216, 384, 6, "BertLayer")


@pytest.mark.parametrize("name,params,blocks,kv", [
    ("llama-7b", 6_738_415_616, 32, 32), ("llama-70b", 70_553_706_496, 80, 8), ("llama-405b", 405_853_388_800, 126, 8),
])
def test_bundled_llama_configs(name, params, blocks, kv):
    s = introspect(job(name))
    assert (s.num_params, s.num_blocks, s.num_kv_heads, s.gated_mlp) == (params, blocks, kv, True)
    h, inter, v = s.hidden_size, s.intermediate_size, s.vocab_size
    # Llama block: q,o (h·h) + k,v (h·kv·d) + 3 MLP matrices + 2 RMSNorms.
    per_block = 2 * h * h + 2 * h * kv * s.head_dim + 3 * h * inter + 2 * h
    assert s.block_params == per_block
    assert s.num_params == blocks * per_block + 2 * v * h + h


def test_lora_trainable_count_equals_peft():
    from peft import LoraConfig, get_peft_model

    lora = {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}
    j = job(LLAMA_TINY, lora=lora)
    stats = introspect(j)
    model = build_model(j, model_config(j), device="cpu")
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    assert stats.trainable_params == trainable == stats.lora_params
    assert stats.num_params == sum(p.numel() for n, p in peft_model.named_parameters() if "lora_" not in n)
    # One per-parameter optimizer per adapter tensor with the step in backward (launcher.planner.cost).
    assert stats.trainable_tensors == sum(1 for p in peft_model.parameters() if p.requires_grad) == 2 * 2 * 2


def test_trainable_tensors_count_each_trained_tensor_once():
    j = job({"family": "gpt2", "hidden_size": 64, "num_layers": 2, "num_heads": 4, "vocab_size": 1024})
    model = build_model(j, model_config(j), device="cpu")
    # GPT-2 ties the head to the embedding: 12 tensors per block, wte, wpe and the final norm's two.
    assert introspect(j).trainable_tensors == len(list(model.parameters())) == 2 * 12 + 4


def test_lora_targets_that_do_not_exist_are_bad_input():
    with pytest.raises(ConfigError) as e:
        introspect(job(LLAMA_TINY, lora={"target_modules": ["q_proj", "query_key"]}))
    assert "['query_key'] match no linear layer" in str(e.value)
    assert "q_proj" in str(e.value) and "gate_proj" in str(e.value)


def test_model_dir_without_config_is_bad_input(tmp_path):
    (tmp_path / "weights").mkdir()
    with pytest.raises(ConfigError, match="directory without config.json"):
        model_config(job(str(tmp_path / "weights")))


def test_meta_build_allocates_nothing():
    j = job("llama-7b")
    model = build_model(j, model_config(j), device="meta")
    assert all(p.device == torch.device("meta") for p in model.parameters())


def test_checkpoint_bytes_are_the_tensors_rank_0_reads(tmp_path):
    import torch
    from safetensors.torch import save_file

    from launcher.model.introspect import checkpoint_bytes

    assert checkpoint_bytes(None) == 0 and checkpoint_bytes(tmp_path) == 0  # random init: nothing read
    # Two shards: 10 x 10 fp32 (400 bytes) and 3 bf16 + 5 int64 (6 + 40): the header's offsets, not file sizes.
    save_file({"a": torch.zeros(10, 10)}, str(tmp_path / "model-00001-of-00002.safetensors"))
    save_file({"b": torch.zeros(3, dtype=torch.bfloat16), "ids": torch.zeros(5, dtype=torch.long)},
              str(tmp_path / "model-00002-of-00002.safetensors"))
    assert checkpoint_bytes(tmp_path) == 446
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    (legacy / "pytorch_model.bin").write_bytes(b"x" * 1234)
    assert checkpoint_bytes(legacy) == 1234


def test_minilm_checkpoint_is_its_fp32_weights():
    m = introspect(job("all-MiniLM-L6-v2", "sentence_embedding"))
    # 22,713,216 parameters (+ the 512 int64 position ids) at 4 bytes: the 90.87 MB rank 0 holds under ZeRO-3.
    assert 4 * m.num_params <= m.checkpoint_bytes <= 4 * m.num_params + 8 * 512 + 1000


def test_one_block_finder_for_the_planner_and_fsdp2():
    import torch.nn as nn

    from launcher.errors import ConfigError
    from launcher.model import introspect
    from launcher.worker.engines import fsdp

    assert fsdp.find_blocks is introspect.find_blocks
    net = nn.Module()
    net.small = nn.ModuleList([nn.Linear(2, 2) for _ in range(3)])
    net.layers = nn.ModuleList([nn.Linear(8, 8) for _ in range(2)])
    net.mixed = nn.ModuleList([nn.Linear(64, 64), nn.ReLU()])  # not one repeated class
    name, blocks = introspect.find_blocks(net)
    assert name == "layers" and blocks is net.layers  # the repeated stack holding the most parameters
    with pytest.raises(ConfigError, match="found in Linear; use engine: deepspeed"):
        introspect.find_blocks(nn.Linear(2, 2), fix="use engine: deepspeed")


def test_a_head_that_cannot_compute_a_chunked_loss_is_named():
    # The planner offers loss_chunks only where launcher.model.chunked_loss can swap the head in.
    assert introspect(job(LLAMA_TINY)).chunk_problem == ""
    assert introspect(job(LLAMA_TINY, lora={"target_modules": ["q_proj"]})).chunk_problem == ""
    wrapped = introspect(job(LLAMA_TINY, lora={"target_modules": ["q_proj", "lm_head"]}))
    assert "needs an nn.Linear lm_head" in wrapped.chunk_problem
