"""The search space: every engine's layouts (launcher.engines) times micro-batch and activation checkpointing,
less what the job pinned."""

from __future__ import annotations

import dataclasses
import itertools

from launcher.config.job import StrategyConfig
from launcher.engines import ENGINES, LAYOUT_KEYS, LAYOUTS, engine_spec
from launcher.engines.layout import Layout
from launcher.errors import ConfigError
from launcher.levers import LEVERS
from launcher.planner.levers import axes, expand, reachable
from launcher.planner.plan import Strategy
from launcher.planner.request import PlanRequest, batch_problem, context_problem, micro_batches


def layouts(req: PlanRequest) -> list[Layout]:
    """Each registered engine's layouts the job's pins admit, in registry order."""
    nvme = req.nvme_free_bytes is not None
    return [c for spec in ENGINES.values()
            for c in spec.candidates(nodes=req.nodes, nvme=nvme, world_size=req.world_size)
            if admitted(c, req.pins)]


def admitted(layout: Layout, pins: StrategyConfig) -> bool:
    """Every layout field the job pinned (strategy.engine and the flat LAYOUT_KEYS) has this layout's value; a field
    its engine lacks has none."""
    return (pins.engine is None or pins.engine == layout.engine) and all(
        getattr(pins, key) is None or getattr(pins, key) == getattr(layout, key, None) for key in LAYOUT_KEYS)


def candidates(req: PlanRequest) -> list[Strategy]:
    """Every strategy the search scores: each admitted layout x micro-batch (dividing the per-rank batch) x the lever
    settings its engine offers. Raises ConfigError when the batch, context or pins admit none."""
    p = req.pins
    problem = batch_problem(req.global_batch_size, req.world_size) or context_problem(req.model, req.seq_len)
    if problem:
        raise ConfigError(problem)
    refusal = next((why for layout in LAYOUTS.values() if (why := layout.pin_problem(p, req.nodes))), "")
    if refusal:
        raise ConfigError(refusal)
    mbs = micro_batches(req)
    if p.micro_batch_size is not None:
        if p.micro_batch_size not in mbs:
            raise ConfigError(
                f"strategy.micro_batch_size: {p.micro_batch_size} does not divide the per-rank batch "
                f"{req.global_batch_size // req.world_size}; use one of {mbs}"
            )
        mbs = [p.micro_batch_size]
    refusal = next((why for spec in LEVERS.values() if (why := spec.request_problem(req))), "")
    if refusal:
        raise ConfigError(refusal)
    out = []
    # Thousands of strategies: each layout's fields and each lever setting's are read once, not per strategy, and
    # the settings expanded once per distinct set of values tried (levers.expand: the same for most micro-batches).
    per_axes: dict[tuple, list[dict[str, object]]] = {}
    settings: dict[tuple, list[dict[str, object]]] = {}
    refused: list[str] = []  # a pinned lever value a layout does not offer, and why
    for c, mb in itertools.product(layouts(req), mbs):
        accum = req.global_batch_size // (mb * req.world_size)
        spec = engine_spec(c.engine)
        levers, limited = reachable(req, spec.levers), spec.lever_values(c)  # c: the layout
        limits = {name: values for name, (values, _) in limited.items()}
        key = (levers, accum, tuple(sorted(limits.items())), spec.pure_bf16_optimizers)
        if key not in settings:
            tried = (axes(req, levers, accum, limits), spec.pure_bf16_optimizers)
            if tried not in per_axes:
                per_axes[tried] = [lv.fields() for lv in expand(*tried)]
            settings[key] = per_axes[tried]
        refused += [f"strategy.{name}: {getattr(p, name)!r} is not offered with {c.title(req.nodes)}"
                    f"{_offload_words(c)}: {why}; leave strategy.{name} out or pin another layout"
                    for name, (values, why) in limited.items()
                    if getattr(p, name) is not None and getattr(p, name) not in values]
        out += [Strategy(layout=c, micro_batch_size=mb, grad_accum_steps=accum, **lv) for lv in settings[key]]
    if not out and refused:
        raise ConfigError(refused[0])
    if not out:
        raise ConfigError(
            f"strategy: the pinned fields {pinned(p)} admit no strategy; FSDP offloads params and optimizer "
            "together (offload_optimizer: cpu with offload_params: cpu), ZeRO-Offload needs zero_stage >= 2, "
            "param offload and NVMe need zero_stage 3 (NVMe also needs cluster.nvme_path), each engine offers "
            f"only the levers it implements ({per_engine('levers')}), pure bf16 pairs only with the low-memory "
            f"optimizers its engine steps bf16 weights with ({per_engine('pure_bf16_optimizers')}) and the optimizer "
            "step in "
            "backward needs grad_accum_steps 1, no fp16 and no Adafactor; unpin one of them"
        )
    return out


def _offload_words(c) -> str:
    return f" (optimizer offload: {c.offload_optimizer})" if c.offload_optimizer != "none" else ""


def per_engine(attr: str) -> str:
    """An EngineSpec set by engine, for the message of pins that admit nothing: "levers" (which engine implements
    which lever), "pure_bf16_optimizers" (which low-memory optimizers it pairs with pure bf16)."""
    return "; ".join(f"{name}: {', '.join(sorted(getattr(spec, attr))) or 'none'}" for name, spec in ENGINES.items())


def pinned(p: StrategyConfig) -> list[str]:
    """The strategy fields the job fixed, by name."""
    return [f.name for f in dataclasses.fields(p) if f.name != "safety_margin" and getattr(p, f.name) is not None]
