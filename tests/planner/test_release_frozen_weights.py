"""ZeRO-3 under LoRA, the frozen weights released after forward (Strategy.release_frozen_weights): DeepSpeed's
memory_efficient_linear saves each frozen linear's input where torch's linear pins its gathered weight. The planner
counts one or the other and chooses (launcher.planner.memory.strategy_activations, engines.deepspeed
.pinned_linear_elems)."""

import dataclasses

import pytest

from launcher.config.job import StrategyConfig
from launcher.engines import ENGINES
from launcher.engines.deepspeed import memory as deepspeed_engine
from launcher.engines.deepspeed.memory import pinned_linear_elems, refetched_params, released_gathered_elems
from launcher.engines.deepspeed.spec import RELEASE_REFUSED
from launcher.errors import ConfigError
from launcher.levers import LEVER_FIELDS
from launcher.planner.buckets import size_buckets
from launcher.planner.levers import options
from launcher.planner.memory import analytic_constants, strategy_activations
from launcher.planner.scoring import score
from launcher.planner.search import candidates, make_plan
from tests.planner.conftest import llama_stats

ALL = frozenset(LEVER_FIELDS)
H, INTER = 4096, 11008
SHAPES = [[H, H]] * 4 + [[INTER, H], [INTER, H], [H, INTER]]
FROZEN_BLOCK = 2 * (H + INTER)  # bf16 bytes per token: gate/up's shared input and down's (o's is a view sdpa saves)
FROZEN_HEAD = 2 * H


def lora7b():
    return dataclasses.replace(llama_stats(trainable=4_194_304), block_linear_shapes=SHAPES)


def measured(m, **kw):
    c = analytic_constants(m, "bf16")
    # sac_bytes_per_token: the op policy measured (a block's input and its saved matmul outputs, bf16).
    return dataclasses.replace(c, sac_bytes_per_token=2 * 4 * H, frozen_input_bytes_per_token=FROZEN_BLOCK,
                               frozen_head_input_bytes_per_token=FROZEN_HEAD, frozen_inputs_measured=True, **kw)


@pytest.fixture
def lora_request(request_for):
    m = lora7b()

    def make(**kw):
        return request_for(**{"model": m, "activations": measured(m), **kw})

    return make


def test_offered_under_lora_where_the_probe_measured_the_frozen_inputs(request_for, lora_request):
    assert {o.release_frozen_weights for o in options(lora_request(), ALL, 1)} == {False, True}
    # A full fine-tune releases them already (the emitter's DeepSpeed linear): nothing to choose.
    assert {o.release_frozen_weights for o in options(request_for(), ALL, 1)} == {False}
    # Constants that do not say (the paper's, a cache from before the probe measured them): not offered.
    unmeasured = lora_request(activations=analytic_constants(lora7b(), "bf16"))
    assert {o.release_frozen_weights for o in options(unmeasured, ALL, 1)} == {False}


def test_only_zero3_offers_it(lora_request):
    ds = ENGINES["deepspeed"]
    assert "release_frozen_weights" in ds.levers and "release_frozen_weights" not in ENGINES["fsdp"].levers
    tried = {(s.layout.zero_stage, s.release_frozen_weights) for s in ds_candidates(lora_request())}
    assert (3, True) in tried and (3, False) in tried
    assert not any(stage != 3 and rel for stage, rel in tried)
    z2 = next(s for s in ds_candidates(lora_request()) if s.layout.zero_stage == 2)
    assert ds.lever_values(z2.layout)["release_frozen_weights"] == ((False,), RELEASE_REFUSED)


def test_zero3_under_lora_offers_op_level_checkpointing(request_for, lora_request):
    # The ranks hide ZeRO-3's parameter fetch and release from the op policy's replay
    # (launcher.worker.engines.deepspeed.hide_zero3_fetches), with either linear: offered as for a full fine-tune.
    tried = {(s.layout.zero_stage, s.checkpoint_policy, s.release_frozen_weights)
             for s in ds_candidates(lora_request())}
    assert {(3, "ops", False), (3, "ops", True), (3, "full", False), (2, "ops", False)} <= tried
    full = request_for(activations=measured(llama_stats()))
    assert (3, "ops") in {(s.layout.zero_stage, s.checkpoint_policy) for s in ds_candidates(full)}  # a full fine-tune
    for release in (False, True):
        pinned = lora_request(pins=StrategyConfig(engine="deepspeed", zero_stage=3, activation_checkpointing=True,
                                                  checkpoint_policy="ops", release_frozen_weights=release))
        s = make_plan(pinned).strategy
        assert (s.layout.zero_stage, s.checkpoint_policy, s.release_frozen_weights) == (3, "ops", release)


def ds_candidates(req):
    return [s for s in candidates(req) if s.engine == "deepspeed"]


def zero3(**kw):
    return StrategyConfig(engine="deepspeed", zero_stage=3, offload_optimizer="none", offload_params="none",
                          micro_batch_size=1, activation_checkpointing=False, loss_chunks=0, **kw)


def test_released_weights_pin_nothing_and_their_inputs_are_activations(lora_request):
    req = lora_request(pins=zero3())
    torch_linear = make_plan(lora_request(pins=zero3(release_frozen_weights=False))).strategy
    released = dataclasses.replace(torch_linear, release_frozen_weights=True)
    assert pinned_linear_elems(req.model, torch_linear) > 0 and pinned_linear_elems(req.model, released) == 0
    c = req.activations
    r = strategy_activations(c, released)
    assert r.block_bytes_per_token == c.block_bytes_per_token + FROZEN_BLOCK
    assert (r.head_bytes_per_token, r.head_ckpt_bytes_per_token) == (c.head_bytes_per_token + FROZEN_HEAD,
                                                                     c.head_ckpt_bytes_per_token + FROZEN_HEAD)
    assert r.ckpt_bytes_per_token == c.ckpt_bytes_per_token  # a checkpointed block keeps its input either way
    assert strategy_activations(c, torch_linear) is c
    # Chunked cross-entropy runs the head in its own checkpoint, which keeps the head's input anyway.
    chunked = strategy_activations(c, dataclasses.replace(released, loss_chunks=8))
    assert chunked.head_bytes_per_token == c.head_bytes_per_token
    # The backward moment: the pinned weights (bf16, the whole frozen model without checkpointing) against the
    # frozen inputs of 2048 tokens in 32 blocks and the head.
    a, b = score(req, torch_linear).estimate, score(req, released).estimate
    pinned = 2 * pinned_linear_elems(req.model, torch_linear)
    inputs = 2048 * (32 * FROZEN_BLOCK + FROZEN_HEAD)
    assert pinned > 10 * 10**9 and inputs < 3 * 10**9
    grown = sum(b.breakdown[k] - a.breakdown[k] for k in ("activations", "logits"))  # the head's is under logits
    assert grown == pytest.approx(inputs, rel=1e-6)
    assert a.peak_bytes - b.peak_bytes > 0.5 * (pinned - inputs)


def test_the_planner_releases_them_where_the_pins_do_not_fit(lora_request):
    torch_linear = score(lora_request(), make_plan(lora_request(pins=zero3(release_frozen_weights=False))).strategy)
    released = score(lora_request(), dataclasses.replace(torch_linear.strategy, release_frozen_weights=True))
    between = int((torch_linear.estimate.peak_bytes + released.estimate.peak_bytes) / 2)
    plan = make_plan(lora_request(pins=zero3(), budget_bytes=between))
    assert plan.strategy.release_frozen_weights and "frozen weights released" in plan.strategy.label()
    assert next(d for d in plan.levers if d.lever == "release_frozen_weights").why == "needed_to_fit"
    # Both fit: as fast either way (the same matmuls), so the lower peak decides, and the plan says so.
    roomy = make_plan(lora_request(pins=zero3()))
    assert roomy.strategy.release_frozen_weights
    assert next(d for d in roomy.levers if d.lever == "release_frozen_weights").why == "lower_peak"


def test_a_pin_without_the_probes_measure_is_refused_not_planned_without_its_term(lora_request):
    # Constants that do not say what the inputs weigh (the paper's, calibrated ones) would predict the released
    # plan without them: the pin is refused with the way out.
    unmeasured = lora_request(activations=analytic_constants(lora7b(), "bf16"), pins=zero3(release_frozen_weights=True))
    with pytest.raises(ConfigError, match="strategy.release_frozen_weights: true saves every frozen linear's input"):
        make_plan(unmeasured)


def tiny_llama(vocab=1024):
    # tests/cli/test_run_cli.py's Llama: h 64, 2 blocks of 36,864 linear weights, an untied head.
    blocks = 2 * (64 * 64 * 2 + 64 * 32 * 2 + 3 * 64 * 128 + 2 * 64)
    n = blocks + 2 * vocab * 64 + 64 + 2 * (4 * (64 + 64) + 4 * (64 + 32))
    m = llama_stats(num_params=n, blocks=2, h=64, inter=128, vocab=vocab, trainable=1536)
    return dataclasses.replace(m, block_linear_shapes=[[64, 64], [32, 64], [32, 64], [64, 64], [128, 64], [128, 64],
                                                       [64, 128]])


def test_what_zero3_keeps_gathered_from_the_forward_with_the_weights_released(request_for, monkeypatch):
    # The coordinator keeps the parameters the trace uses again within the live cap: all but the input tables the
    # frozen embeddings read (no backward fetches them), a tied causal head's table used again by the head.
    m = tiny_llama()
    assert refetched_params(m) == m.num_params - 1024 * 64
    tied = dataclasses.replace(m, tied_embeddings=True, num_params=m.num_params - 1024 * 64)
    assert refetched_params(tied) == tied.num_params
    cls = dataclasses.replace(m, task="seq_cls", is_causal=False, max_positions=512,
                              non_block_params=m.non_block_params + 512 * 64, num_params=m.num_params + 512 * 64)
    assert refetched_params(cls) == cls.num_params - 1024 * 64 - 512 * 64  # the token and the position tables
    pins = dataclasses.replace(zero3(release_frozen_weights=True), micro_batch_size=4)
    req = request_for(model=m, activations=measured(m), pins=pins, gpus_per_node=2, seq_len=64,
                      global_batch_size=8, precision="fp32")
    torch_linear = dataclasses.replace(make_plan(req).strategy, release_frozen_weights=False)
    released = dataclasses.replace(torch_linear, release_frozen_weights=True)
    cap = size_buckets(req).stage3_max_live_parameters
    assert cap > m.num_params  # the cap holds the model: everything used again stays gathered
    kept = score(req, released).estimate
    # The whole model counted (the count before the coordinator's trace was read) is the input table's 4 bytes
    # (fp32) an element more (the peak more again: the allocator's share of it).
    monkeypatch.setattr(deepspeed_engine, "refetched_params", lambda model: model.num_params)
    whole = score(req, released).estimate
    assert whole.breakdown["params"] - kept.breakdown["params"] == 4 * 1024 * 64
    assert whole.peak_bytes > kept.peak_bytes


def test_a_model_over_the_live_cap_keeps_the_caps_worth(lora_request):
    # Llama-7B: the cap is its largest layer, the untied head, which its backward uses first: the head's worth.
    req = lora_request(pins=zero3(release_frozen_weights=True))
    cap = size_buckets(req).stage3_max_live_parameters
    assert cap == 32000 * 4096 < refetched_params(req.model)
    assert released_gathered_elems(req.model, size_buckets(req)) == cap
