"""The lever search space (launcher.planner.levers): permissions, pins and engine support decide what is tried."""

import dataclasses

import pytest

from launcher.config.job import StrategyConfig
from launcher.config.jobfile import job_from_data
from launcher.engines import ENGINES
from launcher.errors import ConfigError
from launcher.levers import LEVER_FIELDS, MATH_LEVERS
from launcher.planner.levers import options
from launcher.planner.plan import Plan
from launcher.planner.search import candidates, make_plan

ALL = frozenset(LEVER_FIELDS)


def test_every_lever_is_a_pinnable_strategy_field():
    assert set(LEVER_FIELDS) <= {f.name for f in dataclasses.fields(StrategyConfig)}


def test_math_levers_are_tried_only_when_the_job_allows_them(request_for):
    plain = options(request_for(), ALL, 1)
    assert {o.low_memory_optimizer for o in plain} == {"none"}
    assert not any(o.pure_bf16 or o.qlora for o in plain)
    allowed = options(request_for(allow_levers=("adamw8bit", "pure_bf16")), ALL, 1)
    assert {o.low_memory_optimizer for o in allowed} == {"none", "adamw8bit"}
    assert {o.pure_bf16 for o in allowed} == {False, True}
    # Exact levers need no permission.
    assert {o.loss_chunks for o in plain} == {0, 8} and {o.activation_offload for o in plain} == {False, True}


def test_an_engine_gets_only_the_levers_it_implements(request_for):
    none = options(request_for(allow_levers=tuple(w for ws in MATH_LEVERS.values() for w in ws)), frozenset(), 1)
    assert {(o.checkpoint_every, o.loss_chunks, o.activation_offload, o.optimizer_in_backward,
             o.low_memory_optimizer, o.pure_bf16, o.qlora) for o in none} == {
        (1, 0, False, False, "none", False, False)}
    assert {o.activation_checkpointing for o in none} == {False, True}


def test_optimizer_in_backward_needs_no_accumulation(request_for):
    assert {o.optimizer_in_backward for o in options(request_for(), ALL, 2)} == {False}
    assert {o.optimizer_in_backward for o in options(request_for(), ALL, 1)} == {False, True}
    # Nor fp16 loss scaling; and a pin where it cannot step in backward admits nothing rather than a plan.
    assert {o.optimizer_in_backward for o in options(request_for(precision="fp16"), ALL, 1)} == {False}
    pinned = request_for(pins=StrategyConfig(optimizer_in_backward=True))
    assert options(pinned, ALL, 2) == [] and {o.optimizer_in_backward for o in options(pinned, ALL, 1)} == {True}
    assert options(request_for(precision="fp16", pins=StrategyConfig(optimizer_in_backward=True)), ALL, 1) == []


def test_fsdp2_offers_the_step_in_backward_and_deepspeed_does_not():
    # DeepSpeed's engine owns the step (its ZeRO gradient hooks, its optimizer): it cannot step in a hook of ours.
    assert "optimizer_in_backward" in ENGINES["fsdp"].levers
    assert "optimizer_in_backward" not in ENGINES["deepspeed"].levers


def test_the_accelerate_export_says_the_script_must_step_in_backward(request_for, tmp_path):
    pins = StrategyConfig(engine="fsdp", micro_batch_size=1, optimizer_in_backward=True)
    plan = make_plan(request_for(pins=pins, global_batch_size=8, seq_len=256))
    assert plan.strategy.optimizer_in_backward
    notes = " ".join(ENGINES["fsdp"].accelerate_notes(plan, tmp_path, optimizer="adamw"))
    assert "register_post_accumulate_grad_hook" in notes and "no clip_grad_norm" in notes
    plain = make_plan(request_for(pins=dataclasses.replace(pins, optimizer_in_backward=False), global_batch_size=8,
                                  seq_len=256))
    plain_notes = " ".join(ENGINES["fsdp"].accelerate_notes(plain, tmp_path, optimizer="adamw"))
    assert "register_post_accumulate_grad_hook" not in plain_notes


def test_a_pinned_lever_is_kept_and_admits_nothing_where_no_engine_implements_it(request_for):
    unsupported = [f for f in LEVER_FIELDS if f != "checkpoint_every"
                   and not any(f in s.levers for s in ENGINES.values())]
    for name in unsupported:
        value = {"loss_chunks": 8, "low_memory_optimizer": "adamw8bit"}.get(name, True)
        req = request_for(pins=StrategyConfig(**{name: value}), allow_levers=("adamw8bit", "pure_bf16", "qlora"))
        with pytest.raises(ConfigError, match="only the levers it implements"):
            candidates(req)


def test_a_plan_json_without_lever_fields_reads_back_with_them_off(request_for):
    d = make_plan(request_for()).to_json()
    for name in LEVER_FIELDS:
        assert name in d
        del d[name]
    s = Plan.from_json(d).strategy
    assert (s.checkpoint_every, s.loss_chunks, s.low_memory_optimizer) == (1, 0, "none")


@pytest.mark.parametrize(("strategy", "train", "message"), [
    ({"low_memory_optimizer": "adamw8bit"}, {}, "add adamw8bit to train.allow_levers"),
    ({"pure_bf16": True}, {}, "add pure_bf16 to train.allow_levers"),
    ({"qlora": True}, {"allow_levers": ["qlora"]}, "has no train.lora"),
    ({"release_frozen_weights": True}, {}, "a full fine-tune releases them already"),
    ({"checkpoint_every": 0}, {}, "must be 1 to 4096"),
    ({"loss_chunks": 10**6}, {}, "must be 0 (whole logits) to 4096"),
    ({}, {"allow_levers": ["qlora", "qlora"]}, "names a lever twice"),
    ({}, {"allow_levers": ["fp8"]}, "allow_levers"),
    ({"optimizer_in_backward": True}, {"precision": "fp16"}, "fp16 needs loss scaling"),
    ({"optimizer_in_backward": True, "low_memory_optimizer": "adafactor"}, {"allow_levers": ["adafactor"]},
     "adafactor's sharded step all-reduces"),
    ({"checkpoint_policy": "ops", "activation_checkpointing": False}, {}, "strategy.activation_checkpointing is false"),
    ({"checkpoint_policy": "ops", "activation_offload": True}, {}, "activation offload's hooks never see"),
    ({"checkpoint_policy": "selective"}, {}, "checkpoint_policy"),
])
def test_lever_pins_and_permissions_must_agree(strategy, train, message, tmp_path):
    data = {"name": "x", "model": "gpt2-124m", "task": "causal_lm", "data": {"path": "d.jsonl"},
            "train": {"global_batch_size": 4, **train}, "strategy": strategy}
    with pytest.raises(ConfigError) as e:
        job_from_data(data, tmp_path, for_run=False)
    assert message in str(e.value)


def test_fsdp_and_deepspeed_try_every_kth_checkpointing_and_activation_offload(request_for):
    for name in ("fsdp", "deepspeed"):
        opts = options(request_for(), ENGINES[name].levers, 1)
        assert {o.checkpoint_every for o in opts if o.activation_checkpointing} == {1, 2, 4}
        assert {o.checkpoint_every for o in opts if not o.activation_checkpointing} == {1}
        assert {o.activation_offload for o in opts} == {False, True}


def test_activation_offload_is_not_tried_on_cpu_ranks_where_it_moves_nothing(request_for):
    from launcher.planner.hardware import PROFILES

    cpu = request_for(hardware=PROFILES["cpu"])
    assert {o.activation_offload for o in options(cpu, ALL, 1)} == {False}
    pinned = request_for(hardware=PROFILES["cpu"], pins=StrategyConfig(activation_offload=True))
    assert {o.activation_offload for o in options(pinned, ALL, 1)} == {True}


def test_a_pinned_checkpoint_every_plans_and_labels_the_plan(request_for):
    plan = make_plan(request_for(pins=StrategyConfig(engine="fsdp", activation_checkpointing=True,
                                                     checkpoint_every=2)))
    assert plan.strategy.checkpoint_every == 2 and "AC every 2" in plan.strategy.label()


def test_chunked_loss_is_tried_on_both_engines_unless_the_head_cannot_compute_it(request_for, llama7b):
    assert all("loss_chunks" in spec.levers for spec in ENGINES.values())
    tried = {(s.engine, s.loss_chunks) for s in candidates(request_for())}
    assert tried >= {("deepspeed", 0), ("deepspeed", 8), ("fsdp", 0), ("fsdp", 8)}
    capped = dataclasses.replace(llama7b, chunk_problem="cannot chunk ... (final_logit_softcapping = 30.0)")
    assert {o.loss_chunks for o in options(request_for(model=capped), ALL, 1)} == {0}
    seq_cls = dataclasses.replace(llama7b, task="seq_cls")
    assert {o.loss_chunks for o in options(request_for(model=seq_cls), ALL, 1)} == {0}

def test_a_lever_the_search_would_not_try_is_not_scored_for_the_plan(request_for, llama7b):
    """The lever decisions and the search read one rule (LeverSpec.values): a head that cannot chunk its loss (a
    LoRA-wrapped lm_head) was never offered chunked loss, yet the plan scored it as an alternative that fits, one the
    ranks would refuse (issue 37). Likewise activation offload on CPU ranks (it moves nothing there) and checkpointing
    every k-th block of a model with no more than k blocks: no plan of these jobs could use them."""
    lora_head = dataclasses.replace(llama7b, trainable_params=4_194_304, lora_params=4_194_304,
                                    chunk_problem="needs an nn.Linear lm_head, and this model has a Linear head "
                                                  "(LoRA on lm_head?)")
    req = request_for(model=lora_head)
    assert {o.loss_chunks for o in options(req, ALL, 1)} == {0}
    d = next(d for d in make_plan(req).levers if d.lever == "loss_chunks")
    assert (d.used, d.why, d.other_value) == (False, "not_applicable", None)

    from launcher.planner.hardware import PROFILES

    cpu = request_for(hardware=PROFILES["cpu"], budget_bytes=10**12, host_ram_per_node_bytes=10**13)
    d = next(d for d in make_plan(cpu).levers if d.lever == "activation_offload")
    assert (d.why, d.other_value) == ("not_applicable", None)
    two_blocks = request_for(model=dataclasses.replace(llama7b, num_blocks=2),
                             pins=StrategyConfig(activation_checkpointing=True))
    assert {o.checkpoint_every for o in options(two_blocks, ALL, 1)} == {1}
    d = next(d for d in make_plan(two_blocks).levers if d.lever == "checkpoint_every")
    assert (d.why, d.other_value) == ("not_applicable", None)


def test_every_scored_lever_value_is_one_the_search_tries_for_that_plan(request_for, llama7b):
    """Whatever a plan's lever lines compare it with is a value its search could have tried at the plan's shape."""
    from launcher.levers import LEVERS
    from launcher.planner.lever_choice import shape_of
    from launcher.planner.search import make_plan as plan_for

    for req in (request_for(), request_for(global_batch_size=512), request_for(precision="fp32"),
                request_for(model=dataclasses.replace(llama7b, task="seq_cls")),
                request_for(allow_levers=tuple(w for ws in MATH_LEVERS.values() for w in ws))):
        plan = plan_for(req)
        for d in plan.levers:
            if d.other_value is not None and d.why != "not_allowed":
                assert d.other_value in LEVERS[d.lever].values(req, shape_of(plan.strategy)), d


def test_the_plan_says_for_every_lever_whether_it_was_used_and_why(request_for, monkeypatch):
    from launcher.engines.fsdp.spec import FsdpSpec

    plan = make_plan(request_for())
    assert {d.lever for d in plan.levers} == set(LEVER_FIELDS)
    why = {d.lever: d.why for d in plan.levers}
    assert why["qlora"] == "not_applicable"  # no LoRA
    assert why["pure_bf16"] == "not_allowed"  # bf16 job, not in train.allow_levers
    # An engine that implements a lever gets it scored both ways: the deltas are the models' own.
    monkeypatch.setattr(FsdpSpec, "levers", frozenset({"loss_chunks"}))
    plan = make_plan(request_for(pins=StrategyConfig(engine="fsdp")))
    d = next(d for d in plan.levers if d.lever == "loss_chunks")
    assert d.why in ("needed_to_fit", "faster", "fits_without", "would_not_fit")
    assert d.other_value == (0 if d.used else 8)
    back = Plan.from_json(plan.to_json())
    assert back.levers == plan.levers


def test_a_lever_that_would_not_fit_names_the_limit_it_would_overrun(request_for):
    """Activation offload lowers the device peak and still does not fit where host RAM is short: the decision
    carries the limit (host RAM, not the budget), plan.json keeps it, and the lever line says it."""
    from launcher.cli.render import lever_line

    plan = make_plan(request_for(host_ram_per_node_bytes=100 * 10**9))
    d = next(d for d in plan.levers if d.lever == "activation_offload")
    assert (d.used, d.why, d.other_value) == (False, "would_not_fit", True)
    assert d.peak_delta_bytes < 0  # it would save device memory ...
    assert d.other_problem.resource == "host_ram"  # ... and overrun host RAM
    assert d.other_problem.have_bytes == 100 * 10**9 < d.other_problem.need_bytes
    assert "host RAM: needs" in lever_line(d) and "has 100.00 GB" in lever_line(d)
    back = Plan.from_json(plan.to_json())
    assert back.levers == plan.levers
    # Where it fits, nothing is named.
    roomy = make_plan(request_for())
    assert all(d.other_problem is None for d in roomy.levers if d.why == "fits_without")


def test_a_script_run_is_planned_with_only_the_levers_a_script_receives(request_for):
    """launch --script: the user's script gets the engine's config and whole-model checkpointing, not the recipes'
    loss, checkpoint wrappers, hooks or optimizers; planned with them, its prediction would not hold."""
    from launcher.levers import SCRIPT_LEVERS
    from launcher.planner.levers import reachable

    every = frozenset(LEVER_FIELDS)
    allow = tuple(w for ws in MATH_LEVERS.values() for w in ws)
    script = request_for(script=True, allow_levers=allow)
    assert reachable(script, every) == SCRIPT_LEVERS == {"release_frozen_weights"}
    assert reachable(request_for(allow_levers=allow), every) == every
    tried = candidates(script)  # the search applies it to every engine's levers
    assert {(o.checkpoint_every, o.checkpoint_policy, o.loss_chunks, o.activation_offload, o.optimizer_in_backward,
             o.low_memory_optimizer, o.pure_bf16) for o in tried} == {(1, "full", 0, False, False, "none", False)}
    assert {o.activation_checkpointing for o in tried} == {False, True}  # whole-model AC reaches it (its env)
    # A pin says the script applies it: kept.
    pinned = request_for(script=True, pins=StrategyConfig(loss_chunks=8))
    assert reachable(pinned, every) == SCRIPT_LEVERS | {"loss_chunks"}
    plan = make_plan(pinned)
    assert plan.strategy.loss_chunks == 8
    why = {d.lever: d.why for d in plan.levers}
    assert why["loss_chunks"] == "pinned" and why["activation_offload"] == "script_lacks"
    # The same job for the launcher's recipe is free to use them.
    assert "script_lacks" not in {d.why for d in make_plan(request_for()).levers}


def test_a_script_plan_under_lora_at_zero3_still_chooses_the_linear(request_for, llama7b):
    # release_frozen_weights reaches a script: ds_config.json's memory_efficient_linear, which DeepSpeed applies.
    from tests.planner.test_release_frozen_weights import measured

    lora = dataclasses.replace(llama7b, trainable_params=4_194_304, lora_params=4_194_304)
    req = request_for(model=lora, activations=measured(lora), script=True,
                      pins=StrategyConfig(engine="deepspeed", zero_stage=3))
    assert {c.release_frozen_weights for c in candidates(req)} == {False, True}


def test_a_lever_the_plans_shape_excludes_is_told_apart_from_one_the_job_excludes(request_for):
    """Checkpointing's refinements with checkpointing off and the step in backward under accumulation: another plan
    of the same job could use them (plan_lacks); fp16's loss scaling excludes the step in backward for every plan."""
    from launcher.cli.render import lever_line

    shape = StrategyConfig(engine="fsdp", micro_batch_size=1, activation_checkpointing=False)
    plan = make_plan(request_for(pins=shape))
    assert plan.strategy.grad_accum_steps == 8
    by = {d.lever: d for d in plan.levers}
    assert {k: by[k].why for k in ("checkpoint_every", "optimizer_in_backward")} == {
        "checkpoint_every": "plan_lacks", "optimizer_in_backward": "plan_lacks"}
    assert "the plan accumulates micro-batches" in lever_line(by["optimizer_in_backward"])
    assert "which the plan leaves off" in lever_line(by["checkpoint_every"])
    fp16 = {d.lever: d.why for d in make_plan(request_for(pins=shape, precision="fp16")).levers}
    assert fp16["optimizer_in_backward"] == "not_applicable"
    ds = {d.lever: d.why for d in make_plan(request_for(pins=dataclasses.replace(shape, engine="deepspeed"))).levers}
    assert ds["optimizer_in_backward"] == "engine_lacks"  # DeepSpeed steps in its engine, not in a hook
