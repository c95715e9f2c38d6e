"""`launch calibrate`: measure this machine into a hardware profile, or refit activation constants from runs."""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

from launcher.errors import ConfigError
from launcher.units import format_bytes

EPILOG = """examples:
  launch calibrate                              measure this machine (cpu, or the detected GPU) with 2 ranks
  launch calibrate --hardware cpu --gpus 2      the CPU-rank profile the planner uses for gloo runs
  launch calibrate --from runs/a runs/b         refit activation constants and the engines' per-step
                                                seconds from finished run dirs
  launch calibrate --from runs/* --dry-run      show the before/after error, write nothing
  launch calibrate --from runs/a* --merge       one set over runs of several architectures (a compromise)
"""


def add_parser(sub) -> None:
    """Register `launch calibrate` and its flags on the verbs' subparsers."""
    p = sub.add_parser("calibrate", help="measure this machine, or refit activation constants from finished runs",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hardware", default="auto",
                   help="profile to write: cpu, a100-80gb, h100-80gb, ... (default: the detected GPU, else cpu)")
    p.add_argument("--gpus", type=int, default=None,
                   help="local ranks measured at once (default 2 on CPU, every GPU on a GPU node)")
    p.add_argument("--quick", action="store_true", help="smaller sizes and fewer repeats (seconds, rougher)")
    p.add_argument("--from", dest="runs", nargs="+", type=Path, metavar="RUN_DIR",
                   help="refit activation constants from these run dirs instead of measuring hardware")
    p.add_argument("--terms", default=None,
                   help="comma-separated ActivationConstants fields to fit (default: every one the runs depend "
                        "on); the others keep their current values")
    p.add_argument("--merge", action="store_true",
                   help="fit one set of constants over runs of several architectures of one model type (the "
                        "constants are bytes per token of one architecture, so this is a compromise)")
    p.add_argument("--force", action="store_true",
                   help="write the refit even when it makes the median peak error worse")
    p.add_argument("--dry-run", action="store_true", help="print the result, write no file")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """`launch calibrate`: refit from run dirs (--from), else measure this machine's hardware; the exit code."""
    if args.runs:
        return refit(args)
    return measure_hardware(args)


def _profile_name(requested: str) -> tuple[str, str]:
    """(profile name, device kind) for --hardware."""
    from launcher.inputs.machine import auto_profile_name, detect_gpu_name
    from launcher.planner.hardware import PROFILES

    gpu = detect_gpu_name()
    name = requested
    if requested == "auto":
        name = auto_profile_name(gpu, "--hardware")
    if name not in PROFILES:
        raise ConfigError(f"--hardware: {name!r} is not a known profile; use one of {', '.join(PROFILES)} or auto")
    device = "cpu" if name == "cpu" else "cuda"
    if device == "cuda" and gpu is None:
        raise ConfigError(f"--hardware {name}: no GPU found (nvidia-smi); calibrate a GPU profile on a GPU node, "
                          "or use --hardware cpu here")
    return name, device


def measure_hardware(args: argparse.Namespace) -> int:
    """Measure this machine on local ranks and write the profile's calibrated figures; the exit code."""
    from launcher.calibrate.hardware import CalibrationOptions, measure, ranks_threads
    from launcher.calibrate.profiles import save_hardware
    from launcher.planner.hardware import PROFILES

    name, device = _profile_name(args.hardware)
    ranks = args.gpus
    if ranks is None:
        ranks = 2 if device == "cpu" else _cuda_count()
    if ranks < 1:
        raise ConfigError(f"--gpus: {ranks} must be at least 1")
    opts = CalibrationOptions(ranks=ranks, device=device, threads=ranks_threads(ranks), quick=args.quick)
    print(f"calibrating {name!r}: {ranks} {device} rank(s), {opts.threads} thread(s) each ...", flush=True)
    try:
        cal = measure(opts)
    except RuntimeError as e:
        print(f"launch: error: {e}", file=sys.stderr)
        return 1
    before = PROFILES[name]
    print(f"{'field':<24} {'built-in':>14} {'measured':>14}")
    for k, v in cal.values.items():
        print(f"{k:<24} {_fmt(getattr(before, k)):>14} {_fmt(v):>14}")
    print(f"measured in {cal.seconds:.1f} s")
    if args.dry_run:
        return 0
    path = save_hardware(name, cal.values, cal.details)
    print(f"wrote {path}")
    return 0


def _cuda_count() -> int:
    import torch

    return max(1, torch.cuda.device_count())


def _fmt(v: float) -> str:
    return f"{v:.4g}"


def refit(args: argparse.Namespace) -> int:
    """Refit the engines' step overheads and the activation constants from finished run dirs, per model type and
    profile; a fit that makes the median peak error worse is not written without --force."""
    from launcher.calibrate.fit import fit
    from launcher.calibrate.profiles import numeric_fields, save_activations
    from launcher.calibrate.runs import samples_from_run

    refit_step_overheads(args)
    terms = [t.strip() for t in args.terms.split(",")] if args.terms else None
    unknown = [t for t in terms or [] if t not in numeric_fields()]
    if unknown:
        raise ConfigError(f"--terms: {unknown} are not activation constants; use some of {', '.join(numeric_fields())}")
    groups: dict[tuple[str, str], list] = defaultdict(list)
    problems = []
    for d in args.runs:
        try:
            found = samples_from_run(d)
        except ConfigError as e:
            problems.append(str(e))
            continue
        if not found:
            problems.append(f"{d}: no rank finished training; nothing to fit")
        for s in found:
            groups[s.group].append(s)
    for p in problems:
        print(f"launch: warning: {p}", file=sys.stderr)
    if not groups:
        raise ConfigError("--from: none of the run dirs has a finished rank to fit; " + "; ".join(problems))
    for (model_type, profile), samples in sorted(groups.items()):
        archs = sorted({s.architecture for s in samples})
        if len(archs) > 1 and not args.merge:
            print(f"\n{model_type} on {profile}: runs of {len(archs)} architectures ({', '.join(archs)}); the "
                  f"constants are bytes per token of one architecture and one file serves every {model_type} "
                  "model, so nothing is written (give one architecture's runs, or --merge). Per architecture:")
            for a in archs:
                mine = [s for s in samples if s.architecture == a]
                r = fit(mine, terms)
                sm = r.summary()
                print(f"  {a}: {len(mine)} samples; median |error| of activation bytes "
                      f"{sm['median_abs_act_err_before']:.1%} -> {sm['median_abs_act_err_after']:.1%}, of the peak "
                      f"{sm['median_abs_peak_err_before']:.1%} -> {sm['median_abs_peak_err_after']:.1%}; "
                      + ", ".join(f"{k} {r.prior[k]:.4g} -> {r.constants[k]:.4g}" for k in r.fitted))
            continue
        result = fit(samples, terms)
        runs = {s.name.rsplit("/", 1)[0] for s in samples}
        print(f"\n{model_type} on {profile} ({', '.join(archs)}): {len(samples)} rank samples from {len(runs)} runs; "
              "activation bytes = activations + temp at the forward/backward peak")
        print(f"{'run/rank':<36} {'measured':>11} {'before':>11} {'err':>7} {'after':>11} {'err':>7}  peak err "
              "before>after")
        for r in result.rows:
            print(f"{r['name'][:36]:<36} {format_bytes(r['measured_bytes']):>11} "
                  f"{format_bytes(r['predicted_before']):>11} "
                  f"{r['act_err_before']:>+7.1%} {format_bytes(r['predicted_after']):>11} {r['act_err_after']:>+7.1%}  "
                  f"{_pct(r['peak_err_before'])} > {_pct(r['peak_err_after'])}")
        s = result.summary()
        print(f"activation bytes |error|: median {s['median_abs_act_err_before']:.1%} -> "
              f"{s['median_abs_act_err_after']:.1%}, rms {s['rms_act_err_before']:.1%} -> {s['rms_act_err_after']:.1%}"
              f", max {s['max_abs_act_err_before']:.1%} -> {s['max_abs_act_err_after']:.1%}")
        print(f"peak per rank |error|:    median {s['median_abs_peak_err_before']:.1%} -> "
              f"{s['median_abs_peak_err_after']:.1%}, max {s['max_abs_peak_err_before']:.1%} -> "
              f"{s['max_abs_peak_err_after']:.1%}")
        print("constants: " + ", ".join(f"{k} {result.prior[k]:.4g} -> {result.constants[k]:.4g}"
                                        for k in result.fitted))
        print(f"note: the file applies to every {model_type} model planned for {profile}, whatever its shape")
        if args.dry_run:
            continue
        if s["median_abs_peak_err_after"] > s["median_abs_peak_err_before"] and not args.force:
            print("not written: the refit makes the median peak error worse; the gap is not in the activation "
                  "constants (compare the categories in benchmarks/results/accuracy.md), or pass --force")
            continue
        path = save_activations(model_type, profile, result.constants, {
            "runs": sorted(str(Path(d).resolve()) for d in args.runs), "fitted_terms": result.fitted,
            "prior": result.prior, "summary": s, "rows": result.rows,
        })
        print(f"wrote {path}")
    return 0


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:+.1%}"


def refit_step_overheads(args: argparse.Namespace) -> None:
    """The cost model's per-step engine seconds, from the runs' measured step times (written into the hardware
    profile file next to what `launch calibrate` measured there)."""
    import json

    from launcher.calibrate.profiles import hardware_path, save_hardware
    from launcher.calibrate.timing import fit_overheads

    fitted = fit_overheads(args.runs)
    if not fitted:
        print("step time: no run has 3 or more timed steps and a plan with step-time terms; engine overheads kept")
        return
    for profile, fields in sorted(fitted.items()):
        print(f"\nstep time on {profile}: measured seconds per step minus the cost model's other terms")
        for field, (seconds, samples) in sorted(fields.items()):
            spread = ", ".join(f"{s.residual_s:+.3f}" for s in samples[:8]) + (" ..." if len(samples) > 8 else "")
            print(f"  {field} = {seconds:.4g} s (median of {len(samples)} runs: {spread})")
        if args.dry_run:
            continue
        path = hardware_path(profile)
        current = json.loads(path.read_text()) if path.is_file() else {}
        values = {**current.get("hardware", {}), **{f: v for f, (v, _) in fields.items()}}
        details = {**current.get("details", {}),
                   "step_overheads_from": sorted({s.run for _, ss in fields.values() for s in ss})}
        print(f"wrote {save_hardware(profile, values, details)}")
