"""Hardware profiles: a datasheet source for each card, and `auto` maps real device-name strings to them."""

import pytest
import yaml

from launcher.cli.main import main
from launcher.planner.hardware import PROFILES, profile_for_gpu_name
from launcher.units import GB, GiB
from tests.conftest import base_job

# As nvidia-smi --query-gpu=name, torch.cuda.get_device_name and rocm-smi --showproductname print them.
DEVICE_NAMES = [
    ("NVIDIA H100 80GB HBM3", "h100-80gb"),
    ("NVIDIA H100 PCIe", "h100-pcie"),
    ("NVIDIA H200", "h200"),
    ("NVIDIA A100-SXM4-80GB", "a100-80gb"),
    ("NVIDIA A100 80GB PCIe", "a100-80gb"),
    ("NVIDIA A100-SXM4-40GB", "a100-40gb"),
    ("NVIDIA A100-PCIE-40GB", "a100-40gb"),
    ("NVIDIA A10G", "a10g"),
    ("NVIDIA L4", "l4"),
    ("NVIDIA L40S", "l40s"),
    ("NVIDIA GeForce RTX 4090", "rtx4090"),
    ("NVIDIA B200", "b200"),
    ("AMD Instinct MI300X", "mi300x"),
    ("AMD Instinct MI300X OAM", "mi300x"),
    ("Tesla V100-SXM2-16GB", "v100-16gb"),
]
# Cards without a profile of their own: no guess (an L40 is not an L40S, an A10 not an A10G, a 94 GB H100 NVL
# not an 80 GB H100).
NO_PROFILE = ["NVIDIA A10", "NVIDIA L40", "NVIDIA H100 NVL", "Tesla V100-SXM2-32GB", "NVIDIA GeForce RTX 3090"]
CARDS = {"a10g": 24, "l4": 24, "l40s": 48, "a100-40gb": 40, "a100-80gb": 80, "h100-80gb": 80, "h100-pcie": 80,
         "h200": 141, "b200": 180, "mi300x": 192, "rtx4090": 24}


@pytest.mark.parametrize(("device", "profile"), DEVICE_NAMES)
def test_device_names_map_to_their_card(device, profile):
    assert profile_for_gpu_name(device) == profile


@pytest.mark.parametrize("device", NO_PROFILE)
def test_a_card_without_a_profile_is_not_guessed(device):
    assert profile_for_gpu_name(device) is None


@pytest.mark.parametrize(("name", "mem_gb"), CARDS.items())
def test_each_card_has_its_datasheet_figures_and_source(name, mem_gb):
    p = PROFILES[name]
    assert p.memory_bytes == mem_gb * GiB
    assert p.source.startswith("https://")
    assert p.flops_bf16 >= p.flops_fp32 > 1e12 and p.memory_bw > 100 * GB and p.intra_node_bw > 0


def test_h200_is_not_an_h100():
    assert PROFILES["h200"].memory_bytes > 140 * GB > PROFILES["h100-80gb"].memory_bytes


@pytest.mark.parametrize(("hardware", "code"), [("h200", 0), ("mi300x", 0), ("h100-80gb", 2)])
def test_a_130gb_budget_fits_an_h200_not_an_h100(tmp_path, data_file, capsys, hardware, code, monkeypatch):
    monkeypatch.setenv("LAUNCHER_CACHE", str(tmp_path / "cache"))
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(base_job(str(data_file), **{"cluster.host_ram_per_node": "4TB"})))
    assert main(["plan", str(job), "--hardware", hardware, "--budget", "130GB", "--gpus", "2"]) == code
    if code:
        assert "budget: 130.00 GB is more than an h100-80gb holds (85.90 GB)" in capsys.readouterr().err


ROCM_SMI = """
============================ ROCm System Management Interface ============================
====================================== Product Info ======================================
GPU[0]		: Card Series: 		AMD Instinct MI300X OAM
GPU[0]		: Card Model: 		0x74a1
GPU[0]		: Card Vendor: 		Advanced Micro Devices, Inc. [AMD/ATI]
GPU[0]		: Card SKU: 		M3000100
GPU[1]		: Card Series: 		AMD Instinct MI300X OAM
==========================================================================================
"""


def test_rocm_smi_names_the_mi300x():
    from launcher.inputs.machine import rocm_product_name

    assert profile_for_gpu_name(rocm_product_name(ROCM_SMI)) == "mi300x"


def _fake_tool(bin_dir, name, stdout):
    path = bin_dir / name
    path.write_text(f"#!/bin/sh\n/bin/cat <<'EOF'\n{stdout}\nEOF\n")
    path.chmod(0o755)


@pytest.mark.parametrize(("tool", "stdout", "profile"), [
    ("nvidia-smi", "NVIDIA H200\nNVIDIA H200", "h200"),
    ("nvidia-smi", "NVIDIA H100 80GB HBM3", "h100-80gb"),
    ("rocm-smi", ROCM_SMI, "mi300x"),
])
def test_auto_detects_the_card_through_its_tool(tmp_path, monkeypatch, tool, stdout, profile):
    from launcher.inputs.machine import auto_profile_name, detect_gpu_name

    _fake_tool(tmp_path, tool, stdout)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert auto_profile_name(detect_gpu_name()) == profile


def test_auto_on_a_card_without_a_profile_is_bad_input(tmp_path, monkeypatch):
    from launcher.errors import ConfigError
    from launcher.inputs.machine import auto_profile_name, detect_gpu_name

    _fake_tool(tmp_path, "nvidia-smi", "NVIDIA A10")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ConfigError, match=r"cluster.hardware: auto found a 'NVIDIA A10', which has no profile; "
                                          r"set cluster.hardware to the card closest"):
        auto_profile_name(detect_gpu_name())


def test_fp32_is_priced_as_plain_fp32_not_tf32():
    # The ranks leave torch's TF32 matmuls off (its default since 1.12), so an fp32 plan on a tensor-core card runs at
    # the datasheet's non-tensor FP32: A100 19.5 TFLOPS, not the 156 of TF32 (8x too fast a plan before).
    assert PROFILES["a100-80gb"].flops_fp32 == 19.5e12 and PROFILES["h100-80gb"].flops_fp32 == 67e12
    for name in ("a10g", "l4", "l40s", "a100-40gb", "a100-80gb", "h100-80gb", "h100-pcie", "h200", "b200"):
        assert PROFILES[name].flops_bf16 / PROFILES[name].flops_fp32 > 2.2, name  # TF32 would be 2x
