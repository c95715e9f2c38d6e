"""report.json's verdict and memory.png's scale."""

import json
import struct

from launcher.report import BUDGET_OFF_CHART, over_budget_message, plot_memory, plot_unit


def report(budget: int, measured: int = 8_340_000, predicted: int = 8_610_000) -> dict:
    rows = [{"rank": r, "host": "h", "measured_peak_bytes": measured, "predicted_peak_bytes": predicted,
             "budget_bytes": budget, "headroom_bytes": budget - measured, "within_budget": measured <= budget,
             "grew_most": "activations", "grew_most_bytes": 10,
             "measured_breakdown": {"params": 500_000, "activations": 7_000_000}} for r in range(2)]
    return {"ranks": rows, "budget_bytes": budget, "within_budget": all(r["within_budget"] for r in rows),
            "predicted_breakdown": {"params": 400_000, "activations": 7_000_000, "logits": 100}}


def png_size(path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", head[16:24])


def test_plot_unit_follows_the_peaks_in_decimal_units():
    assert plot_unit(8.6e6) == ("MB", 1e6)
    assert plot_unit(14e9) == ("GB", 1e9)
    assert plot_unit(999) == ("bytes", 1.0)


def test_memory_png_in_both_scales(tmp_path):
    near, far = tmp_path / "near.png", tmp_path / "far.png"
    assert plot_memory(report(budget=12_000_000), near) == near
    assert plot_memory(report(budget=int(BUDGET_OFF_CHART * 8_610_000) + 1), far) == far
    assert png_size(near) == png_size(far) == (990, 360)
    assert plot_memory({"ranks": [], "budget_bytes": 1}, tmp_path / "none.png") is None


def test_over_budget_message_names_the_rank_peak_budget_and_category():
    msg = over_budget_message(report(budget=8_000_000))
    assert msg.startswith("rank 1 on h peaked at 8.34 MB, over the budget of 8.00 MB by 340.00 KB") or \
        msg.startswith("rank 0 on h peaked at 8.34 MB, over the budget of 8.00 MB by 340.00 KB")
    assert "activations grew most" in msg and "(1 more rank(s) over)" in msg
    assert over_budget_message(report(budget=9_000_000)) is None
    json.dumps(report(1))  # the report stays plain JSON
