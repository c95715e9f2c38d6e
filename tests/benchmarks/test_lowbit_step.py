"""The low-bit step benchmark's logic: which sizes fit the constant, which check it, what the constant is."""

import pytest

from benchmarks.lowbit_step.run import ASIDE_SIZES, CHECK_SIZES, FIT_SIZES, fit, render, split_of


def cell(numel: int, ratio: float, name: str = "adamw8bit", threads: int = 1) -> dict:
    return {"threads": threads, "numel": numel, "optimizer": name, "split": split_of(numel), "ratio": ratio,
            "ratios": [ratio], "adamw_s": 1e-3, "lowbit_s": ratio * 1e-3}


def test_fit_and_check_sizes_are_apart_and_out_of_cache():
    assert not set(FIT_SIZES) & set(CHECK_SIZES) and not set(ASIDE_SIZES) & set(FIT_SIZES + CHECK_SIZES)
    assert min(FIT_SIZES + CHECK_SIZES) >= 2**20 > max(ASIDE_SIZES)
    assert [split_of(n) for n in (FIT_SIZES[0], CHECK_SIZES[0], ASIDE_SIZES[0])] == ["fit", "check", "aside"]


def test_each_constant_is_the_median_of_its_one_thread_fit_cells():
    cells = [cell(FIT_SIZES[0], 40.0), cell(FIT_SIZES[1], 60.0), cell(FIT_SIZES[1], 5.0, threads=2),
             cell(FIT_SIZES[0], 30.0, "adamw4bit"), cell(CHECK_SIZES[0], 1000.0), cell(CHECK_SIZES[0], 9.0, threads=2),
             cell(ASIDE_SIZES[0], 500.0)]
    # The 2-thread and in-cache cells count for nothing (FIT_THREADS, ASIDE_SIZES).
    assert fit(cells) == {"adamw4bit": 30.0, "adamw8bit": 50.0}
    loads = [{"round": 0, "threads": 1, "load_before": (1, 1, 1), "load_after": (2, 2, 2)}]
    text = render(cells, loads, fit(cells), 1.0)
    # Checked against the one 1-thread check cell, 8-bit's: (50 - 1000) / 1000.
    assert "median 95.0%, at most 95.0%" in text and "LOW_BIT_CPU_STEP_RATIO adamw4bit 30, adamw8bit 50" in text


def test_it_times_the_optimizers_the_launcher_builds():
    from benchmarks.lowbit_step.run import build

    opt, p = build("adamw8bit", 2**12)
    assert type(opt).__name__ == "AdamW8bit" and p.shape == (4, 1024)
    opt, _ = build("adamw", 2**12)
    assert isinstance(opt, __import__("torch").optim.AdamW) and opt.defaults["foreach"] is False
    with pytest.raises(ValueError, match="unknown low_memory_optimizer"):
        build("sgd8bit", 2**12)
