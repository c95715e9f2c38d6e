"""`plan --out`'s accelerate.yaml used as written: `launch plan --out DIR` through the real CLI, then the launch
line DIR/accelerate.yaml documents, on 2 CPU ranks, running accelerate_check.py, which records on every rank what
the prepared engine holds. One DeepSpeed plan and one FSDP2 plan, a few steps of a tiny GPT-2 each.

On CPU accelerate does not apply FSDP at all (its FSDP path is for GPU-family devices; with ACCELERATE_USE_CPU it
runs DDP over gloo): the FSDP test asserts that as the CPU truth, beside the settings accelerate would apply, and
asserts the sharding itself where CUDA is present.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import torch
import yaml

from tests.conftest import REPO, base_job

LAUNCH = str(REPO / ".venv" / "bin" / "launch")
CHECK = Path(__file__).with_name("accelerate_check.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def plan_out(tmp_path: Path, data_file: Path, **over) -> tuple[Path, dict]:
    """`launch plan JOB --out DIR` for a bf16 tiny GPT-2 on 2 ranks; the export dir and its plan.json."""
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(base_job(str(data_file), **{"train.precision": "bf16", **over}), sort_keys=False))
    out = tmp_path / "export"
    proc = subprocess.run([LAUNCH, "plan", str(job), "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return out, json.loads((out / "plan.json").read_text())


def documented_line(export: Path) -> str:
    """The launch line accelerate.yaml's header gives, as written there."""
    text = (export / "accelerate.yaml").read_text()
    lines = [ln.removeprefix("#").strip() for ln in text.splitlines() if ln.startswith("#")]
    return next(ln for ln in lines if re.search(r"\baccelerate launch --config_file ", ln))


def run_documented(export: Path, out: Path, env_extra: dict[str, str] | None = None) -> list[dict]:
    """Run the documented line with accelerate_check.py as train.py; each rank's facts, by rank."""
    line = documented_line(export)
    assert line.endswith(" train.py"), line
    # The script and its arguments in place of train.py; a free port, since other tests may hold 29500.
    line = line.removesuffix(" train.py") + f" --main_process_port {_free_port()} " + " ".join(
        shlex.quote(str(a)) for a in (CHECK, export, out))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", **(env_extra or {})}
    env = {k: v for k, v in env.items() if v != ""}  # an empty value: unset
    proc = subprocess.run(["bash", "-c", line], env=env, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, f"{line}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    facts = [json.loads(p.read_text()) for p in sorted(out.glob("rank-*.json"))]
    assert [f["rank"] for f in facts] == [0, 1], facts
    return facts


def test_deepspeed_export_runs_the_plan(tmp_path, data_file):
    export, plan = plan_out(tmp_path, data_file, **{"strategy.engine": "deepspeed", "strategy.zero_stage": 2,
                                                   "strategy.micro_batch_size": 2})
    assert plan["precision"] == "bf16" and plan["grad_accum_steps"] > 1  # accumulation accelerate must not drop
    # A shell without TORCH_EXTENSIONS_DIR (issue 36 section 2): the line itself names the launcher's ops, so
    # DeepSpeed's CPU comm start loads deepspeed_shm_comm from there instead of compiling it for two minutes into
    # torch's own cache (under XDG_CACHE_HOME).
    xdg = tmp_path / "xdg"
    hf_home = os.environ.get("HF_HOME", str(Path.home() / ".cache" / "huggingface"))
    env = {"XDG_CACHE_HOME": str(xdg), "HF_HOME": hf_home, "TORCH_EXTENSIONS_DIR": ""}
    facts = run_documented(export, tmp_path / "facts", env)
    assert not (xdg / "torch_extensions").exists(), sorted(p.name for p in xdg.rglob("*"))
    for f in facts:
        assert f["distributed_type"] == "DEEPSPEED" and f["world_size"] == f["engine_dp_world_size"] == 2
        assert (f["bf16"], f["fp16"], f["param_dtype"], f["mixed_precision"]) == (True, False, "bfloat16", "bf16")
        assert f["zero_stage"] == plan["zero_stage"]
        assert f["engine_micro_batch"] == f["loader_batch_size"] == plan["micro_batch_size"]
        assert f["engine_accumulation"] == f["accumulation"] == plan["grad_accum_steps"]
        assert f["optimizer_steps"] == 2 and f["losses_finite"]


def test_fsdp2_export_runs_the_plan_and_says_what_cpu_does(tmp_path, data_file):
    export, plan = plan_out(tmp_path, data_file, **{"strategy.engine": "fsdp", "strategy.micro_batch_size": 2})
    assert plan["precision"] == "bf16" and plan["grad_accum_steps"] > 1
    cuda = torch.cuda.is_available()
    # On CPU the documented ACCELERATE_USE_CPU=1: without it accelerate sees no backend and each rank runs alone.
    facts = run_documented(export, tmp_path / "facts", None if cuda else {"ACCELERATE_USE_CPU": "1"})
    for f in facts:
        assert f["world_size"] == 2 and f["mixed_precision"] == "bf16"
        assert f["accumulation"] == plan["grad_accum_steps"] and f["loader_batch_size"] == plan["micro_batch_size"]
        # What `accelerate launch` handed the ranks from accelerate.yaml: FSDP2 with the plan's resharding.
        assert f["env_fsdp_version"] == 2 and f["env_wrap_classes"] == ["GPT2Block"]
        assert f["env_reshard_after_forward"] is plan["fsdp_reshard_after_forward"]
        assert f["optimizer_steps"] == 2 and f["losses_finite"]
        if cuda:  # accelerate applied it: every block and the root are FSDP2 units over DTensor parameters
            assert f["distributed_type"] == "FSDP" and f["plugin_applied"] and f["fsdp_version"] == 2
            assert f["root_is_fsdp2"] and f["blocks_fsdp2"] == f["blocks"] and f["dtensor_params"] == f["params"]
            assert f["block_reshards_after_forward"] is plan["fsdp_reshard_after_forward"]
            assert f["param_dtype"] == "bfloat16"
        else:  # CPU: the settings arrive, but accelerate runs replicated DDP; nothing is sharded (docs say so)
            assert f["distributed_type"] == "MULTI_CPU" and not f["plugin_applied"]
            assert not f["root_is_fsdp2"] and f["blocks_fsdp2"] == 0 and f["dtensor_params"] == 0

