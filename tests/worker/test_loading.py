"""Rank 0 loads, the others receive: two real CPU ranks under torchrun end with the checkpoint's weights, and only
rank 0 ever built the model for real (the planner's host-RAM term counts one copy: tests/planner/test_memory)."""

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import REPO

SCRIPT = REPO / "tests" / "worker" / "loader_ranks.py"


def save_checkpoint(root, family):
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(7)
    if family == "llama":  # untied head, rotary inv_freq: a non-persistent buffer
        model = LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                             num_attention_heads=2, vocab_size=300, max_position_embeddings=64))
    else:  # tied input and output embeddings
        model = GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=300, n_positions=64,
                                           bos_token_id=299, eos_token_id=299))
    d = root / family
    model.save_pretrained(str(d))
    return d, {k: v.clone() for k, v in model.state_dict().items()}, {k: b.clone() for k, b in model.named_buffers()}


CASES = {f"{engine}-{family}": (family, engine, "") for engine in ("deepspeed", "fsdp") for family in ("llama", "gpt2")}
CASES["deepspeed-llama-bf16"] = ("llama", "deepspeed", "bf16")
"""Each test's case: the checkpoint's family, the engine that loads it, DeepSpeed's working dtype."""


@pytest.fixture(scope="module")
def loaded_ranks(tmp_path_factory) -> dict:
    """Every case on the same two CPU ranks under torchrun (loader_ranks.py, one start-up for all): for each case,
    the folder each rank wrote its files to, and the checkpoint's own tensors."""
    root = tmp_path_factory.mktemp("loading")
    saved = {family: save_checkpoint(root, family) for family in ("llama", "gpt2")}
    args = []
    for name, (family, engine, dtype) in CASES.items():
        (root / name).mkdir()
        args.append(",".join(filter(None, (str(saved[family][0]), str(root / name), engine, dtype))))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert res.returncode == 0, res.stderr[-3000:]
    return {name: (root / name, saved[family]) for name, (family, _, _) in CASES.items()}


@pytest.mark.parametrize("engine", ["deepspeed", "fsdp"])
@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_two_ranks_end_with_the_checkpoint_loaded_once(loaded_ranks, engine, family):
    out, (model_dir, want, want_buffers) = loaded_ranks[f"{engine}-{family}"]
    on_disk = load_file(str(next(model_dir.glob("*.safetensors"))))
    info = [json.loads((out / f"rank-{k}.json").read_text()) for k in (0, 1)]
    assert [i["built_on_meta"] for i in info] == [False, True]  # rank 1 never held weights of its own
    total = sum(v.numel() for v in want.values() if v.dtype.is_floating_point)
    if engine == "fsdp":
        assert all(i["local_params"] < total for i in info)  # sharded: no rank holds the whole model
        # Blocks reshard after forward; the root does not (it would be gathered again at once for backward).
        assert all(i["reshards_after_forward"] == [False, True, True] for i in info), info
    for k in (0, 1):
        got = torch.load(out / f"rank-{k}.pt")
        assert set(got["state"]) == set(want)
        for name, tensor in want.items():
            assert torch.equal(got["state"][name], tensor), (k, name)
            if name in on_disk:
                assert torch.equal(got["state"][name], on_disk[name]), (k, name)
        for name, buf in want_buffers.items():  # rotary inv_freq and other buffers outside the state dict
            assert torch.allclose(got["buffers"][name].to(buf.dtype), buf), (k, name)


def test_deepspeed_ranks_receive_the_weights_already_cast_to_bf16(loaded_ranks):
    # Rank 0 casts on the host before anything reaches a device (a GPU would otherwise hold the fp32 build first),
    # and the other ranks allocate bf16 tensors to receive it: half the bytes broadcast.
    out, (_, want, _) = loaded_ranks["deepspeed-llama-bf16"]
    for k in (0, 1):
        got = torch.load(out / f"rank-{k}.pt")["state"]
        for name, tensor in want.items():
            assert got[name].dtype == torch.bfloat16, (k, name)
            assert torch.equal(got[name], tensor.to(torch.bfloat16)), (k, name)
