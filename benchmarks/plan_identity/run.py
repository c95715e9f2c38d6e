"""Plans unchanged: record what `launch plan` answers for a set of jobs, to diff before and after a refactor.

    .venv/bin/python benchmarks/plan_identity/run.py record DIR [PREFIX]   # one file per case (+ --out dirs)
    diff -r BEFORE AFTER                                             # a structural change must show nothing

Every example job as text and as --json, and the cases a refactor of the planner's plan side can move: every math
lever allowed, LoRA and QLoRA, 70B on 1024 GPUs with every lever, hybrid FSDP2, pins that admit nothing or that a
layout refuses, a forced plan, a no-fit answer, a --script plan, fp16, and the --out exports (ds_config.json,
ds_config.hf.json, fsdp.yaml, accelerate.yaml, job.sbatch). Each case runs as its own `launch` process with the
same LAUNCHER_CACHE (.cache/plan-identity), so both records read the same model statistics and probe constants.
Written for issue 37 §1-2 / 38 §1 (levers as specs, layouts owned by the engines, one package per engine).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ALL_MATH = "train.allow_levers=[adamw8bit,adamw4bit,adafactor,pure_bf16,qlora]"
EXAMPLES = ["chat-sft", "llama-3b-24gb", "llama-405b", "llama-70b", "llama-7b-lora", "minilm-embed", "seq-cls",
            "tiny-gpt2"]

CASES: list[tuple[str, list[str]]] = [
    *[(f"{name}.txt", [f"examples/{name}.yaml"]) for name in EXAMPLES],
    *[(f"{name}.json", [f"examples/{name}.yaml", "--json"]) for name in EXAMPLES],
    ("3b-all-levers.txt", ["examples/llama-3b-24gb.yaml", ALL_MATH]),
    ("3b-all-levers.json", ["examples/llama-3b-24gb.yaml", ALL_MATH, "--json"]),
    ("3b-all-levers-2gpu.txt", ["examples/llama-3b-24gb.yaml", ALL_MATH, "--gpus", "2"]),
    ("3b-fp16-h100.txt", ["examples/llama-3b-24gb.yaml", "--hardware", "h100-80gb", "train.precision=fp16",
                          "--budget", "30GB"]),
    ("3b-fsdp-pure-8bit.txt", ["examples/llama-3b-24gb.yaml", "train.allow_levers=[pure_bf16,adamw8bit]",
                               "strategy.engine=fsdp", "--gpus", "4"]),
    ("3b-zero2-adafactor-refused.txt", ["examples/llama-3b-24gb.yaml", "train.allow_levers=[adafactor]",
                                        "strategy.zero_stage=2", "strategy.low_memory_optimizer=adafactor"]),
    ("3b-pure-unallowed.txt", ["examples/llama-3b-24gb.yaml", "strategy.pure_bf16=true"]),
    ("3b-pins-admit-none.txt", ["examples/llama-3b-24gb.yaml", "strategy.engine=fsdp", "strategy.zero_stage=3"]),
    ("7b-lora-qlora.txt", ["examples/llama-7b-lora.yaml", ALL_MATH]),
    ("7b-lora-qlora-1gpu.json", ["examples/llama-7b-lora.yaml", ALL_MATH, "--gpus", "1", "--budget", "8GB",
                                 "--json"]),
    ("7b-lora-zero3.txt", ["examples/llama-7b-lora.yaml", "strategy.zero_stage=3", "--hardware", "a100-40gb"]),
    ("70b-1024-all-levers.json", ["examples/llama-70b.yaml", ALL_MATH, "train.global_batch_size=65536", "--json"]),
    ("70b-1024-all-levers.txt", ["examples/llama-70b.yaml", ALL_MATH]),
    ("70b-hybrid.txt", ["examples/llama-70b.yaml", "--nodes", "2", "strategy.engine=fsdp",
                        "train.global_batch_size=64"]),
    ("70b-hybrid-pinned.json", ["examples/llama-70b.yaml", "--nodes", "4", "strategy.engine=fsdp",
                                "strategy.fsdp_sharding=hybrid", "train.global_batch_size=64", "--json"]),
    ("70b-nofit.txt", ["examples/llama-70b.yaml", "--nodes", "1", "--gpus", "1", "--budget", "1GB"]),
    ("70b-nofit.json", ["examples/llama-70b.yaml", "--nodes", "1", "--gpus", "1", "--budget", "1GB", "--json"]),
    ("70b-nvme.txt", ["examples/llama-70b.yaml", "--nodes", "2", "--budget", "60GB",
                      "train.global_batch_size=16"]),
    ("gpt2-zero3-offload.txt", ["examples/tiny-gpt2.yaml", "strategy.zero_stage=3",
                                "strategy.offload_optimizer=cpu", "strategy.offload_params=cpu"]),
    ("gpt2-fsdp-levers.txt", ["examples/tiny-gpt2.yaml", "strategy.engine=fsdp",
                              "strategy.fsdp_reshard_after_forward=false", "strategy.loss_chunks=4",
                              "strategy.activation_checkpointing=true", "strategy.checkpoint_every=2"]),
    ("gpt2-forced.txt", ["examples/tiny-gpt2.yaml", "--budget", "16MB", "--force", "strategy.engine=deepspeed",
                         "strategy.zero_stage=1", "strategy.micro_batch_size=4",
                         "strategy.activation_checkpointing=false", "strategy.offload_optimizer=none",
                         "strategy.offload_params=none"]),
    ("gpt2-script.txt", ["examples/tiny-gpt2.yaml", "--script", "examples/hf_trainer/train.py"]),
    ("gpt2-script-pinned.json", ["examples/tiny-gpt2.yaml", "--script", "examples/hf_trainer/train.py",
                                 "strategy.loss_chunks=8", "--json"]),
    ("gpt2-bf16-all.txt", ["examples/tiny-gpt2.yaml", "train.precision=bf16", ALL_MATH]),
    ("gpt2-ops-policy.txt", ["examples/tiny-gpt2.yaml", "strategy.checkpoint_policy=ops"]),
    ("gpt2-in-backward.txt", ["examples/tiny-gpt2.yaml", "strategy.optimizer_in_backward=true",
                              "train.global_batch_size=2"]),
    ("seq-cls-all.txt", ["examples/seq-cls.yaml", ALL_MATH]),
    ("minilm-lora-all.txt", ["examples/minilm-embed.yaml", ALL_MATH,
                             "train.lora={r: 8, target_modules: [query, value]}"]),
    ("chat-lora.txt", ["examples/chat-sft.yaml", "train.lora={r: 4, target_modules: [q_proj, v_proj]}"]),
    # A LoRA-wrapped head cannot chunk its loss: the search never offered chunked loss here, while the lever
    # decision scored it (issue 37's disagreement); this one's lever line changes with the fix.
    ("fix-chat-lora-head.txt", ["examples/chat-sft.yaml", "train.lora={r: 4, target_modules: [q_proj, lm_head]}"]),
]

OUT_CASES: list[tuple[str, list[str]]] = [
    ("out-gpt2", ["examples/tiny-gpt2.yaml"]),
    ("out-gpt2-fsdp", ["examples/tiny-gpt2.yaml", "strategy.engine=fsdp", "train.precision=bf16",
                       "train.allow_levers=[pure_bf16,adamw8bit]"]),
    ("out-gpt2-zero2-8bit", ["examples/tiny-gpt2.yaml", "strategy.zero_stage=2", "train.precision=bf16",
                             "train.allow_levers=[pure_bf16,adamw8bit]", "strategy.low_memory_optimizer=adamw8bit"]),
    ("out-70b", ["examples/llama-70b.yaml", "--sbatch"]),
    ("out-7b-lora", ["examples/llama-7b-lora.yaml", "strategy.zero_stage=3", "--hardware", "a100-40gb"]),
    ("out-70b-hybrid", ["examples/llama-70b.yaml", "--nodes", "4", "strategy.engine=fsdp",
                        "strategy.fsdp_sharding=hybrid", "train.global_batch_size=64", "--sbatch"]),
]


def launch(argv: list[str], env: dict) -> str:
    p = subprocess.run([sys.executable, "-m", "launcher", "plan", *argv], cwd=REPO, env=env, capture_output=True,
                       text=True)
    return f"$ launch plan {' '.join(argv)}\nexit {p.returncode}\n--- stdout\n{p.stdout}--- stderr\n{p.stderr}"


def record(out: Path, only: str = "") -> None:
    """Every case's answer (or those whose name starts with ``only``) into ``out`` (replaced, or added to)."""
    if not only:
        shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "LAUNCHER_CACHE": str(REPO / ".cache" / "plan-identity"), "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": str(REPO)}
    for name, argv in CASES:
        if not name.startswith(only):
            continue
        (out / name).write_text(launch(argv, env))
        print(name, flush=True)
    for name, argv in OUT_CASES:
        if not name.startswith(only):
            continue
        # The same --out path in both records: job.yaml, accelerate.yaml and the script name it.
        target = Path("/tmp/plan-identity-out") / name
        shutil.rmtree(target, ignore_errors=True)
        (out / f"{name}.log").write_text(launch([*argv, "--out", str(target)], env))
        if target.is_dir():
            shutil.copytree(target, out / name, ignore=shutil.ignore_patterns(".launcher-run", ".lock"))
        print(name, flush=True)


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4) or sys.argv[1] != "record":
        sys.exit(__doc__)
    record(Path(sys.argv[2]), *sys.argv[3:])
