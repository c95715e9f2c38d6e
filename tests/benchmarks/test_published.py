"""The published-figure benchmark: every entry is complete enough to re-plan, and each is predicted on its own basis."""

import pytest

from benchmarks.published.run import BASIS, UNITS, compare, job_for, load_entries, profile_for
from launcher.config.jobfile import job_from_data
from launcher.units import GiB, MiB

ENTRIES = load_entries()


def test_at_least_eight_exact_published_measurements():
    assert len({e["id"] for e in ENTRIES}) == len(ENTRIES)
    assert sum(e["exact"] for e in ENTRIES) >= 8


@pytest.mark.parametrize("entry", ENTRIES, ids=[e["id"] for e in ENTRIES])
def test_entry_names_its_source_figure_configuration_and_basis(entry, tmp_path):
    assert entry["source"]["url"].startswith("https://") and entry["source"]["repo"] and entry["quote"]
    pub = entry["published"]
    assert pub["counts"] in BASIS and pub["unit"] in UNITS and pub["value"] > 0
    assert entry["assumed"], "every entry says what it had to assume"
    for key in ("model", "task", "seq_len", "micro_batch_size", "grad_accum_steps", "gpus", "precision", "optimizer",
                "engine", "activation_checkpointing", "attn_implementation", "hardware"):
        assert key in entry["config"], key
    # The job it becomes is a valid launcher job with every strategy field pinned.
    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "a", "label": 0}\n')
    job = job_from_data(job_for(entry, data), base_dir=str(tmp_path))
    s = job.strategy
    assert s.engine == entry["config"]["engine"] and s.micro_batch_size == entry["config"]["micro_batch_size"]
    assert s.activation_checkpointing == entry["config"]["activation_checkpointing"]
    assert s.offload_optimizer == s.offload_params == "none"
    assert job.cluster.hardware == profile_for(entry)


def plan(peak: int, reserve: int, overhead: dict) -> dict:
    return {"predicted_peak_bytes": peak, "breakdown": {"params": peak - reserve, "reserve": reserve},
            "overhead": overhead, "hardware": "h100-80gb", "label": "x", "num_params": 1, "trainable_params": 1,
            "constants": {}}


def test_each_figure_is_compared_on_its_own_basis():
    over = {"cublas_workspace": 1 * MiB, "allocator_reserve": 10 * MiB, "cuda_context": 100 * MiB,
            "nccl_buffers": 1000 * MiB}
    p = plan(GiB + 1111 * MiB, 1111 * MiB, over)
    entry = next(e for e in ENTRIES if e["published"]["counts"] == "driver_used")
    assert compare(entry, p)["predicted_bytes"] == GiB + 1111 * MiB
    entry = next(e for e in ENTRIES if e["published"]["counts"] == "max_memory_reserved")
    assert compare(entry, p)["predicted_bytes"] == GiB + 11 * MiB
    entry = next(e for e in ENTRIES if e["published"]["counts"] == "max_memory_allocated")
    row = compare(entry, p)
    assert row["predicted_bytes"] == GiB + 1 * MiB
    assert row["error"] == pytest.approx((GiB + MiB - row["published_bytes"]) / row["published_bytes"])


def test_an_entrys_own_run_sets_its_context_kernels_and_nccl():
    """The HF guide's one-process V100 run (CUDA 11.2: every kernel loaded with the 1343 MiB context it measured)
    has no NCCL communicator and no separately loaded kernels; an entry that states nothing changes nothing."""
    from benchmarks.published.run import load_entries, profile_overrides

    (hf,) = load_entries("hf-bert-large-fp32-mb4-adam8bit")
    assert profile_overrides(hf) == {"context_bytes": 1408237568, "kernel_bytes": 0, "nccl_comm_bytes": 0,
                                     "nccl_extra_comm_bytes": 0}
    (qwen,) = load_entries("qwen-7b-lora-s512")
    assert profile_overrides(qwen) == {"nccl_comm_bytes": 0, "nccl_extra_comm_bytes": 0}
    (titan,) = load_entries("torchtitan-llama31-8b-fsdp8-s32k")
    assert profile_overrides(titan) == {}
