"""Re-predict the measured rows of stored accuracy results where their run dirs are gone, and say what moved.

`run.py --replan` re-predicts from the run dirs under runs/bench/accuracy, which are git-ignored and exist only where
the cells ran. The results files keep what a replan needs: each row's cell (its job, ranks and budget) and its
measured peak. This plans each cell's job with the current planner (in-process, the benchmarks' cache) and keeps the
stored measurement, so a change to the memory model can be judged on every stored run without running any:

    .venv/bin/python benchmarks/accuracy/restored.py --cells z1- z2- --out /tmp/before.json
    ... change the planner ...
    .venv/bin/python benchmarks/accuracy/restored.py --cells z1- z2- --out /tmp/after.json
    .venv/bin/python benchmarks/accuracy/restored.py --compare /tmp/before.json /tmp/after.json --md OUT.md

A row is one (results file, cell); the same cell measured in several files is kept per file (their workers differ).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.accuracy.cells import every_cell, select  # noqa: E402
from benchmarks.accuracy.compare import rel  # noqa: E402
from benchmarks.accuracy.harness import BENCH_CACHE, RESULTS, git_blob, log  # noqa: E402


def stored_rows(patterns: list[str] | None) -> list[tuple[str, dict]]:
    """(results file stem, row) of every stored accuracy row whose cell still exists and matches ``patterns``."""
    names = {c.name for c in select(every_cell(), patterns)}
    out = []
    for path in sorted(RESULTS.glob("accuracy*.json")):
        for row in json.loads(path.read_text()).get("rows", []):
            if row.get("cell") in names and row.get("measured_peak_bytes"):
                out.append((path.stem, row))
    return out


def predict(patterns: list[str] | None) -> dict:
    """The current planner's peak and moments for every stored row, beside the row's measurement."""
    from launcher.config.jobfile import job_from_data
    from launcher.inputs.plan_inputs import plan_job

    os.environ["LAUNCHER_CACHE"] = str(BENCH_CACHE)
    cells = {c.name: c for c in every_cell()}
    plans: dict[str, dict] = {}
    rows = []
    for stem, row in stored_rows(patterns):
        cell = cells[row["cell"]]
        if cell.name not in plans:
            log(f"planning {cell.name}")
            job = job_from_data({**cell.job(), "gpus": cell.ranks, "budget": cell.budget}, ".")
            plans[cell.name] = plan_job(job, force=True).to_json()
        plan = plans[cell.name]
        measured = row["measured_peak_bytes"]
        rows.append({"file": stem, "cell": cell.name, "measured_bytes": measured,
                     "measured_per_rank": row.get("measured_per_rank"),
                     "stored_predicted_bytes": row["predicted"]["planner"],
                     "predicted_bytes": plan["predicted_peak_bytes"], "moment_bytes": plan["moment_bytes"],
                     "error": rel(plan["predicted_peak_bytes"], measured)})
    return {"planner_memory_sha": git_blob(Path(__file__).resolve().parents[2] / "launcher/planner/memory.py"),
            "rows": rows}


def compare(before: dict, after: dict) -> str:
    """A markdown table of the rows whose prediction moved between two predict() outputs."""
    old = {(r["file"], r["cell"]): r for r in before["rows"]}
    lines = ["| results file | cell | measured MB | before MB | error | after MB | error | moment that moved |",
             "|---|---|---|---|---|---|---|---|"]
    moved = both = 0
    for r in after["rows"]:
        b = old.get((r["file"], r["cell"]))
        both += b is not None
        if b is None or b["predicted_bytes"] == r["predicted_bytes"] and b["moment_bytes"] == r["moment_bytes"]:
            continue
        moved += 1
        which = [k for k in r["moment_bytes"] if r["moment_bytes"][k] != b["moment_bytes"].get(k)]
        lines.append(f"| {r['file']} | {r['cell']} | {r['measured_bytes'] / 1e6:.2f} | "
                     f"{b['predicted_bytes'] / 1e6:.2f} | {b['error']:+.1%} | {r['predicted_bytes'] / 1e6:.2f} | "
                     f"{r['error']:+.1%} | {', '.join(which)} |")
    head = (f"{moved} of {both} stored rows moved (planner memory.py `{before['planner_memory_sha']}` -> "
            f"`{after['planner_memory_sha']}`); a row whose peak and moments are unchanged is left out, and so is a "
            "row "
            "the first file lacks.")
    return "\n".join([head, "", *lines]) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cells", nargs="+", metavar="PATTERN", help="as run.py --cells (default: every cell)")
    ap.add_argument("--out", type=Path, help="write the predictions here (JSON)")
    ap.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"), help="two --out files")
    ap.add_argument("--md", type=Path, help="with --compare: write the table here too")
    args = ap.parse_args(argv)
    if args.compare:
        table = compare(*(json.loads(p.read_text()) for p in args.compare))
        print(table)
        if args.md:
            args.md.write_text(table)
        return 0
    result = predict(args.cells)
    text = json.dumps(result, indent=1) + "\n"
    if args.out:
        args.out.write_text(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
