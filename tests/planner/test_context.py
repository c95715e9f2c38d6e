"""data.max_seq_len past the model's position table is bad input naming the limit (and the RoPE scaling)."""

import json

import pytest

from launcher.config.job import Job
from launcher.config.load import from_dict
from launcher.errors import ConfigError
from launcher.model.introspect import introspect
from launcher.planner.hardware import PROFILES
from launcher.planner.search import PlanRequest, make_plan
from tests.model.families import save_model_dir


def stats(tmp_path, model, **over):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"text": "a"}) + "\n")
    if over or "/" not in model and model not in ("gpt2-124m",):
        model = str(save_model_dir(model, tmp_path, **over))
    job = from_dict(Job, {"name": "t", "model": model, "task": "causal_lm", "data": {"path": str(data)},
                          "train": {"global_batch_size": 8, "max_steps": 1, "precision": "bf16"}})
    return introspect(job)


def plan(m, seq_len):
    return make_plan(PlanRequest(model=m, gpus_per_node=8, nodes=1, budget_bytes=80 * 10**9, seq_len=seq_len,
                                 global_batch_size=8, precision="bf16", optimizer="adamw",
                                 hardware=PROFILES["a100-80gb"]))


def test_gpt2_past_its_1024_positions(tmp_path):
    m = stats(tmp_path, "gpt2-124m")
    assert (m.max_positions, m.position_key) == (1024, "n_positions")
    assert plan(m, 1024).seq_len == 1024
    with pytest.raises(ConfigError) as e:
        plan(m, 8192)
    assert str(e.value) == ("data.max_seq_len: 8192 tokens is past this gpt2 model's position table "
                            "(n_positions = 1024); use --seq-len 1024 or less")


def test_mistral_at_100000(tmp_path):
    m = stats(tmp_path, "mistral", max_position_embeddings=32768)
    with pytest.raises(ConfigError, match=r"100000 tokens is past this mistral model's position table "
                                          r"\(max_position_embeddings = 32768\); use --seq-len 32768 or less$"):
        plan(m, 100000)


def test_rope_scaling_is_named_when_the_config_has_one(tmp_path):
    rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64, "rope_theta": 500000.0}
    m = stats(tmp_path, "mistral", max_position_embeddings=512, rope_parameters=rope)
    assert "llama3" in m.rope_scaling
    with pytest.raises(ConfigError) as e:
        plan(m, 1024)
    msg = str(e.value)
    assert "\n" not in msg and "(max_position_embeddings = 512)" in msg
    assert "or raise max_position_embeddings together with the config's rope_scaling ({" in msg and "llama3" in msg

