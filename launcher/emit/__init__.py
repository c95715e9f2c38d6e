"""Emitters: pure functions from a plan (and the job) to files other tools read: the exports for HF Trainer and
accelerate (``exports``), the sbatch script (``sbatch``) and its Slurm parameters (``slurm_params``). Each engine's
own configs are its package's (launcher.engines.<name>.emit).

No I/O here; the caller writes the files. Each output is checked against golden files in tests/emit.
"""
