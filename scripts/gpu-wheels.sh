#!/usr/bin/env bash
# Run HERE (a machine with PyPI) before a device run: puts into .whl/ the wheels the lent GPU machine lacks.
# That machine reaches no package index; its image has CUDA torch, accelerate, tokenizers, safetensors,
# huggingface_hub, pyarrow and the rest (/work/.library/device/KINDS.md), not these. Versions are this venv's, so
# the GPU runs use the code the CPU suite tested; torch stays the image's CUDA build (a CUDA wheel is GBs).
# scripts/gpu-offline-env.sh installs them there. The wheels are for CPython 3.12, the image's Python.
set -euo pipefail
cd "$(dirname "$0")/.."
ver() { .venv/bin/python -c "import importlib.metadata as m; print(m.version('$1'))"; }
mkdir -p .whl
rm -f .whl/*.whl
pkgs=()
for p in transformers peft torchao submitit hjson pydantic pydantic_core annotated-types typing-inspection \
         typing_extensions datasets dill multiprocess bitsandbytes; do
  pkgs+=("$p==$(ver "$p")")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d .whl "${pkgs[@]}"  # 2_24: bitsandbytes' wheel (py3-none, its CUDA libs inside)
# DeepSpeed publishes a source archive only: build its pure-Python wheel (no ops; they JIT-compile on first use).
.venv/bin/python -m pip wheel -q --no-deps --no-build-isolation -w .whl "deepspeed==$(ver deepspeed)"
du -sh .whl
