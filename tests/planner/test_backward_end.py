"""The end-of-backward moment's last instant (States.backward_end_late): a tied embedding's three vocabulary tables,
FSDP2's retained reduce-scatter input and ZeRO-2's flattened bucket copy (docs/memory-model.md)."""

import dataclasses
import json
from pathlib import Path

import pytest

from benchmarks.accuracy.cells import BWDEND_DEV
from launcher.config.jobfile import job_from_data
from launcher.engines.deepspeed import deepspeed_states
from launcher.engines.fsdp import fsdp_states
from launcher.plan_inputs import plan_job
from launcher.planner.hardware import PROFILES
from launcher.planner.memory import MemoryInputs, analytic_constants, estimate_memory
from launcher.planner.plan import Buckets, Strategy
from launcher.planner.terms import tied_embedding_grad_bytes
from tests.planner.conftest import llama_stats

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "accuracy-dev-bwdend.json"


def gpt2_stats(vocab=4096, h=128, blocks=4, pos=1024, tied=True, lora=0):
    block = 12 * h * h + 13 * h
    root = vocab * h + pos * h + 2 * h + (0 if tied else vocab * h)
    return dataclasses.replace(
        llama_stats(num_params=root + blocks * block, blocks=blocks, h=h, inter=4 * h, vocab=vocab),
        model_type="gpt2", block_params=block, non_block_params=root, tied_embeddings=tied,
        trainable_params=lora or root + blocks * block, lora_params=lora, largest_layer_params=vocab * h)


def inputs(m, precision="fp32", n=2):
    return MemoryInputs(model=m, world_size=n, gpus_per_node=n, nodes=1, seq_len=32, precision=precision,
                        optimizer="adamw", hardware=PROFILES["cpu"], activations=analytic_constants(m, precision))


FSDP = Strategy(engine="fsdp", zero_stage=None, fsdp_reshard_after_forward=True, offload_optimizer="none",
                offload_params="none", micro_batch_size=1, grad_accum_steps=1, activation_checkpointing=False)
ZERO2 = dataclasses.replace(FSDP, engine="deepspeed", zero_stage=2, fsdp_reshard_after_forward=None)


def buckets(elems):
    return Buckets(reduce_bucket_size=elems, allgather_bucket_size=elems, stage3_prefetch_bucket_size=0,
                   stage3_max_live_parameters=0, stage3_param_persistence_threshold=0)


def test_tied_embedding_holds_three_tables_in_the_working_dtype():
    m = gpt2_stats()
    assert tied_embedding_grad_bytes(m, 4) == 3 * 4 * 4096 * 128
    assert tied_embedding_grad_bytes(m, 2) == 3 * 2 * 4096 * 128
    # Untied: the head's gradient goes to its own weight and the embedding's is stolen by AccumulateGrad, no sum.
    assert tied_embedding_grad_bytes(gpt2_stats(tied=False), 4) == 0
    # A frozen table (LoRA) has no gradient; a classifier has no head on the table.
    assert tied_embedding_grad_bytes(gpt2_stats(lora=10_000), 4) == 0
    assert tied_embedding_grad_bytes(dataclasses.replace(m, task="seq_cls"), 4) == 0


def test_fsdp2_tied_end_of_backward_is_the_embeddings_backward():
    m = gpt2_stats()
    st = fsdp_states(inputs(m), FSDP)
    block, root, table = m.block_params, m.non_block_params, m.vocab_size * m.hidden_size
    waiting = 4 * m.num_blocks * block / 2
    # The root unsharded, the blocks' shards waiting, block 0's fp32 reduce-scatter input still held, the root's
    # other gradients and the three tables.
    assert st.backward_end_late == pytest.approx(4 * root + waiting + 4 * block + 4 * (root - table) + 3 * 4 * table)
    assert st.backward_end_late > st.backward_end_extra  # the root's reduce: 4 * root + waiting + 8 * root
    untied = fsdp_states(inputs(gpt2_stats(tied=False)), FSDP)
    assert untied.backward_end_late < untied.backward_end_extra  # untied: the reduce stays the larger instant


def test_zero2_end_of_backward_flushes_a_flattened_copy_of_the_bucket_or_holds_the_tied_tables():
    llama = llama_stats(num_params=7_342_336, blocks=4, h=256, inter=688, vocab=8192)
    psi = llama.trainable_params
    st = deepspeed_states(inputs(llama), ZERO2, buckets(psi))
    assert st.backward_end_late == 4 * psi + 4 * psi  # the bucket and allreduce_bucket's flattened copy
    # A bucket smaller than the model flattens at most its own elements.
    assert deepspeed_states(inputs(llama), ZERO2, buckets(psi // 4)).backward_end_late == 2 * 4 * (psi // 4)
    gpt2 = gpt2_stats()
    st = deepspeed_states(inputs(gpt2), ZERO2, buckets(gpt2.trainable_params))
    assert st.backward_end_late == 4 * gpt2.trainable_params + 3 * 4 * gpt2.vocab_size * gpt2.hidden_size
    # ZeRO-1 (whole gradients until the end) is not modelled by it.
    assert deepspeed_states(inputs(llama), dataclasses.replace(ZERO2, zero_stage=1), buckets(psi)).backward_end_late == 0


def test_the_late_instant_carries_no_activations_in_the_breakdown():
    m = gpt2_stats()
    est = estimate_memory(inputs(m), FSDP, buckets(0))
    st = fsdp_states(inputs(m), FSDP)
    assert est.moment_bytes["backward_end"] == int(st.params + st.optimizer + st.grads + st.backward_end_late)
    llama = llama_stats(num_params=7_342_336, blocks=4, h=256, inter=688, vocab=8192)
    est = estimate_memory(inputs(llama), ZERO2, buckets(llama.trainable_params))
    if est.peak_moment == "backward_end":
        assert est.breakdown["activations"] == 0


@pytest.mark.parametrize("cell", [c for c in BWDEND_DEV if c.sharding != "z3"], ids=lambda c: c.name)
def test_dev_cells_end_of_backward_matches_what_the_ranks_measured(cell, tmp_path, monkeypatch):
    # The measured backward-phase peak of each development cell (benchmarks/results/accuracy-dev-bwdend.json, real
    # 2-rank CPU runs) against the planner's end-of-backward moment for the same job: within 0.1 % (it was 7.6 to
    # 13.7 % under before these terms). ZeRO-3 (-12.3 %) is not fixed.
    monkeypatch.setenv("LAUNCHER_CACHE", str(tmp_path / "cache"))
    rows = {r["cell"]: r for r in json.loads(RESULTS.read_text())["rows"]}
    measured = rows[cell.name]["moment_totals"]["backward_end"]["measured_bytes"]
    plan = plan_job(job_from_data({**cell.job(), "gpus": cell.ranks, "budget": "16GB"}, "."), force=True)
    assert plan.estimate.moment_bytes["backward_end"] == pytest.approx(measured, rel=1e-3)
