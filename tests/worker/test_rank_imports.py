"""What a rank imports: a plain or FSDP2 rank trains and exports without loading DeepSpeed (about 0.26 s of CPU
a rank 0 would pay for nothing; benchmarks/results/startup.md)."""

import json
import os
import subprocess
import sys

import pytest

from tests.worker.run_dirs import plan_dict, tiny_gpt2_job, write_run_dir

RANKS = """
import json, os, socket, sys
import launcher.rank_entry  # noqa: F401  (what torchrun starts, before the worker)
from launcher.worker.main import main

for run in sys.argv[1:]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    code = main([run])
    print(json.dumps({"code": code, "deepspeed": sorted(m for m in sys.modules if m.split(".")[0] == "deepspeed")}))
"""
"""One world-of-one rank after another, each through the worker's main as rank_entry runs it; after each, the
deepspeed modules loaded so far."""


@pytest.mark.slow
def test_a_plain_or_fsdp2_rank_trains_and_exports_without_importing_deepspeed(tmp_path, examples_data):
    job = tiny_gpt2_job(str(examples_data / "causal.jsonl"), max_steps=2)
    runs = [write_run_dir(tmp_path / engine, job=job, plan=plan_dict(engine=engine, world_size=1))
            for engine in ("plain", "fsdp")]
    env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
           "OMP_NUM_THREADS": "1", "LAUNCHER_CACHE": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-c", RANKS, *map(str, runs)], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    results = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [r["code"] for r in results] == [0, 0], done.stderr[-3000:]
    for run in runs:  # each trained to the end and wrote its model (the export is where DeepSpeed crept in)
        assert json.loads((run / "model" / "export.json").read_text())["format"] == "full"
    assert [r["deepspeed"] for r in results] == [[], []]
