"""The embedded default job (scripts/demo.sh: examples/minilm-embed.yaml, 2 CPU ranks, 2 GB) as a newcomer runs
it, on a CPU with native bf16 and on one without, timed end to end.

    .venv/bin/python benchmarks/newcomer/run.py                 # writes benchmarks/results/newcomer.json
    .venv/bin/python benchmarks/newcomer/run.py --bf16-steps 3  # also: bf16 forced on the AVX2 stand-in
    .venv/bin/python benchmarks/newcomer/run.py --path          # only the README's "Fine-tune and use the result"
    .venv/bin/python benchmarks/newcomer/run.py --fresh         # only scripts/demo.sh on a fresh clone

Modes (precision: auto in the example decides per machine):
  avx2-auto     ONEDNN_MAX_CPU_ISA=AVX2: oneDNN dispatches no bf16 instruction, the stand-in for an AVX2-only CPU
                (the issue's 2-core machine); auto must choose fp32.
  native-auto   this CPU as it is; auto chooses bf16 where /proc/cpuinfo has amx_bf16 or avx512_bf16.
  avx2-bf16     (with --bf16-steps N) bf16 forced on the AVX2 stand-in, N steps: the per-step cost auto avoids.
Each run: wall seconds of the whole `launch` command, its CPU seconds (user + sys, ranks included, from
os.wait4), the plan's precision and reason, and the ranks' step seconds (rank 0's steps/rank-0.jsonl).
The machine's 1-minute load average before each run is recorded: on a shared machine it inflates wall time.

--fresh runs scripts/demo.sh's two steps on a fresh clone of this checkout's HEAD in a temporary dir, as a newcomer
meets them: scripts/setup.sh making its own .venv (pip with no cache: every package fetched and built), then the
demo job. Each step's wall and CPU seconds and the load, and which DeepSpeed ops got built (the goal: none, the
demo's plan loads none; issue 36: under 2 minutes on 2 cores). Merged into newcomer.json under "fresh".

--path runs the README's section "Fine-tune and use the result" as written there (its commands and its Python
snippet, read from README.md, with runs/ moved into a fresh temporary dir) and times each command: plan, run,
status, export, reload + predict. It is merged into newcomer.json under "path", the other results kept.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from launcher.records.runreport import read_report

REPO = Path(__file__).resolve().parents[2]
LAUNCH = REPO / ".venv" / "bin" / "launch"
JOB = REPO / "examples" / "minilm-embed.yaml"
RESULTS = REPO / "benchmarks" / "results" / "newcomer.json"


def run_mode(name: str, env_over: dict[str, str | None], extra: list[str], runs: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in env_over}
    env.update({k: v for k, v in env_over.items() if v is not None})
    run_dir = runs / name
    argv = [str(LAUNCH), "--gpus", "2", "--budget", "2GB", str(JOB), *extra, "--run-dir", str(run_dir),
            "--overwrite", "--quiet"]
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    err = proc.stderr.read()
    plan = json.loads((run_dir / "plan.json").read_text())
    steps = [json.loads(ln)["step_time_s"] for ln in (run_dir / "steps" / "rank-0.jsonl").read_text().splitlines()
             if ln.strip()]
    return {
        "mode": name, "env": env_over, "extra_args": extra, "exit_code": os.waitstatus_to_exitcode(status),
        "stderr_tail": err[-500:], "load_1min_before": round(load, 2), "wall_s": round(wall, 1),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 1), "precision": plan["precision"],
        "precision_reason": plan.get("precision_reason"), "plan": plan["label"],
        "predicted_step_s": round(plan["predicted_step_time_s"], 2), "steps": len(steps),
        "step_s_median": round(statistics.median(steps), 2) if steps else None,
        "steps_total_s": round(sum(steps), 1),
    }


PATH_SECTION = "## Fine-tune and use the result"


def readme_path() -> tuple[list[str], str]:
    """(the shell commands, the Python snippet) of the README's section, as a reader would copy them."""
    text = (REPO / "README.md").read_text()
    section = text[text.index(PATH_SECTION):]
    section = section[: section.index("\n## ", len(PATH_SECTION))]
    blocks = re.findall(r"```\n(.*?)```", section, flags=re.S)
    commands = [ln.split("  #")[0].strip() for ln in blocks[0].splitlines() if ln.strip()]
    snippet = blocks[1].split("<<'PY'\n", 1)[1].rsplit("PY\n", 1)[0]
    return commands, snippet


def time_path() -> dict:
    commands, snippet = readme_path()
    root = Path(tempfile.mkdtemp(prefix="launcher-path-"))
    steps = []
    for cmd in commands + ["predict"]:
        if cmd == "predict":
            argv, name = [str(REPO / ".venv" / "bin" / "python"), "-c", snippet.replace("runs/", f"{root}/")], "predict"
        else:
            argv = [a.replace("runs/", f"{root}/") for a in cmd.split()]
            name = argv[1] if argv[1] in ("plan", "status", "export") else "run"
        load = os.getloadavg()[0]
        t0 = time.perf_counter()
        proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        steps.append({"step": name, "command": cmd if name != "predict" else "python (README snippet)",
                      "exit_code": proc.returncode, "wall_s": round(wall, 1), "load_1min_before": round(load, 2),
                      "stdout_tail": proc.stdout[-400:], "stderr_tail": proc.stderr[-300:] if proc.returncode else ""})
        print(json.dumps(steps[-1]), flush=True)
        if proc.returncode:
            break
    report = read_report(root / "sentiment")
    return {"steps": steps, "total_wall_s": round(sum(s["wall_s"] for s in steps), 1),
            "eval_accuracy": report and report.eval_accuracy, "eval_loss": report and report.eval_loss,
            "verdict": report and report.verdict, "run_root": str(root)}


def timed(name: str, argv: list[str], *, cwd: Path, env: dict[str, str]) -> dict:
    """Run ``argv``: its exit code, wall and CPU seconds (user + sys, children included), the load before it."""
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    return {"step": name, "command": " ".join(argv), "exit_code": os.waitstatus_to_exitcode(status),
            "wall_s": round(time.perf_counter() - t0, 1), "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
            "load_1min_before": round(load, 2), "output_tail": out[-600:]}


def time_fresh() -> dict:
    """scripts/demo.sh's set-up and job on a fresh clone (see the module docstring)."""
    root = Path(tempfile.mkdtemp(prefix="launcher-fresh-"))
    subprocess.run(["git", "clone", "-q", str(REPO), str(root)], check=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TORCH_EXTENSIONS_DIR", "VIRTUAL_ENV")}
    env["PIP_NO_CACHE_DIR"] = "1"
    steps = []
    for name, argv in (("setup", ["bash", "scripts/setup.sh"]),
                       ("demo job", [".venv/bin/launch", "--gpus", "2", "--budget", "2GB",
                                     "examples/minilm-embed.yaml"])):
        steps.append(timed(name, argv, cwd=root, env=env))
        print(json.dumps(steps[-1]), flush=True)
        if steps[-1]["exit_code"]:
            break
    ops = root / ".cache" / "torch_extensions"
    return {"steps": steps, "total_wall_s": round(sum(s["wall_s"] for s in steps), 1),
            "total_cpu_s": round(sum(s["cpu_s"] for s in steps), 1), "cpus": os.cpu_count(),
            "ops_built": sorted(p.name for p in ops.iterdir()) if ops.is_dir() else [], "clone": str(root),
            "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True,
                                     text=True).stdout.strip()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bf16-steps", type=int, default=0, help="also time N steps of bf16 forced on the AVX2 stand-in")
    ap.add_argument("--runs", type=Path, default=Path("/tmp/launcher-newcomer"), help="where the run dirs go")
    ap.add_argument("--path", action="store_true",
                    help="only time the README's plan -> run -> export -> reload -> predict (merged into the json)")
    ap.add_argument("--fresh", action="store_true",
                    help="only time scripts/demo.sh's set-up and job on a fresh clone (merged into the json)")
    a = ap.parse_args()
    if a.path or a.fresh:
        out = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {}
        key = "path" if a.path else "fresh"
        out[key] = time_path() if a.path else time_fresh()
        RESULTS.write_text(json.dumps(out, indent=2) + "\n")
        print(f"wrote {RESULTS} ({key})", file=sys.stderr)
        return
    modes = [("avx2-auto", {"ONEDNN_MAX_CPU_ISA": "AVX2"}, []), ("native-auto", {"ONEDNN_MAX_CPU_ISA": None}, [])]
    if a.bf16_steps:
        modes.append(("avx2-bf16", {"ONEDNN_MAX_CPU_ISA": "AVX2"},
                      ["train.precision=bf16", f"train.max_steps={a.bf16_steps}"]))
    out = {"machine": {"cpus": os.cpu_count(), "cpu_bf16_flags": sorted(
        {f for f in ("amx_bf16", "avx512_bf16") if f in Path("/proc/cpuinfo").read_text()})}, "results": []}
    for name, env, extra in modes:
        r = run_mode(name, env, extra, a.runs)
        print(json.dumps(r), flush=True)
        out["results"].append(r)
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {RESULTS}", file=sys.stderr)


if __name__ == "__main__":
    main()
