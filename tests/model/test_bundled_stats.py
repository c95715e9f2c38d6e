"""The shipped statistics of the bundled configs (launcher/model/bundled_stats.json): current, equal to a fresh
introspection and probe, used without importing torch, and reused across sequence lengths only as the data
shows it may be."""

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.inputs.plan_inputs import (
    PER_TOKEN,
    SEQ_LINEAR,
    _transformers_quiet,
    activation_key,
    bundled,
    model_fingerprint,
    shipped_constants,
)
from launcher.model.activations import probe_activations
from launcher.model.introspect import introspect

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
import gen_bundled_stats as gen  # noqa: E402


def shipped_probes():
    """(model, seq, precision) of every probe the generator ships."""
    for model, lora in gen.jobs():
        if lora:
            continue
        stats = bundled()["introspect"][model_fingerprint(gen.job(model, None))]
        for seq in gen.SEQ_LENS:
            if stats["max_positions"] is None or seq <= stats["max_positions"]:
                for precision in gen.PRECISIONS:
                    yield model, seq, precision


@pytest.mark.parametrize("model,lora", list(gen.jobs()), ids=lambda x: str(x)[:20])
def test_every_bundled_config_ships_its_current_introspection(model, lora):
    """Keyed by today's fingerprint (config text, transformers and peft versions, INTROSPECT_VERSION) and equal to
    a fresh meta-device build: a changed config, library or introspection shows here, not as a stale plan."""
    job = gen.job(model, lora)
    shipped = bundled()["introspect"].get(model_fingerprint(job))
    assert shipped is not None, "bundled_stats.json is stale: run scripts/gen_bundled_stats.py"
    with _transformers_quiet():
        assert shipped == introspect(job).to_json()


def test_every_shipped_probe_is_keyed_as_the_cache_is():
    table = bundled()["activations"]
    keys = [activation_key(gen.job(m, None, s, p)) for m, s, p in shipped_probes()]
    assert keys and all(k in table for k in keys), "bundled_stats.json is stale: run scripts/gen_bundled_stats.py"
    assert set(table) == set(keys)


@pytest.mark.parametrize("model,seq,precision", [("llama-1b", 1024, "bf16"), ("gpt2-124m", 1024, "fp32")])
def test_a_shipped_probe_equals_a_fresh_probe(model, seq, precision):
    job = gen.job(model, None, seq, precision)
    with _transformers_quiet():
        fresh = dataclasses.asdict(probe_activations(job, seq_len=seq, precision=precision))
    assert bundled()["activations"][activation_key(job)] == fresh


def test_shipped_constants_are_linear_in_the_sequence_length():
    """What SEQ_LINEAR claims, on the data: every shipped length's constants are the straight line through its
    neighbours' (the per-block terms do not move at all; the head's carry a small s-proportional part)."""
    table = bundled()["activations"]
    by_model: dict = {}
    for m, s, p in shipped_probes():
        by_model.setdefault((m, p), []).append((s, table[activation_key(gen.job(m, None, s, p))]))
    checked = 0
    for (m, p), entries in by_model.items():
        for (s1, c1), (s, c), (s2, c2) in zip(entries, entries[1:], entries[2:], strict=False):
            for k in PER_TOKEN:
                line = c1[k] + (c2[k] - c1[k]) * (s - s1) / (s2 - s1)
                assert c[k] == pytest.approx(line, rel=1e-9, abs=1e-6), (m, p, s, k)
                checked += 1
    assert checked > 50


def test_a_length_between_shipped_ones_is_interpolated_and_equals_a_fresh_probe():
    job = gen.job("llama-1b", None, 3000, "bf16")
    c = shipped_constants(job)
    assert c.source.startswith("measured on fake tensors at seq 2048 and 4096") and SEQ_LINEAR in c.source
    assert c.probe_seq_len == 3000
    with _transformers_quiet():
        fresh = probe_activations(job, seq_len=3000, precision="bf16")
    for k in PER_TOKEN:
        assert getattr(c, k) == pytest.approx(getattr(fresh, k), rel=1e-5, abs=1e-6), k
    assert shipped_constants(gen.job("llama-7b", None, 512, "bf16")) is None  # outside the shipped lengths: probe
    assert shipped_constants(gen.job("llama-7b", None, 2048, "fp16")) is None  # not shipped: probe


def test_a_cold_plan_of_a_bundled_family_imports_no_torch(tmp_path):
    """The first plan of llama-70b with an empty cache: the shipped statistics, no torch, no transformers."""
    code = (
        "import sys; from launcher.config.jobfile import load_job; from launcher.inputs.plan_inputs import plan_job\n"
        f"plan = plan_job(load_job({str(REPO / 'examples' / 'llama-70b.yaml')!r}, for_run=False))\n"
        "print(plan.constants['activations']['source'])\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    env = {**os.environ, "LAUNCHER_CACHE": str(tmp_path / "cache")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True,
                         cwd=REPO).stdout.splitlines()
    assert out[0].startswith("measured on fake tensors (causal_lm, bf16, seq 4096")
    assert "; shipped with the launcher" in out[0]
    assert out[1] == "[]"


CACHED_FIELDS = {5: ["model_type", "task", "num_params", "trainable_params", "lora_params", "largest_layer_params",
                     "num_blocks", "block_params", "block_class", "non_block_params", "hidden_size", "num_heads",
                     "num_kv_heads", "intermediate_size", "vocab_size", "head_dim", "is_causal", "gated_mlp",
                     "tied_embeddings", "num_labels", "per_block_params", "trainable_tensors", "num_experts",
                     "experts_per_token", "expert_params", "max_positions", "position_key", "rope_scaling",
                     "checkpoint_bytes"]}
CACHED_FIELDS[6] = [*CACHED_FIELDS[5][:-1], "block_linear_shapes", "checkpoint_bytes", "chunk_problem"]
CACHED_FIELDS[7] = [*CACHED_FIELDS[6], "grad_layout"]


def test_the_introspection_version_moves_with_what_it_caches():
    """A cached (or shipped) ModelStats written before a field existed reads back with the field's default
    (trainable_tensors = 0 made the step in backward look free): a new field must come with a new
    INTROSPECT_VERSION, so old caches are rebuilt. Add the new version's field list here when bumping it."""
    from launcher.inputs.plan_inputs import INTROSPECT_VERSION
    from launcher.model.introspect import ModelStats

    assert [f.name for f in dataclasses.fields(ModelStats)] == CACHED_FIELDS.get(INTROSPECT_VERSION), (
        "ModelStats changed: bump launcher.inputs.plan_inputs.INTROSPECT_VERSION, list its fields here, and rerun "
        "scripts/gen_bundled_stats.py")
