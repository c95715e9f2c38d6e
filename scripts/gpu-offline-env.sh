#!/usr/bin/env bash
# Run THERE, on a lent GPU machine that reaches no package index (see scripts/gpu-wheels.sh, run here first and
# carry .whl): installs the carried wheels beside the image's own CUDA torch and writes .venv/bin/python and
# .venv/bin/launch as wrappers of the image's python3, so scripts/gpu-check.sh and tests/gpu run unchanged.
# .venv/.launcher-offline tells gpu-check.sh not to run scripts/setup.sh (which needs an index).
set -euo pipefail
cd "$(dirname "$0")/.."
base=$(command -v python3)
"$base" -c 'import torch; assert torch.cuda.is_available(), "no CUDA"' || exit 1
site=$PWD/.cache/gpu-site
"$base" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl
mkdir -p .venv/bin
for name in python launch; do
  run='"$@"'
  [ "$name" = launch ] && run='-m launcher "$@"'
  cat > ".venv/bin/$name" <<SH
#!/bin/sh
export PYTHONPATH="$site:$PWD\${PYTHONPATH:+:\$PYTHONPATH}"
exec "$base" $run
SH
  chmod +x ".venv/bin/$name"
done
touch .venv/.launcher-offline
.venv/bin/python -c 'import torch, transformers, deepspeed, torchao, peft, launcher; print("gpu-offline-env:", torch.__version__, "transformers", transformers.__version__, "deepspeed", deepspeed.__version__, "torchao", torchao.__version__)'
