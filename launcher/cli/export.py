"""`launch export RUN_DIR [--step N] [--merge] [--out DIR]`: a Hugging Face model dir from a run's checkpoint."""

from __future__ import annotations

import argparse
from pathlib import Path

EPILOG = """examples:
  launch export runs/tiny                          the latest checkpoint into runs/tiny/model
  launch export runs/tiny --step 200 --out hf/tiny-200
  launch export runs/lora --merge                  the adapter, and base + adapter merged in model/merged
Layout, dtypes and memory: docs/export.md.
"""


def add_parser(sub) -> None:
    """Register `launch export` and its flags on the verbs' subparsers."""
    p = sub.add_parser("export", help="write a Hugging Face model dir (or LoRA adapter) from a run's checkpoint",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", type=Path, help="the run dir (its checkpoint/ holds the engine's files)")
    p.add_argument("--step", type=int, help="export this step's checkpoint (default: the latest complete one)")
    p.add_argument("--merge", action="store_true", help="LoRA: also write base + adapter merged into OUT/merged")
    p.add_argument("--out", type=Path, help="where to write (default RUN_DIR/model); new, empty, or an earlier export")
    p.set_defaults(func=export)


def export(args: argparse.Namespace) -> int:
    """`launch export`: write the Hugging Face model dir (or LoRA adapter) of a run's checkpoint; the exit code."""
    from launcher.errors import ConfigError

    if args.step is not None and args.step < 1:
        raise ConfigError(f"--step {args.step}: steps count from 1; give a step that has a checkpoint")
    from launcher.processes import rankenv

    rankenv.set_extensions_dir()
    from launcher.worker.export_offline import export_checkpoint

    out, record = export_checkpoint(args.run_dir, step=args.step, merge=args.merge, out=args.out)
    what = "LoRA adapter" if record["format"] == "lora_adapter" else "model"
    merged = f", merged model in {out / 'merged'}" if record["merged"] else ""
    print(f"exported the {what} of step {record['step']} ({record['source']}, {record['dtype']}) to {out}{merged}")
    return 0
