"""benchmarks/results/gpu.md from the run dirs scripts/gpu-check.sh made: predicted vs measured per moment.

    python -m benchmarks.gpu.report --out benchmarks/results/gpu.md --tests-rc 0 --run RUN_DIR RC [--run ...]

Each run's predicted moments are its plan.json ``moment_bytes``; each is set beside the measured phase peak that
benchmarks/accuracy judges it by (compare.moment_totals, compare.MOMENT_PHASES), for the rank that used the most.
Both sides are on the run's verdict basis: on CUDA reserved plus what lies outside the allocator (context, NCCL),
"cuda_reserved_plus_context"; a run on any other basis is flagged, since the GPU check is about that one.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from benchmarks.accuracy.compare import moment_totals, rel
from benchmarks.accuracy.harness import rank_files, read_json
from benchmarks.gpu.splits import (
    GPU_VALIDATION_1,
    GPU_VALIDATION_2,
    GPU_VALIDATION_3,
    GPU_VALIDATION_4,
    GPU_VALIDATION_5,
    GPU_VALIDATION_6,
    GPU_VALIDATION_7,
    GPU_VALIDATION_8,
    MOMENT_TOLERANCE,
    OUTSIDE_TOLERANCE,
    PEAK_TOLERANCE,
    RESERVE_TOLERANCE,
)
from launcher.planner.cuda_overhead import OUTSIDE_ALLOCATOR, absent_at
from launcher.planner.plan import Plan
from launcher.records.report import predicted_on_basis
from launcher.records.runreport import read_report
from launcher.units import format_bytes

CUDA_BASIS = "cuda_reserved_plus_context"
INIT_ABSENT_SCHEMA = 2
"""The plan.json schema from which the init moment leaves out the cuBLAS workspace and kernels."""


def allocated_moments(plan: dict) -> dict[str, int]:
    """plan.json's moments on the allocated basis: each moment less what lies outside the allocator and less the
    allocator reserve and side-stream pools it was given (memory.py adds cuda_overhead(tensors) per moment; the
    pools are plan.json's moment_stream_pool_bytes; the reserve is the profile's
    fragmentation share of the moment's tensors, read back from the plan's own peak, so a calibrated profile's
    share is the one used). On CUDA the reserved-basis phase peaks cannot tell moments apart (reserved segments
    stay cached, so every phase after the largest reads the largest); allocated ones can."""
    ov = plan.get("overhead") or {}
    tensors = plan.get("predicted_peak_bytes", 0) - (plan.get("breakdown") or {}).get("reserve", 0)
    if not ov or tensors <= 0:
        return {}
    pools = plan.get("moment_stream_pool_bytes") or {}  # FSDP2's side-stream pools: reserved, not allocated
    fragmentation = ov.get("allocator_reserve", 0) / tensors
    out = {}
    for m, v in (plan.get("moment_bytes") or {}).items():
        # The init moment has no cuBLAS workspace or kernels yet (cuda_overhead.absent_at); plans from before that
        # rule counted them there too, so a plan's own init is read as it was made.
        absent = absent_at(m) if plan.get("schema", 0) >= INIT_ABSENT_SCHEMA else ()
        outside = sum(ov.get(k, 0) for k in OUTSIDE_ALLOCATOR if k not in absent)
        blas = 0 if "cublas_workspace" in absent else ov.get("cublas_workspace", 0)
        out[m] = int((v - pools.get(m, 0) - outside - blas) / (1 + fragmentation) + blas)
    return out


def run_row(run_dir: Path, returncode: int) -> dict:
    """What one run shows in the table: its verdict, peak and every predicted moment beside its measured phase."""
    plan, report = read_json(run_dir / "plan.json"), read_report(run_dir)
    row: dict = {"run": run_dir.name, "run_dir": str(run_dir), "returncode": returncode}
    if plan is None or report is None or not report.ranks:
        row["problem"] = "no plan.json or report.json with ranks: the run stopped before its verdict"
        return row
    worst = max(report.ranks, key=lambda r: r.measured_peak_bytes)
    rank = rank_files(run_dir).get(worst.rank)
    ov = plan.get("overhead") or {}
    # The measured maxima need not come from one moment: reserved peaks at the verdict's moment, allocated at the
    # largest tensor moment, which a side-stream pool may have made another (plan.json tensor_peak_bytes). So the
    # allocated peak is predicted as launcher.records.report does for that basis, and reserved - allocated as the
    # difference of the two peaks, not the allocator_reserve + stream_pools of the verdict's moment alone.
    planned = Plan.from_json(plan)
    allocated = predicted_on_basis(planned, "cuda_allocated")
    row.update(
        allocated_bytes=worst.max_memory_allocated_bytes, reserved_bytes=worst.max_memory_reserved_bytes,
        outside_bytes=worst.outside_allocator_bytes, predicted_outside_bytes=sum(ov.get(k, 0)
                                                                                 for k in OUTSIDE_ALLOCATOR),
        predicted_allocated_bytes=allocated,
        predicted_cache_bytes=predicted_on_basis(planned, "cuda_reserved") - allocated,
        allocated_moments=moment_totals(allocated_moments(plan), rank.phases_allocated or {} if rank else {}),
        engine=plan.get("engine"), label=plan.get("label"), world_size=plan.get("world_size"),
        basis=report.basis, within_budget=report.within_budget, worst_rank=worst.rank,
        predicted_peak_bytes=plan.get("predicted_peak_bytes"), measured_peak_bytes=worst.measured_peak_bytes,
        moments=moment_totals(plan.get("moment_bytes") or {}, rank.phases if rank else {}),
    )
    if row["basis"] != CUDA_BASIS:
        row["problem"] = f"verdict basis {row['basis']!r}, not {CUDA_BASIS!r}: not a CUDA run"
    return row


def _bytes(n: int | None) -> str:
    return "-" if n is None else format_bytes(n)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.1%}"


def render(rows: list[dict], *, tests_rc: int | None, machine: str) -> str:
    """The markdown page: the tests/gpu outcome, one verdict line per run, then predicted vs measured per moment."""
    out = ["# GPU check", "", f"Written by `scripts/gpu-check.sh` on {machine}.", ""]
    if tests_rc is not None:
        out += [f"`pytest tests/gpu`: {'passed' if tests_rc == 0 else f'FAILED (exit {tests_rc})'}.", ""]
    out += ["## Runs (`launch --enforce`)", "",
            "| run | plan | ranks | exit | verdict | basis | predicted peak | measured peak (worst rank) | error |",
            "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "moments" not in r:
            out.append(f"| {r['run']} | - | - | {r['returncode']} | - | - | - | - | {r['problem']} |")
            continue
        verdict = "within budget" if r["within_budget"] else "OVER BUDGET"
        err = None
        if r["predicted_peak_bytes"] and r["measured_peak_bytes"]:
            err = (r["predicted_peak_bytes"] - r["measured_peak_bytes"]) / r["measured_peak_bytes"]
        out.append(f"| {r['run']} | {r['label']} | {r['world_size']} | {r['returncode']} | {verdict} | {r['basis']} | "
                   f"{_bytes(r['predicted_peak_bytes'])} | {_bytes(r['measured_peak_bytes'])} (rank "
                   f"{r['worst_rank']}) | {_pct(err)} |")
    out += ["", "## Where the peak is: allocated, the allocator's cache, outside the allocator", "",
            "Measured on the worst rank (max_memory_allocated, max_memory_reserved - allocated, device used - "
            "reserved at its largest) beside the plan's: the largest tensor moment with the cuBLAS workspace "
            "(`tensor_peak_bytes` where a side-stream pool made the peak another moment); the reserved peak less it "
            "(allocator_reserve and stream_pools at the peak, less what the tensor peak exceeds the peak's tensors "
            "by); "
            "the terms outside the allocator: cuda_context, cuda_kernels, nccl_communicators, nccl_buffers.", "",
            "| run | allocated | predicted allocated | reserved - allocated | (share of allocated) | "
            "predicted reserved - allocated | outside allocator | predicted outside |",
            "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.get("allocated_bytes") is None:
            continue
        cache = r["reserved_bytes"] - r["allocated_bytes"]
        out.append(f"| {r['run']} | {_bytes(r['allocated_bytes'])} | {_bytes(r.get('predicted_allocated_bytes'))} | "
                   f"{_bytes(cache)} | "
                   f"{cache / r['allocated_bytes']:.1%} | {_bytes(r.get('predicted_cache_bytes'))} | "
                   f"{_bytes(r['outside_bytes'])} | "
                   f"{_bytes(r['predicted_outside_bytes'])} |")
    out += _moment_table(rows, "allocated_moments", "allocated basis",
                         "Each moment of `plan.json` `moment_bytes` less its overhead terms (`allocated_moments`) "
                         "against the measured phase peak of torch.cuda.max_memory_allocated (`phases_allocated`) "
                         "that benchmarks/accuracy judges it by (`MOMENT_PHASES`).")
    out += _moment_table(rows, "moments", "verdict basis",
                         "Each moment of `plan.json` `moment_bytes` against the measured phase peak that "
                         "benchmarks/accuracy judges it by (`MOMENT_PHASES`), on the rank that used the most; error = "
                         "(predicted - measured) / measured.")
    out += judge_split(rows)
    problems = [f"- {r['run']}: {r['problem']}" for r in rows if r.get("problem")]
    if problems:
        out += ["", "## Problems", "", *problems]
    return "\n".join(out) + "\n"


def _moment_table(rows: list[dict], key: str, basis: str, intro: str) -> list[str]:
    """One section of the page: every run's moments under ``key`` (moment_totals rows) on ``basis``."""
    out = ["", f"## Predicted vs measured per moment, {basis}", "",
           f"{intro} A phase peak is its largest moment, so of two moments in one phase (backward, backward_end) the "
           "smaller reads low.", "",
           "| run | moment | predicted | measured phase | measured | error |", "|---|---|---|---|---|---|"]
    for r in rows:
        for moment, m in (r.get(key) or {}).items():
            out.append(f"| {r['run']} | {moment} | {_bytes(m['predicted_bytes'])} | {m['measured_phase'] or '-'} | "
                       f"{_bytes(m['measured_bytes'])} | {_pct(m['error'])} |")
    return out


def judge_split(rows: list[dict]) -> list[str]:
    """The runs of each split in benchmarks/gpu/splits.py among ``rows``, judged by its criteria (lines of the page)."""
    out = []
    for name, runs, reserve, by_phase in (("GPU_VALIDATION_1", GPU_VALIDATION_1, False, False),
                                          ("GPU_VALIDATION_2", GPU_VALIDATION_2, True, False),
                                          ("GPU_VALIDATION_3", GPU_VALIDATION_3, False, True),
                                          ("GPU_VALIDATION_4", GPU_VALIDATION_4, False, True),
                                          ("GPU_VALIDATION_5", GPU_VALIDATION_5, False, True),
                                          ("GPU_VALIDATION_6", GPU_VALIDATION_6, False, True),
                                          ("GPU_VALIDATION_7", GPU_VALIDATION_7, False, True),
                                          ("GPU_VALIDATION_8", GPU_VALIDATION_8, False, True)):
        named = [r for r in rows if r["run"] in runs and "moments" in r]
        if named:
            out += _judge(name, named, reserve, by_phase)
    return out


def _judge(name: str, named: list[dict], reserve: bool, by_phase: bool = False) -> list[str]:
    """One split's table; ``by_phase``: its moment criterion reads each phase against its largest predicted moment
    (GPU_VALIDATION_3's, committed so), else every moment (the earlier splits')."""
    out = ["", f"## Validation split {name} (benchmarks/gpu/splits.py, named before it ran)", "",
           "| run | outside: predicted / measured | peak error | worst allocated moment | worst allocated phase | "
           f"{'reserved - allocated: predicted / measured | ' if reserve else ''}within the criteria |",
           f"|---|---|---|---|---|{'---|' if reserve else ''}---|"]
    for r in named:
        if r["returncode"] != 0:  # stopped before its end (a time box, an OOM): its peaks are not the run's
            out.append(f"| {r['run']} | - | - | - | - | {'- | ' if reserve else ''}not judged: exit {r['returncode']} "
                       "|")
            continue
        outside = rel(r["predicted_outside_bytes"], r["outside_bytes"])
        peak = rel(r["predicted_peak_bytes"], r["measured_peak_bytes"])
        errs = [m["error"] for m in r["allocated_moments"].values() if m["error"] is not None]
        worst = max(errs, key=abs) if errs else None
        phase_errs = list(phase_errors(r["allocated_moments"]).values())
        worst_phase = max(phase_errs, key=abs) if phase_errs else None
        # GPU_VALIDATION_1/_2's committed criterion reads every moment; the phase column is how the page's own note
        # says to read it (a phase's smaller moment reads low). Both are shown; "within" keeps each split's own.
        judged = worst_phase if by_phase else worst
        ok = (outside is not None and abs(outside) <= OUTSIDE_TOLERANCE and peak is not None
              and abs(peak) <= PEAK_TOLERANCE and judged is not None and abs(judged) <= MOMENT_TOLERANCE)
        cells = ""
        if reserve:
            cache = r["reserved_bytes"] - r["allocated_bytes"]
            err = rel(r["predicted_cache_bytes"], cache)
            ok = ok and err is not None and abs(err) <= RESERVE_TOLERANCE
            cells = f"{_bytes(r['predicted_cache_bytes'])} / {_bytes(cache)} ({_pct(err)}) | "
        out.append(f"| {r['run']} | {_bytes(r['predicted_outside_bytes'])} / {_bytes(r['outside_bytes'])} "
                   f"({_pct(outside)}) | {_pct(peak)} | {_pct(worst)} | {_pct(worst_phase)} | "
                   f"{cells}{'yes' if ok else 'NO'} |")
    return out


def phase_errors(moments: dict[str, dict]) -> dict[str, float]:
    """Each measured phase against the largest moment predicted in it: a phase peak is its largest moment, so this
    is the comparison a phase can make (moment_totals rows in, relative error per phase out)."""
    best: dict[str, dict] = {}
    for m in moments.values():
        phase = m.get("measured_phase")
        if phase and m.get("measured_bytes") and (phase not in best
                                                  or m["predicted_bytes"] > best[phase]["predicted_bytes"]):
            best[phase] = m
    return {phase: (m["predicted_bytes"] - m["measured_bytes"]) / m["measured_bytes"] for phase, m in best.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.gpu.report", description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="the markdown file to write")
    ap.add_argument("--tests-rc", type=int, default=None, help="exit status of pytest tests/gpu")
    ap.add_argument("--machine", default="this machine", help="what ran it, e.g. the GPU's name and count")
    ap.add_argument("--run", nargs=2, action="append", default=[], metavar=("RUN_DIR", "RC"),
                    help="a run dir and the exit status of its launch (repeat)")
    a = ap.parse_args(argv)
    rows = [run_row(Path(d), int(rc)) for d, rc in a.run]
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(render(rows, tests_rc=a.tests_rc, machine=a.machine))
    print(f"wrote {a.out}")
    bad = [r for r in rows if r.get("problem") or r["returncode"] != 0]
    return 1 if bad or (a.tests_rc or 0) != 0 else 0


if __name__ == "__main__":
    sys.exit(main())
