"""The calibration's timed collectives: every rank runs the same number of them, whatever its own clock says."""

import multiprocessing as mp
import time

from launcher.calibrate.hardware import free_port


def _rank(rank: int, world: int, port: int, queue) -> None:
    import torch
    import torch.distributed as dist

    from launcher.calibrate.hardware import allreduce

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    calls = {"n": 0}

    def sync() -> None:
        # Rank 1 comes back from its warm-up 0.3 s late, so its time box starts 0.3 s after rank 0's: with loops
        # stopped by each rank's own clock, rank 1 would want more all_reduces than rank 0 ever joins.
        calls["n"] += 1
        if rank == 1 and calls["n"] == 1:
            time.sleep(0.3)

    out = allreduce(torch, dist, torch.device("cpu"), sync, [4, 1 << 16], box_s=0.2)
    dist.barrier()
    dist.destroy_process_group()
    queue.put((rank, out["latency_s"]))


def test_timed_all_reduce_never_leaves_a_rank_waiting():
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank, args=(r, 2, port, queue), daemon=True) for r in range(2)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + 60  # the whole measurement takes a few seconds
    for p in procs:
        p.join(timeout=max(0.0, deadline - time.monotonic()))
    hung = [i for i, p in enumerate(procs) if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.terminate()
    assert not hung, f"rank(s) {hung} still waiting in a collective"
    assert [p.exitcode for p in procs] == [0, 0]
    results = dict(queue.get(timeout=5) for _ in procs)
    assert sorted(results) == [0, 1] and all(v > 0 for v in results.values())
