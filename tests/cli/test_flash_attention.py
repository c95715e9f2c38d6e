"""flash_attention_2 is planned for the cluster, not for the machine the planner runs on: a CUDA profile plans
without the flash-attn package (as sdpa: the same parameters and saved tensors), and only `launch run`, which
starts the ranks here, needs the package, said as bad input with the pip line before anything is written."""

from __future__ import annotations

import json

import pytest

from launcher.cli.main import main

FLASH = "train.attn_implementation=flash_attention_2"


@pytest.fixture
def no_flash_attn(monkeypatch):
    """The run check sees this machine without flash-attn, whatever is installed."""
    import launcher.session.checks as checks

    monkeypatch.setattr(checks, "package_installed", lambda name: name != "flash_attn")


def test_flash_attention_plans_for_a_cuda_profile_without_the_package(capsys, write_job, tmp_path, monkeypatch):
    """Fails before the fix where flash-attn is not installed (transformers' ImportError from the meta build);
    where it is installed, it shows the plan keeps flash attention's terms."""
    monkeypatch.setenv("LAUNCHER_CACHE", str(tmp_path / "cache"))  # a fresh introspection: the meta build runs
    code = main(["plan", str(write_job()), "--hardware", "h100-80gb", "--budget", "4GB", FLASH, "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "Traceback" not in err and "ImportError" not in err
    plan = json.loads(out)
    activations = plan["constants"]["activations"]
    # Planned with flash attention's terms: no a·s² scores saved, probed as sdpa (the same tensors).
    assert activations["attention"] == "flash_attention_2"
    assert "probed as sdpa" in activations["source"] and activations["block_bytes_per_token_per_seq"] == 0.0


def test_run_needs_the_package_where_the_ranks_start(capsys, write_job, no_flash_attn, tmp_path, monkeypatch):
    monkeypatch.setenv("LAUNCHER_CACHE", str(tmp_path / "cache"))
    run_dir = tmp_path / "run"
    code = main(["run", str(write_job()), "--hardware", "h100-80gb", "--budget", "4GB", FLASH, "--run-dir",
                 str(run_dir),
                 "--quiet"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.strip().splitlines() == [
        "launch: error: train.attn_implementation: 'flash_attention_2' needs the flash-attn package on the ranks, "
        "and this machine, where they would run, does not have it; pip install flash-attn (or use "
        "train.attn_implementation: sdpa)"]
    assert not run_dir.exists()


def test_the_run_check_passes_with_the_package_or_without_flash(write_job, monkeypatch):
    from launcher.config.jobfile import load_job
    from launcher.inputs.plan_inputs import plan_job
    from launcher.session import checks

    job = load_job(write_job(**{"train.attn_implementation": "flash_attention_2", "cluster.hardware": "h100-80gb",
                                "budget": "4GB"}))
    monkeypatch.setattr(checks, "package_installed", lambda name: True)
    plan = plan_job(job)
    assert checks.plan_attention(job, plan) == "flash_attention_2"
    assert checks.check_flash_attn(job, plan) == []
    monkeypatch.setattr(checks, "package_installed", lambda name: False)
    assert "pip install flash-attn" in checks.check_flash_attn(job, plan)[0]
    sdpa = load_job(write_job(**{"cluster.hardware": "h100-80gb", "budget": "4GB"}))
    assert checks.check_flash_attn(sdpa, plan_job(sdpa)) == []
