"""Compile the DeepSpeed ops the launcher's engines load, once, at set-up time.

DeepSpeed JIT-compiles its C++ ops on first use (async_io ~170 s, cpu_adam ~50 s on 2 cores), inside whatever
run first needs them; DeepSpeed's own install guide offers pre-building them (DS_BUILD_OPS) for that reason.
This builds them into the launcher's extension cache (TORCH_EXTENSIONS_DIR, default <repo>/.cache/torch_extensions,
launcher.rankenv.default_extensions_dir), the directory every launcher rank and test loads from, so that the first
NVMe-offload or CPU-Adam run starts training at once. An op that cannot build here (no compiler, no libaio) is
reported and left to the run that needs it, which fails with DeepSpeed's own message; set-up does not fail.

    .venv/bin/python scripts/build_ops.py        # called by scripts/setup.sh; a no-op when already built
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

OPS = ("CPUAdamBuilder", "AsyncIOBuilder", "PinMemoryBuilder", "ShareMemCommBuilder")
"""cpu_adam: ZeRO's CPU optimizer offload; async_io and pin_memory: NVMe offload; deepspeed_shm_comm: loaded by
DeepSpeed's comm start on CPU ranks outside the launcher's engine (accelerate's and HF Trainer's DeepSpeed path)."""


def main() -> int:
    from launcher.rankenv import set_extensions_dir

    where = set_extensions_dir()  # before deepspeed is imported: it reads the variable once
    from deepspeed.accelerator import get_accelerator

    acc = get_accelerator()
    for name in OPS:
        builder = acc.create_op_builder(name)
        if builder is None:
            continue  # this accelerator has no such op
        if not builder.is_compatible(verbose=False):
            print(f"build_ops: {builder.NAME}: not buildable here (DeepSpeed's compatibility check); left to the run "
                  "that needs it", file=sys.stderr)
            continue
        t0 = time.time()
        try:
            builder.load(verbose=False)
        except Exception as e:  # a build failure must not fail set-up: only runs that need the op do
            print(f"build_ops: {builder.NAME}: build failed ({type(e).__name__}: {e}); left to the run that needs it",
                  file=sys.stderr)
            continue
        if time.time() - t0 > 5:
            print(f"build_ops: {builder.NAME} built in {time.time() - t0:.0f} s into {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
