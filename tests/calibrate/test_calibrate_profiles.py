"""Calibration files round-trip through the planner's loaders."""

import json
from pathlib import Path

import pytest

from launcher.calibrate.profiles import activations_path, numeric_fields, save_activations, save_hardware
from launcher.config.jobfile import job_from_data
from launcher.inputs.machine import hardware_profile
from launcher.inputs.plan_inputs import plan_request
from launcher.planner.hardware import PROFILES

DATA = str(Path(__file__).resolve().parents[2] / "examples" / "data" / "causal.jsonl")


def job(hardware="cpu"):
    data = {"name": "t", "model": {"family": "gpt2", "hidden_size": 64, "num_layers": 2, "num_heads": 4},
            "task": "causal_lm", "data": {"path": DATA}, "train": {"global_batch_size": 8, "max_steps": 1},
            "cluster": {"hardware": hardware}, "gpus": 2, "budget": "4GB"}
    return job_from_data(data, ".")


def test_hardware_profile_round_trips(cache):
    values = {"flops_bf16": 1.5e11, "flops_fp32": 9e10, "intra_node_bw": 8e8, "collective_latency_s": 1.4e-4,
              "host_link_bw": 7.9e8, "cpu_adam_params_per_s": 8.5e8, "block_overhead_s": 0.2}
    path = save_hardware("cpu", values, {"ranks": 2})
    assert path == cache / "profiles" / "cpu.json"
    data = json.loads(path.read_text())
    assert data["hardware"] == values and data["measured_at"] and data["host"]
    prof = hardware_profile(job())
    for k, v in values.items():
        assert getattr(prof, k) == v, k
    # Fields not measured keep the built-in values.
    assert prof.device_is_host is True and prof.mfu == PROFILES["cpu"].mfu


def test_unknown_hardware_field_is_refused():
    with pytest.raises(ValueError, match="not HardwareProfile fields"):
        save_hardware("cpu", {"flops_int8": 1.0})


def test_activation_constants_round_trip(cache):
    fitted = {name: 10.0 + i for i, name in enumerate(numeric_fields())}
    path = save_activations("gpt2", "cpu", fitted, {"runs": ["a"]})
    # The documented place, spelled out (not the module's own path helper): one file per model type and profile.
    assert path == cache / "profiles" / "activations-gpt2-cpu.json" == activations_path("gpt2", "cpu")
    assert json.loads(path.with_suffix(".fit.json").read_text())["runs"] == ["a"]
    c = plan_request(job()).activations  # what the planner reads for a gpt2 job on the cpu profile
    assert {k: getattr(c, k) for k in fitted} == fitted
    assert c.source.startswith("calibrated: ")
    assert plan_request(job("a100-80gb")).activations.source != c.source  # one file per profile


def test_a_measured_matmul_rate_is_not_derated_again(cache):
    """`launch calibrate` measures the matmul rate itself; the profile's share of the datasheet peak (mfu, 0.8 on a
    GPU) would count the same shortfall twice, so the calibration writes mfu 1.0 beside the rates it measured."""
    from launcher.calibrate.hardware import CalibrationOptions, summarize
    from launcher.planner.hardware import GPU_MATMUL_SHARE

    rank = {"flops_fp32": 1.9e13, "flops_bf16": 2.5e14, "allreduce": {"bus_bw": 2e11, "latency_s": 2e-5},
            "host_copy": {"bw": 2.5e10}, "adam": {"params_per_s": 1e9}, "block_overhead_s": 1e-4,
            "context_bytes": 5e8, "kernel_bytes": 1.5e8, "nccl_comm_bytes": 5e8, "nccl_extra_comm_bytes": 4e8}
    cal = summarize({0: rank, 1: rank}, CalibrationOptions(ranks=2, device="cuda"), 1.0)
    assert cal.values["mfu"] == 1.0 and cal.values["flops_bf16"] == 2.5e14
    assert hardware_profile(job("a100-80gb")).mfu == GPU_MATMUL_SHARE
    save_hardware("a100-80gb", cal.values)
    prof = hardware_profile(job("a100-80gb"))
    assert prof.mfu == 1.0 and prof.flops_bf16 == 2.5e14


def test_the_node_adam_rate_reads_as_deepspeeds_cpu_adam_whichever_the_ranks_timed():
    """cpu_adam_params_per_s is DeepSpeed's CPU Adam's rate (the one ZeRO-Offload runs): a rank that could not load
    its op timed torch's AdamW, which the rate reads TORCH_HOST_ADAM_RATIO times faster (issue 37 §4: the host step
    priced from the implementation that runs it, FSDP2's torch AdamW at that ratio)."""
    from launcher.calibrate.hardware import CalibrationOptions, summarize
    from launcher.planner.terms import TORCH_HOST_ADAM_RATIO

    def rank(optimizer):
        return {"flops_fp32": 1e11, "flops_bf16": 1e11, "allreduce": {"bus_bw": 1e9, "latency_s": 1e-4},
                "host_copy": {"bw": 5e9}, "adam": {"params_per_s": 1e8, "optimizer": optimizer},
                "block_overhead_s": 1e-3}

    ds, torch_adam = rank("deepspeed.ops.adam.DeepSpeedCPUAdam"), rank("torch.optim.AdamW(foreach=False)")
    opts = CalibrationOptions(ranks=2, device="cpu")
    assert summarize({0: ds, 1: ds}, opts, 1.0).values["cpu_adam_params_per_s"] == pytest.approx(2e8)
    assert summarize({0: torch_adam, 1: torch_adam}, opts, 1.0).values["cpu_adam_params_per_s"] == pytest.approx(
        2e8 * TORCH_HOST_ADAM_RATIO)
