"""Plain-text views of plans and reports (pure: data in, text out)."""

from __future__ import annotations

from launcher.emit.slurm_alloc import SlurmResources, allocation_lines
from launcher.engines import engine_spec
from launcher.errors import LauncherError, NoPlanError
from launcher.levers import LEVERS, REFINEMENTS
from launcher.planner.advice import NoFit, Suggestion
from launcher.planner.duration import TotalTime
from launcher.planner.levers import MATH_LEVER_MARGIN
from launcher.planner.plan import LeverDecision, Plan, Rejected
from launcher.planner.plan_words import problem_words
from launcher.units import format_bytes


def _bar(part: int, whole: int, width: int = 24) -> str:
    n = 0 if whole <= 0 else round(width * min(part, whole) / whole)
    return "█" * n + "·" * (width - n)


def _count(n: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)


BUCKET_WORDS = {"reduce_bucket_size": "reduce", "allgather_bucket_size": "allgather",
                "stage3_prefetch_bucket_size": "prefetch", "stage3_max_live_parameters": "max live",
                "stage3_param_persistence_threshold": "persistence", "sub_group_size": "sub-group"}
"""The plan's Buckets fields as `launch plan` names them (an engine's spec says which it shows: buckets_shown)."""

BASIS_WORDS = {
    "cpu_tensor_bytes": "tensor bytes (CPU ranks: what MemTracker measures)",
    "cuda_reserved_plus_context": "the allocator's reserved memory plus what lies outside it (the CUDA context, "
                                  "loaded kernels, NCCL communicators and buffers) "
                                  "(what OOMs on a GPU; the run's verdict counts the same)",
}


def render_total_time(t: TotalTime) -> list[str]:
    """The predicted training time line, and the warning when it is past train.warn_total_time_h."""
    warning = t.warning()
    return [f"  total time  {t.describe()}"] + ([f"  WARNING: {warning}"] if warning else [])


def render_plan(plan: Plan, job_name: str, model_desc: str, total: TotalTime | None = None) -> str:
    """The plan as `launch plan` prints it: ranks and budget, model, batch, strategy, offload, buckets, the predicted
    peak and its breakdown, host memory, step and total time, then why, each lever's decision and the alternatives."""
    s, e = plan.strategy, plan.estimate
    spec = engine_spec(s.engine)
    engine = s.layout.title(plan.nodes)
    b = plan.buckets
    lines = [
        f"plan for {job_name}: {plan.world_size} GPU(s) = {plan.nodes} node(s) x {plan.gpus_per_node}, "
        f"budget {format_bytes(plan.budget_bytes)} per GPU, hardware profile {plan.hardware}",
        f"  model       {model_desc}: {_count(plan.num_params)} params, {_count(plan.trainable_params)} trainable",
        f"  batch       global {plan.global_batch_size} = micro-batch {s.micro_batch_size} x "
        f"{s.grad_accum_steps} accumulation x {plan.world_size} ranks, seq {plan.seq_len}, {plan.precision}",
        f"  strategy    {engine}, activation checkpointing "
        + ("on" + "".join(spec.checkpointing_words(spec.of(s))[1] for spec in REFINEMENTS)
           if s.activation_checkpointing else "off"),
        f"  offload     optimizer: {s.layout.offload_optimizer}, params: {s.layout.offload_params}"
        + "".join(f"; {w}" for spec in LEVERS.values() if (w := spec.offload_words(spec.of(s)))),
    ]
    if s.lever_words():
        lines.append(f"  levers      {', '.join(s.lever_words())} (why: below)")
    shown = spec.buckets_shown(s.layout)
    if shown:
        lines.append("  buckets     " + ", ".join(f"{BUCKET_WORDS[f]} {_count(getattr(b, f))}" for f in shown)
                     + " elements")
    lines.append("")
    lines.append("  predicted peak per rank, by category:")
    for cat, n in e.breakdown.items():
        lines.append(f"    {cat:<12} {format_bytes(n):>10}  {_bar(n, plan.budget_bytes)}")
        if cat == "reserve" and e.overhead:
            lines.append("      = " + ", ".join(f"{k.replace('_', ' ')} {format_bytes(v)}"
                                                for k, v in e.overhead.items()))
    verdict = "fits" if e.peak_bytes <= plan.usable_bytes else "OVER BUDGET"
    lines.append(f"    {'peak':<12} {format_bytes(e.peak_bytes):>10}  {_bar(e.peak_bytes, plan.budget_bytes)}  "
                 f"{verdict}: usable {format_bytes(plan.usable_bytes)} of budget {format_bytes(plan.budget_bytes)}")
    lines.append(f"  the peak counts {BASIS_WORDS.get(e.basis, e.basis)}")
    lines.append(f"  host RAM per node {format_bytes(e.host_bytes_per_node)}"
                 + (f", NVMe per node {format_bytes(e.nvme_bytes_per_node)}" if e.nvme_bytes_per_node else ""))
    terms = ", ".join(f"{k} {v:.3g} s" for k, v in e.step_time_terms.items())
    lines.append(f"  step time   {e.step_time_s:.3g} s predicted ({terms})")
    if total is not None:
        lines += render_total_time(total)
    lines.append("")
    lines.append("why this plan:")
    lines += [f"  - {r}" for r in plan.reasons]
    act = plan.constants.get("activations", {})
    if isinstance(act, dict) and act.get("source"):
        lines.append(f"  - activation constants: {act['source']}")
    if plan.levers:
        lines.append("levers (exact: same math; permit: needs train.allow_levers):")
        lines += [f"  - {lever_line(d)}" for d in plan.levers]
    if plan.rejected:
        lines.append("alternatives not chosen:")
        lines += [f"  - {r.label}: {rejected_reason(r, plan)}" for r in plan.rejected]
    return "\n".join(lines)


def rejected_reason(r: Rejected, plan: Plan) -> str:
    """Why an alternative was not chosen, in words, from its numbers."""
    t0 = plan.estimate.step_time_s
    speed = f"{r.step_time_s:.3g} s/step" + (f" ({r.step_time_s / t0 - 1:+.0%})" if t0 else "")
    if r.why == "slower" and r.step_time_s < t0:  # a change of the training math that does not buy the margin
        return (f"fits, {speed}, but changes the training math more for less than the {MATH_LEVER_MARGIN:.0%} "
                "a change must buy")
    if r.why == "slower":
        return f"fits but slower: {speed}"
    if r.why == "device":
        need = r.need_bytes or r.peak_bytes
        have = r.have_bytes or plan.usable_bytes
        largest = f", largest: {r.largest}" if r.largest else ""
        return (f"over budget by {format_bytes(need - have)} (peak {format_bytes(need)} of "
                f"{format_bytes(have)} usable{largest}); would step at {speed}")
    what = "host RAM per node" if r.why == "host_ram" else "free NVMe per node"
    if not r.need_bytes:
        return f"{what} short; would step at {speed}"
    return f"{what}: needs {format_bytes(r.need_bytes)}, has {format_bytes(r.have_bytes)}; would step at {speed}"


def no_fit_reasons(no_fit: NoFit) -> list[str]:
    """Why no plan fits: what was tried and the smallest footprint."""
    return [f"no plan fits {format_bytes(no_fit.budget_bytes)} per GPU on {no_fit.world_size} GPUs ({no_fit.tried} "
            f"candidates tried); smallest footprint: {format_bytes(no_fit.smallest_peak_bytes)} with "
            f"{no_fit.smallest_label} ({problem_words(no_fit.smallest)})"]


def suggestion_change(s: Suggestion) -> str:
    """The change a suggestion makes, in the job file's and the CLI's words."""
    if s.change == "budget":
        budget = format_bytes(s.value)
        card = f" ({s.card} holds {format_bytes(s.card_bytes)})" if s.card else ""
        return f"a budget of {budget} per GPU{card} (--budget {budget.replace(' ', '')})"
    if s.change == "unpin":
        return f"unpinning {', '.join(s.names)}"
    if s.change == "gpus":
        return f"{s.world_size} GPUs, {s.value} per node (--gpus {s.value})"
    if s.change == "nodes":
        return f"{s.value} nodes of {s.gpus_per_node} GPUs, {s.world_size} in all (--nodes {s.value})"
    if s.change == "nvme":
        return "NVMe offload (set cluster.nvme_path and nvme_free)"
    if s.change == "seq_len":
        return f"a shorter sequence: max_seq_len {s.value} (--seq-len {s.value})"
    if s.change == "lora":
        return (f"LoRA (train.lora: {{r: {s.lora_rank}, target_modules: [{', '.join(s.names)}]}}, ~{s.value:,} "
                "trainable)")
    if s.change == "micro_batch":
        return "a smaller micro-batch"
    return f"more host RAM per node: {format_bytes(s.value)} (cluster.host_ram_per_node)"


def suggestion_line(s: Suggestion) -> str:
    """One suggestion: the change, then the plan the re-plan found (strategy, peak per GPU, seconds per step)."""
    nvme = f", {format_bytes(s.nvme_bytes_per_node)} of NVMe per node" if s.change == "nvme" else ""
    return (f"{suggestion_change(s)}: {s.label}, peak {format_bytes(s.peak_bytes)} per GPU, "
            f"{s.step_time_s:.3g} s/step{nvme}")


def no_fit_suggestions(e: NoPlanError) -> list[str]:
    """What would fit, one line each: the search's suggestions, then the job fields behind the refusal."""
    lines = [suggestion_line(s) for s in e.no_fit.suggestions] or [
        "nothing within reach by one change; combine more GPUs with LoRA or a shorter sequence"]
    return lines + [str(h) for h in e.hints]


def no_fit_lines(e: NoPlanError) -> list[str]:
    """The no-plan answer as printed: the reasons, then "what would fit:" and one "  - " line per suggestion."""
    return [*no_fit_reasons(e.no_fit), "what would fit:", *(f"  - {s}" for s in no_fit_suggestions(e))]


SCREEN_LINES = 25
"""Most lines one error answer takes: a terminal's screen. Past it, "... and N more" stands for the rest."""
SCREEN_BYTES = 2048
"""Most bytes one error answer takes (its "launch: error: " prefixes included)."""
LINE_CHARS = 1200
"""Most characters of one line: a longer one keeps its start (the field, the value, the rule) and its end (the
fix), its middle (a long list of choices) cut."""
PREFIX = "launch: error: "


def screen(lines: list[str]) -> list[str]:
    """``lines`` bounded to a screen: each at most LINE_CHARS (its middle cut), at most SCREEN_LINES lines and
    SCREEN_BYTES in all, the rest counted in a last line."""
    head = LINE_CHARS * 3 // 4
    cut = [ln if len(ln) <= LINE_CHARS else f"{ln[:head]} [...] {ln[-(LINE_CHARS - head - 7):]}" for ln in lines]
    kept: list[str] = []
    used = 0
    for i, ln in enumerate(cut):
        size = len((PREFIX + ln).encode()) + 1
        rest = len(cut) - i - 1
        room_lines = SCREEN_LINES - (1 if rest else 0)
        if len(kept) >= room_lines or used + size > SCREEN_BYTES - (60 if rest else 0):
            kept.append(f"... and {len(cut) - i} more line(s) of this answer; fix the ones above and run again")
            break
        kept.append(ln)
        used += size
    return kept


def error_lines(e: LauncherError) -> list[str]:
    """An error's lines for the user, at most a screen: a no-plan answer worded from its typed values, any other as
    it says."""
    return screen(no_fit_lines(e) if isinstance(e, NoPlanError) else str(e).splitlines())


WHY_WORDS = {
    "needed_to_fit": "used: without it the plan does not fit",
    "faster": "used: it fits without it, but steps slower",
    "faster_than_without": (f"used: plans without it fit, but this one is faster by more than the "
                            f"{MATH_LEVER_MARGIN:.0%} each change of the training math must buy (or they change it "
                            "more)"),
    "lower_peak": "used: as fast without it, with a higher peak",
    "pinned": "as pinned by the job",
    "fits_without": "not used: the plan fits without it",
    "would_not_fit": "not used: it would not fit",
    "would_fit": "not used (forced plan): it would fit",
    "no_fit_either": "not used (forced plan): it would not fit either",
    "not_allowed": "not allowed: changes the training math; add it to train.allow_levers to let the planner use it",
    "engine_lacks": "not offered by this engine",
    "not_paired": "not together with the plan's other math lever: pure bf16 pairs only with 8-bit or 4-bit AdamW "
                  "(Adafactor has no stochastically rounding step)",
    "not_applicable": "not applicable to this job",
    "plan_lacks": "not with this plan's shape",
    "script_lacks": "not tried: your --script does not receive it (the launcher's recipes apply it); pin it under "
                    "strategy: if your script does",
}


def lever_line(d: LeverDecision) -> str:
    """One lever's decision in words, with what the other setting would predict."""
    kind = "exact" if d.exact else "permit"
    spec = LEVERS.get(d.lever)
    words = spec.plan_lacks if spec is not None and d.why == "plan_lacks" else None
    if d.why == "engine_lacks" and d.layout_reason:
        words = f"not offered with this plan's layout: {d.layout_reason}"
    out = f"{spec.title if spec is not None else d.lever} [{kind}]: {words or WHY_WORDS.get(d.why, d.why)}"
    if d.other_value is not None and d.why != "not_allowed":
        dp, dt = d.peak_delta_bytes, d.step_time_delta_s
        sign = "+" if dp >= 0 else "-"
        # The limit it would overrun first: a lever can lower the device peak and still not fit (host RAM).
        over = f"{problem_words(d.other_problem)}; " if d.other_problem is not None else ""
        out += (f" ({d.lever}={d.other_value!r}: {over}peak {sign}{format_bytes(abs(dp))}, step "
                f"{'+' if dt >= 0 else '-'}{abs(dt):.3g} s)")
    return out


def render_slurm_resources(r: SlurmResources, profile: str) -> str:
    """What a Slurm job of the plan asks for, each value saying whether the job set it or how the plan derived it."""
    return "\n".join(["slurm allocation per node:",
                      *(f"  {option:<19} {how}" for option, how in allocation_lines(r, profile))])
