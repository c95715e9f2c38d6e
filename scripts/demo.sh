#!/usr/bin/env bash
# Set up (once) and run the embedded default job: MiniLM contrastive fine-tune on 2 CPU ranks, 2 GB budget. Its
# plan (DDP) loads no DeepSpeed op, so none is built (benchmarks/results/newcomer.md times it on a fresh clone).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/launch --gpus 2 --budget 2GB examples/minilm-embed.yaml "$@"
