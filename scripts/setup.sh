#!/usr/bin/env bash
# Creates .venv with everything launcher needs. Idempotent: a second run only checks.
# On a machine without a GPU it pins the CPU torch wheel, never the multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
stamp=.venv/.launcher-setup-$(sha1sum pyproject.toml scripts/setup.sh | sha1sum | cut -c1-12)
if [ ! -f "$stamp" ]; then
  [ -x .venv/bin/python ] || "$PY" -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip
  # Pinned: this machine kind keeps the CPU wheel of this exact version on disk, and an unpinned torch pulls the
  # multi-GB CUDA build. On a GPU machine the same pin resolves to that machine's index's CUDA wheel.
  .venv/bin/python -m pip install -q "torch==${TORCH_VERSION}"
  .venv/bin/python -m pip install -q -e ".[test]"
  # NVMe offload compiles DeepSpeed's async_io op, which needs libaio's headers.
  if ! [ -e /usr/include/libaio.h ] && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q libaio-dev >/dev/null 2>&1 \
      || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q libaio-dev >/dev/null; }
  fi
  rm -f .venv/.launcher-setup-*
  touch "$stamp"
fi
# DeepSpeed's ops, compiled once here rather than inside the first run that needs them (scripts/build_ops.py).
ext=${TORCH_EXTENSIONS_DIR:-$PWD/.cache/torch_extensions}
for op in cpu_adam async_io pin_memory deepspeed_shm_comm; do
  if ! [ -e "$ext/$op/$op.so" ]; then .venv/bin/python scripts/build_ops.py 2>&1 | grep -v "Setting accelerator to CPU" || true; break; fi
done
