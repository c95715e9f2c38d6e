#!/usr/bin/env bash
# Creates .venv with everything launcher needs; with --test also what the test suite needs (pytest, ruff, trl, and
# libaio's headers for DeepSpeed's NVMe op). Idempotent: a second run only checks.
# On a machine without a GPU it pins the CPU torch wheel, never the multi-GB CUDA build.
# DeepSpeed's C++ ops are not built here: a run builds the ones its plan loads before its ranks start, once, with
# a line saying so (launcher/processes/ops.py); scripts/test.sh builds them all, since the tests load every one.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
extras=""
[ "${1:-}" = "--test" ] && extras="[test]"
# uv itself, installed by the venv's pip beside the venv (not in it, so the venv holds what pip would install).
uv_tool() {
  [ -x .cache/uv-tool/bin/uv ] \
    || .venv/bin/python -m pip install -q --disable-pip-version-check --target .cache/uv-tool uv >/dev/null 2>&1 \
    || return 1
  echo .cache/uv-tool/bin/uv
}
# pip's configuration (its files and PIP_* variables: find-links, indexes, constraints) as uv's flags: uv reads
# neither, and without them it would miss a local wheel (a CPU torch) or a constraint that pip honours.
uv_pip_config() {
  uv_args=()
  local key value v
  declare -A seen=()
  # pip lists its environment first; it overrides the files, so the first value of a key wins.
  while IFS='=' read -r key value; do
    key=${key#*.}
    [ -n "${seen[$key]:-}" ] && continue
    seen[$key]=1
    value=${value#\'}; value=${value%\'}
    for v in $value; do
      case $key in
        index-url) uv_args+=(--index-url "$v") ;;
        extra-index-url) uv_args+=(--extra-index-url "$v") ;;
        find-links) uv_args+=(--find-links "$v") ;;
        constraint) uv_args+=(--constraint "$v") ;;
        no-index) uv_args+=(--no-index) ;;
      esac
    done
  done < <(.venv/bin/python -m pip config list 2>/dev/null)
  [ -n "${PIP_CERT:-}" ] && export SSL_CERT_FILE=${SSL_CERT_FILE:-$PIP_CERT}
  return 0
}
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
  # uv installs the same pins in about half pip's wall time (benchmarks/results/newcomer.md); it goes into
  # .cache/uv-tool, never into .venv, and where it cannot be had (offline, no wheel for this machine) pip does it all.
  if ! { uv=$(uv_tool) && uv_pip_config && "$uv" pip install -q --python .venv/bin/python --compile-bytecode \
           --index-strategy unsafe-best-match "${uv_args[@]}" "torch==${TORCH_VERSION}" -e ".${extras}"; }; then
    [ -n "${uv:-}" ] && echo "setup.sh: uv did not install the packages (above); pip installs them"
    .venv/bin/python -m pip install -q "torch==${TORCH_VERSION}" -e ".${extras}"
  fi
  if [ -n "$extras" ] && ! [ -e /usr/include/libaio.h ] && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q libaio-dev >/dev/null 2>&1 \
      || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q libaio-dev >/dev/null; }
  fi
  rm -f .venv/.launcher-setup-*
  touch "$stamp"
fi
