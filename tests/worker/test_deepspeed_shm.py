"""A DeepSpeed rank neither builds nor loads the shared-memory all-reduce op
(worker.engines.deepspeed.skip_shm_comm_op), and asks py-cpuinfo once (ask_cpu_info_once)."""

from launcher.worker.engines.deepspeed import ask_cpu_info_once, skip_shm_comm_op


def test_after_the_seam_deepspeed_builds_no_shm_op(monkeypatch):
    import importlib

    import deepspeed.ops

    ds_torch = importlib.import_module("deepspeed.comm.torch")  # the module (deepspeed.comm.torch is torch itself)

    ops = deepspeed.ops.__compatible_ops__
    monkeypatch.setitem(ops, "deepspeed_shm_comm", ops.get("deepspeed_shm_comm", False))  # restored after the test
    skip_shm_comm_op()
    assert deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] is False
    assert ds_torch.build_shm_op() is None  # what init_distributed calls on CPU: no build, no load


def test_deepspeed_cpu_adam_asks_py_cpuinfo_once(monkeypatch):
    """cpu_adam's load (cpu_arch, simd_width) and DeepSpeedCPUAdam itself each call get_cpu_info, a Python
    subprocess apiece; after the seam the first answer serves every one of them."""
    import subprocess

    import cpuinfo
    import torch
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    monkeypatch.setattr(cpuinfo, "get_cpu_info", cpuinfo.get_cpu_info)  # restored after the test
    started = []
    real_popen = subprocess.Popen

    def counting_popen(args, *a, **kw):
        if "--json" in list(args) and str(args[1]).endswith("cpuinfo.py"):
            started.append(args)
        return real_popen(args, *a, **kw)

    monkeypatch.setattr(subprocess, "Popen", counting_popen)
    ask_cpu_info_once()
    ask_cpu_info_once()  # a second call keeps the one cache
    DeepSpeedCPUAdam([torch.nn.Parameter(torch.zeros(4))])  # loads cpu_adam from the op cache set-up built
    DeepSpeedCPUAdam([torch.nn.Parameter(torch.zeros(4))])
    assert len(started) == 1, started
    assert cpuinfo.get_cpu_info()["arch"]  # the answer kept is a real one
