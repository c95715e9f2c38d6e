#!/usr/bin/env bash
# Set up (once), start the dev Slurm cluster where we may (root + apt), lint, and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$PWD/.cache/torch_extensions}
export HF_HUB_OFFLINE=1
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  bash slurm/dev-cluster/start.sh
else
  echo "test.sh: not root or no apt-get: the Slurm tests will skip and say why"
fi
.venv/bin/ruff check launcher tests benchmarks
set +e
.venv/bin/python -m pytest "$@"
rc=$?
set -e
# pytest's 5 means it collected no test: that is a failure of the suite, not a pass.
[ "$rc" = 5 ] && echo "test.sh: pytest collected no tests" >&2
exit "$rc"
