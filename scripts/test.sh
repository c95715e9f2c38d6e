#!/usr/bin/env bash
# Set up (once, with the test tools), build every DeepSpeed op (once), start the dev Slurm cluster where we may
# (root + apt), lint, and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$PWD/.cache/torch_extensions}
export HF_HUB_OFFLINE=1
# The tests load every op (CPU Adam, NVMe's async I/O, the CPU ranks' shm all-reduce): ~5 min on 2 cores the first
# time, each with a line; a no-op once built. A run builds only what its plan loads (launcher/processes/ops.py).
.venv/bin/python -m launcher.processes.ops --all || echo "test.sh: an op did not build (above); the tests that load it will fail"
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  bash slurm/dev-cluster/start.sh
else
  echo "test.sh: not root or no apt-get: the Slurm tests will skip and say why"
fi
.venv/bin/ruff check launcher tests benchmarks scripts
set +e
.venv/bin/python -m pytest "$@"
rc=$?
set -e
# pytest's 5 means it collected no test: that is a failure of the suite, not a pass.
[ "$rc" = 5 ] && echo "test.sh: pytest collected no tests" >&2
exit "$rc"
