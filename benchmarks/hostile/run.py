"""The hostile-input table (issue 35 §3): every refused-input case of the suite (tests/faults/test_bad_input.py and
test_hostile_*.py) and this benchmark's own (benchmarks/hostile/cases.py: config.json key by bad value, files that
are no config or no data, launch flags, damaged checkpoints), each run through the real CLI in-process in a fresh
sandbox, as the suite's harness does; the table says each one's exit, its message's first line and size, and
whether nothing was written.

    nice -n 10 .venv/bin/python benchmarks/hostile/run.py            # ~10 min on 2 shared cores
    .venv/bin/python benchmarks/hostile/run.py --only config-        # cases whose id starts so; no table written

Writes benchmarks/results/hostile.{md,json}. A row is "ok" when the input was refused as bad input must be: exit 2,
one error block of at most a screen (25 lines, 2 KB), no traceback, nothing on stdout, nothing new in the sandbox
and the case's words in the message.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import pytest  # noqa: E402

from benchmarks.hostile.cases import ExportCase, export_cases, table_cases  # noqa: E402
from launcher.cli.main import main  # noqa: E402
from tests.faults.harness import Case, Sandbox, entries, one_error_block  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results"
SUITE = ["test_bad_input", *sorted(p.stem for p in (REPO / "tests" / "faults").glob("test_hostile_*.py")
                                   if p.stem != "test_hostile_table")]
SCREEN_LINES, SCREEN_BYTES = 25, 2048


@dataclass
class Row:
    """One case's line of the table."""

    id: str
    source: str
    verb: str
    input: str
    """The command line after `launch`, the sandbox's path written <sandbox>."""
    exit: int | str
    first_line: str
    lines: int
    bytes: int
    nothing_written: bool
    traceback: bool
    words: bool
    seconds: float
    ok: bool


def suite_cases() -> list[tuple[str, Case]]:
    out = []
    for name in SUITE:
        mod = importlib.import_module(f"tests.faults.{name}")
        out += [(name.removeprefix("test_"), c) for c in getattr(mod, "CASES", [])]
    return out


@contextlib.contextmanager
def sandbox(cache: Path):
    """A fresh working dir, HOME and data file, the shared planner cache (tests/faults/conftest.py's sandbox)."""
    tmp = Path(tempfile.mkdtemp(prefix="hostile-"))
    root = tmp / "box"
    root.mkdir()
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    os.environ.update(LAUNCHER_CACHE=str(cache), HOME=str(tmp / "home"), HF_HUB_OFFLINE="1",
                      MPLCONFIGDIR=str(tmp / "mpl"))
    os.chdir(root)
    data = root / "data.jsonl"
    data.write_text("".join(f'{{"text": "sentence number {i} about memory"}}\n' for i in range(64)))
    try:
        yield Sandbox(root=root, data=data)
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        for p in tmp.rglob("*"):  # a read-only dir a case made must not stop the clean-up
            if p.is_dir() and not p.is_symlink():
                p.chmod(0o755)
        shutil.rmtree(tmp, ignore_errors=True)


def run_cli(argv: list[str]) -> tuple[int | str, str, str]:
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code
        except BaseException as e:  # noqa: BLE001 - the table records what escaped, it never stops on it
            import traceback

            traceback.print_exc(file=err)
            code = f"raised {type(e).__name__}"
    return code, out.getvalue(), err.getvalue()


def judge(case_id: str, source: str, argv: list[str], root: Path, code, out: str, err: str, written: bool,
          words: list[str], seconds: float) -> Row:
    lines = [ln.replace(str(root.parent), "<sandbox>") for ln in err.splitlines() if ln.strip()]
    try:
        block = one_error_block(err) if code == 2 else []
    except AssertionError:
        block = []
    has_words = all(w in err for w in words)
    first = next((ln for ln in lines if " error: " in ln), lines[0] if lines else "")
    ok = (code == 2 and bool(block) and "Traceback" not in err and not out and not written and has_words
          and len(lines) <= SCREEN_LINES and len(err.encode()) <= SCREEN_BYTES)
    shown = " ".join(a if len(a) <= 60 else a[:57] + "..." for a in argv).replace(str(root.parent), "<sandbox>")
    return Row(id=case_id, source=source, verb=argv[0], input=shown, exit=code, first_line=first, lines=len(lines),
               bytes=len(err.encode()), nothing_written=not written, traceback="Traceback" in err, words=has_words,
               seconds=round(seconds, 2), ok=ok)


def run_case(case: Case, source: str, cache: Path) -> Row:
    with sandbox(cache) as s:
        try:
            if case.setup:
                case.setup(s)
            argv = [str(a) for a in case.argv(s)]
        except pytest.skip.Exception as e:
            return Row(id=case.id, source=source, verb=case.verb, input="", exit="skipped", first_line=str(e), lines=0,
                       bytes=0, nothing_written=True, traceback=False, words=False, seconds=0.0, ok=False)
        if case.verb == "run" and "--run-dir" not in argv:
            argv += ["--run-dir", str(s.run_dir)]
        argv = [case.verb, *argv, "--quiet"] if case.verb == "run" else [case.verb, *argv]
        before = entries(s.root)
        t = time.monotonic()
        code, out, err = run_cli(argv)
        took = time.monotonic() - t
        written = entries(s.root) != before or ("run" not in case.keeps and s.run_dir.exists())
        words = [e.replace("{root}", str(s.root)) for e in case.expect]  # as test_hostile_rundir.py fills them
        return judge(case.id, source, argv, s.root, code, out, err, written, words, took)


def run_export_case(case: ExportCase, runs: dict[str, Path], cache: Path) -> Row:
    with sandbox(cache) as s:
        run = Path(shutil.copytree(runs[case.engine], s.root / "run"))
        case.damage(run)
        before = entries(s.root)
        t = time.monotonic()
        argv = ["export", str(run), *case.argv]
        code, out, err = run_cli(argv)
        took = time.monotonic() - t
        return judge(case.id, "benchmarks/hostile (checkpoints)", argv, s.root, code, out, err,
                     entries(s.root) != before, ["launch: error: "], took)


def cell(text: str, n: int = 150) -> str:
    text = " ".join(str(text).split()).replace("|", "\\|")
    return text if len(text) <= n else text[: n - 3] + "..."


def write_table(rows: list[Row], seconds: float) -> None:
    ok = sum(r.ok for r in rows)
    by_source: dict[str, list[Row]] = {}
    for r in rows:
        by_source.setdefault(r.source, []).append(r)
    head = [
        "# Hostile inputs: every case refused, in one screen, before anything starts",
        "",
        "Generated by `benchmarks/hostile/run.py` (issue 35 §3); do not edit. Each case ran through the real CLI "
        "in-process in a fresh sandbox (tests/faults/harness.py's): **ok** is exit 2, one error block of at most "
        f"{SCREEN_LINES} lines and {SCREEN_BYTES} bytes, no traceback, nothing on stdout, nothing new in the "
        "sandbox (no run dir, no rank log, no file), and the case's words in the message.",
        "",
        f"**{ok} of {len(rows)} ok** ({len(rows) - ok} not), {seconds:.0f} s in all on the 2-core dev VM.",
        "",
        "| source | cases | ok |",
        "|---|---|---|",
        *(f"| {src} | {len(rs)} | {sum(r.ok for r in rs)} |" for src, rs in by_source.items()),
        "",
        "| case | input | exit | lines | bytes | nothing written | s | ok | first line of the message |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    body = [f"| {r.id} ({r.source}) | `{cell(r.input, 90)}` | {r.exit} | {r.lines} | {r.bytes} | "
            f"{'yes' if r.nothing_written else 'NO'} | {r.seconds} | {'ok' if r.ok else 'NOT OK'} | "
            f"{cell(r.first_line)} |" for r in rows]
    (RESULTS / "hostile.md").write_text("\n".join(head + body) + "\n")
    (RESULTS / "hostile.json").write_text(json.dumps([asdict(r) for r in rows], indent=1) + "\n")


def main_(argv: list[str] | None = None) -> int:
    """Run the table (or the cases --only names) and write the results; the exit code is 1 when a case is not ok."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", help="run the cases whose id starts with this; the table is not written")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    cache = Path(tempfile.mkdtemp(prefix="hostile-cache-"))
    cases = [(src, c) for src, c in suite_cases()] + [("benchmarks/hostile", c) for c in table_cases()]
    exports = export_cases()
    if args.only:
        cases = [(src, c) for src, c in cases if c.id.startswith(args.only)]
        exports = [c for c in exports if c.id.startswith(args.only)]
    rows = []
    for i, (src, case) in enumerate(cases, 1):
        rows.append(run_case(case, src, cache))
        print(f"[{i}/{len(cases)}] {case.id}: {rows[-1].exit} {'ok' if rows[-1].ok else 'NOT OK'}", flush=True)
    if exports:
        from tests.faults.conftest import trained_run

        root = Path(tempfile.mkdtemp(prefix="hostile-trained-"))
        runs = {e: trained_run(root, e) for e in sorted({c.engine for c in exports})}
        for case in exports:
            rows.append(run_export_case(case, runs, cache))
            print(f"[export] {case.id}: {rows[-1].exit} {'ok' if rows[-1].ok else 'NOT OK'}", flush=True)
    bad = [r for r in rows if not r.ok]
    for r in bad:
        print(f"NOT OK: {r.id} ({r.source}): exit {r.exit}, {r.lines} lines, {r.bytes} bytes, written "
              f"{not r.nothing_written}, words {r.words}: {r.first_line[:200]}")
    if not args.only:
        write_table(rows, time.monotonic() - t0)
    print(f"{len(rows) - len(bad)} of {len(rows)} ok in {time.monotonic() - t0:.0f} s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main_())
