"""A sweep as one Slurm array: submit it, and summarize its variants (the session plans them: launcher.session.sweep).

    RUN/job.yaml  sweep.json  slurm.json  submitit/     the array (slurm.json kind 'array')
    RUN/variants/<k>-<name>/                            one full run dir per variant (slurm.json kind 'array-task')

Variants that cannot be planned are listed with their reason at submit time and in slurm.json ('unplanned');
the others are still submitted. Exit code: 1 if a variant failed, else 130 if one was interrupted, else 3 if one
went over budget, else 2 if one could not be planned, else 0 (without --wait: 2 if any could not be planned).
"""

from __future__ import annotations

import json
from pathlib import Path

from launcher.backends.slurm import make_executor
from launcher.backends.slurm_task import SlurmTask
from launcher.errors import EXIT_BAD_INPUT, EXIT_INTERRUPTED, EXIT_OK, EXIT_OVER_BUDGET, EXIT_TRAINING_FAILED
from launcher.files.rundir import RunDir, slug
from launcher.inputs.variants import Variant
from launcher.records.runreport import read_report
from launcher.units import format_bytes

SEVERITY = (EXIT_TRAINING_FAILED, EXIT_INTERRUPTED, EXIT_OVER_BUDGET, EXIT_BAD_INPUT)
VERDICTS = {EXIT_OK: "ok", EXIT_TRAINING_FAILED: "failed", EXIT_OVER_BUDGET: "OVER budget",
            EXIT_INTERRUPTED: "interrupted", EXIT_BAD_INPUT: "not planned"}


def array_exit_code(codes: list[int]) -> int:
    """The sweep's exit code from its variants': the most severe of failed, interrupted, over budget, not planned;
    else the first other non-zero code, else 0."""
    for code in SEVERITY:
        if code in codes:
            return code
    return next((c for c in codes if c), EXIT_OK)


def submit_array(folder: Path, params: dict, tasks: list[SlurmTask], *, max_requeues: int) -> tuple[Path, list]:
    """(submitit folder, one submitit job per task), submitted as one array."""
    ex = make_executor(folder, params, max_requeues=max_requeues)
    with ex.batch():
        sjobs = [ex.submit(task) for task in tasks]
    return ex.folder, sjobs


def variant_dir(root: Path, v: Variant) -> Path:
    """A variant's run dir under the sweep's root: variants/<index>-<slug of name>."""
    return root / "variants" / f"{v.index}-{slug(v.name)}"


def variant_row(run_dir: Path) -> dict:
    """variant, plan, measured peak, verdict and final loss, from a variant's run dir files."""
    row = {"measured_peak_bytes": None, "final_loss": None, "verdict": "-"}
    state = RunDir(run_dir).run_state().state
    rep = read_report(run_dir)
    if rep is not None and rep.ranks:
        row["measured_peak_bytes"] = max(r.measured_peak_bytes for r in rep.ranks)
        row["final_loss"] = next((r.final_loss for r in rep.ranks if r.rank == 0), None)
    row["verdict"] = {"completed": "ok", "over_budget": "OVER budget"}.get(state, state or "-")
    return row


def summary_table(root: Path) -> str:
    """The sweep's table, one line per variant (job, plan, peak, verdict, final loss), unplanned ones with their
    reason; read from sweep.json and each variant's run dir."""
    sweep = json.loads((root / "sweep.json").read_text())
    lines = [f"{'variant':<28} {'job':>10}  {'plan':<34} {'peak':>10}  {'verdict':<12} {'final loss':>10}"]
    for v in sweep["variants"]:
        r = variant_row(Path(v["run_dir"]))
        peak = format_bytes(r["measured_peak_bytes"]) if r["measured_peak_bytes"] is not None else "-"
        loss = f"{r['final_loss']:.4f}" if isinstance(r["final_loss"], (int, float)) else "-"
        name = f"{v['index']}-{v['name']}"
        lines.append(f"{name[:28]:<28} {v['job_id']:>10}  {v['plan'][:34]:<34} {peak:>10}  {r['verdict']:<12} "
                     f"{loss:>10}")
    for v in sweep["unplanned"]:
        name = f"{v['index']}-{v['name']}"
        lines.append(f"{name[:28]:<28} {'-':>10}  {'-':<34} {'-':>10}  {'not planned':<12} {'-':>10}  {v['reason']}")
    return "\n".join(lines)
