"""A DeepSpeed rank neither builds nor loads the shared-memory all-reduce op (worker.engines.deepspeed.skip_shm_comm_op)."""

from launcher.worker.engines.deepspeed import skip_shm_comm_op


def test_after_the_seam_deepspeed_builds_no_shm_op(monkeypatch):
    import importlib

    import deepspeed.ops

    ds_torch = importlib.import_module("deepspeed.comm.torch")  # the module (deepspeed.comm.torch is torch itself)

    ops = deepspeed.ops.__compatible_ops__
    monkeypatch.setitem(ops, "deepspeed_shm_comm", ops.get("deepspeed_shm_comm", False))  # restored after the test
    skip_shm_comm_op()
    assert deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] is False
    assert ds_torch.build_shm_op() is None  # what init_distributed calls on CPU: no build, no load
