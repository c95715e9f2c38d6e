"""Merge the ranks' memory files into report.json, decide the verdict, and render it."""

from __future__ import annotations

import json
from pathlib import Path

from launcher.rundir import RunDir
from launcher.units import format_bytes

# Predicted categories and the measured (MemTracker) categories they correspond to.
CATEGORY_GROUPS = {
    "params": (("params",), ("params",)),
    "grads": (("grads",), ("grads",)),
    "optimizer": (("optimizer",), ("optimizer",)),
    "activations": (("activations", "logits"), ("activations", "temp")),
    "buffers": (("buffers",), ("buffers", "other")),
}


def grown_category(predicted: dict[str, int], measured: dict[str, int]) -> tuple[str, int]:
    """The category whose measured bytes exceed the prediction by the most."""
    best, growth = "activations", None
    for name, (pred_keys, meas_keys) in CATEGORY_GROUPS.items():
        diff = sum(measured.get(k, 0) for k in meas_keys) - sum(predicted.get(k, 0) for k in pred_keys)
        if growth is None or diff > growth:
            best, growth = name, diff
    return best, int(growth or 0)


def build_report(run: RunDir, plan: dict, *, expected_ranks: int) -> dict:
    rows = []
    budget = int(plan["budget_bytes"])
    predicted = int(plan["predicted_peak_bytes"])
    for path in run.rank_files():
        r = json.loads(path.read_text())
        measured = int(r.get("measured_peak_bytes") or 0)
        cats = {k: int(v) for k, v in (r.get("peak_by_category") or {}).items()}
        largest = max(cats, key=cats.get) if cats else None
        grew, growth = grown_category(plan.get("breakdown", {}), cats)
        rows.append({
            "rank": int(r["rank"]),
            "host": r.get("host", "?"),
            "device": r.get("device", "cpu"),
            "status": r.get("status", "unknown"),
            "measured_peak_bytes": measured,
            "predicted_peak_bytes": predicted,
            "budget_bytes": budget,
            "headroom_bytes": budget - measured,
            "within_budget": measured <= budget,
            "relative_error": (predicted - measured) / measured if measured else None,
            "largest_category": largest,
            "grew_most": grew,
            "grew_most_bytes": growth,
            "measured_breakdown": cats,
            "phases": r.get("phases", {}),
            "peak_rss_bytes": r.get("peak_rss_bytes"),
            "max_memory_allocated_bytes": r.get("max_memory_allocated_bytes"),
            "max_memory_reserved_bytes": r.get("max_memory_reserved_bytes"),
            "first_loss": r.get("first_loss"),
            "final_loss": r.get("final_loss"),
            "eval_loss": r.get("eval_loss"),
            "steps_done": r.get("steps_done"),
        })
    missing = sorted(set(range(expected_ranks)) - {row["rank"] for row in rows})
    return {
        "within_budget": bool(rows) and not missing and all(row["within_budget"] for row in rows),
        "budget_bytes": budget,
        "predicted_peak_bytes": predicted,
        "predicted_breakdown": plan.get("breakdown", {}),
        "plan": plan.get("label"),
        "world_size": expected_ranks,
        "missing_ranks": missing,
        "ranks": rows,
    }


def over_budget_message(report: dict) -> str | None:
    worst = [r for r in report["ranks"] if not r["within_budget"]]
    if not worst:
        return None
    r = max(worst, key=lambda row: row["measured_peak_bytes"])
    others = f" ({len(worst) - 1} more rank(s) over)" if len(worst) > 1 else ""
    return (f"rank {r['rank']} on {r['host']} peaked at {format_bytes(r['measured_peak_bytes'])}, over the budget of "
            f"{format_bytes(r['budget_bytes'])} by {format_bytes(-r['headroom_bytes'])}; {r['grew_most']} grew most "
            f"(+{format_bytes(r['grew_most_bytes'])} over its prediction){others}")


def render_report(report: dict) -> str:
    head = f"{'rank':>4}  {'host':<12} {'predicted':>10} {'measured':>10} {'budget':>10} {'headroom':>10}  {'verdict':<7} largest"
    lines = [head]
    for r in report["ranks"]:
        verdict = "ok" if r["within_budget"] else "OVER"
        lines.append(
            f"{r['rank']:>4}  {r['host'][:12]:<12} {format_bytes(r['predicted_peak_bytes']):>10} "
            f"{format_bytes(r['measured_peak_bytes']):>10} {format_bytes(r['budget_bytes']):>10} "
            f"{format_bytes(r['headroom_bytes']):>10}  {verdict:<7} {r['largest_category'] or '-'}"
        )
    if report["missing_ranks"]:
        lines.append(f"missing ranks (no memory file): {report['missing_ranks']}")
    lines.append("verdict: " + ("every rank within budget" if report["within_budget"] else "NOT within budget"))
    return "\n".join(lines)


def plot_memory(report: dict, path: Path) -> Path | None:
    """memory.png: per-rank measured peak vs prediction and budget, and the breakdown bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranks = report["ranks"]
    if not ranks:
        return None
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    xs = [r["rank"] for r in ranks]
    gb = 1e9
    ax1.bar([x - 0.2 for x in xs], [r["measured_peak_bytes"] / gb for r in ranks], width=0.4, label="measured")
    ax1.bar([x + 0.2 for x in xs], [r["predicted_peak_bytes"] / gb for r in ranks], width=0.4, label="predicted")
    ax1.axhline(report["budget_bytes"] / gb, color="red", linestyle="--", label="budget")
    ax1.set_xlabel("rank")
    ax1.set_ylabel("GB (1e9 bytes)")
    ax1.set_title("peak per rank")
    ax1.legend()
    cats = list(CATEGORY_GROUPS)
    pred = [sum(report["predicted_breakdown"].get(k, 0) for k in CATEGORY_GROUPS[c][0]) / gb for c in cats]
    meas = [sum(ranks[0]["measured_breakdown"].get(k, 0) for k in CATEGORY_GROUPS[c][1]) / gb for c in cats]
    idx = range(len(cats))
    ax2.barh([i - 0.2 for i in idx], meas, height=0.4, label=f"measured (rank {ranks[0]['rank']})")
    ax2.barh([i + 0.2 for i in idx], pred, height=0.4, label="predicted")
    ax2.set_yticks(list(idx), cats)
    ax2.set_xlabel("GB at peak")
    ax2.set_title("breakdown")
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
