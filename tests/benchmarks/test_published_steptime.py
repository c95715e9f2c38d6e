"""The published step-time set: every entry re-plannable, the split as committed, each figure turned into s/step."""

import pytest

from benchmarks.published.run import job_for
from benchmarks.published.steptime.entries import SIDES, balanced, load_entries, recorded_split, split
from benchmarks.published.steptime.run import compare, published_step_s, summary
from launcher.config.jobfile import job_from_data

ENTRIES = load_entries()
BY_ID = {e["id"]: e for e in ENTRIES}
UNITS = ("tokens_per_s_per_gpu", "samples_per_s", "s_per_step")


def test_at_least_ten_entries_from_three_sources():
    assert len(BY_ID) == len(ENTRIES) >= 10
    assert len({e["source"]["repo"] for e in ENTRIES}) >= 3


@pytest.mark.parametrize("entry", ENTRIES, ids=[e["id"] for e in ENTRIES])
def test_entry_names_its_source_figure_and_configuration(entry, tmp_path):
    assert entry["source"]["url"].startswith("https://") and entry["source"]["repo"] and entry["quote"]
    assert entry["published"]["unit"] in UNITS and entry["published"]["value"] > 0
    assert entry["assumed"], "every entry says what it had to assume"
    c = entry["config"]
    for key in ("model", "task", "seq_len", "micro_batch_size", "grad_accum_steps", "gpus", "precision", "optimizer",
                "engine", "activation_checkpointing", "attn_implementation", "hardware"):
        assert key in c, key
    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "a", "label": 0}\n')
    job = job_from_data(job_for(entry, data), base_dir=str(tmp_path))
    assert job.strategy.engine == c["engine"] and job.strategy.micro_batch_size == c["micro_batch_size"]
    assert job.gpus == c["gpus"] and job.nodes == c.get("nodes", 1)
    assert job.train.global_batch_size == c["micro_batch_size"] * c["grad_accum_steps"] * c["gpus"] * job.nodes


def test_config_from_takes_the_memory_entrys_configuration_and_overrides_its_keys():
    """The 128-GPU torchtitan row is the memory entry's configuration on 16 nodes of 8, not 128 ranks on one node."""
    e = BY_ID["tt-h100-llama31-8b-fsdp128-sacop"]
    assert e["config"]["gpus"] == 8 and e["config"]["nodes"] == 16
    assert e["config"]["model"]["hidden_size"] == 4096 and e["config"]["levers"] == {"checkpoint_policy": "ops"}
    assert BY_ID["hf-bert-large-fp16amp-mb1-ga4-gc-adam8bit-speed"]["config"]["levers"] == {
        "low_memory_optimizer": "adamw8bit"}


def test_the_split_is_the_one_committed_before_any_comparison():
    record = recorded_split()
    sides = split(ENTRIES)
    assert {side: sorted(i for i, s in sides.items() if s == side) for side in SIDES} == {
        side: record[side] for side in SIDES}
    assert balanced(ENTRIES, sides)


def test_an_unbalanced_split_is_refused():
    sides = {e["id"]: "fit" for e in ENTRIES}
    assert not balanced(ENTRIES, sides)
    # Every H100 row on one side: an axis value two entries share is on one side only.
    sides = {e["id"]: ("fit" if i % 2 else "validation") for i, e in enumerate(ENTRIES)}
    for e in ENTRIES:
        if e["config"]["hardware"] == "h100-80gb":
            sides[e["id"]] = "fit"
    assert not balanced(ENTRIES, sides)


def test_each_unit_becomes_seconds_per_optimizer_step():
    # torchtitan: one rank's tokens per second; a step is local batch 2 x 8192 tokens.
    assert published_step_s(BY_ID["tt-h100-llama31-8b-fsdp8-sacop"]) == pytest.approx(2 * 8192 / 5762)
    assert published_step_s(BY_ID["tt-a100-llama2-70b-fsdp64-fullac"]) == pytest.approx(2 * 4096 / 353)
    # The Trainer's samples per second over one GPU's batch of 4 (or 1 x accumulation 4).
    assert published_step_s(BY_ID["hf-bert-large-fp32-mb4-speed"]) == pytest.approx(4 / 8.86)
    assert published_step_s(BY_ID["hf-bert-large-fp32-mb1-ga4-speed"]) == pytest.approx(4 / 7.75)
    # Qwen's s/it is already per optimizer step.
    assert published_step_s(BY_ID["qwen-7b-lora-s8192-speed"]) == 21.3
    with pytest.raises(ValueError, match="tokens_per_s_per_gpu"):
        published_step_s({**BY_ID["qwen-7b-lora-s8192-speed"], "published": {"value": 1, "unit": "it/s"}})


def plan(step_s: float) -> dict:
    return {"predicted_step_time_s": step_s, "step_time_terms": {"compute": step_s}, "label": "x",
            "hardware": "a100-80gb", "world_size": 1, "num_params": 1, "trainable_params": 1}


def test_error_is_signed_against_the_published_step_and_summarised_per_side():
    entry = BY_ID["qwen-7b-lora-s8192-speed"]
    slow, fast = compare(entry, plan(2 * 21.3), "fit"), compare(entry, plan(21.3 / 2), "validation")
    assert slow["error"] == pytest.approx(1.0) and fast["error"] == pytest.approx(-0.5)
    exact = compare(BY_ID["tt-a100-llama3-8b-fsdp64-sacop"], plan(8192 / 2973 * 1.1), "validation")
    s = summary([slow, fast, exact])
    assert s["fit"]["n"] == 1 and s["fit"]["median_abs"] == pytest.approx(1.0)
    assert s["validation"]["n"] == 2 and s["validation"]["median_abs"] == pytest.approx(0.3)
    assert s["validation"]["worst_under"] == pytest.approx(-0.5) and s["validation"]["within_goal"] == 1
    assert s["validation"]["exact"]["n"] == 1 and s["validation"]["exact"]["median_abs"] == pytest.approx(0.1)
    assert set(s["validation"]["by_source"]) == {"QwenLM/Qwen", "pytorch/torchtitan"}
