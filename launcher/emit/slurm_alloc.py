"""What a Slurm job of a plan asks for: --time, --mem, --cpus-per-task and GPUs, each with where it came from.

Pure: ``slurm_resources(job, plan, facts)`` computes from the job, the plan and the ``RunFacts`` a caller found on
disk (the data's step count for a train.epochs job, the weights' size, the DeepSpeed ops not yet built:
launcher.session.prepare.run_facts); without facts it assumes what the plan alone says, each assumption on the
safe side (all the plan's ops to build, fp32 weights to read). The sbatch script, submitit's parameters, a
sweep's array (``combined``), `launch plan`'s text and `launch plan --json` all read the one record it returns.
docs/reliability/slurm.md derives each value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from launcher.config.job import InlineArch, Job
from launcher.config.slurm_rules import TIMEOUT_MAX_MIN
from launcher.planner.hardware import PROFILES, ranks_on_host
from launcher.planner.plan import Plan
from launcher.units import GB, GiB

TIME_FACTOR = 1.5
"""Margin on the predicted training time: the cost model's step time is a prediction (benchmarks/results/
plan_quality.md), and a run that outlives its limit still checkpoints and requeues (slurm.max_requeues)."""
BASE_STARTUP_S = 120.0
"""Start-up and end of any run, seconds: imports, the run dir, rendezvous, the report. Measured 10-15 s from
`launch` to the first step and ~3 s for the report on the 2-core dev VM (benchmarks/results/newcomer.md), from a
local disk; 120 s leaves room for importing torch, transformers and DeepSpeed from a network filesystem."""
WEIGHT_READ_BYTES_PER_S = 200e6
"""How fast the first rank reads the model's weights, bytes/s: the low end of a network filesystem for one
client (NFS 100-500 MB/s; Lustre and GPFS several GB/s)."""
FP32_WEIGHT_BYTES = 4
"""Bytes per parameter assumed on disk when the weights are not measured (fp32, the widest a checkpoint holds)."""
FIRST_STEP_FACTOR = 3.0
"""The first step's time over a steady step's: allocator warm-up, CUDA's lazily loaded kernels, the optimizer's
first state. Measured 2.6x on CPU ranks (a tiny GPT-2, 1.27 s against 0.49 s); the extra is (factor - 1) steps."""
MEM_FACTOR = 1.25
"""Margin on the plan's host RAM per node (offloaded optimizer states and parameters, the weight load)."""
RANK_PROCESS_BYTES = {"cuda_reserved_plus_context": 4 * GB, "cpu_tensor_bytes": 1 * GB}
"""Host memory of one rank's process beyond the plan's tensors, bytes, by the plan's basis (GPU or CPU ranks):
Python, torch, transformers, DeepSpeed and the data (CPU ranks: 0.43 GB peak RSS measured, docs/reliability/slurm.md);
on GPU ranks also CUDA's libraries and pinned staging buffers (assumed, not measured here)."""
MEM_KEYS_ELSEWHERE = ("mem_per_cpu", "mem_per_gpu")
"""additional_parameters that set memory another way: sbatch refuses them beside --mem, so none is derived."""
CPU_KEYS_ELSEWHERE = ("cpus_per_gpu",)
"""additional_parameters that set CPUs another way: sbatch refuses them beside --cpus-per-task."""

Source = Literal["job", "plan", "none"]


@dataclass(kw_only=True, slots=True, frozen=True)
class RunFacts:
    """What the allocation rests on besides the job and the plan, found where files are read
    (launcher.session.prepare.run_facts); ``plan_facts`` is what the plan alone says."""

    train_steps: int | None
    """Optimizer steps the run takes (train.max_steps, or train.epochs over the data); None: not known."""
    steps_basis: str
    """Where train_steps came from, or why it is not known, in words."""
    weight_bytes: int
    """Bytes of weights the first rank reads at start-up (0: the model starts from random weights)."""
    weights_measured: bool
    """weight_bytes is the weight files' size on disk (else parameters x FP32_WEIGHT_BYTES)."""
    ops_to_build: tuple[str, ...]
    """DeepSpeed ops the run loads that are not built yet (launcher.processes.ops), built before its ranks start."""


def plan_facts(job: Job, plan: Plan) -> RunFacts:
    """The facts as the job and plan alone give them: train.max_steps (else unknown), fp32 weights unless the
    model is an inline architecture, and every op the plan loads still to build."""
    from launcher.processes.ops import plan_ops

    steps = job.train.max_steps
    return RunFacts(train_steps=steps, steps_basis="train.max_steps" if steps else
                    "train.epochs: the step count needs the data's size (`launch plan` counts it)",
                    weight_bytes=0 if isinstance(job.model, InlineArch) else plan.num_params * FP32_WEIGHT_BYTES,
                    weights_measured=False, ops_to_build=plan_ops(plan))


@dataclass(kw_only=True, slots=True, frozen=True)
class Startup:
    """The seconds a run spends outside its steady steps, which --time adds to the training time."""

    base_s: float
    """Imports, rendezvous, the report (BASE_STARTUP_S)."""
    load_s: float
    """The weights read at WEIGHT_READ_BYTES_PER_S."""
    build_s: float
    """The DeepSpeed ops still to build, at their measured build times (launcher.processes.ops.OPS)."""
    first_step_s: float
    """The first step's extra over a steady one ((FIRST_STEP_FACTOR - 1) x the predicted step time)."""

    @property
    def total_s(self) -> float:
        """All of it, seconds."""
        return self.base_s + self.load_s + self.build_s + self.first_step_s


@dataclass(kw_only=True, slots=True, frozen=True)
class SlurmResources:
    """Time, memory, CPUs and GPUs a Slurm job asks for, and where each came from: the job (pinned in slurm:), the
    plan (derived), or none (time: the step count is unknown; memory and CPUs: set another way through
    additional_parameters). The sbatch script and the submitit parameters both use it; cli/ renders it."""

    time_min: int | None
    """--time, minutes; None when nothing gives it (the job's steps unknown and slurm.timeout_min unset)."""
    time_source: Source
    """Where time_min came from."""
    facts: RunFacts
    """The facts the derivation used."""
    predicted_train_s: float | None
    """Predicted step time x the run's optimizer steps, seconds; None when the step count is unknown."""
    startup: Startup
    """The start-up the derived --time adds."""
    mem_bytes: int | None
    """--mem per node, bytes (rendered in whole GiB when derived); None: not set (mem_per_cpu or mem_per_gpu)."""
    mem_source: Source
    """Where mem_bytes came from."""
    predicted_host_bytes: int
    """The plan's host RAM per node, bytes, before the margin."""
    mem_capped: bool
    """The derivation was cut to cluster.host_ram_per_node (a node cannot give more)."""
    rank_process_bytes: int
    """Host bytes counted for each rank's process beyond the plan's tensors (RANK_PROCESS_BYTES)."""
    cpus_per_task: int | None
    """--cpus-per-task (the node's one task runs every rank); None: not set (cpus_per_gpu)."""
    cpus_source: Source
    """Where cpus_per_task came from."""
    cpus_per_rank_from: Literal["cluster", "profile"]
    """A derived cpus_per_task shares cluster.cpus_per_node, or takes the profile's CPUs per device per rank."""
    threads_per_rank: int
    """OMP_NUM_THREADS for the ranks (CPU Adam's and torch's host threads): cpus_per_task shared by the node's ranks
    (1 when not set)."""
    gpus_per_node: int
    """--gpus-per-node: the plan's ranks per node, 0 for CPU ranks."""

    @property
    def derived(self) -> list[str]:
        """The sbatch options derived from the plan, sbatch spelling."""
        return [o for o, src in (("--time", self.time_source), ("--mem", self.mem_source),
                                 ("--cpus-per-task", self.cpus_source)) if src == "plan"]


def _time(job: Job, plan: Plan, facts: RunFacts) -> tuple[int | None, Source, float | None, Startup]:
    step_s = plan.estimate.step_time_s
    startup = Startup(base_s=BASE_STARTUP_S, load_s=facts.weight_bytes / WEIGHT_READ_BYTES_PER_S,
                      build_s=_build_s(facts.ops_to_build), first_step_s=(FIRST_STEP_FACTOR - 1) * step_s)
    train_s = None if facts.train_steps is None else step_s * facts.train_steps
    cfg = job.slurm
    if cfg.timeout_min is not None:
        return cfg.timeout_min, "job", train_s, startup
    if train_s is None:
        return None, "none", None, startup
    # At least one minute past the checkpoint signal, so USR2 always comes inside the limit.
    minutes = max(math.ceil((train_s * TIME_FACTOR + startup.total_s) / 60), cfg.signal_delay_s // 60 + 1)
    return min(minutes, TIMEOUT_MAX_MIN), "plan", train_s, startup


def _build_s(ops: tuple[str, ...]) -> float:
    from launcher.processes.ops import build_seconds

    return build_seconds(ops)


def slurm_resources(job: Job, plan: Plan, facts: RunFacts | None = None) -> SlurmResources:
    """--time, --mem, --cpus-per-task and GPUs: the job's when it pins them, else derived from the plan and
    ``facts`` (default: ``plan_facts``). Pure."""
    facts = facts or plan_facts(job, plan)
    cfg, ranks = job.slurm, plan.gpus_per_node
    extra = {str(k).replace("-", "_") for k in cfg.additional_parameters}
    time_min, time_src, train_s, startup = _time(job, plan, facts)
    host = plan.estimate.host_bytes_per_node
    capped, per_process = False, RANK_PROCESS_BYTES.get(plan.estimate.basis, 4 * GB)
    if cfg.mem_gb is not None:
        mem, mem_src = int(cfg.mem_gb * GiB), "job"
    elif extra & set(MEM_KEYS_ELSEWHERE):
        mem, mem_src = None, "none"
    else:
        need = host * MEM_FACTOR + ranks * per_process
        mem, mem_src = math.ceil(need / GiB) * GiB, "plan"
        node = job.cluster.host_ram_per_node_bytes
        if node is not None and mem > node:
            mem, capped = node // GiB * GiB, True
    node_cpus = job.cluster.cpus_per_node
    profile = PROFILES.get(plan.hardware)
    if cfg.cpus_per_task is not None:
        cpus, cpus_src = cfg.cpus_per_task, "job"
    elif extra & set(CPU_KEYS_ELSEWHERE):
        cpus, cpus_src = None, "none"
    elif node_cpus is not None:
        cpus, cpus_src = min(max(node_cpus // ranks, 1) * ranks, node_cpus), "plan"  # never more than the node
    else:
        cpus, cpus_src = ranks * (profile.host_cpus_per_device if profile else 1), "plan"
    return SlurmResources(time_min=time_min, time_source=time_src, facts=facts, predicted_train_s=train_s,
                          startup=startup, mem_bytes=mem, mem_source=mem_src, predicted_host_bytes=host,
                          mem_capped=capped, rank_process_bytes=per_process, cpus_per_task=cpus, cpus_source=cpus_src,
                          cpus_per_rank_from="cluster" if node_cpus is not None else "profile",
                          threads_per_rank=max(1, (cpus or ranks) // ranks),
                          gpus_per_node=0 if ranks_on_host(plan) else ranks)


def combined(resources: list[SlurmResources]) -> SlurmResources:
    """One allocation for several plans (a sweep's array): the largest of each, so every variant fits; no time
    when one variant has none."""
    best = resources[0]
    for r in resources[1:]:
        longest = r if (r.predicted_train_s or 0.0) > (best.predicted_train_s or 0.0) else best
        slowest = r if r.startup.total_s > best.startup.total_s else best
        best = SlurmResources(
            time_min=None if None in (best.time_min, r.time_min) else max(best.time_min, r.time_min),
            time_source=best.time_source, facts=longest.facts, predicted_train_s=longest.predicted_train_s,
            startup=slowest.startup,
            mem_bytes=None if best.mem_bytes is None else max(best.mem_bytes, r.mem_bytes or 0),
            mem_source=best.mem_source, predicted_host_bytes=max(best.predicted_host_bytes, r.predicted_host_bytes),
            mem_capped=best.mem_capped or r.mem_capped,
            rank_process_bytes=max(best.rank_process_bytes, r.rank_process_bytes),
            cpus_per_task=None if best.cpus_per_task is None else max(best.cpus_per_task, r.cpus_per_task or 0),
            cpus_source=best.cpus_source, cpus_per_rank_from=best.cpus_per_rank_from,
            threads_per_rank=max(best.threads_per_rank, r.threads_per_rank),
            gpus_per_node=max(best.gpus_per_node, r.gpus_per_node))
    return best


def allocation_lines(r: SlurmResources, profile: str) -> list[tuple[str, str]]:
    """(sbatch option=value, how it was reached) for each value of ``r``, in words: `launch plan`'s text
    (cli.render) and the sbatch script's header both print these. ``profile``: the plan's hardware profile."""
    from launcher.units import format_bytes, format_duration

    f = r.facts
    if r.time_source == "plan":
        st = r.startup
        ops = (f"DeepSpeed's {', '.join(f.ops_to_build)} to build {format_duration(st.build_s)}" if f.ops_to_build
               else "no DeepSpeed op to build")
        weights = (f"weights {format_bytes(f.weight_bytes)} {'on disk' if f.weights_measured else '(fp32, assumed)'}"
                   f" read in {format_duration(st.load_s)} at {WEIGHT_READ_BYTES_PER_S / 1e6:g} MB/s"
                   if f.weight_bytes else "random weights, nothing to read")
        time = (f"from the plan: {format_duration(r.predicted_train_s)} of steps ({f.train_steps} x "
                f"{r.predicted_train_s / f.train_steps:.3g} s, {f.steps_basis}) x {TIME_FACTOR} + "
                f"{format_duration(st.total_s)} start-up ({format_duration(st.base_s)} imports, rendezvous and report; "
                f"{weights}; {ops}; first step +{format_duration(st.first_step_s)})")
    elif r.time_source == "job":
        time = "slurm.timeout_min"
    else:
        time = f"not derived: {f.steps_basis}; set slurm.timeout_min (minutes) or train.max_steps"
    if r.mem_source == "plan":
        mem = (f"from the plan: host RAM {format_bytes(r.predicted_host_bytes)} per node x {MEM_FACTOR} + "
               f"{format_bytes(r.rank_process_bytes)} per rank process"
               + (", cut to cluster.host_ram_per_node" if r.mem_capped else ""))
    else:
        mem = {"job": "slurm.mem_gb", "none": "not set: additional_parameters sets memory per CPU or GPU"}[r.mem_source]
    if r.cpus_source == "plan" and r.cpus_per_rank_from == "cluster":
        cpus = "from cluster.cpus_per_node, shared by the node's ranks"
    elif r.cpus_source == "plan":
        cpus = (f"from the {profile} profile: {r.threads_per_rank} CPU(s) per rank (set cluster.cpus_per_node to "
                "share a node's CPUs)")
    else:
        cpus = {"job": "slurm.cpus_per_task", "none": "not set: additional_parameters sets CPUs per GPU"}[r.cpus_source]
    mem_value = "-" if r.mem_bytes is None else (f"{r.mem_bytes // GiB}G" if r.mem_bytes % GiB == 0
                                                 else f"{r.mem_bytes // 2**20}M")
    return [
        (f"--time={r.time_min if r.time_min is not None else '-'}", time),
        (f"--mem={mem_value}", mem),
        (f"--cpus-per-task={r.cpus_per_task if r.cpus_per_task is not None else '-'}",
         f"{cpus}; OMP_NUM_THREADS={r.threads_per_rank} per rank"),
        (f"--gpus-per-node={r.gpus_per_node if r.gpus_per_node else '-'}",
         "the plan's ranks per node" if r.gpus_per_node else f"the {profile} profile's ranks compute on the host"),
    ]
