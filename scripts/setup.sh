#!/usr/bin/env bash
# Creates .venv with everything launcher needs; with --test also what the test suite needs (pytest, ruff, trl, and
# libaio's headers for DeepSpeed's NVMe op). Idempotent: a second run only checks.
# On a machine without a GPU it pins the CPU torch wheel, never the multi-GB CUDA build.
# DeepSpeed's C++ ops are not built here: a run builds the ones its plan loads before its ranks start, once, with
# a line saying so (launcher/ops.py); scripts/test.sh builds them all, since the tests load every one.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
extras=""
[ "${1:-}" = "--test" ] && extras="[test]"
hash=$(sha1sum pyproject.toml scripts/setup.sh | sha1sum | cut -c1-12)
stamp=.venv/.launcher-setup${extras:+-test}-$hash
# A test set-up includes the plain one.
if [ ! -f "$stamp" ] && ! { [ -z "$extras" ] && [ -f ".venv/.launcher-setup-test-$hash" ]; }; then
  [ -x .venv/bin/python ] || "$PY" -m venv .venv
  # Pinned: this machine kind keeps the CPU wheel of this exact version on disk, and an unpinned torch pulls the
  # multi-GB CUDA build. On a GPU machine the same pin resolves to that machine's index's CUDA wheel.
  # One resolver pass for torch and the rest. pip compiles the bytecode (~45 s of CPU): left to the first import,
  # it is never written where PYTHONDONTWRITEBYTECODE is set, and every process then pays ~11 s more to import
  # torch and transformers (benchmarks/results/newcomer.md).
  .venv/bin/python -m pip install -q "torch==${TORCH_VERSION}" -e ".${extras}"
  if [ -n "$extras" ] && ! [ -e /usr/include/libaio.h ] && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q libaio-dev >/dev/null 2>&1 \
      || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q libaio-dev >/dev/null; }
  fi
  rm -f .venv/.launcher-setup-*
  touch "$stamp"
fi
