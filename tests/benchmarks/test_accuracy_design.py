"""The accuracy matrix covers every axis value, its jobs are valid, and the error arithmetic is right."""

import dataclasses

import numpy as np
import pytest

from benchmarks.accuracy.cells import (
    BUDGET,
    BWDEND_DEV,
    BWDEND_VALIDATION,
    BWDEND_VALIDATION_2,
    COMPOSE_VALIDATION,
    CURRENT_VALIDATION,
    DS_PURE_BF16_DEV,
    DS_PURE_BF16_LOW_BIT_VALIDATION,
    DS_PURE_BF16_VALIDATION,
    GC_VALIDATION,
    LORA_DTYPE_VALIDATION,
    MATRIX,
    MODELS,
    ONE_RANK_VALIDATION,
    PLAIN_VALIDATION,
    PURE_BF16_LOW_BIT_VALIDATION,
    QUICK,
    SAC_DS_DEV,
    SAC_DS_VALIDATION,
    SAC_DS_VALIDATION_2,
    SAC_VALIDATION,
    SAC_Z3LORA_VALIDATION,
    SEEN_VALIDATION,
    SHARDINGS,
    VALIDATION,
    Z3_BF16_ADAPTER_VALIDATION,
    Z3_PIN_VALIDATION,
    Z3_RELEASE_VALIDATION,
    Z3_RELEASE_VALIDATION_2,
    ZERO2_FLUSH_DEV,
    ZERO2_FLUSH_VALIDATION,
    balanced,
    every_cell,
    full_matrix,
    select,
    sides_of_all,
    split,
    split_salt,
)
from benchmarks.accuracy.compare import category_bias, compare_categories, moment_totals, rel, summary, wrong_terms
from benchmarks.accuracy.fit_split import fit_on_split
from launcher.calibrate.fit import Sample
from launcher.config.jobfile import job_from_data
from launcher.planner.buckets import MIN_BUCKET


def test_matrix_covers_every_axis_value():
    cells = full_matrix()
    assert len(cells) >= 30 and len({c.name for c in cells}) == len(cells)
    # ZeRO-0 entered with DeepSpeed's low-memory optimizers (LEVER_DEV cells only), the plain engine with its own
    # validation split: the fit / held-out matrix predates both and stays as it was split.
    assert {c.sharding for c in cells} == set(SHARDINGS) - {"z0", "plain"}
    assert {c.sharding for c in every_cell()} == set(SHARDINGS)
    assert {c.model for c in every_cell()} == set(MODELS)
    assert {c.model for c in cells} == set(MODELS) - {"gpt2m", "llama6", "gpt2xs"}  # validation-only models
    assert {c.precision for c in cells} == {"fp32", "bf16"}
    assert {c.task for c in cells} == {"causal_lm", "seq_cls", "sentence_embedding"}
    assert {c.lora for c in cells} == {False, True} and {c.checkpointing for c in cells} == {False, True}
    assert {c.ranks for c in cells} == {2, 4} and max(c.accum for c in cells) > 1
    assert max(c.seq_len for c in cells) == 1024
    assert sum(c.precision == "fp32" for c in cells) > len(cells) / 2  # bf16 may be slow on a CPU: kept few


def test_split_is_deterministic_disjoint_and_covers_every_axis_value_on_both_sides():
    cells = full_matrix()
    sides = split(cells)
    assert sides == split(list(reversed(cells)))  # the order of the list does not matter, only the names
    assert set(sides) == {c.name for c in cells} and set(sides.values()) == {"fit", "held-out"}
    fit = {n for n, s in sides.items() if s == "fit"}
    held = {n for n, s in sides.items() if s == "held-out"}
    assert not fit & held and len(fit) + len(held) == len(cells)
    assert 0.4 * len(cells) <= len(held) <= 0.6 * len(cells)
    for axis in ("precision", "task", "model", "lora", "accum", "ranks", "sharding", "checkpointing", "long"):
        values = {c.axes()[axis] for c in cells}
        for side in (fit, held):
            assert {c.axes()[axis] for c in cells if c.name in side} == values, (axis, side is fit)
    assert balanced(cells, sides) and split_salt(cells) >= 0


def test_adding_a_cell_does_not_move_the_others_unless_the_salt_must_change():
    cells = full_matrix()
    extra = dataclasses.replace(cells[0], seq_len=768)
    before, after = split(cells), split([*cells, extra])
    assert split_salt(cells) == split_salt([*cells, extra]) == 0  # this cell keeps the balance as it is
    assert all(after[n] == s for n, s in before.items())


def _samples(cell: str, scale_truth: float, rng, n=3) -> list[Sample]:
    out = []
    for i in range(n):
        coef = {"block_bytes_per_token": float(rng.integers(1000, 5000)),
                "head_bytes_per_token": float(rng.integers(100, 900))}
        current = {"block_bytes_per_token": float(rng.integers(50, 500)),
                   "head_bytes_per_token": float(rng.integers(10, 90))}
        measured = sum(coef[k] * current[k] for k in coef) * scale_truth
        out.append(Sample(name=f"{cell}/{i}", measured_bytes=measured, base_bytes=0.0, coefficients=coef,
                          current=current))
    return out


def test_the_fit_reads_the_fit_split_only():
    rng = np.random.default_rng(0)
    samples = {f"c{i}": _samples(f"c{i}", 1.2, rng) for i in range(8)}
    sides = {f"c{i}": "fit" if i % 2 else "held-out" for i in range(8)}
    terms = ("block_bytes_per_token", "head_bytes_per_token")
    scales = fit_on_split(samples, sides, terms)
    assert scales["block_bytes_per_token"] == pytest.approx(1.2, rel=1e-3)
    # Whatever the held-out cells measured (here: 3x, or nothing at all), the fitted scales are the same.
    wild = {c: (_samples(c, 3.0, rng) if sides[c] == "held-out" else s) for c, s in samples.items()}
    assert fit_on_split(wild, sides, terms) == scales
    assert fit_on_split({c: s for c, s in samples.items() if sides[c] == "fit"}, sides, terms) == scales


def test_quick_cells_exist_and_selection_works():
    cells = full_matrix()
    assert len(select(cells, list(QUICK))) == len(QUICK)
    z3 = select(cells, ["z3-,minilm"])
    assert z3 and all(c.sharding == "z3" and c.model == "minilm" for c in z3)
    assert select(cells, ["nothing-like-this"]) == []
    assert select(cells, None) == cells


def test_validation_cells_are_new_disjoint_and_never_read_by_the_fit():
    matrix_names = {c.name for c in (*MATRIX, *SEEN_VALIDATION)}
    val_names = {c.name for c in VALIDATION}
    assert 8 <= len(VALIDATION) <= 10 and len(val_names) == len(VALIDATION) and not matrix_names & val_names
    # Not near-copies either: no validation cell shares its sharding, model, task, sequence length and micro-batch
    # with a cell run before it (the matrix and the first, seen, validation split).
    seen = {(c.sharding, c.model, c.task, c.seq_len, c.micro_batch) for c in (*MATRIX, *SEEN_VALIDATION)}
    assert not any((c.sharding, c.model, c.task, c.seq_len, c.micro_batch) in seen for c in VALIDATION)
    # What the goal asks of them: ZeRO-3 with and without offload, LoRA, FSDP2 full-shard, AC, 2 and 4 ranks, bf16.
    assert {"z3", "z3off", "fsdp"} <= {c.sharding for c in VALIDATION}
    assert any(c.lora for c in VALIDATION) and any(c.checkpointing for c in VALIDATION)
    assert {c.ranks for c in VALIDATION} == {2, 4} and {c.precision for c in VALIDATION} == {"fp32", "bf16"}
    # The matrix's split is computed without them: adding them moved no cell.
    sides = sides_of_all()
    assert {n: s for n, s in sides.items() if n in {c.name for c in MATRIX}} == split(full_matrix())
    assert {sides[n] for n in val_names} == {"validation"}
    assert {sides[c.name] for c in SEEN_VALIDATION} == {"validation-1"}
    # The fit reads "fit" cells only: whatever the validation cells measured, the scales do not move.
    rng = np.random.default_rng(1)
    samples = {c.name: _samples(c.name, 1.1, rng) for c in every_cell()}
    terms = ("block_bytes_per_token", "head_bytes_per_token")
    wild = {n: (_samples(n, 5.0, rng) if sides[n].startswith("validation") else s) for n, s in samples.items()}
    assert fit_on_split(wild, sides, terms) == fit_on_split(samples, sides, terms)


def test_end_of_backward_validation_is_disjoint_from_its_development_cells():
    # The end-of-backward split judges terms built on BWDEND_DEV: none of its cells shares a model with them, and
    # every cell name is unique across all splits (a cell run under two splits would be read twice).
    assert not {c.model for c in BWDEND_DEV} & {c.model for c in BWDEND_VALIDATION}
    assert not {c.seq_len for c in BWDEND_DEV} & {c.seq_len for c in BWDEND_VALIDATION}
    names = [c.name for c in every_cell()]
    assert len(names) == len(set(names))
    sides = sides_of_all()
    assert {sides[c.name] for c in BWDEND_VALIDATION} == {"bwdend-validation"}
    assert {sides[c.name] for c in BWDEND_DEV} == {"bwdend-dev"}


def test_second_end_of_backward_validation_is_out_of_sample_for_zero3_and_zero1():
    # BWDEND_VALIDATION_2 judges ZeRO-3's and ZeRO-1's end-of-backward terms, built on BWDEND_DEV's ZeRO-3 and
    # ZeRO-1 cells: one cell of each, on models, lengths and micro-batches those cells do not use, and ZeRO-3's
    # reduce bucket (the planner's floor) larger than its model, where every development cell's is the model.
    dev = [c for c in BWDEND_DEV if c.sharding in ("z3", "z1")]
    assert sorted(c.sharding for c in BWDEND_VALIDATION_2) == ["z1", "z3"]
    assert not {c.model for c in dev} & {c.model for c in BWDEND_VALIDATION_2}
    assert not {c.seq_len for c in dev} & {c.seq_len for c in BWDEND_VALIDATION_2}
    assert {sides_of_all()[c.name] for c in BWDEND_VALIDATION_2} == {"bwdend-validation-2"}
    z3 = next(c for c in BWDEND_VALIDATION_2 if c.sharding == "z3")
    m = MODELS[z3.model]
    h, v, n = m["hidden_size"], m["vocab_size"], m["num_layers"]
    params = v * h + m["max_position_embeddings"] * h + 2 * h + n * (12 * h * h + 13 * h)
    assert params < MIN_BUCKET


def test_deepspeed_pure_bf16_validation_is_disjoint_from_its_development_cells():
    # Neither a model nor a sequence length of the development cells, one ZeRO-2 and one ZeRO-3 cell.
    assert not {c.model for c in DS_PURE_BF16_DEV} & {c.model for c in DS_PURE_BF16_VALIDATION}
    assert not {c.seq_len for c in DS_PURE_BF16_DEV} & {c.seq_len for c in DS_PURE_BF16_VALIDATION}
    assert sorted(c.sharding for c in DS_PURE_BF16_VALIDATION) == ["z2", "z3"]
    assert all(dict(c.levers) == {"pure_bf16": True} for c in (*DS_PURE_BF16_DEV, *DS_PURE_BF16_VALIDATION))
    sides = sides_of_all()
    assert {sides[c.name] for c in DS_PURE_BF16_VALIDATION} == {"dsbf16-validation"}
    assert {sides[c.name] for c in DS_PURE_BF16_DEV} == {"dsbf16-dev"}


def test_deepspeed_op_checkpointing_validation_is_disjoint_from_its_development_cells():
    # Neither a model nor a length of the development cells; ZeRO-1 (no development cell) and ZeRO-3 with k = 2.
    assert not {c.model for c in SAC_DS_DEV} & {c.model for c in SAC_DS_VALIDATION}
    assert not {c.seq_len for c in SAC_DS_DEV} & {c.seq_len for c in SAC_DS_VALIDATION}
    assert all(dict(c.levers)["checkpoint_policy"] == "ops" and c.sharding.startswith("z")
               for c in (*SAC_DS_DEV, *SAC_DS_VALIDATION))
    sides = sides_of_all()
    assert {sides[c.name] for c in SAC_DS_VALIDATION} == {"sac-ds-validation"}
    assert {sides[c.name] for c in SAC_DS_DEV} == {"sac-ds-dev"}


@pytest.mark.parametrize("cell", every_cell(), ids=lambda c: c.name)
def test_every_cell_is_a_valid_fully_pinned_job(cell):
    job = job_from_data({**cell.job(), "gpus": cell.ranks, "budget": "16GB"}, ".")
    s = job.strategy
    assert s.engine and s.micro_batch_size == cell.micro_batch
    assert s.activation_checkpointing is cell.checkpointing
    assert s.offload_optimizer is not None and s.offload_params is not None
    assert job.train.global_batch_size == cell.ranks * cell.micro_batch * cell.accum
    assert job.train.precision == cell.precision and (job.train.lora is not None) == cell.lora
    assert job.data.eval_fraction == 0.0


def test_moment_totals_match_each_moment_with_its_phase():
    phases = {"forward": 80, "backward": 100, "optimizer_step": 50}
    got = moment_totals({"backward": 90, "backward_end": 70, "step": 55}, phases)
    assert got["backward"]["measured_bytes"] == 100 and got["backward"]["error"] == pytest.approx(-0.1)
    assert got["backward_end"]["measured_phase"] == "backward"
    assert got["step"]["measured_phase"] == "optimizer_step" and got["step"]["error"] == pytest.approx(0.1)


def row(name, measured, planner, ds, acc, cats):
    return {"cell": name, "sharding": name.split("-")[0], "measured_peak_bytes": measured,
            "predicted": {"planner": planner, "deepspeed": ds, "accelerate": acc},
            "errors": {"planner": rel(planner, measured), "deepspeed": rel(ds, measured),
                       "accelerate": rel(acc, measured)},
            "categories_at_peak": cats}


def test_errors_summary_and_category_diagnosis():
    cats = compare_categories({"params": 10, "grads": 0, "optimizer": 40, "activations": 30, "logits": 20},
                              {"params": 10, "grads": 25, "optimizer": 40, "activations": 20, "temp": 10})
    assert cats["activations"] == {"predicted": 50, "measured": 30, "diff": 20}
    assert cats["grads"]["diff"] == -25
    rows = [row("z2-a", 100, 90, 50, 40, cats), row("z3-b", 200, 230, 100, 60, cats)]
    s = summary(rows)
    assert s["planner"]["median_abs"] == pytest.approx(0.125)
    assert s["planner"]["max_abs"] == pytest.approx(0.15)
    assert s["planner"]["under"] == 1 and s["deepspeed"]["under"] == 2
    assert s["planner"]["within_goal"] == 1
    text = wrong_terms(rows[0])
    assert text.startswith("grads -0.00 MB") and "activations +0.00 MB" in text
    bias = category_bias(rows)
    assert bias["all"]["grads"]["median_ratio"] == 0.0
    assert set(bias) == {"all", "ZeRO-2", "ZeRO-3"}


def test_the_current_planners_validation_split_is_new_and_spans_the_space():
    # Every cell a (sharding, model, task, length, micro-batch) no earlier cell ran, so nothing in memory.py was
    # ever checked against it; both engines, every ZeRO stage, all three tasks, both precisions, LoRA and
    # QLoRA, and each FSDP2 lever once.
    earlier = {(c.sharding, c.model, c.task, c.seq_len, c.micro_batch) for c in every_cell()
               if c not in CURRENT_VALIDATION}
    assert not earlier & {(c.sharding, c.model, c.task, c.seq_len, c.micro_batch) for c in CURRENT_VALIDATION}
    assert {sides_of_all()[c.name] for c in CURRENT_VALIDATION} == {"validation-3"}
    assert {c.sharding for c in CURRENT_VALIDATION} == set(SHARDINGS) - {"plain"}  # the plain engine came later
    assert {c.task for c in CURRENT_VALIDATION} == {"causal_lm", "seq_cls", "sentence_embedding"}
    assert {c.precision for c in CURRENT_VALIDATION} == {"fp32", "bf16"}
    levers = {k for c in CURRENT_VALIDATION for k, _ in c.levers}
    assert levers == {"loss_chunks", "checkpoint_policy", "checkpoint_every", "activation_offload",
                      "optimizer_in_backward", "low_memory_optimizer", "pure_bf16", "qlora"}
    # The gaps stop 26 left: ZeRO-3 under LoRA, ZeRO-1 in bf16 with and without LoRA.
    assert any(c.sharding == "z3" and c.lora for c in CURRENT_VALIDATION)
    assert {c.lora for c in CURRENT_VALIDATION if c.sharding == "z1" and c.precision == "bf16"} == {False, True}


def test_the_zero3_pin_validation_is_new():
    earlier = {(c.sharding, c.model, c.task, c.seq_len, c.micro_batch) for c in every_cell()
               if c not in Z3_PIN_VALIDATION}
    assert not earlier & {(c.sharding, c.model, c.task, c.seq_len, c.micro_batch) for c in Z3_PIN_VALIDATION}
    assert {c.sharding for c in Z3_PIN_VALIDATION} == {"z3"} and {c.lora for c in Z3_PIN_VALIDATION} == {False, True}
    assert {sides_of_all()[c.name] for c in Z3_PIN_VALIDATION} == {"z3pin-validation"}


def test_the_zero3_release_validation_is_new():
    earlier = {(c.sharding, c.model, c.task, c.seq_len, c.micro_batch) for c in every_cell()
               if c not in Z3_RELEASE_VALIDATION}
    assert not earlier & {(c.sharding, c.model, c.task, c.seq_len, c.micro_batch) for c in Z3_RELEASE_VALIDATION}
    assert {c.sharding for c in Z3_RELEASE_VALIDATION} == {"z3", "z3off"}
    assert all(c.lora and ("release_frozen_weights", True) in c.levers for c in Z3_RELEASE_VALIDATION)
    assert {sides_of_all()[c.name] for c in Z3_RELEASE_VALIDATION} == {"z3release-validation"}


def test_the_second_zero3_release_validation_is_new():
    earlier = {(c.sharding, c.model, c.task, c.seq_len, c.micro_batch) for c in every_cell()
               if c not in Z3_RELEASE_VALIDATION_2}
    assert not earlier & {(c.sharding, c.model, c.task, c.seq_len, c.micro_batch) for c in Z3_RELEASE_VALIDATION_2}
    assert all(c.sharding == "z3" and c.lora and ("release_frozen_weights", True) in c.levers
               for c in Z3_RELEASE_VALIDATION_2)
    # Shapes the first split did not take: a head tied to the embedding, and a task without a head.
    first = {(c.model, c.task, c.precision, c.checkpointing) for c in Z3_RELEASE_VALIDATION}
    assert all((c.model, c.task, c.precision, c.checkpointing) not in first for c in Z3_RELEASE_VALIDATION_2)
    assert {c.model for c in Z3_RELEASE_VALIDATION_2} >= {"gpt2s", "minilm"}
    assert {sides_of_all()[c.name] for c in Z3_RELEASE_VALIDATION_2} == {"z3release-validation-2"}


def test_the_zero3_lora_op_policy_validation_is_new():
    earlier = {(c.sharding, c.model, c.task, c.seq_len, c.micro_batch) for c in every_cell()
               if c not in SAC_Z3LORA_VALIDATION}
    assert not earlier & {(c.sharding, c.model, c.task, c.seq_len, c.micro_batch) for c in SAC_Z3LORA_VALIDATION}
    assert {c.sharding for c in SAC_Z3LORA_VALIDATION} == {"z3"}
    assert all(c.lora and c.checkpointing and ("checkpoint_policy", "ops") in c.levers for c in SAC_Z3LORA_VALIDATION)
    # Both of ZeRO-3's linears under LoRA: torch's and DeepSpeed's memory_efficient_linear (released frozen weights).
    assert {dict(c.levers).get("release_frozen_weights", False) for c in SAC_Z3LORA_VALIDATION} == {False, True}
    assert {sides_of_all()[c.name] for c in SAC_Z3LORA_VALIDATION} == {"sac-z3lora-validation"}


def test_the_second_deepspeed_op_policy_validation_is_new():
    """Mixed layouts on DeepSpeed with the op policy: some blocks checkpointed, the last not, on new shapes."""
    from launcher.levers.checkpoint_every import checkpointed

    sac = SAC_VALIDATION + SAC_DS_DEV + SAC_DS_VALIDATION + SAC_Z3LORA_VALIDATION
    earlier = {(c.sharding, c.model, c.task, c.seq_len, c.micro_batch) for c in every_cell()
               if c not in SAC_DS_VALIDATION_2}
    assert not earlier & {(c.sharding, c.model, c.task, c.seq_len, c.micro_batch) for c in SAC_DS_VALIDATION_2}
    assert not {(c.model, c.seq_len) for c in sac} & {(c.model, c.seq_len) for c in SAC_DS_VALIDATION_2}
    assert len(SAC_DS_VALIDATION_2) == 3 and {c.sharding for c in SAC_DS_VALIDATION_2} == {"z1", "z2", "z3"}
    for c in SAC_DS_VALIDATION_2:
        levers = dict(c.levers)
        assert c.checkpointing and levers["checkpoint_policy"] == "ops"
        blocks = MODELS[c.model]["num_layers"]
        assert not checkpointed(blocks - 1, levers["checkpoint_every"])  # the backward start is the moment
    assert {sides_of_all()[c.name] for c in SAC_DS_VALIDATION_2} == {"sac-ds-validation-2"}


def test_the_one_rank_validation_is_new():
    """No earlier cell ran on a single rank; each shape is new, ZeRO-3 and QLoRA each with and without offload."""
    earlier = [c for c in every_cell() if c not in ONE_RANK_VALIDATION and c not in PLAIN_VALIDATION]
    assert all(c.ranks > 1 for c in earlier)
    assert {c.ranks for c in ONE_RANK_VALIDATION} == {1}
    shapes = {(c.model, c.seq_len, c.micro_batch) for c in earlier}
    assert not shapes & {(c.model, c.seq_len, c.micro_batch) for c in ONE_RANK_VALIDATION}
    assert {c.sharding for c in ONE_RANK_VALIDATION} == {"z3", "z3off", "fsdp", "fsdpoff"}
    assert {c.sharding for c in ONE_RANK_VALIDATION if dict(c.levers).get("qlora")} == {"fsdp", "fsdpoff"}
    assert {sides_of_all()[c.name] for c in ONE_RANK_VALIDATION} == {"one-rank-validation"}



def test_the_lora_dtype_validation_is_new():
    """bf16 LoRA on shapes no earlier cell used: ZeRO-1, ZeRO-2 with checkpointing and FSDP2 (adapters computed in bf16
    there) and ZeRO-3 (in fp32 there)."""
    earlier = [c for c in every_cell() if c not in LORA_DTYPE_VALIDATION]
    shapes = {(c.model, c.seq_len, c.micro_batch) for c in earlier}
    assert not shapes & {(c.model, c.seq_len, c.micro_batch) for c in LORA_DTYPE_VALIDATION}
    assert all(c.lora and c.precision == "bf16" for c in LORA_DTYPE_VALIDATION)
    assert {c.sharding for c in LORA_DTYPE_VALIDATION} == {"z1", "z2", "z3", "fsdp"}
    assert {sides_of_all()[c.name] for c in LORA_DTYPE_VALIDATION} == {"lora-dtype-validation"}


def test_the_zero3_bf16_adapter_validation_is_new():
    """bf16 ZeRO-3 LoRA on shapes no earlier cell used: torch's linear, DeepSpeed's, offload with the op policy."""
    earlier = [c for c in every_cell() if c not in Z3_BF16_ADAPTER_VALIDATION]
    shapes = {(c.model, c.seq_len, c.micro_batch) for c in earlier}
    assert not shapes & {(c.model, c.seq_len, c.micro_batch) for c in Z3_BF16_ADAPTER_VALIDATION}
    assert all(c.lora and c.precision == "bf16" and c.sharding.startswith("z3") for c in Z3_BF16_ADAPTER_VALIDATION)
    assert {dict(c.levers).get("release_frozen_weights", False) for c in Z3_BF16_ADAPTER_VALIDATION} == {False, True}
    assert {sides_of_all()[c.name] for c in Z3_BF16_ADAPTER_VALIDATION} == {"z3-bf16-adapter-validation"}


def test_the_pure_bf16_low_bit_validation_is_new():
    later = (*PURE_BF16_LOW_BIT_VALIDATION, *COMPOSE_VALIDATION)  # the step in backward pairs them since issue 37
    earlier = [c for c in every_cell() if c not in later]
    shapes = {(c.model, c.seq_len, c.micro_batch) for c in earlier}
    assert not shapes & {(c.model, c.seq_len, c.micro_batch) for c in PURE_BF16_LOW_BIT_VALIDATION}
    levers = [dict(c.levers) for c in PURE_BF16_LOW_BIT_VALIDATION]
    assert all(lv["pure_bf16"] and lv["low_memory_optimizer"] in ("adamw8bit", "adamw4bit") for lv in levers)
    assert {lv["low_memory_optimizer"] for lv in levers} == {"adamw8bit", "adamw4bit"}
    assert not any(c.sharding.startswith("fsdp") and dict(c.levers).get("pure_bf16")
                   and dict(c.levers).get("low_memory_optimizer", "none") != "none" for c in earlier)
    assert {c.sharding for c in PURE_BF16_LOW_BIT_VALIDATION} == {"fsdp", "fsdp-noreshard", "fsdpoff"}
    assert {sides_of_all()[c.name] for c in PURE_BF16_LOW_BIT_VALIDATION} == {"pbf16-lowbit-validation"}


def test_the_deepspeed_pure_bf16_low_bit_validation_is_new():
    earlier = [c for c in every_cell() if c not in DS_PURE_BF16_LOW_BIT_VALIDATION]
    shapes = {(c.model, c.seq_len, c.micro_batch) for c in earlier}
    assert not shapes & {(c.model, c.seq_len, c.micro_batch) for c in DS_PURE_BF16_LOW_BIT_VALIDATION}
    assert {c.sharding for c in DS_PURE_BF16_LOW_BIT_VALIDATION} == {"z1", "z2"}
    assert not any(c.sharding.startswith("z") and dict(c.levers).get("pure_bf16")
                   and dict(c.levers).get("low_memory_optimizer", "none") != "none" for c in earlier)
    assert {dict(c.levers)["low_memory_optimizer"] for c in DS_PURE_BF16_LOW_BIT_VALIDATION} == {"adamw8bit",
                                                                                              "adamw4bit"}
    assert {sides_of_all()[c.name] for c in DS_PURE_BF16_LOW_BIT_VALIDATION} == {"ds-pbf16-lowbit-validation"}


def test_the_zero2_flush_validation_is_new():
    earlier = [c for c in every_cell() if c not in ZERO2_FLUSH_VALIDATION]
    shapes = {(c.model, c.seq_len, c.micro_batch) for c in earlier}
    assert not shapes & {(c.model, c.seq_len, c.micro_batch) for c in ZERO2_FLUSH_VALIDATION}
    assert all(c.budget == BUDGET for c in earlier if c not in ZERO2_FLUSH_DEV)  # the development cells: seen
    assert all(c.sharding == "z2" and c.ranks == 2 and c.budget != BUDGET for c in ZERO2_FLUSH_VALIDATION)
    assert {c.accum for c in ZERO2_FLUSH_VALIDATION} == {1, 2}
    assert len({c.model for c in ZERO2_FLUSH_VALIDATION}) == len({c.task for c in ZERO2_FLUSH_VALIDATION}) + 2 == 5
    assert {sides_of_all()[c.name] for c in ZERO2_FLUSH_VALIDATION} == {"zero2-flush-validation"}


@pytest.mark.slow
@pytest.mark.parametrize("cell", ZERO2_FLUSH_VALIDATION, ids=lambda c: c.name)
def test_the_zero2_flush_cells_flush_during_backward(cell):
    # Each cell's budget sizes the reduce bucket below the trainable parameters (and fits the plan).
    from launcher.inputs.plan_inputs import plan_job

    plan = plan_job(job_from_data({**cell.job(), "gpus": cell.ranks, "budget": cell.budget}, "."))
    assert plan.buckets.reduce_bucket_size < plan.trainable_params
    assert plan.estimate.peak_bytes < plan.usable_bytes


def test_restored_compare_lists_the_rows_that_moved_only():
    from benchmarks.accuracy.restored import compare

    def out(sha, *rows):
        return {"planner_memory_sha": sha, "rows": [
            {"file": "accuracy", "cell": c, "measured_bytes": 100e6, "predicted_bytes": p, "moment_bytes": m,
             "error": (p - 100e6) / 100e6} for c, p, m in rows]}

    before = out("a", ("x", 90e6, {"backward": 90e6}), ("y", 100e6, {"backward": 100e6}))
    after = out("b", ("x", 101e6, {"backward": 101e6}), ("y", 100e6, {"backward": 100e6}),
                ("new", 1e6, {"backward": 1e6}))
    table = compare(before, after)
    assert table.startswith("1 of 2 stored rows moved (planner memory.py `a` -> `b`)")
    assert "| accuracy | x | 100.00 | 90.00 | -10.0% | 101.00 | +1.0% | backward |" in table
    assert "| y |" not in table and "| new |" not in table


def test_the_compose_validation_is_new():
    """Issue 37: the step in backward with a low-bit AdamW (with and without pure bf16) and the in-place chunked
    loss, on FSDP2, on shapes no cell used; committed before it ran."""
    earlier = [c for c in every_cell() if c not in COMPOSE_VALIDATION]
    shapes = {(c.model, c.seq_len, c.micro_batch) for c in earlier}
    assert not shapes & {(c.model, c.seq_len, c.micro_batch) for c in COMPOSE_VALIDATION}
    levers = [dict(c.levers) for c in COMPOSE_VALIDATION]
    assert not any(lv.get("optimizer_in_backward") and lv.get("low_memory_optimizer", "none") != "none"
                   for lv in map(lambda c: dict(c.levers), earlier))
    combined = [lv for lv in levers if lv.get("optimizer_in_backward")]
    assert {lv["low_memory_optimizer"] for lv in combined} == {"adamw8bit", "adamw4bit"}
    assert {bool(lv.get("pure_bf16")) for lv in combined} == {True, False}
    assert {c.sharding for c in COMPOSE_VALIDATION} == {"fsdp"} and any(lv.get("loss_chunks") for lv in levers)
    assert {sides_of_all()[c.name] for c in COMPOSE_VALIDATION} == {"compose-validation"}


def test_the_plain_validation_is_new():
    """No earlier cell ran the plain engine, and none used one of its shapes; it spans one rank and DDP."""
    cells = every_cell()
    earlier = cells[:cells.index(PLAIN_VALIDATION[0])]
    assert all(c.sharding != "plain" for c in earlier)
    shapes = {(c.model, c.seq_len, c.micro_batch) for c in earlier}
    assert not shapes & {(c.model, c.seq_len, c.micro_batch) for c in PLAIN_VALIDATION}
    assert {c.sharding for c in PLAIN_VALIDATION} == {"plain"} and {c.ranks for c in PLAIN_VALIDATION} == {1, 2}
    assert {sides_of_all()[c.name] for c in PLAIN_VALIDATION} == {"plain-validation"}


def test_the_gc_validation_is_new():
    """The probe's collector split: shapes no earlier cell ran, every probed task, and engines of all three kinds."""
    cells = every_cell()
    earlier = cells[:cells.index(GC_VALIDATION[0])]
    shapes = {(c.model, c.seq_len, c.micro_batch) for c in earlier}
    assert not shapes & {(c.model, c.seq_len, c.micro_batch) for c in GC_VALIDATION}
    assert {c.task for c in GC_VALIDATION} == {"causal_lm", "seq_cls", "sentence_embedding"}
    assert {SHARDINGS[c.sharding]["engine"] for c in GC_VALIDATION} == {"deepspeed", "fsdp", "plain"}
    assert {sides_of_all()[c.name] for c in GC_VALIDATION} == {"gc-validation"}
