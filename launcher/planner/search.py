"""Enumerate strategies, keep those that fit, choose the fastest, and explain the choice.

Pure: plain numbers in, a Plan (or NoPlanError with what would fit) out.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field

from launcher.config.job import StrategyConfig
from launcher.errors import ConfigError, NoPlanError
from launcher.model.introspect import ModelStats
from launcher.planner.cost import step_time_terms
from launcher.planner.hardware import HardwareProfile
from launcher.planner.memory import ActivationConstants, MemoryInputs, analytic_constants, estimate_memory
from launcher.planner.plan import Buckets, Estimate, Plan, Rejected, Strategy
from launcher.units import format_bytes

DS_DEFAULT_BUCKET = 500_000_000  # DeepSpeed's reduce/allgather default, elements (2 GB at fp32)
DS_DEFAULT_PREFETCH = 50_000_000  # DeepSpeed's stage3_prefetch_bucket_size default, elements (zero/config.py)
BUCKET_BUDGET_SHARE = 0.02  # share of the usable budget one communication bucket may take
MIN_BUCKET = 1_000_000


@dataclass(kw_only=True, slots=True)
class PlanRequest:
    """What the planner is asked: a model, a cluster shape, a batch and a per-GPU budget."""

    model: ModelStats
    """Parameter counts and shapes (counts in parameters, sizes in features)."""
    gpus_per_node: int
    """Ranks per node, GPUs (or CPU ranks)."""
    nodes: int
    """Machines, each with gpus_per_node ranks."""
    budget_bytes: int
    """Per-GPU budget, bytes."""
    seq_len: int
    """Tokens per sequence."""
    global_batch_size: int
    """Sequences per optimizer step over all ranks; never changed by the planner."""
    precision: str
    """Working dtype: bf16, fp16 or fp32 (train.precision: auto is decided before the planner, with its reason)."""
    optimizer: str
    """adamw, adam or sgd."""
    hardware: HardwareProfile
    """Device constants the memory and cost models read."""
    pins: StrategyConfig = field(default_factory=StrategyConfig)
    """Strategy fields the job fixed; None fields are searched."""
    host_ram_per_node_bytes: int | None = None
    """None skips the host check (unknown)."""
    nvme_free_bytes: int | None = None
    """None: no NVMe path given, so NVMe offload is not a candidate."""
    activations: ActivationConstants | None = None
    """Measured activation constants; None derives them from the paper (analytic_constants)."""
    force: bool = False
    """Return a fully pinned plan even when it is over budget."""
    precision_reason: str = ""
    """Why this precision (launcher.precision.choose_precision); the plan repeats it among its reasons."""

    @property
    def world_size(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def usable_bytes(self) -> int:
        return int(self.budget_bytes * (1.0 - self.pins.safety_margin))


def size_buckets(req: PlanRequest, *, smallest: bool = False) -> Buckets:
    """Communication buffers sized to the budget instead of DeepSpeed's 5e8-element defaults.

    ``smallest`` gives the floor sizes, tried when a strategy misses the budget only by its buckets; that also
    keeps feasibility monotone in the budget (a larger budget never forces larger buckets).
    """
    m = req.model
    elem = 4
    by_budget = MIN_BUCKET if smallest else int(BUCKET_BUDGET_SHARE * req.usable_bytes / elem)
    bucket = max(MIN_BUCKET, min(DS_DEFAULT_BUCKET, by_budget, m.trainable_params))
    # HF's "auto" rules for ZeRO-3: prefetch 0.9·h², persistence 10·h; live params capped at the bucket.
    h2 = m.hidden_size * m.hidden_size
    # Capped at DeepSpeed's own default, which 0.9·h² passes from h ≈ 7.5k on.
    prefetch = max(MIN_BUCKET, min(bucket, int(0.9 * h2), DS_DEFAULT_PREFETCH))
    return Buckets(
        reduce_bucket_size=bucket,
        allgather_bucket_size=bucket,
        stage3_prefetch_bucket_size=prefetch,
        stage3_max_live_parameters=max(bucket, m.largest_layer_params),
        stage3_param_persistence_threshold=10 * m.hidden_size,
    )


def _sharding_options(pins: StrategyConfig, nodes: int) -> list[tuple[str, int | None, bool | None, str | None]]:
    # Hybrid sharding differs from full sharding only across nodes: on one node the two are the same plan.
    fsdp_groups = ("full", "hybrid") if nodes > 1 else ("full",)
    opts = [("deepspeed", z, None, None) for z in (0, 1, 2, 3)]
    opts += [("fsdp", None, reshard, group) for group in fsdp_groups for reshard in (True, False)]
    out = []
    for engine, zero, reshard, group in opts:
        if pins.engine is not None and engine != pins.engine:
            continue
        if pins.zero_stage is not None and zero != pins.zero_stage:
            continue
        if pins.fsdp_reshard_after_forward is not None and reshard != pins.fsdp_reshard_after_forward:
            continue
        if pins.fsdp_sharding is not None and group != pins.fsdp_sharding:
            continue
        out.append((engine, zero, reshard, group))
    return out


def _offload_options(engine: str, zero: int | None, nvme: bool) -> list[tuple[str, str]]:
    if engine == "fsdp":
        return [("none", "none"), ("cpu", "cpu")]  # CPUOffloadPolicy moves params, grads and optimizer together
    if not zero or zero == 1:
        return [("none", "none")]  # ZeRO-Offload of the optimizer needs gradient partitioning (stage 2+)
    opts = [("none", "none"), ("cpu", "none")]
    if zero == 3:
        opts += [("cpu", "cpu")]
        if nvme:
            opts += [("nvme", "none"), ("nvme", "nvme"), ("cpu", "nvme")]
    return opts


def micro_batches(req: PlanRequest) -> list[int]:
    per_rank = req.global_batch_size // req.world_size
    return [d for d in range(1, per_rank + 1) if per_rank % d == 0]


def batch_problem(global_batch_size: int, world_size: int) -> str | None:
    """The global batch must split evenly over the data-parallel ranks: it is never changed to fit."""
    if global_batch_size % world_size == 0:
        return None
    example = world_size * max(1, round(global_batch_size / world_size))
    return (f"train.global_batch_size: {global_batch_size} is not divisible by {world_size} GPUs; use a multiple of "
            f"{world_size} (e.g. {example}) or another --gpus")


def context_problem(m: ModelStats, seq_len: int) -> str | None:
    """A sequence past the model's position table indexes embeddings that do not exist (learned positions) or
    positions it never trained on (RoPE): refused, never silently truncated."""
    if m.max_positions is None or seq_len <= m.max_positions:
        return None
    rope = (f", or raise {m.position_key} together with the config's rope_scaling ({m.rope_scaling})"
            if m.rope_scaling else "")
    return (f"data.max_seq_len: {seq_len} tokens is past this {m.model_type} model's position table "
            f"({m.position_key} = {m.max_positions}); use --seq-len {m.max_positions} or less{rope}")


def candidates(req: PlanRequest) -> list[Strategy]:
    p = req.pins
    problem = batch_problem(req.global_batch_size, req.world_size) or context_problem(req.model, req.seq_len)
    if problem:
        raise ConfigError(problem)
    if p.fsdp_sharding == "hybrid" and req.nodes == 1:
        raise ConfigError(
            "strategy.fsdp_sharding: 'hybrid' shards within a node and replicates across nodes, but this job runs "
            "on 1 node; use fsdp_sharding: full, or --nodes 2 or more"
        )
    mbs = micro_batches(req)
    if p.micro_batch_size is not None:
        if p.micro_batch_size not in mbs:
            raise ConfigError(
                f"strategy.micro_batch_size: {p.micro_batch_size} does not divide the per-rank batch "
                f"{req.global_batch_size // req.world_size}; use one of {mbs}"
            )
        mbs = [p.micro_batch_size]
    acs = [False, True] if p.activation_checkpointing is None else [p.activation_checkpointing]
    out = []
    for engine, zero, reshard, group in _sharding_options(p, req.nodes):
        for opt_off, par_off in _offload_options(engine, zero, req.nvme_free_bytes is not None):
            if p.offload_optimizer is not None and opt_off != p.offload_optimizer:
                continue
            if p.offload_params is not None and par_off != p.offload_params:
                continue
            for ac, mb in itertools.product(acs, mbs):
                accum = req.global_batch_size // (mb * req.world_size)
                out.append(Strategy(engine=engine, zero_stage=zero, fsdp_reshard_after_forward=reshard,
                                    fsdp_sharding=group, offload_optimizer=opt_off, offload_params=par_off, micro_batch_size=mb,
                                    grad_accum_steps=accum, activation_checkpointing=ac))
    if not out:
        raise ConfigError(
            f"strategy: the pinned fields {_pinned(p)} admit no strategy; FSDP offloads params and optimizer "
            "together (offload_optimizer: cpu with offload_params: cpu), ZeRO-Offload needs zero_stage >= 2, "
            "param offload and NVMe need zero_stage 3 (NVMe also needs cluster.nvme_path); unpin one of them"
        )
    return out


def _pinned(p: StrategyConfig) -> list[str]:
    return [f.name for f in dataclasses.fields(p) if f.name != "safety_margin" and getattr(p, f.name) is not None]


def _inputs(req: PlanRequest) -> MemoryInputs:
    return MemoryInputs(model=req.model, world_size=req.world_size, gpus_per_node=req.gpus_per_node,
                        nodes=req.nodes, seq_len=req.seq_len, precision=req.precision, optimizer=req.optimizer,
                        hardware=req.hardware, activations=_constants(req))


def _constants(req: PlanRequest) -> ActivationConstants:
    return req.activations or analytic_constants(req.model, req.precision)


@dataclass(slots=True)
class Scored:
    strategy: Strategy
    estimate: Estimate
    problem: str | None  # None when it fits
    buckets: Buckets | None = None


def score(req: PlanRequest, s: Strategy) -> Scored:
    """Estimate with budget-sized buckets; if that misses, with the smallest buckets."""
    first = _score(req, s, size_buckets(req))
    if first.problem is None or s.engine != "deepspeed":
        return first
    second = _score(req, s, size_buckets(req, smallest=True))
    return second if second.problem is None else first


def _score(req: PlanRequest, s: Strategy, buckets: Buckets) -> Scored:
    inp = _inputs(req)
    mem = estimate_memory(inp, s, buckets)
    terms = step_time_terms(inp, s, buckets.reduce_bucket_size)
    est = Estimate(breakdown=mem.breakdown, peak_bytes=mem.peak_bytes, host_bytes_per_node=mem.host_bytes_per_node,
                   nvme_bytes_per_node=mem.nvme_bytes_per_node, step_time_s=sum(terms.values()),
                   step_time_terms=terms, basis=mem.basis, overhead=mem.overhead,
                   moment_bytes=mem.moment_bytes)
    problem = None
    if mem.peak_bytes > req.usable_bytes:
        largest = max(mem.breakdown, key=mem.breakdown.get)
        problem = (f"over budget by {format_bytes(mem.peak_bytes - req.usable_bytes)} "
                   f"(peak {format_bytes(mem.peak_bytes)}, largest: {largest})")
    elif req.host_ram_per_node_bytes is not None and mem.host_bytes_per_node > req.host_ram_per_node_bytes:
        problem = (f"host RAM: needs {format_bytes(mem.host_bytes_per_node)} per node, "
                   f"has {format_bytes(req.host_ram_per_node_bytes)}")
    elif mem.nvme_bytes_per_node and mem.nvme_bytes_per_node > (req.nvme_free_bytes or 0):
        problem = (f"NVMe: needs {format_bytes(mem.nvme_bytes_per_node)}, "
                   f"has {format_bytes(req.nvme_free_bytes or 0)} free")
    return Scored(s, est, problem, buckets)


def evaluate(req: PlanRequest) -> list[Scored]:
    return [score(req, s) for s in candidates(req)]


def make_plan(req: PlanRequest) -> Plan:
    """The fastest strategy whose predicted peak fits the usable budget, host RAM and NVMe."""
    scored = evaluate(req)
    fits = sorted((c for c in scored if c.problem is None), key=lambda c: (c.estimate.step_time_s, c.estimate.peak_bytes))
    pinned = _pinned(req.pins)
    if not fits:
        fully_pinned = len(scored) == 1
        if req.force and fully_pinned:
            return _build(req, scored[0], [], pinned, status="forced")
        raise NoPlanError(explain_no_fit(req, scored))
    return _build(req, fits[0], scored, pinned, status="fits")


def _build(req, best: Scored, scored, pinned, *, status) -> Plan:
    fit_count = sum(1 for c in scored if c.problem is None)
    b = best.estimate
    reasons = []
    if status == "forced":
        reasons.append(f"forced: every strategy field is pinned and the prediction is {best.problem}")
    else:
        reasons.append(
            f"fastest of {fit_count} fitting candidates out of {len(scored)}: predicted {b.step_time_s:.3g} s/step, "
            f"peak {format_bytes(b.peak_bytes)} of {format_bytes(req.usable_bytes)} usable "
            f"(budget {format_bytes(req.budget_bytes)} less {req.pins.safety_margin:.0%} margin)"
        )
        dominant = max(b.step_time_terms, key=b.step_time_terms.get)
        reasons.append(f"step time is dominated by {dominant} ({b.step_time_terms[dominant]:.3g} s)")
        moments = b.moment_bytes
        if moments and max(moments, key=moments.get) == "init":
            training = max(v for k, v in moments.items() if k != "init")
            reasons.append(f"the peak is rank 0 loading the weights, {format_bytes(moments['init'])} (the checkpoint "
                           f"it reads counts where host memory is the device), above training's "
                           f"{format_bytes(training)}")
        hw = req.hardware
        if req.precision == "bf16" and hw.flops_bf16 < hw.flops_fp32:
            # CPUs without AMX / AVX512-BF16 emulate bf16 matmuls (~13x slower): `launch calibrate` measures it.
            reasons.append(f"bf16 matmuls run {hw.flops_fp32 / hw.flops_bf16:.1f}x slower than fp32 on the "
                           f"{hw.name} profile ({hw.flops_bf16:.3g} vs {hw.flops_fp32:.3g} FLOP/s); the compute "
                           "term uses the bf16 rate, and precision: fp32 would step faster")
        if pinned:
            reasons.append(f"kept as pinned by the job: {', '.join(pinned)}")
    if req.precision_reason:
        reasons.append(req.precision_reason)
    reasons += activation_reasons(_constants(req))
    m = req.model
    if m.num_experts:
        reasons.append(f"MoE: {m.num_params:,} total, {m.active_params:,} active (top-{m.experts_per_token} of "
                       f"{m.num_experts} experts): memory counts every expert, compute only the active ones, "
                       "activations the top-k experts' MLP width")
    return Plan(
        strategy=best.strategy, estimate=b, buckets=best.buckets, num_params=req.model.num_params,
        trainable_params=req.model.trainable_params, budget_bytes=req.budget_bytes, usable_bytes=req.usable_bytes,
        world_size=req.world_size, nodes=req.nodes, gpus_per_node=req.gpus_per_node,
        global_batch_size=req.global_batch_size, seq_len=req.seq_len, precision=req.precision,
        hardware=req.hardware.name, reasons=reasons, rejected=top_rejected(best, scored), pinned=pinned,
        constants={"activations": dataclasses.asdict(_constants(req))}, status=status,
        largest_layer_params=req.model.largest_layer_params, block_class=req.model.block_class,
        precision_reason=req.precision_reason,
    )


def activation_reasons(c: ActivationConstants) -> list[str]:
    """What the activation term assumed: the attention kernel, and a probe that failed (never silently)."""
    scores = "a·s² score matrices saved per block" if c.attention == "eager" else "fused, no a·s² scores saved"
    out = [f"activations assume {c.attention} attention ({scores})"]
    if c.probe_error:
        out.append(f"activation probe FAILED ({c.probe_error}): activations use Korthikanti et al.'s per-layer "
                   "constants, not measured ones; expect a larger error")
    return out


def top_rejected(best: Scored, scored: list[Scored], limit: int = 6) -> list[Rejected]:
    """The alternatives a user would ask about: faster ones that do not fit, then the runners-up."""
    t0 = best.estimate.step_time_s
    faster = sorted((c for c in scored if c.problem and c.estimate.step_time_s < t0),
                    key=lambda c: c.estimate.step_time_s)
    runners = sorted((c for c in scored if c.problem is None and c is not best),
                     key=lambda c: c.estimate.step_time_s)
    out, seen = [], set()
    for c in faster[: limit // 2] + runners:
        label = c.strategy.label()
        if label in seen:
            continue
        seen.add(label)
        if c.problem:
            reason = c.problem
        else:
            slower = (c.estimate.step_time_s / t0 - 1) if t0 else 0.0
            reason = f"fits but slower: {c.estimate.step_time_s:.3g} s/step (+{slower:.0%})"
        out.append(Rejected(label=label, reason=reason, peak_bytes=c.estimate.peak_bytes,
                            step_time_s=c.estimate.step_time_s))
        if len(out) >= limit:
            break
    return out


def _fits_with(req: PlanRequest, **changes) -> Scored | None:
    trial = dataclasses.replace(req, force=False, **changes)
    try:
        scored = evaluate(trial)
    except ConfigError:
        return None
    fits = [c for c in scored if c.problem is None]
    return min(fits, key=lambda c: c.estimate.step_time_s) if fits else None


LORA_RANK = 8


def lora_suggestion(m: ModelStats, r: int = LORA_RANK) -> tuple[list[str], int]:
    """The attention query and value projections of this model family, by their module names, and the adapter
    parameters LoRA of rank ``r`` adds on them [Hu et al., arXiv:2106.09685 §4.2: W_q and W_v; r·(d_in + d_out)
    per adapted matrix].
    """
    h = m.hidden_size
    kv = m.num_kv_heads * m.head_dim
    if m.model_type == "gpt2":
        # GPT-2 fuses Q, K and V into one Conv1D (h -> 3h); peft adapts the whole of it.
        return ["c_attn"], r * (h + 3 * h) * m.num_blocks
    if m.model_type in ("bert", "roberta", "xlm-roberta", "camembert", "electra", "ernie", "megatron-bert"):
        return ["query", "value"], 2 * r * (h + h) * m.num_blocks
    if m.model_type == "distilbert":
        return ["q_lin", "v_lin"], 2 * r * (h + h) * m.num_blocks
    if m.model_type in ("gpt_neox", "falcon", "bloom", "persimmon"):
        # One fused query_key_value projection, h -> 3h (falcon's GQA variants narrower; 3h bounds it).
        return ["query_key_value"], r * (h + 3 * h) * m.num_blocks
    if m.model_type in ("phi3", "phimoe"):
        # Phi-3 fuses Q, K and V into qkv_proj: h -> h + 2 * the key/value heads' width.
        return ["qkv_proj"], r * (h + h + 2 * kv) * m.num_blocks
    # llama and its kin (mistral, qwen2, ...): q_proj h -> h, v_proj h -> the key/value heads' width (GQA).
    return ["q_proj", "v_proj"], r * ((h + h) + (h + kv)) * m.num_blocks


GPUS_PER_NODE_STEPS = (2, 4, 8)
"""GPUs per node the advice tries: what a node holds; past that the advice adds nodes."""
NODE_STEPS = (2, 4, 8, 16, 32, 64, 128, 256)


def _round_up(x: float, digits: int = 3) -> int:
    """``x`` rounded up to ``digits`` significant figures, so the printed figure is never below what fits."""
    scale = 10 ** max(0, len(str(int(x))) - digits)
    return -(-int(x) // scale) * scale


def _outcome(hit: Scored) -> str:
    e = hit.estimate
    return f"{hit.strategy.label()}, peak {format_bytes(e.peak_bytes)} per GPU, {e.step_time_s:.3g} s/step"


def smallest_budget(req: PlanRequest) -> tuple[int, Scored] | None:
    """The smallest per-GPU budget at which the planner finds a plan, never more than the card holds (on CPU
    ranks, more than the node's host RAM shared by its ranks); None when even that does not fit.

    Bisection is sound because feasibility is monotone in the budget (tests/planner/test_search.py's property
    test: more budget never loses a plan).
    """
    if req.hardware.memory_bytes:
        cap = req.hardware.memory_bytes
    elif req.host_ram_per_node_bytes:
        cap = req.host_ram_per_node_bytes // req.gpus_per_node
    else:
        cap = 10_000 * 10**9
    if cap <= req.budget_bytes or _fits_with(req, budget_bytes=cap) is None:
        return None
    lo, hi = req.budget_bytes, cap
    while hi - lo > max(10**6, lo // 200):
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if _fits_with(req, budget_bytes=mid) else (mid, hi)
    budget = min(cap, _round_up(hi))
    hit = _fits_with(req, budget_bytes=budget)
    return (budget, hit) if hit else None


def explain_no_fit(req: PlanRequest, scored: list[Scored]) -> str:
    """Exit-2 message: the smallest footprint, and what would make the job fit.

    Every suggestion is a re-plan: the request with that one change goes through the same search, and only a
    change that then fits is offered, with the plan it gets (strategy, peak, step time).
    """
    smallest = min(scored, key=lambda c: c.estimate.peak_bytes)
    lines = [
        f"no plan fits {format_bytes(req.budget_bytes)} per GPU on {req.world_size} GPUs "
        f"({len(scored)} candidates tried); smallest footprint: {format_bytes(smallest.estimate.peak_bytes)} "
        f"with {smallest.strategy.label()} ({smallest.problem})",
        "what would fit:",
    ]

    def offer(text: str, hit: Scored | None, extra: str = "") -> bool:
        if hit is not None:
            lines.append(f"  - {text}: {_outcome(hit)}{extra}")
        return hit is not None

    found = smallest_budget(req)
    if found:
        budget, hit = found
        card = (f" ({req.hardware.name} holds {format_bytes(req.hardware.memory_bytes)})"
                if req.hardware.memory_bytes else "")
        offer(f"a budget of {format_bytes(budget)} per GPU{card} (--budget {format_bytes(budget).replace(' ', '')})",
              hit)
    pinned = _pinned(req.pins)
    if pinned:
        free = dataclasses.replace(req, pins=StrategyConfig(safety_margin=req.pins.safety_margin))
        offer(f"unpinning {', '.join(pinned)}", _fits_with(free))
    for gpus in GPUS_PER_NODE_STEPS:
        world = gpus * req.nodes
        if gpus > req.gpus_per_node and req.global_batch_size % world == 0 and offer(
                f"{world} GPUs, {gpus} per node (--gpus {gpus})", _fits_with(req, gpus_per_node=gpus)):
            break
    for nodes in NODE_STEPS:
        world = req.gpus_per_node * nodes
        if nodes > req.nodes and req.global_batch_size % world == 0 and offer(
                f"{nodes} nodes of {req.gpus_per_node} GPUs, {world} in all (--nodes {nodes})",
                _fits_with(req, nodes=nodes)):
            break
    if req.nvme_free_bytes is None:
        hit = _fits_with(req, nvme_free_bytes=10**15)
        if hit:
            offer("NVMe offload (set cluster.nvme_path and nvme_free)", hit,
                  f", {format_bytes(hit.estimate.nvme_bytes_per_node)} of NVMe per node")
    # Only shorter than now, and the current length is within the position table (checked by candidates()):
    # never a sequence past the model's context.
    seq = req.seq_len // 2
    while seq >= 16 and not offer(f"a shorter sequence: max_seq_len {seq} (--seq-len {seq})",
                                  _fits_with(req, seq_len=seq)):
        seq //= 2
    m = req.model
    if m.trainable_params == m.num_params:
        targets, lora = lora_suggestion(m)
        offer(f"LoRA (train.lora: {{r: {LORA_RANK}, target_modules: [{', '.join(targets)}]}}, ~{lora:,} trainable)",
              _fits_with(req, model=dataclasses.replace(m, trainable_params=lora, lora_params=lora)))
    if req.pins.micro_batch_size not in (None, 1):
        offer("a smaller micro-batch", _fits_with(req, pins=dataclasses.replace(req.pins, micro_batch_size=None)))
    if req.host_ram_per_node_bytes is not None:
        short = sorted((c for c in scored if c.problem and c.problem.startswith("host RAM")),
                       key=lambda c: c.estimate.host_bytes_per_node)
        for c in short[:1]:
            need = _round_up(c.estimate.host_bytes_per_node)
            offer(f"more host RAM per node: {format_bytes(need)} (cluster.host_ram_per_node)",
                  _fits_with(req, host_ram_per_node_bytes=need))
    if len(lines) == 2:
        lines.append("  - nothing within reach by one change; combine more GPUs with LoRA or a shorter sequence")
    return "\n".join(lines)
