"""`launch calibrate`: measure a machine into a hardware profile, and refit activation constants from runs.

- ``hardware``: micro-benchmarks on local ranks (matmul FLOP/s, all-reduce, host copies, CPU Adam, per-block cost).
- ``profiles``: the files under ``cache_dir()/profiles`` that ``launcher.inputs.machine`` and
  ``launcher.inputs.plan_inputs`` read.
- ``fit``: least squares of measured activation bytes on the memory model's activation terms.
"""
