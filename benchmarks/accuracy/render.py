"""accuracy.md, accuracy.png and the per-category table printed to stdout."""

from __future__ import annotations

from pathlib import Path

from benchmarks.accuracy.cells import SHARDING_LABEL
from benchmarks.accuracy.compare import ESTIMATORS, GOAL, GROUPS, TRAINING_PHASES, category_bias, summary, wrong_terms

COLORS = {"planner": "tab:blue", "deepspeed": "tab:orange", "accelerate": "tab:green"}
NAMES = {"planner": "launch plan", "deepspeed": "DeepSpeed estimator", "accelerate": "accelerate estimate-memory"}


def mb(n: float | None) -> str:
    return "-" if n is None else f"{n / 1e6:.2f}"


def pct(e: float | None) -> str:
    return "-" if e is None else f"{e:+.0%}" if abs(e) >= 0.995 else f"{e:+.1%}"


def category_table(rows: list[dict], moment: str | None = None) -> str:
    """Predicted / measured MB per category group, one line per cell: at the measured peak (moment None) or at
    one planner moment against the matching measured phase. What a refit of memory.py works from."""
    groups = list(GROUPS)
    title = "total pred/meas MB" if moment else "peak pred/meas MB"
    head = f"{'cell':<38} {title:>19} " + " ".join(f"{g + ' p/m':>17}" for g in groups)
    lines = [head, "-" * len(head)]
    for r in rows:
        if moment is None:
            c = r["categories_at_peak"]
            peak = f"{mb(r['predicted']['planner'])}/{mb(r['measured_peak_bytes'])}"
        else:
            m = (r.get("moments") or {}).get(moment)
            if not m:
                continue
            c = m["categories"]
            peak = f"{mb(m['predicted_bytes'])}/{mb(m['measured_bytes'])}"
        cells = " ".join(f"{mb(c[g]['predicted']) + '/' + mb(c[g]['measured']):>17}" for g in groups)
        lines.append(f"{r['cell']:<38} {peak:>19} {cells}")
    return "\n".join(lines)


def markdown(rows: list[dict], meta: dict) -> str:
    s = summary(rows)
    out = [
        "# Memory prediction accuracy: `launch plan` vs DeepSpeed's and accelerate's estimators",
        "",
        f"Measured {meta.get('measured_time') or meta['time']} on {meta['cores']} cores ({meta['machine']}), 2 CPU "
        "ranks (gloo), bf16, "
        f"{meta['steps']} optimizer steps per run, budget {meta['budget']} (never reached). Planner: "
        f"launcher/planner/memory.py blob `{meta['planner_memory_sha']}`"
        + (f" (stored runs re-predicted {meta['time']}: `--replan`)." if meta.get("replanned") else "."),
        "Rerun: `.venv/bin/python benchmarks/accuracy/run.py` (all cells) or `--quick` (4 cells); "
        "`--replan` re-predicts the stored runs with the current planner without running them.",
        "",
        "Measured = the largest per-rank peak over the whole run (report.json `measured_peak_bytes`, tracked tensor "
        "bytes: on CPU ranks every tensor a rank holds, offloaded optimizer state included). Error = (predicted - "
        "measured) / measured: negative means the estimator promised less memory than the run used. "
        "DeepSpeed and accelerate count model states only; that gap is the point of the comparison.",
        "",
        "| cell | plan | peak phase | measured MB | launch plan MB | err | DeepSpeed MB | err | accelerate MB | err |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        p, e = r["predicted"], r["errors"]
        phase = r["peak_phase"] or "-"
        if phase not in TRAINING_PHASES:
            phase = f"**{phase}**"
        ds_mark = "†" if "analogue" in r["deepspeed_row"] else ""
        out.append(
            f"| {r['cell']} | {r['label']} | {phase} | {mb(r['measured_peak_bytes'])} | {mb(p['planner'])} | "
            f"{pct(e['planner'])} | {mb(p['deepspeed'])}{ds_mark} | {pct(e['deepspeed'])} | {mb(p['accelerate'])} | "
            f"{pct(e['accelerate'])} |")
    out += ["", "† FSDP2 has no DeepSpeed estimator: the nearest row (full-shard ~ ZeRO-3, grad-op ~ ZeRO-2). "
            "**Bold** peak phase: the run's peak fell outside forward/backward/optimizer_step.", "",
            "## Summary", "",
            "| estimator | cells | median abs error | max abs error | median signed | under-predicted | within 10 % |",
            "|---|---|---|---|---|---|---|"]
    for est in ESTIMATORS:
        if est in s:
            x = s[est]
            out.append(f"| {NAMES[est]} | {x['cells']} | {x['median_abs']:.1%} | {x['max_abs']:.1%} | "
                       f"{x['median_signed']:+.1%} | {x['under']} | {x['within_goal']} |")
    ds_only = [r for r in rows if "analogue" not in r["deepspeed_row"]]
    if ds_only and len(ds_only) != len(rows):
        d = summary(ds_only)["deepspeed"]
        out.append(f"| DeepSpeed estimator, DeepSpeed cells only | {d['cells']} | {d['median_abs']:.1%} | "
                   f"{d['max_abs']:.1%} | {d['median_signed']:+.1%} | {d['under']} | {d['within_goal']} |")
    out += ["", "## Which planner terms are off", "",
            "The planner takes the peak as the largest of three moments (memory.py): the backward start (states, "
            "saved activations, logits and loss temporaries), the gradient reduce (ZeRO-1/2's bucket, ZeRO-3's and "
            "FSDP2's end of backward) and the optimizer step (states plus the step's gradients and fp32 copies). "
            "Two are compared here with the matching measured phase: the backward start against the larger of the "
            "forward and backward phase peaks, the step against the optimizer_step phase peak "
            "(`benchmarks/accuracy/moments.py`).",
            "", "| cell | planner's peak | run's peak | backward: pred / meas MB | err | step: pred / meas MB | err | "
            "pred. offloaded MB |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        m = r.get("moments")
        if not m:
            out.append(f"| {r['cell']} | {r['planner_moment']} | {r['peak_phase']} | - | - | - | - | - |")
            continue
        b, st = m["backward"], m["optimizer_step"]
        out.append(f"| {r['cell']} | {r['planner_moment']} | {r['peak_phase']} | {mb(b['predicted_bytes'])} / "
                   f"{mb(b['measured_bytes'])} | {pct(b['error'])} | {mb(st['predicted_bytes'])} / "
                   f"{mb(st['measured_bytes'])} | {pct(st['error'])} | {mb(b['predicted_offloaded_bytes'])} |")
    out += ["", "Per category group (report.CATEGORY_GROUPS: activations = activations + logits predicted, "
            "activations + temp measured; buffers = buffers predicted, buffers + other measured; offloaded = what "
            "the planner moves to the host, which on CPU ranks stays in the rank's memory and is measured as "
            "optimizer and grads): median of predicted / measured (where the measured bytes are over 1 % of the "
            "peak) and median signed difference (predicted - measured), per engine and moment:", ""]
    for moment, title in (("backward", "backward start"), ("optimizer_step", "optimizer step"), (None, "measured peak")):
        bias = category_bias(rows, moment)
        if not bias:
            continue
        out += [f"At the {title}:", "", "| engine | " + " | ".join(GROUPS) + " |",
                "|---|" + "---|" * len(GROUPS)]
        for fam, cats in bias.items():
            cells = []
            for g in GROUPS:
                c = cats[g]
                ratio = "-" if c["median_ratio"] is None else f"x{c['median_ratio']:.2f}"
                cells.append(f"{ratio}, {c['median_diff_bytes'] / 1e6:+.2f} MB")
            out.append(f"| {fam} | " + " | ".join(cells) + " |")
        out.append("")
    bad = [r for r in rows if r["errors"]["planner"] is not None and abs(r["errors"]["planner"]) > GOAL]
    out += [f"Cells where `launch plan` is off by more than {GOAL:.0%}, and the terms that make up the gap at the "
            "moment the run peaked (+ = predicted more than measured):", ""]
    if not bad:
        out.append("- none")
    for r in bad:
        out.append(f"- `{r['cell']}` ({pct(r['errors']['planner'])}; planner's peak {r['planner_moment']}, run's "
                   f"peak {r['peak_phase']}): {wrong_terms(r)}")
    out += ["", "Per-category numbers for every cell, predicted / measured MB:", "", "```"]
    for moment, title in (("backward", "backward start vs max(forward, backward) phase"),
                          ("optimizer_step", "optimizer step vs optimizer_step phase"),
                          (None, "planner's peak vs the run's peak")):
        out += [f"# {title}", category_table(rows, moment), ""]
    out += ["```", "", "Raw numbers (per rank, per phase breakdowns, estimator rows): `benchmarks/results/"
            f"{meta['stem']}.json`. Plot: `{meta['stem']}.png`.", ""]
    return "\n".join(out)


def plot(rows: list[dict], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 6))
    xs_all = []
    for est in ESTIMATORS:
        pts = [(r["measured_peak_bytes"] / 1e6, r["predicted"][est] / 1e6) for r in rows if r["predicted"].get(est)]
        if not pts:
            continue
        xs, ys = zip(*pts, strict=True)
        xs_all += list(xs) + list(ys)
        ax.scatter(xs, ys, s=28, alpha=0.8, color=COLORS[est], label=NAMES[est])
    lo, hi = min(xs_all) * 0.7, max(xs_all) * 1.4
    ax.plot([lo, hi], [lo, hi], color="black", lw=1, label="y = x")
    ax.fill_between([lo, hi], [lo * (1 - GOAL), hi * (1 - GOAL)], [lo * (1 + GOAL), hi * (1 + GOAL)],
                    color="grey", alpha=0.15, label="±10 %")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured peak per rank (MB)")
    ax.set_ylabel("predicted (MB)")
    ax.set_title(f"Peak memory per rank: {len(rows)} runs, 2 CPU ranks")
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(True, which="both", alpha=0.2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def sharding_label(key: str) -> str:
    return SHARDING_LABEL.get(key, key)
