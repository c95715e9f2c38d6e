"""Malformed input through the real CLI: exit 2, one clear message (field, value, rule, fix), nothing started.

Every case runs `launcher.cli.main.main([...])` in-process (a few also through the `launch` binary) inside a
sandbox: the working dir, HOME and the launcher's cache are temporary, and after each case the sandbox holds
nothing but the inputs the case wrote and the shared planner cache: no run dir, no logs, no rank started.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from launcher.cli.main import main
from tests.conftest import REPO
from tests.faults.harness import Case, Sandbox, check_refused, entries, one_error_block
from tests.faults.harness import read_only_dir as _read_only_dir
from tests.model.families import save_model_dir

LAUNCH = str(REPO / ".venv" / "bin" / "launch")


def _nvme_pins(**cluster) -> dict:
    return {"strategy": {"engine": "deepspeed", "zero_stage": 3, "offload_optimizer": "nvme",
                         "offload_params": "nvme"}, "cluster": cluster}


CASES = [
    # -- the YAML itself ------------------------------------------------------------------------------------------
    Case("yaml-unclosed-flow", lambda s: [s.raw("name: x\ntrain: {global_batch_size: 8\nmodel: y\n")],
         ["raw.yaml: YAML syntax error at line 3, column", "fix the YAML there"]),
    Case("yaml-tab-indent", lambda s: [s.raw("name: x\ntrain:\n\tlr: 1\n")],
         ["YAML syntax error at line 3, column 1", "'\\t' that cannot start any token"]),
    Case("yaml-python-tag", lambda s: [s.raw("name: !!python/object/apply:os.system ['echo pwned']\n")],
         ["YAML syntax error at line 1, column 7", "python/object/apply:os.system"]),
    Case("yaml-duplicate-key", lambda s: [s.raw(s.job().read_text().replace("  lr: 0.001\n",
                                                                            "  lr: 0.001\n  lr: 1\n"))],
         ["train.lr: duplicate key at line", "(first at line", "delete the one you do not mean"]),
    Case("yaml-empty-file", lambda s: [s.raw("")], ["raw.yaml: the job file is empty", "examples/minilm-embed.yaml"]),
    Case("yaml-top-level-list", lambda s: [s.raw("- name\n- model\n")],
         ["must be a mapping of keys, got list", "write name:, model:"]),
    Case("job-file-missing", lambda s: [s.root / "nope.yaml"], ["nope.yaml: no such job file; check the path"]),
    Case("job-file-is-a-directory", lambda s: [s.root],
         ["not a regular file (a directory); pass the path of a YAML job file"]),
    # -- keys and types -------------------------------------------------------------------------------------------
    Case("unknown-top-level-key", lambda s: [s.raw(s.job().read_text().replace("train:", "trian:"))],
         ["trian: unknown key; did you mean 'train'?"]),
    Case("pure-bf16-without-bf16", lambda s: [s.job(**{"train.allow_levers": ["pure_bf16"], "strategy.pure_bf16": True,
                                                       "train.precision": "fp32"})],
         ["strategy.pure_bf16: true keeps weights, gradients and optimizer states in bf16, but train.precision is "
          "'fp32'; set train.precision: bf16"]),
    Case("low-bit-optimizer-with-deepspeed-offload",
         lambda s: [s.job(**{"train.allow_levers": ["adamw8bit"]},
                          strategy={"engine": "deepspeed", "zero_stage": 2, "offload_optimizer": "cpu",
                                    "low_memory_optimizer": "adamw8bit"})],
         ["strategy.low_memory_optimizer: 'adamw8bit' is not offered with DeepSpeed ZeRO-2 (optimizer offload: cpu)",
          "DeepSpeedCPUAdam", "leave strategy.low_memory_optimizer out or pin another layout"]),
    Case("pure-bf16-with-deepspeed-zero0",
         lambda s: [s.job(**{"train.allow_levers": ["pure_bf16"], "train.precision": "bf16"},
                          strategy={"engine": "deepspeed", "zero_stage": 0, "pure_bf16": True})],
         ["strategy.pure_bf16: True is not offered with DeepSpeed ZeRO-0: DeepSpeed keeps bf16 master weights and "
          "gradients only under ZeRO-1, 2 or 3", "leave strategy.pure_bf16 out or pin another layout"]),
    Case("unknown-nested-key", lambda s: [s.job(**{"train.max_step": 4})],
         ["train.max_step: unknown key; did you mean 'max_steps'?"]),
    Case("wrong-type-int", lambda s: [s.job(**{"train.global_batch_size": "eight"})],
         ["train.global_batch_size: 'eight' must be an integer", "as a whole number, e.g. 8"]),
    Case("wrong-type-float", lambda s: [s.job(**{"train.lr": "fast"})],
         ["train.lr: 'fast' must be a number", "e.g. 2.0e-5"]),
    Case("bool-for-int", lambda s: [s.job(**{"train.max_steps": True})], ["train.max_steps: True must be an integer"]),
    Case("enum-typo", lambda s: [s.job(task="causal")],
         ["task: 'causal' is not one of 'causal_lm', 'seq_cls', 'sentence_embedding'", "did you mean 'causal_lm'?"]),
    Case("float-for-zero-stage", lambda s: [s.job(**{"strategy.zero_stage": 1.0})],
         ["strategy.zero_stage: 1.0 is not one of 0, 1, 2, 3", "did you mean"]),
    Case("nan-learning-rate", lambda s: [s.raw(s.job().read_text().replace("lr: 0.001", "lr: .nan"))],
         ["train.lr: nan must be a finite number", "e.g. 2.0e-5"]),
    Case("inline-arch-not-divisible", lambda s: [s.job(**{"model.hidden_size": 66})],
         ["model.hidden_size: 66 is not divisible by model.num_heads 4", "use a multiple of 4"]),
    Case("seq-longer-than-position-table", lambda s: [s.job(**{"model.max_position_embeddings": 32})],
         ["data.max_seq_len: 64 is longer than model.max_position_embeddings 32", "--seq-len 32"]),
    # -- sizes ----------------------------------------------------------------------------------------------------
    Case("negative-max-steps", lambda s: [s.job(**{"train.max_steps": -5})],
         ["train.max_steps: -5 must be greater than 0", "max_steps: 100"]),
    Case("zero-global-batch", lambda s: [s.job(**{"train.global_batch_size": 0})],
         ["train.global_batch_size: 0 must be greater than 0", "global_batch_size: 32"]),
    Case("zero-warn-total-time", lambda s: [s.job(**{"train.warn_total_time_h": 0})],
         ["train.warn_total_time_h: 0.0 must be greater than 0", "or null to never warn"]),
    Case("negative-max-grad-norm", lambda s: [s.job(**{"train.max_grad_norm": -1.0})],
         ["train.max_grad_norm: -1.0 must be a finite number >= 0", "turn gradient clipping off"]),
    Case("zero-micro-batch", lambda s: [s.job(**{"strategy.micro_batch_size": 0})],
         ["strategy.micro_batch_size: 0 must be greater than 0", "or leave it out"]),
    Case("negative-seq-len-flag", lambda s: [s.job(), "--seq-len", "-4"],
         ["argument --seq-len: '-4' must be greater than 0", "e.g. 4"]),
    Case("zero-gpus-flag", lambda s: [s.job(), "--gpus", "0"], ["argument --gpus: '0' must be greater than 0"]),
    Case("budget-unparsable-in-file", lambda s: [s.job(budget="lots")],
         ["budget: 'lots' is not a size", "16GB, 16GiB"]),
    Case("budget-unparsable-flag", lambda s: [s.job(), "--budget", "sixteen"],
         ["argument --budget: 'sixteen' is not a size", "GB is 1e9 bytes"]),
    Case("budget-ambiguous-flag", lambda s: [s.job(), "--budget", "16G"],
         ["argument --budget: '16G' is ambiguous: GB (10^9) or GiB (2^30)?"]),
    Case("budget-ambiguous-in-file", lambda s: [s.job(budget="16Gb")],
         ["budget: '16Gb' is ambiguous: GB (10^9) or GiB (2^30)?"]),
    Case("host-ram-ambiguous", lambda s: [s.job(cluster={"host_ram_per_node": "512g"})],
         ["cluster.host_ram_per_node: '512g' is ambiguous: GB (10^9) or GiB (2^30)?"]),
    Case("budget-overflows-float", lambda s: [s.job(), "--budget", "1e400GB"],
         ["argument --budget: '1e400GB' is too large to be a size"]),
    Case("budget-absurd", lambda s: [s.job(budget="50TB")],
         ["budget: 50.00 TB per GPU is absurd", "e.g. --budget 80GB"]),
    Case("budget-too-small", lambda s: [s.job(budget="10MB")],
         ["budget: 10.00 MB is below 16 MB", "did you mean GB"]),
    Case("budget-over-the-card", lambda s: [s.job(), "--hardware", "a100-40gb", "--budget", "80GB"],
         ["budget: 80.00 GB is more than an a100-40gb holds (42.95 GB)", "give at most the card's memory"]),
    Case("cpu-budget-over-host-ram",
         lambda s: [s.job(cluster={"hardware": "cpu", "host_ram_per_node": "2GB"}), "--budget", "4GB"],
         ["budget: 4.00 GB per CPU rank is more than cluster.host_ram_per_node (2.00 GB)"]),
    Case("unknown-hardware", lambda s: [s.job(), "--hardware", "tpu-v9"],
         ["cluster.hardware: 'tpu-v9' is not a known profile", "use one of"]),
    Case("gpus-do-not-divide-global-batch", lambda s: [s.job(), "--gpus", "3"],
         ["train.global_batch_size: 8 is not divisible by 3 GPUs", "use a multiple of 3"]),
    Case("micro-batch-does-not-divide", lambda s: [s.job(**{"strategy.micro_batch_size": 3})],
         ["strategy.micro_batch_size: 3 does not divide the per-rank batch 4", "use one of [1, 2, 4]"]),
    Case("eval-fraction-out-of-range", lambda s: [s.job(**{"data.eval_fraction": 0.9})],
         ["data.eval_fraction: 0.9 must be between 0 and 0.5", "e.g. 0.1"]),
    Case("max-steps-and-epochs", lambda s: [s.job(**{"train.epochs": 1})],
         ["train.epochs: given together with train.max_steps; keep one of them"]),
    Case("negative-auto-fallback-flag", lambda s: [s.job(), "--auto-fallback", "-1"],
         ["argument --auto-fallback: '-1' must not be negative"]),
    Case("negative-hang-timeout", lambda s: [s.job(), "--hang-timeout", "-5"],
         ["argument --hang-timeout: '-5' must be 0 or more seconds"]),
    # -- data and model -------------------------------------------------------------------------------------------
    Case("missing-data-file", lambda s: [s.job(**{"data.path": str(s.root / "nope.jsonl")})],
         ["data.path: ", "nope.jsonl' does not exist", "check the path"]),
    Case("empty-dataset", lambda s: [s.job(**{"data.path": str(s.file("empty.jsonl", "\n\n"))})],
         ["data.path: ", "empty.jsonl' holds no examples", "add at least one record"]),
    Case("data-not-jsonl", lambda s: [s.job(**{"data.path": str(s.file("data.txt"))})],
         ["data.path: ", "data.txt' must end in .jsonl, .json, .csv, .parquet or .arrow", "convert the data to JSONL"]),
    Case("model-dir-without-config", lambda s: [s.job(model=str(s.root))],
         ["model: ", "is a directory without config.json", "point model at a transformers model dir"]),
    Case("model-empty-name", lambda s: [s.job(model="  ")],
         ["model: '  ' names no model", "a bundled name such as gpt2-124m"]),
    Case("lora-targets-not-in-model", lambda s: [s.job(**{"train.lora": {"r": 4, "target_modules": ["q_proj"]}})],
         ["train.lora.target_modules: ['q_proj'] match no linear layer of this gpt2 model", "use some of",
          "c_attn"]),
    Case("hub-id-not-in-the-cache", lambda s: [s.job(model="acme/not-downloaded-here")],
         ["model: 'acme/not-downloaded-here' is not a local dir, a bundled config",
          "nor in the local Hugging Face cache", "launcher never downloads"]),
    Case("encoder-decoder-model", lambda s: [s.job(model=str(save_model_dir("t5", s.root)))],
         ["model: t5 is an encoder-decoder (seq2seq) model, which launcher does not train",
          "causal_lm, seq_cls, sentence_embedding"]),
    Case("causal-lm-on-an-encoder", lambda s: [s.job(model=str(save_model_dir("bert", s.root)))],
         ["task: causal_lm needs a decoder, but bert is an encoder"]),
    Case("seq-past-a-model-dirs-position-table",
         lambda s: [s.job(model=str(save_model_dir("mistral", s.root))), "--seq-len", "100000"],
         ["data.max_seq_len: 100000 tokens is past this mistral model's position table "
          "(max_position_embeddings = 256)"]),
    Case("fp16-on-cpu-ranks", lambda s: [s.job(**{"train.precision": "fp16"})],
         ["train.precision: 'fp16' is refused on CPU ranks", "use bf16 or fp32"]),
    # -- host RAM, NVMe, the run dir ------------------------------------------------------------------------------
    Case("nvme-path-under-a-file",
         lambda s: [s.job(**_nvme_pins(nvme_path=str(s.root / "plain-file" / "nvme"), nvme_free="1TB"))],
         ["cluster.nvme_path: ", "plain-file/nvme' cannot be created", "is a file, not a directory",
          "point nvme_path at a directory"],
         setup=lambda s: s.file("plain-file") and None, keeps=["plain-file"]),
    Case("nvme-lacks-space", lambda s: [s.job(**_nvme_pins(nvme_path=str(s.root / "nvme"), nvme_free="1KB"))],
         ["NVMe: needs", "has 1.00 KB free", "cluster.nvme_free: 1.00 KB is less than the NVMe offload needs"]),
    Case("host-ram-too-small-for-offload",
         lambda s: [s.job(strategy={"engine": "deepspeed", "zero_stage": 3, "offload_optimizer": "cpu",
                                    "offload_params": "cpu"},
                            # A GPU profile: on CPU ranks a 1 MB node cannot hold the 1 GB budget at all
                            # (cpu-budget-over-host-ram), so the offload's own need would never be reached.
                            cluster={"host_ram_per_node": "1MB", "hardware": "a100-80gb"},
                            # 4 GB: a GPU rank holds ~1.9 GB outside the allocator (context, kernels, NCCL).
                            budget="4GB")],
         ["host RAM: needs", "has 1.00 MB", "cluster.host_ram_per_node: 1.00 MB is less than the offload needs"]),
    Case("run-dir-under-a-file", lambda s: [s.job(), "--run-dir", s.root / "plain-file" / "run"],
         ["--run-dir: ", "plain-file/run' is not writable (Not a directory)", "choose a directory you can write"],
         setup=lambda s: s.file("plain-file") and None, keeps=["plain-file"]),
    Case("run-dir-is-a-file", lambda s: [s.job(), "--run-dir", s.root / "plain-file"],
         ["--run-dir: ", "plain-file' exists and is not a directory", "choose another path"],
         setup=lambda s: s.file("plain-file") and None, keeps=["plain-file"]),
    Case("run-dir-holds-a-run", lambda s: [s.job()],
         ["--run-dir: ", "already holds a run; pass --overwrite", "or choose another --run-dir"],
         setup=lambda s: (s.run_dir.mkdir(), (s.run_dir / "report.json").write_text("{}"),
                          (s.run_dir / ".launcher-run").write_text("{}")) and None, keeps=["run"]),
    Case("resume-without-checkpoint", lambda s: [s.job(), "--resume"],
         ["--resume: ", "has no checkpoint to resume from", "run without --resume"]),
    Case("script-missing", lambda s: [s.job(), "--script", s.root / "train.py"],
         ["--script: ", "train.py' does not exist", "give the path of your training script"]),
    Case("multi-node-without-rendezvous", lambda s: [s.job(), "--nodes", "2"],
         ["--nodes: a multi-node run needs --rdzv-endpoint host:port"]),
    Case("auto-fallback-with-slurm", lambda s: [s.job(auto_fallback=2), "--slurm"],
         ["auto_fallback: 2 relaunches the ranks of this node only", "set auto_fallback: 0"]),
    # -- Slurm ----------------------------------------------------------------------------------------------------
    Case("slurm-unknown-additional-parameter",
         lambda s: [s.job(slurm={"additional_parameters": {"gpu_typo": 1}}), "--slurm"],
         ["slurm.additional_parameters.gpu_typo: unknown key", "valid keys:", "mem_per_gpu"]),
    # -- every problem in one error ------------------------------------------------------------------------------
    Case("four-problems-of-four-kinds",
         lambda s: [s.job(**{"train.max_step": 4, "train.max_steps": None, "data.max_seq_len": -5,
                             "cluster.hardware": "a100-40gb", "budget": "80GB"}), "--gpus", "3"],
         ["train.max_step: unknown key; did you mean 'max_steps'?",
          "data.max_seq_len: -5 must be greater than 0",
          "budget: 80.00 GB is more than an a100-40gb holds (42.95 GB)",
          "train.global_batch_size: 8 is not divisible by 3 GPUs"]),
    Case("slurm-section-typo", lambda s: [s.job(slurm={"partiton": "gpu"}), "--slurm"],
         ["slurm.partiton: unknown key; did you mean 'partition'?",
          "valid keys: partition, account, qos, timeout_min, cpus_per_task, mem_gb, constraint, exclusive, "
          "signal_delay_s, max_requeues, array_parallelism, additional_parameters, setup"]),
    # -- flags ----------------------------------------------------------------------------------------------------
    Case("negative-budget-flag", lambda s: [s.job(), "--budget", "-4GB"],
         ["argument --budget: '-4GB' must be greater than 0"]),
    Case("nnodes-is-nodes", lambda s: [s.job(), "--nnodes", "2"],
         ["--nodes: a multi-node run needs --rdzv-endpoint host:port"]),
    Case("nvme-path-read-only",
         lambda s: [s.job(**_nvme_pins(nvme_path=str(_read_only_dir(s) / "nvme"), nvme_free="1TB"))],
         ["cluster.nvme_path: ", "/nvme' is not writable", "is read-only or not yours"]),
    # -- command-line conventions -------------------------------------------------------------------------------
    Case("unknown-command", lambda s: [s.job()], ["unknown command 'plna'"], verb="plna"),
    Case("override-unknown-key", lambda s: [s.job(), "train.lrr=1e-4"],
         ["train.lrr: unknown key; did you mean 'lr'?"]),
    Case("override-ambiguous-size", lambda s: [s.job(), "budget=16G"],
         ["budget: '16G' is ambiguous: GB (10^9) or GiB (2^30)?"]),
    Case("override-into-a-scalar", lambda s: [s.job(model="gpt2-124m"), "model.hidden_size=64"],
         ["model.hidden_size: 'model' is not a mapping in the job"]),
    Case("run-without-max-steps", lambda s: [s.job(**{"train.max_steps": None})],
         ["train.max_steps: missing", "give train.max_steps (e.g. 100) or train.epochs (e.g. 1)"]),
    # -- the plan verb shares the checks --------------------------------------------------------------------------
    Case("plan-verb-unknown-key", lambda s: [s.job(**{"train.learning_rate": 1})],
         ["train.learning_rate: unknown key; did you mean 'lr'?"], verb="plan"),
]


# The fix each case's message must give, by case id: a message that names the problem but not the way out fails.
FIXES = {
    "yaml-unclosed-flow": "fix the YAML there",
    "yaml-tab-indent": "fix the YAML there",
    "yaml-python-tag": "fix the YAML there",
    "yaml-duplicate-key": "delete the one you do not mean",
    "yaml-empty-file": "start from examples/minilm-embed.yaml",
    "yaml-top-level-list": "write name:, model:, task:, data:, train: lines",
    "job-file-missing": "check the path",
    "job-file-is-a-directory": "pass the path of a YAML job file",
    "unknown-top-level-key": "did you mean 'train'?",
    "unknown-nested-key": "did you mean 'max_steps'?",
    "pure-bf16-without-bf16": "set train.precision: bf16, or leave strategy.pure_bf16 out",
    "low-bit-optimizer-with-deepspeed-offload": "leave strategy.low_memory_optimizer out or pin another layout",
    "pure-bf16-with-deepspeed-zero0": "leave strategy.pure_bf16 out or pin another layout",
    "wrong-type-int": "write train.global_batch_size as a whole number, e.g. 8",
    "wrong-type-float": "write train.lr as a number, e.g. 2.0e-5",
    "bool-for-int": "write train.max_steps as a whole number",
    "enum-typo": "did you mean 'causal_lm'?",
    "float-for-zero-stage": "did you mean 1?",
    "nan-learning-rate": "write train.lr as a number, e.g. 2.0e-5",
    "inline-arch-not-divisible": "use a multiple of 4",
    "seq-longer-than-position-table": "use --seq-len 32 or raise max_position_embeddings",
    "negative-max-steps": "use e.g. max_steps: 100",
    "zero-warn-total-time": "use e.g. warn_total_time_h: 24, or null to never warn",
    "negative-max-grad-norm": "use e.g. 1.0, or 0 (or null)",
    "zero-global-batch": "use e.g. global_batch_size: 32",
    "zero-micro-batch": "use e.g. micro_batch_size: 4 or leave it out",
    "negative-seq-len-flag": "give e.g. 4",
    "zero-gpus-flag": "give e.g. 4",
    "budget-unparsable-in-file": "sizes take a unit: 16GB, 16GiB",
    "budget-unparsable-flag": "sizes take a unit: 16GB, 16GiB",
    "budget-ambiguous-flag": "write 16GB or 16GiB",
    "budget-ambiguous-in-file": "write 16GB or 16GiB",
    "host-ram-ambiguous": "write 512GB or 512GiB",
    "budget-overflows-float": "sizes take a unit: 16GB",
    "budget-absurd": "give the per-GPU budget, e.g. --budget 80GB",
    "budget-too-small": "did you mean GB (e.g. --budget 16GB)?",
    "budget-over-the-card": "give at most the card's memory or set cluster.hardware",
    "cpu-budget-over-host-ram": "give at most the node's RAM (--budget)",
    "unknown-hardware": "use one of",
    "gpus-do-not-divide-global-batch": "use a multiple of 3",
    "micro-batch-does-not-divide": "use one of [1, 2, 4]",
    "eval-fraction-out-of-range": "use e.g. 0.1",
    "max-steps-and-epochs": "keep one of them",
    "negative-auto-fallback-flag": "give 0 (off) or e.g. 3",
    "negative-hang-timeout": "give e.g. 120",
    "missing-data-file": "check the path",
    "empty-dataset": "add at least one record",
    "data-not-jsonl": "convert the data to JSONL",
    "model-dir-without-config": "point model at a transformers model dir",
    "model-empty-name": "give a local model dir, a bundled name such as gpt2-124m",
    "lora-targets-not-in-model": "use some of",
    "fp16-on-cpu-ranks": "use bf16 or fp32",
    "encoder-decoder-model": "point model at one of those",
    "hub-id-not-in-the-cache": "get it with `huggingface-cli download acme/not-downloaded-here`",
    "causal-lm-on-an-encoder": "use task: seq_cls or sentence_embedding, or a decoder-only model",
    "seq-past-a-model-dirs-position-table": "use --seq-len 256 or less",
    "nvme-path-under-a-file": "point nvme_path at a directory",
    "nvme-lacks-space": "free space at cluster.nvme_path or point it at a larger drive",
    "host-ram-too-small-for-offload": "is less than the offload needs; raise it",
    "run-dir-under-a-file": "choose a directory you can write",
    "run-dir-is-a-file": "choose another path",
    "run-dir-holds-a-run": "pass --overwrite",
    "resume-without-checkpoint": "run without --resume",
    "script-missing": "give the path of your training script",
    "multi-node-without-rendezvous": "needs --rdzv-endpoint host:port",
    "auto-fallback-with-slurm": "set auto_fallback: 0",
    "slurm-unknown-additional-parameter": "valid keys:",
    "four-problems-of-four-kinds": "use e.g. max_seq_len: 512",
    "slurm-section-typo": "did you mean 'partition'?",
    "negative-budget-flag": "give e.g. 16GB",
    "nnodes-is-nodes": "needs --rdzv-endpoint host:port",
    "nvme-path-read-only": "point nvme_path at a directory you can write",
    "plan-verb-unknown-key": "did you mean 'lr'?",
    "unknown-command": "did you mean 'plan'?",
    "override-unknown-key": "valid keys:",
    "override-ambiguous-size": "write 16GB or 16GiB",
    "override-into-a-scalar": "fix the key",
    "run-without-max-steps": "or train.epochs (e.g. 1)",
}


def test_the_table_is_big_enough():
    assert len(CASES) >= 30 and len({c.id for c in CASES}) == len(CASES)


def test_every_case_names_its_fix():
    assert set(FIXES) == {c.id for c in CASES}
    assert all(fix.strip() for fix in FIXES.values())


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_exits_2_with_one_clear_message(case: Case, sandbox: Sandbox):
    check_refused(case, sandbox, FIXES[case.id])


SUBPROCESS_CASES = ["yaml-unclosed-flow", "budget-unparsable-flag", "gpus-do-not-divide-global-batch",
                    "lora-targets-not-in-model", "run-dir-under-a-file", "four-problems-of-four-kinds",
                    "negative-budget-flag"]


@pytest.mark.parametrize("case", [c for c in CASES if c.id in SUBPROCESS_CASES], ids=SUBPROCESS_CASES)
def test_bad_input_through_the_launch_binary(case: Case, sandbox: Sandbox, tmp_path):
    """The same through the installed `launch` entry point: a separate process, a clean environment."""
    if case.setup:
        case.setup(sandbox)
    argv = [str(a) for a in case.argv(sandbox)]
    if "--run-dir" not in argv:
        argv += ["--run-dir", str(sandbox.run_dir)]
    before = entries(sandbox.root)
    env = {**os.environ, "HOME": str(tmp_path / "home"), "TMPDIR": str(tmp_path)}
    res = subprocess.run([LAUNCH, *argv, "--quiet"], capture_output=True, text=True, timeout=300, cwd=sandbox.root,
                         env=env)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "Traceback" not in res.stderr, res.stderr
    one_error_block(res.stderr)
    for part in [*case.expect, FIXES[case.id]]:
        assert part in res.stderr, f"{part!r} not in:\n{res.stderr}"
    assert res.stdout == "", "nothing is planned or run, so nothing is printed"
    assert not sandbox.run_dir.exists()
    assert entries(sandbox.root) == before


@pytest.mark.parametrize("flag", ["--nodes", "--nnodes"])
def test_nnodes_is_an_alias_of_nodes(flag):
    from launcher.cli.main import build_parser

    for verb in ("run", "plan"):
        args = build_parser().parse_args([verb, flag, "3", "job.yaml"])
        assert args.nodes == 3


def test_a_negative_looking_value_reaches_its_flag(sandbox: Sandbox, capsys):
    from launcher.cli.main import attach_negative_values

    # A dash-led word that is not a number (a missing value followed by the next flag) is left to argparse.
    assert attach_negative_values(["--budget", "-4GB", "--gpus", "-2", "--nnodes", "-.5", "--budget", "--gpus"]) == [
        "--budget=-4GB", "--gpus=-2", "--nnodes=-.5", "--budget", "--gpus"]
    with pytest.raises(SystemExit) as e:
        main(["plan", str(sandbox.job()), "--budget", "-0.5GB"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "argument --budget: '-0.5GB' must be greater than 0 (memory per GPU); give e.g. 16GB" in err
    assert "expected one argument" not in err
