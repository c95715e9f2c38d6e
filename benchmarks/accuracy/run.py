"""Accuracy matrix: real 2-rank runs through `launch`, each rank's measured peak against three predictions.

    .venv/bin/python benchmarks/accuracy/run.py                  # every cell (cells.py), ~25 min on 2 idle cores
    .venv/bin/python benchmarks/accuracy/run.py --quick          # 4 cells, a few minutes
    .venv/bin/python benchmarks/accuracy/run.py --cells z3-,minilm fsdp-gpt2s-noac-mb1-s32
    .venv/bin/python benchmarks/accuracy/run.py --replan         # re-predict the stored runs, run nothing
    .venv/bin/python benchmarks/accuracy/run.py --list

Writes benchmarks/results/accuracy.{md,json,png} for the full matrix, accuracy-quick.* for --quick,
accuracy-partial.* for other subsets (or --stem NAME), and prints the per-category comparison. Predictions
always come from the planner as it is when the results are written (the same plan `launch plan` prints for the
cell's job, strategy pinned), so every row uses one planner version even while memory.py is being edited; the
plan the run itself used is kept as predicted_at_run_bytes. Run dirs stay under runs/bench/accuracy/<cell>, so
`launch calibrate --from runs/bench/accuracy/*` can refit activation constants from them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.accuracy.cells import (  # noqa: E402
    BUDGET,
    QUICK,
    STEPS,
    VALIDATION,
    every_cell,
    full_matrix,
    select,
    sides_of_all,
    split_salt,
)
from benchmarks.accuracy.compare import analyze, moment_summary, rel, summary  # noqa: E402
from benchmarks.accuracy.fit_split import cell_samples, fit_on_split, refit_peak_bytes  # noqa: E402
from benchmarks.accuracy.harness import (  # noqa: E402
    BENCH_CACHE,
    RESULTS,
    RUNS,
    bench_env,
    launch,
    log,
    machine,
    read_json,
    step_times_s,
    write_job,
)
from benchmarks.accuracy.render import SIDES, category_table, markdown, plot  # noqa: E402

ROOT = RUNS / "accuracy"


def replan(run_dir: Path) -> dict | None:
    """The current planner's plan for the run's job (the strategy is fully pinned, so it is the same strategy)."""
    import os

    from launcher.calibrate.runs import run_job
    from launcher.inputs.plan_inputs import plan_job

    if not (run_dir / "job.yaml").is_file():
        return None
    os.environ.update({k: v for k, v in bench_env().items() if k == "LAUNCHER_CACHE"})
    job = run_job(run_dir)
    return plan_job(job, force=True).to_json()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK)}")
    ap.add_argument("--cells", nargs="+", metavar="PATTERN",
                    help="cells named so, or containing every comma-separated part (z3-,minilm)")
    ap.add_argument("--replan", action="store_true",
                    help="run nothing: re-predict the stored runs with the current planner and rewrite the results")
    ap.add_argument("--reuse", action="store_true", help="skip cells whose run dir already holds a report")
    ap.add_argument("--stem", help="output name under benchmarks/results (default accuracy or accuracy-partial)")
    ap.add_argument("--list", action="store_true", help="print the cells and exit")
    ap.add_argument("--validation", action="store_true", help="only the validation cells (cells.VALIDATION)")
    args = ap.parse_args(argv)

    cells = every_cell()
    chosen = select(cells, list(QUICK)) if args.quick else select(cells, args.cells)
    if args.validation:
        chosen = [c for c in chosen if c in VALIDATION]
    if args.list:
        print("\n".join(c.name for c in chosen))
        return 0
    if not chosen:
        log(f"no cell matches {args.cells}; --list shows them")
        return 2
    stem = args.stem or ("accuracy" if len(chosen) == len(cells) else "accuracy-quick" if args.quick
                         else "accuracy-partial")
    sides = sides_of_all()
    budgets = sorted({c.budget for c in chosen})
    meta = {**machine(), "steps": STEPS, "budget": budgets[0] if budgets == [BUDGET]
            else f"{', '.join(budgets)} per cell",
            "ranks": sorted({c.ranks for c in chosen}), "stem": stem,
            "replanned": args.replan, "cache": str(BENCH_CACHE), "split_salt": split_salt(full_matrix()),
            "safety_margin": 0.05}
    meta["measured_time"] = meta["time"]
    if args.replan:  # the runs are older than the predictions: keep when they were measured
        previous = read_json(RESULTS / f"{stem}.json") or {}
        meta["measured_time"] = previous.get("meta", {}).get("measured_time") or previous.get("meta", {}).get("time")
    rows, failures = [], []
    for i, cell in enumerate(chosen, 1):
        run_dir = ROOT / cell.name
        if not args.replan and not (args.reuse and (run_dir / "report.json").is_file()):
            job_file = write_job(cell.job(), ROOT / "jobs" / f"{cell.name}.yaml")
            log(f"[{i}/{len(chosen)}] {cell.name} ...")
            res = launch(job_file, run_dir, gpus=cell.ranks, budget=cell.budget, timeout_s=1500)
            log(f"    exit {res.returncode} in {res.wall_s:.0f} s")
            if res.returncode != 0:
                failures.append({"cell": cell.name, "exit": res.returncode, "tail": res.output_tail})
        try:
            plan = replan(run_dir)
        except Exception as e:  # a planner mid-edit must not lose the measurements: keep the run's own plan
            log(f"    {cell.name}: replanning failed ({type(e).__name__}: {e}); using the run's plan.json")
            plan = None
        row = analyze(cell, run_dir, plan)
        if row is None:
            log(f"    {cell.name}: no report in {run_dir}; skipped")
            continue
        at_run = read_json(run_dir / "plan.json") or {}
        row["predicted_at_run_bytes"] = at_run.get("predicted_peak_bytes")
        row["replanned"] = plan is not None
        row["step_time_s"] = step_times_s(run_dir)
        row["split"] = sides[cell.name]
        rows.append(row)
    if not rows:
        log("no finished runs to report")
        return 1
    # The one fitted quantity: activation scales, fitted on the fit cells' ranks only, then applied to every cell.
    samples = {r["cell"]: cell_samples(Path(r["run_dir"])) for r in rows}
    scales = fit_on_split(samples, sides) if any(samples[c] for c in samples if sides.get(c) == "fit") else {}
    meta["activation_scales"] = scales
    for r in rows:
        refit = refit_peak_bytes(samples[r["cell"]], scales) if scales else None
        r["predicted"]["refit"] = refit
        r["errors"]["refit"] = rel(refit, r["measured_peak_bytes"])
    by_split = {side: summary([r for r in rows if r["split"] == side]) for side in SIDES}
    moments = {side: moment_summary([r for r in rows if r["split"] == side]) for side in SIDES}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{stem}.json").write_text(json.dumps(
        {"meta": meta, "summary": summary(rows), "summary_by_split": by_split, "moments_by_split": moments,
         "rows": rows, "failures": failures}, indent=1, default=str) + "\n")
    (RESULTS / f"{stem}.md").write_text(markdown(rows, meta))
    plot(rows, RESULTS / f"{stem}.png")
    for moment in ("backward", "optimizer_step", None):
        print(f"# {moment or 'peak'}: predicted / measured MB")
        print(category_table(rows, moment))
        print()
    for side, summ in by_split.items():
        for est, s in summ.items():
            print(f"{side:<10} {est:<11} median |err| {s['median_abs']:6.1%}  max |err| {s['max_abs']:6.1%}  "
                  f"median signed {s['median_signed']:+6.1%}  under-predicted {s['under']}/{s['cells']}  "
                  f"worst under {s['worst_under']:+.1%}")
    print(f"activation scales fitted on the fit split: {scales}")
    print(f"wrote {RESULTS / (stem + '.md')}, .json, .png")
    if failures:
        log(f"{len(failures)} run(s) failed: {', '.join(f['cell'] for f in failures)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
