"""Write launcher/model/bundled_stats.json: the introspected ModelStats and the fake-tensor probe's activation
constants of the bundled configs (launcher/model/configs), so that a first `launch plan` of a bundled family
imports neither torch nor transformers.

    .venv/bin/python scripts/gen_bundled_stats.py            # rewrite the file (minutes: one probe per entry)
    .venv/bin/python scripts/gen_bundled_stats.py --check    # exit 1 if the file differs from a fresh run

Entries are keyed exactly as launcher.inputs.plan_inputs keys its cache (the model fingerprint, which includes the
transformers and peft versions, then seq_len, precision, attention and PROBE_VERSION): with other library
versions nothing matches and the planner introspects and probes as before. tests/model/test_bundled_stats.py
checks that the file equals a fresh introspection and probe, so it cannot go stale unnoticed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from launcher.config.jobfile import job_from_data  # noqa: E402
from launcher.inputs.plan_inputs import BUNDLED_STATS, SHIPPED_SEQ_LENS, activation_key, model_fingerprint  # noqa: E402
from launcher.model.build import BUNDLED_DIR  # noqa: E402

SEQ_LENS = SHIPPED_SEQ_LENS
"""The sequence lengths shipped: the examples' and the usual fine-tuning ones."""
PRECISIONS = ("bf16", "fp32")
"""What train.precision: auto resolves to on bf16-capable GPUs and on CPU ranks."""
LORA = {"r": 8, "alpha": 16, "target_modules": ["q_proj", "v_proj"]}
"""examples/llama-7b-lora.yaml's adapters."""


def jobs():
    """The jobs whose statistics are shipped: each bundled config fully trained, and the LoRA example."""
    for cfg in sorted(BUNDLED_DIR.glob("*.json")):
        yield cfg.stem, None
    yield "llama-7b", LORA


def job(model: str, lora: dict | None, seq_len: int = 2048, precision: str = "bf16"):
    train = {"global_batch_size": 8, "precision": precision, "lr": 1e-4, "max_steps": 1}
    if lora:
        train["lora"] = lora
    data = {"name": "bundled", "model": model, "task": "causal_lm", "gpus": 1, "budget": "80GB",
            "data": {"path": "data.jsonl", "max_seq_len": seq_len}, "train": train}
    return job_from_data(data, REPO, for_run=False)


def fresh(seq_lens=SEQ_LENS, precisions=PRECISIONS, models=None) -> dict:
    """Introspect and probe every shipped entry now."""
    from launcher.inputs.plan_inputs import _transformers_quiet
    from launcher.model.activations import probe_activations
    from launcher.model.introspect import introspect

    out: dict = {"introspect": {}, "activations": {}}
    for model, lora in jobs():
        if models and model not in models:
            continue
        j = job(model, lora)
        with _transformers_quiet():
            stats = introspect(j)
        out["introspect"][model_fingerprint(j)] = stats.to_json()
        if lora:
            continue  # LoRA keeps the probe per job: its constants depend on the adapters
        for seq in seq_lens:
            if stats.max_positions is not None and seq > stats.max_positions:
                continue  # past the position table: refused before any probe
            for precision in precisions:
                j = job(model, lora, seq, precision)
                with _transformers_quiet():
                    c = probe_activations(j, seq_len=seq, precision=precision)
                out["activations"][activation_key(j)] = dataclasses.asdict(c)
                print(f"{model} seq {seq} {precision}: {c.block_bytes_per_token:.1f} + "
                      f"{c.block_bytes_per_token_per_seq}"
                      f"·s, head {c.head_bytes_per_token:.1f}", file=sys.stderr)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare with a fresh run instead of writing")
    args = ap.parse_args()
    data = fresh()
    text = json.dumps(data, indent=1, sort_keys=True) + "\n"
    if args.check:
        same = BUNDLED_STATS.is_file() and BUNDLED_STATS.read_text() == text
        print("bundled_stats.json is current" if same else "bundled_stats.json differs from a fresh run")
        return 0 if same else 1
    BUNDLED_STATS.write_text(text)
    print(f"wrote {BUNDLED_STATS}: {len(data['introspect'])} models, {len(data['activations'])} probes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
