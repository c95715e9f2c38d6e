"""train.precision: auto: what the CPU or GPU computes natively, the rule, and the plan that says why."""

import json

import pytest

from launcher.inputs import machine
from launcher.inputs.machine import cpu_bf16_support, gpu_bf16_support
from launcher.inputs.precision import Bf16Support, choose_precision
from tests.cli.test_plan_cli import run_cli

AMX_CPU = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f amx_bf16 amx_tile avx512_bf16\n"
AVX2_CPU = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n"


@pytest.fixture
def cpu(tmp_path, monkeypatch):
    """cpu(flags_text) makes the CPU look like that, with no dispatch cap in the environment."""
    for var in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY"):
        monkeypatch.delenv(var, raising=False)

    def _set(text: str) -> None:
        path = tmp_path / "cpuinfo"
        path.write_text(text)
        monkeypatch.setattr(machine, "CPUINFO", path)

    return _set


def test_amx_or_avx512_bf16_is_native(cpu):
    cpu(AMX_CPU)
    s = cpu_bf16_support()
    assert s.native and s.device == "cpu" and "amx_bf16 and avx512_bf16" in s.evidence


def test_avx2_alone_is_not_native(cpu):
    cpu(AVX2_CPU)
    s = cpu_bf16_support()
    assert not s.native and "neither amx_bf16 nor avx512_bf16" in s.evidence


@pytest.mark.parametrize("var,value,native", [
    ("ONEDNN_MAX_CPU_ISA", "AVX2", False),
    ("ONEDNN_MAX_CPU_ISA", "avx512_core", False),
    ("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16", True),
    ("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_AMX", True),
    ("ONEDNN_MAX_CPU_ISA", "ALL", True),
    ("ATEN_CPU_CAPABILITY", "avx2", False),
    ("ATEN_CPU_CAPABILITY", "avx512", True),
])
def test_a_dispatch_cap_overrides_the_flags(cpu, monkeypatch, var, value, native):
    cpu(AMX_CPU)
    monkeypatch.setenv(var, value)
    s = cpu_bf16_support()
    assert s.native is native
    if not native:
        assert f"{var}={value.upper() if var.startswith('ONEDNN') else value}" in s.evidence


def test_gpu_profiles_by_compute_capability():
    assert gpu_bf16_support("a100-80gb", detected=False).native
    assert gpu_bf16_support("l4", detected=False).native
    v100 = gpu_bf16_support("v100-16gb", detected=False)
    assert not v100.native and v100.evidence == "compute capability 7 (the v100-16gb profile)"


def test_the_rule():
    native, emulated = Bf16Support(True, "cpu", "x"), Bf16Support(False, "cpu", "ONEDNN_MAX_CPU_ISA=AVX2")
    assert choose_precision("auto", native)[0] == "bf16"
    p, why = choose_precision("auto", emulated)
    assert p == "fp32" and why == ("precision fp32 (auto): the CPU ranks lack native bf16 (ONEDNN_MAX_CPU_ISA=AVX2), "
                                   "where bf16 matmuls run ~10x slower than fp32")
    p, why = choose_precision("bf16", emulated)  # the job's word stands, with the warning
    assert p == "bf16" and "precision auto would choose fp32" in why
    p, why = choose_precision("auto", Bf16Support(False, "cuda", "compute capability 7"))
    assert p == "fp32" and "set train.precision: fp16" in why
    assert choose_precision("fp32", native) == ("fp32", "precision fp32: set by the job")


def test_auto_is_the_default(write_job):
    from launcher.config.jobfile import load_job
    from tests.conftest import base_job

    doc = base_job("x.jsonl", **{"train.precision": None})
    assert load_job(write_job(doc), for_run=False).train.precision == "auto"


@pytest.mark.parametrize("cpuinfo,isa,expect", [
    (AMX_CPU, None, "bf16"),
    (AMX_CPU, "AVX2", "fp32"),
    (AVX2_CPU, None, "fp32"),
])
def test_plan_decides_auto_on_cpu_ranks_and_says_why(capsys, cpu, monkeypatch, write_job, cpuinfo, isa, expect):
    cpu(cpuinfo)
    if isa:
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", isa)
    code, out, err = run_cli(capsys, "plan", write_job(**{"train.precision": "auto"}), "--json")
    assert code == 0, err
    plan = json.loads(out)
    assert plan["precision"] == expect and plan["hardware"] == "cpu"
    assert plan["precision_reason"].startswith(f"precision {expect} (auto): the CPU ranks ")
    assert plan["precision_reason"] in plan["reasons"]
    code, out, err = run_cli(capsys, "plan", write_job(**{"train.precision": "auto"}))
    assert f", {expect}\n" in out and f"  - {plan['precision_reason']}" in out  # the printed plan says it too


@pytest.mark.parametrize("hardware,expect", [("a100-80gb", "bf16"), ("v100-16gb", "fp32")])
def test_plan_decides_auto_for_a_gpu_profile(capsys, write_job, hardware, expect):
    code, out, err = run_cli(capsys, "plan", write_job(**{"train.precision": "auto"}), "--hardware", hardware,
                             "--budget", "8GB", "--json")
    assert code == 0, err
    plan = json.loads(out)
    assert plan["precision"] == expect and f"the {hardware} profile" in plan["precision_reason"]


def test_every_gpu_profile_has_a_bf16_answer():
    from launcher.inputs.machine import NATIVE_BF16_WITHOUT_CUDA
    from launcher.planner.hardware import PROFILES

    gpus = {name for name, p in PROFILES.items() if not p.device_is_host}
    with_capability = {name for name in gpus if PROFILES[name].compute_capability is not None}
    assert gpus == with_capability | set(NATIVE_BF16_WITHOUT_CUDA)
    assert all("unknown" not in gpu_bf16_support(name, detected=False).evidence for name in gpus)
