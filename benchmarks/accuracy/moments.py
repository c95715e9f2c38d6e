"""The planner's prediction at its backward-start and optimizer-step moments, not only at the largest one.

memory.py takes the peak as the larger of the backward start (states + activations + logits) and the optimizer
step (states + the step's gradients and fp32 copies), and reports the breakdown of the larger only. When the run
peaks at the other moment, comparing categories at the peak mixes two moments. Both are recovered through the
planner's public entry (search.score) alone:

  step moment      the same request with every activation constant at 0 (the step has no activations, so
                   whichever moment wins then, the states are those of the step);
  backward moment  with the constants scaled up (launcher.calibrate.runs.SCALE), so the backward start wins,
                   then its activation and logits bytes replaced by the real ones (the scaled ones divided back).
If memory.py stops having that shape the moments are left out (None) rather than guessed.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

ACT_KEYS = ("activations", "logits")


def predicted_moments(run_dir: Path) -> dict[str, dict[str, int]] | None:
    from launcher.calibrate.profiles import numeric_fields
    from launcher.calibrate.runs import SCALE, activation_bytes, constants_dict, run_job
    from launcher.inputs.plan_inputs import plan_job, plan_request
    from launcher.planner.search import score

    try:
        job = run_job(run_dir)
        req = plan_request(job)
        strategy = plan_job(job, force=True).strategy
        c = req.activations
        names = [n for n in numeric_fields() if n != "probe_seq_len"]

        def breakdown(r) -> dict[str, int]:
            return {k: int(v) for k, v in score(r, strategy).estimate.breakdown.items()}

        zero = dataclasses.replace(c, **dict.fromkeys(names, 0.0))
        big = dataclasses.replace(c, **{n: getattr(c, n) * SCALE for n in names})
        step = breakdown(dataclasses.replace(req, activations=zero))
        backward = breakdown(dataclasses.replace(req, activations=big))
        acts = activation_bytes(req, strategy, c, constants_dict(c))
    except Exception:  # a planner mid-edit or of another shape: no moments rather than wrong ones
        return None
    for k in ACT_KEYS:
        backward[k] = int(acts.get(k, 0))
        step[k] = 0
    if not any(backward.get(k) for k in ACT_KEYS):
        return None
    return {"backward": backward, "optimizer_step": step}


def total(breakdown: dict[str, int]) -> int:
    """A moment's predicted bytes per rank, summed as memory.py sums its peak (on CPU ranks the breakdown's
    "offloaded" counts: that state stays in the rank's own memory)."""
    return int(sum(breakdown.values()))
