"""Measure this machine the way the ranks see it: local ranks in parallel, each with the ranks' thread count.

Every figure is in seconds-based units (FLOP/s, bytes/s, params/s, s) and maps onto one HardwareProfile field:

  flops_bf16, flops_fp32   square matmuls per rank (CPU 512, CUDA 8192), median over repeats; with them mfu
                           1.0 (the rate measured is the rate the matmuls reach)
  intra_node_bw            all-reduce bus bandwidth, 2(n-1)/n * bytes / s (the cost model's ring convention)
  collective_latency_s     a 4-byte all-reduce
  host_link_bw             CPU: a memcpy between host buffers; CUDA: pinned host <-> device, the slower way
  cpu_adam_params_per_s    the node: every rank steps its own fp32 partition at once (DeepSpeedCPUAdam when it
                           loads, else torch AdamW read at DeepSpeed's rate: deepspeed_rate), summed over ranks
  block_overhead_s         a GPT-2 block's forward + backward at a tiny size, minus its FLOPs at the measured
                           rate; on CPU under the same MemTracker the ranks run (its per-op hooks are the cost)
  context_bytes            CUDA only: device memory in use after the context exists, outside the allocator
  kernel_bytes             CUDA only: what the libraries' kernels add outside the allocator once loaded (the
                           matmuls', then the optimizer's and the block's)
  nccl_comm_bytes          CUDA only: what the first NCCL communicator adds there (at the first all-reduce)
  nccl_extra_comm_bytes    CUDA only: what one more communicator adds (a new group's first all-reduce)
"""

from __future__ import annotations

import math
import os
import socket
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

TIME_BOX_S = 0.4
"""Seconds each repeated measurement runs for (at least 3 repeats)."""
MAX_REPS = 200
"""At most this many timed repeats of one measurement."""


@dataclass(kw_only=True, slots=True)
class CalibrationOptions:
    """How `launch calibrate` measures the hardware: ranks, device, threads per rank, quick mode."""

    ranks: int = 2
    """Local ranks measured at once (torchrun's --nproc-per-node)."""
    device: str = "cpu"
    """cpu (gloo) or cuda (nccl)."""
    threads: int = 1
    """torch threads per rank: what torchrun's OMP_NUM_THREADS gives the ranks."""
    quick: bool = False
    """Smaller sizes and fewer repeats (tests)."""


@dataclass(kw_only=True, slots=True)
class Calibration:
    """What a hardware calibration measured: HardwareProfile values, the raw figures and how long it took."""

    values: dict[str, float]
    """HardwareProfile field -> measured value."""
    details: dict[str, object] = field(default_factory=dict)
    """Per-rank raw figures and sizes, for the file's "details"."""
    seconds: float = 0.0


def ranks_threads(ranks: int) -> int:
    """torchrun sets OMP_NUM_THREADS=1 for nproc > 1 unless the user set it; one process keeps every core."""
    env = os.environ.get("OMP_NUM_THREADS")
    if env and env.isdigit() and int(env) > 0:
        return int(env)
    return 1 if ranks > 1 else (os.cpu_count() or 1)


def _timed(fn: Callable[[], object], sync: Callable[[], object], box_s: float, min_reps: int = 3,
           reps: int | None = None) -> float:
    """Median seconds of ``fn`` over repeats filling ``box_s`` (one untimed warm-up), or exactly ``reps``."""
    fn()
    sync()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < (reps or min_reps) or (reps is None and time.perf_counter() - start < box_s):
        t = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t)
        if len(times) >= MAX_REPS:
            break
    return statistics.median(times)


def agreed_reps(torch, dist, device, fn: Callable[[], object], sync: Callable[[], object], box_s: float) -> int:
    """How many repeats of the collective ``fn`` fill ``box_s``, the same number on every rank.

    A rank that stops its loop by its own clock can leave the others waiting in a collective it never joins.
    One timed call gives each rank its count; the group takes the largest.
    """
    t = time.perf_counter()
    fn()
    sync()
    once_s = max(time.perf_counter() - t, 1e-9)
    n = torch.tensor([min(MAX_REPS, max(3, math.ceil(box_s / once_s)))], dtype=torch.int64, device=device)
    dist.all_reduce(n, op=dist.ReduceOp.MAX)
    return int(n.item())


def matmul_flops(torch, dtype, n: int, device, sync, box_s: float) -> float:
    """FLOP/s of an n x n matmul in ``dtype`` on ``device``, timed over about ``box_s`` seconds."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    return 2.0 * n**3 / _timed(lambda: a @ b, sync, box_s)


def allreduce(torch, dist, device, sync, sizes_bytes: list[int], box_s: float) -> dict[str, float]:
    """Latency (4 bytes) and bus bandwidth (largest size) of all-reduce over the group."""
    n = dist.get_world_size()
    out = {}
    for size in sizes_bytes:
        t = torch.ones(max(1, size // 4), dtype=torch.float32, device=device)
        dist.barrier()
        reduce = lambda t=t: dist.all_reduce(t)  # noqa: E731
        out[size] = _timed(reduce, sync, box_s, reps=agreed_reps(torch, dist, device, reduce, sync, box_s))
    largest = max(sizes_bytes)
    return {"latency_s": out[min(sizes_bytes)],
            "bus_bw": 2.0 * (n - 1) / n * largest / out[largest] if n > 1 else largest / out[largest],
            "seconds_by_size": {str(k): v for k, v in out.items()}}


def host_copy(torch, device, sync, nbytes: int, box_s: float) -> dict[str, float]:
    """Host link bandwidth, bytes/s: pinned device-to-host and host-to-device copies on CUDA ("bw" the slower), a
    host memory copy on CPU."""
    numel = nbytes // 4
    if device.type == "cuda":
        host = torch.empty(numel, dtype=torch.float32).pin_memory()
        dev = torch.empty(numel, dtype=torch.float32, device=device)
        d2h = nbytes / _timed(lambda: host.copy_(dev, non_blocking=True), sync, box_s)
        h2d = nbytes / _timed(lambda: dev.copy_(host, non_blocking=True), sync, box_s)
        return {"bw": min(d2h, h2d), "d2h": d2h, "h2d": h2d}
    src = torch.ones(numel, dtype=torch.float32)
    dst = torch.empty_like(src)
    return {"bw": nbytes / _timed(lambda: dst.copy_(src), sync, box_s)}


def deepspeed_adam_ready() -> str | None:
    """Why DeepSpeedCPUAdam should not be loaded now, or None when its compiled op is there and unlocked.

    Loading JIT-builds the op if needed (minutes) under a lock file in the shared extensions cache; a
    calibration must neither wait behind someone else's build nor be cut off holding that lock.
    """
    from launcher.processes.rankenv import set_extensions_dir

    root = Path(set_extensions_dir()) / "cpu_adam"
    if not (root / "cpu_adam.so").is_file():
        return (f"{root}/cpu_adam.so is not built yet (a DeepSpeed offload run builds it, or "
                "python -m launcher.processes.ops cpu_adam)")
    if (root / "lock").exists():
        return f"{root}/lock: another process is building or loading it"
    return None


def cpu_adam(torch, params: list, ds_ok: bool):
    """ZeRO-Offload's optimizer (DeepSpeedCPUAdam) when its op is ready, else the one FSDP offload steps."""
    if ds_ok:
        try:
            from deepspeed.ops.adam import DeepSpeedCPUAdam

            return DeepSpeedCPUAdam(params, lr=1e-3), "deepspeed.ops.adam.DeepSpeedCPUAdam"
        except Exception:  # no deepspeed, or its op does not load here
            pass
    return torch.optim.AdamW(params, lr=1e-3, foreach=False), "torch.optim.AdamW(foreach=False)"


def deepspeed_rate(adam: dict) -> float:
    """What one rank's measured Adam rate (adam_params_per_s) is multiplied by to read as DeepSpeed's CPU Adam's:
    1 where it timed DeepSpeedCPUAdam, TORCH_HOST_ADAM_RATIO where it timed torch's AdamW."""
    from launcher.planner.terms import TORCH_HOST_ADAM_RATIO

    return 1.0 if "DeepSpeedCPUAdam" in str(adam.get("optimizer", "")) else TORCH_HOST_ADAM_RATIO


def adam_params_per_s(torch, dist, rank: int, device, numel: int, box_s: float) -> dict[str, object]:
    """One rank's Adam steps per second over a flat fp32 partition (ZeRO-Offload keeps it flat)."""
    p = torch.nn.Parameter(torch.zeros(numel, dtype=torch.float32))
    p.grad = torch.full_like(p, 1e-3)
    # Rank 0 decides and loads first; the others then only open the loaded library, and all use the same one.
    flag = torch.zeros(1, device=device)  # NCCL only moves device tensors
    why = None
    if rank == 0:
        why = deepspeed_adam_ready()
        flag[0] = 1.0 if why is None else 0.0
    dist.broadcast(flag, 0)
    ds_ok = bool(flag[0].item())
    if rank == 0:
        opt, kind = cpu_adam(torch, [p], ds_ok)
    dist.barrier()
    if rank != 0:
        opt, kind = cpu_adam(torch, [p], ds_ok)
    dist.barrier()
    t = _timed(opt.step, lambda: None, box_s)
    return {"params_per_s": numel / t, "optimizer": kind, "deepspeed_skipped": why}


def block_step(torch, device, layers: int, seq: int, hidden: int) -> Callable[[], None]:
    """Forward + backward of a bf16 GPT-2 stack of ``layers`` blocks at micro-batch 1."""
    from transformers import GPT2Config, GPT2Model

    cfg = GPT2Config(n_embd=hidden, n_layer=layers, n_head=4, vocab_size=128, n_positions=seq, use_cache=False,
                     bos_token_id=0, eos_token_id=0)
    model = GPT2Model(cfg).to(device=device, dtype=torch.bfloat16)
    ids = torch.randint(0, 128, (1, seq), device=device)

    def step():
        model(input_ids=ids).last_hidden_state.float().sum().backward()
        model.zero_grad(set_to_none=True)

    return step


def per_block_seconds(torch, device, seq: int, hidden: int, track: bool, box_s: float, sync) -> dict[str, float]:
    """Seconds one more block adds: 1- and 3-block stacks timed alternately, median of the halved differences.

    Alternating keeps a change in the machine's load from landing on one of the two only.
    """
    one, three = block_step(torch, device, 1, seq, hidden), block_step(torch, device, 3, seq, hidden)
    tracker = None
    if track:
        from launcher.runtime.tracker import PhaseMemTracker

        tracker = PhaseMemTracker()
        tracker.setup(device, None)
        tracker.__enter__()
    try:
        def timed(fn) -> float:
            if tracker is not None:
                tracker.reset_mod_stats()
            t = time.perf_counter()
            fn()
            sync()
            return time.perf_counter() - t

        timed(one), timed(three)  # warm-up
        t1s, t3s = [], []
        start = time.perf_counter()
        while len(t1s) < 3 or time.perf_counter() - start < 2 * box_s:
            t1s.append(timed(one))
            t3s.append(timed(three))
            if len(t1s) >= 50:
                break
    finally:
        if tracker is not None:
            tracker.__exit__(None, None, None)
    return {"seconds_1": statistics.median(t1s), "seconds_3": statistics.median(t3s),
            "per_block_s": statistics.median((b - a) / 2 for a, b in zip(t1s, t3s, strict=True)), "reps": len(t1s)}


def rank_main(rank: int, world: int, port: int, opts: CalibrationOptions, queue) -> None:
    """One local rank: every measurement; puts (rank, stage name) as it goes, then (rank, dict) or (rank, error)."""
    try:
        queue.put((rank, _measure(rank, world, port, opts, lambda stage: queue.put((rank, ("stage", stage))))))
    except Exception as e:  # the parent reports it; a hung rank would stall the others
        import traceback

        queue.put((rank, f"{type(e).__name__}: {e}\n{traceback.format_exc()[-2000:]}"))


def _measure(rank: int, world: int, port: int, opts: CalibrationOptions, progress: Callable[[str], None]) -> dict:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(opts.threads)
    cuda = opts.device == "cuda"
    device = torch.device(f"cuda:{rank}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    box = TIME_BOX_S / (3 if opts.quick else 1)
    out: dict[str, object] = {"threads": torch.get_num_threads()}
    stage_s: dict[str, float] = {}
    out["stage_s"] = stage_s
    clock = [time.perf_counter()]

    def lap(name: str) -> None:
        now = time.perf_counter()
        stage_s[name] = round(now - clock[0], 3)
        clock[0] = now
        progress(f"done {name}")

    def outside() -> int:  # device bytes outside the caching allocator now (device-wide: one rank per GPU)
        free, total = torch.cuda.mem_get_info(device)
        return max(0, total - free - torch.cuda.memory_reserved(device))

    seen: dict[str, int] = {}
    if cuda:
        out["context_bytes"] = seen["context"] = outside()
    n = (1024 if opts.quick else 8192) if cuda else (256 if opts.quick else 512)
    dist.barrier()
    out["flops_fp32"] = matmul_flops(torch, torch.float32, n, device, sync, box)
    out["flops_bf16"] = matmul_flops(torch, torch.bfloat16, n, device, sync, box)
    lap("matmul")
    if cuda:
        seen["matmul"] = outside()  # cuBLAS and cuBLASLt loaded (lazily, at the first matmul)
    sizes = [4, 1 << 20, (4 << 20) if opts.quick else (32 << 20)]
    out["allreduce"] = allreduce(torch, dist, device, sync, sizes, box)
    dist.barrier()
    if cuda:
        # NCCL creates the default group's communicator at its first collective; then one more group's
        # (launcher.planner.cuda_overhead [COMM]: engines hold more than one).
        seen["first_comm"] = outside()
        group = dist.new_group(list(range(world)))
        probe = torch.ones(1, device=device)
        dist.all_reduce(probe, group=group)
        sync()
        seen["second_comm"] = outside()
    lap("allreduce")
    out["host_copy"] = host_copy(torch, device, sync, (16 << 20) if opts.quick else (128 << 20), box)
    dist.barrier()
    lap("host_copy")
    out["adam"] = adam_params_per_s(torch, dist, rank, device, (1 << 20) if opts.quick else (8 << 20), box)
    dist.barrier()
    lap("adam")
    track = not cuda  # CPU ranks always run under the MemTracker; CUDA ranks only on request
    seq, hidden = (32, 64) if not cuda else (128, 256)
    block = per_block_seconds(torch, device, seq, hidden, track, box, sync)
    # 6 FLOPs per parameter per token for forward + backward; a GPT-2 block has 12 h^2 weights.
    block_flops = 6.0 * 12 * hidden * hidden * seq
    out["block"] = {**block, "seq": seq, "hidden": hidden, "tracked": track}
    out["block_overhead_s"] = max(block["per_block_s"] - block_flops / float(out["flops_bf16"]), 1e-6)
    lap("block")
    if cuda:
        # Kernels: the matmul libraries, then whatever the optimizer and the block (attention) loaded after the
        # second communicator; each communicator's bytes between.
        end = outside()
        out["kernel_bytes"] = max(0, seen["matmul"] - seen["context"]) + max(0, end - seen["second_comm"])
        out["nccl_comm_bytes"] = max(0, seen["first_comm"] - seen["matmul"])
        out["nccl_extra_comm_bytes"] = max(0, seen["second_comm"] - seen["first_comm"])
    dist.barrier()
    dist.destroy_process_group()
    return out


def free_port() -> int:
    """A free TCP port on 127.0.0.1 for the calibration's own process group."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(opts: CalibrationOptions, timeout_s: float = 600.0) -> Calibration:
    """Start ``opts.ranks`` local processes, measure, and reduce the per-rank figures to profile fields."""
    import multiprocessing as mp

    t0 = time.perf_counter()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=rank_main, args=(r, opts.ranks, port, opts, queue), daemon=True)
             for r in range(opts.ranks)]
    for p in procs:
        p.start()
    results: dict[int, object] = {}
    stage = dict.fromkeys(range(opts.ranks), "starting (imports, process group)")
    try:
        deadline = time.monotonic() + timeout_s
        while len(results) < opts.ranks:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                where = ", ".join(f"rank {r}: after {s}" for r, s in stage.items() if r not in results)
                raise RuntimeError(f"calibration ranks did not finish in {timeout_s:.0f} s ({where})")
            try:
                rank, res = queue.get(timeout=min(remaining, 5.0))
            except Exception:
                dead = [i for i, p in enumerate(procs) if not p.is_alive() and i not in results]
                if not dead:
                    continue
                # A rank may exit right after its result went into the pipe: read what is there first.
                try:
                    rank, res = queue.get(timeout=2.0)
                except Exception:
                    raise RuntimeError(f"calibration rank(s) {dead} exited without a result") from None
            if isinstance(res, tuple) and res[0] == "stage":
                stage[rank] = res[1]
                continue
            results[rank] = res
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
    errors = {r: v for r, v in results.items() if isinstance(v, str)}
    if errors:
        raise RuntimeError("calibration failed on rank(s) " + "; ".join(f"{r}: {v}" for r, v in errors.items()))
    return summarize(results, opts, time.perf_counter() - t0)


def summarize(per_rank: dict[int, dict], opts: CalibrationOptions, seconds: float) -> Calibration:
    """The Calibration from every rank's figures: medians over ranks, CPU Adam summed over the node's ranks."""
    ranks = [per_rank[r] for r in sorted(per_rank)]

    def med(get) -> float:
        return float(statistics.median(get(r) for r in ranks))

    values = {
        "flops_fp32": med(lambda r: r["flops_fp32"]),
        "flops_bf16": med(lambda r: r["flops_bf16"]),
        "intra_node_bw": med(lambda r: r["allreduce"]["bus_bw"]),
        "collective_latency_s": med(lambda r: r["allreduce"]["latency_s"]),
        "host_link_bw": med(lambda r: r["host_copy"]["bw"]),
        # The cost model divides the node's partitions by this: every rank's optimizer runs at once. It is DeepSpeed's
        # CPU Adam's rate (HardwareProfile.cpu_adam_params_per_s): a rank that timed torch's AdamW (no compiled op)
        # counts TORCH_HOST_ADAM_RATIO times faster.
        "cpu_adam_params_per_s": float(sum(r["adam"]["params_per_s"] * deepspeed_rate(r["adam"]) for r in ranks)),
        "block_overhead_s": med(lambda r: r["block_overhead_s"]),
        # The measured rate is what a large matmul reaches here: the profile's share of the datasheet peak (mfu)
        # would count the same shortfall twice.
        "mfu": 1.0,
    }
    if opts.device == "cuda":
        for name in ("context_bytes", "kernel_bytes", "nccl_comm_bytes", "nccl_extra_comm_bytes"):
            values[name] = int(med(lambda r, name=name: r[name]))
    details = {"ranks": opts.ranks, "threads_per_rank": opts.threads, "device": opts.device,
               "seconds": round(seconds, 2), "per_rank": ranks}
    return Calibration(values=values, details=details, seconds=seconds)
