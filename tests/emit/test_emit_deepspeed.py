import copy
import dataclasses
import importlib
import itertools
import math

import pytest
import torch
from emit_helpers import BUCKETS, LARGEST_LAYER_PARAMS, check_golden, json_text, make_job, make_plan, run_ds_check
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.engines import engine_spec
from launcher.engines.deepspeed.emit import ds_config, template_name, templates
from launcher.engines.deepspeed.memory import deepspeed_states
from launcher.errors import ConfigError
from launcher.planner.hardware import PROFILES
from launcher.planner.memory import NVME_PARAM_BUFFER_COUNT, MemoryInputs, analytic_constants
from tests.planner.conftest import llama_stats

# The golden cases: strategy overrides on make_plan's ZeRO-2 / world 8 / mb 2x4 default.
GOLDEN = {
    "zero1": dict(zero_stage=1),
    "zero2": dict(zero_stage=2),
    "zero2_offload_cpu": dict(zero_stage=2, offload_optimizer="cpu"),
    "zero3": dict(zero_stage=3),
    "zero3_offload_opt_cpu": dict(zero_stage=3, offload_optimizer="cpu"),
    "zero3_offload_nvme": dict(zero_stage=3, offload_optimizer="nvme", offload_params="nvme"),
    "zero3_pure_bf16": dict(zero_stage=3, pure_bf16=True),
}


def emit(plan_kw: dict | None = None, job_kw: dict | None = None, **strategy) -> dict:
    plan = make_plan(**(plan_kw or {}), **strategy)
    return ds_config(plan, make_job(**(job_kw or {})), largest_layer_params=LARGEST_LAYER_PARAMS)


# Every supported strategy shape, plus precision / optimizer / scheduler / world-size variants: what
# DeepSpeed's own parser must accept. name -> (plan kwargs, job overrides, strategy overrides).
VARIANTS: dict[str, tuple[dict, dict, dict]] = {name: ({}, {}, s) for name, s in GOLDEN.items()}
VARIANTS |= {
    "zero0": ({}, {}, dict(zero_stage=0)),
    "zero3_offload_cpu_both": ({}, {}, dict(zero_stage=3, offload_optimizer="cpu", offload_params="cpu")),
    "zero3_params_cpu_only": ({}, {}, dict(zero_stage=3, offload_params="cpu")),
    "zero3_opt_nvme_params_cpu": ({}, {}, dict(zero_stage=3, offload_optimizer="nvme", offload_params="cpu")),
    "zero3_opt_nvme_only": ({}, {}, dict(zero_stage=3, offload_optimizer="nvme")),
    "zero2_fp16": (dict(precision="fp16"), {}, dict(zero_stage=2)),
    "zero3_fp32": (dict(precision="fp32"), {}, dict(zero_stage=3)),
    "zero2_sgd_offload": ({}, {"train.optimizer": "sgd"}, dict(zero_stage=2, offload_optimizer="cpu")),
    "zero0_sgd": ({}, {"train.optimizer": "sgd"}, dict(zero_stage=0)),
    "zero3_adam_no_warmup": ({}, {"train.optimizer": "adam", "train.warmup_steps": 0}, dict(zero_stage=3)),
    "zero1_world1": (dict(world_size=1), {}, dict(zero_stage=1, micro_batch_size=4, grad_accum_steps=16)),
    "zero3_two_nodes": (dict(world_size=16, nodes=2), {}, dict(zero_stage=3, micro_batch_size=1, grad_accum_steps=3)),
    "zero1_pure_bf16": ({}, {}, dict(zero_stage=1, pure_bf16=True)),
    "zero2_pure_bf16_sgd": ({}, {"train.optimizer": "sgd"}, dict(zero_stage=2, pure_bf16=True)),
}


def variant_config(name: str) -> tuple[dict, int]:
    plan_kw, job_kw, strategy = VARIANTS[name]
    return emit(plan_kw, job_kw, **strategy), plan_kw.get("world_size", 8)


@pytest.fixture(scope="module")
def parsed() -> dict:
    """Every variant through DeepSpeedConfig, one fresh process per world size."""
    by_world: dict[int, dict] = {}
    for name in VARIANTS:
        cfg, world = variant_config(name)
        by_world.setdefault(world, {})[name] = cfg
    # Two deliberately broken configs prove the check is not vacuous.
    good, _ = variant_config("zero3")
    bad_batch = copy.deepcopy(good)
    bad_batch["gradient_accumulation_steps"] += 1
    bad_key = copy.deepcopy(good)
    bad_key["zero_optimization"]["stage3_prefetch_bucket"] = 1
    by_world[8] |= {"BAD_batch": bad_batch, "BAD_key": bad_key}
    out = {}
    for world, configs in by_world.items():
        out |= run_ds_check("parse", configs, world_size=world)
    return out


@pytest.mark.parametrize("name", GOLDEN)
def test_golden(name):
    check_golden(f"ds_{name}.json", json_text(emit(**GOLDEN[name])))


@pytest.mark.parametrize("name", VARIANTS)
def test_deepspeed_parser_accepts(parsed, name):
    cfg, world = variant_config(name)
    r = parsed[name]
    assert r["ok"], r["error"]
    # DeepSpeed read the world size from the (fake) process group and checked the batch against it.
    assert r["world_size"] == world
    assert r["train_batch_size"] == cfg["train_batch_size"]
    s = make_plan(**VARIANTS[name][0], **VARIANTS[name][2]).strategy
    assert r["zero_stage"] == s.layout.zero_stage
    assert (r["offload_optimizer"], r["offload_param"]) == (s.layout.offload_optimizer, s.layout.offload_params)


def test_deepspeed_parser_rejects_broken(parsed):
    assert not parsed["BAD_batch"]["ok"] and "train_batch_size is not equal" in parsed["BAD_batch"]["error"]
    assert not parsed["BAD_key"]["ok"] and "stage3_prefetch_bucket" in parsed["BAD_key"]["error"]


def test_parsed_buckets_are_the_plans(parsed):
    z2, z3 = parsed["zero2"], parsed["zero3"]
    assert z2["reduce_bucket_size"] == BUCKETS["reduce_bucket_size"]
    assert z2["allgather_bucket_size"] == BUCKETS["allgather_bucket_size"]
    assert z3["reduce_bucket_size"] == BUCKETS["reduce_bucket_size"]
    assert z3["prefetch_bucket_size"] == BUCKETS["stage3_prefetch_bucket_size"]
    assert z3["max_live_parameters"] == BUCKETS["stage3_max_live_parameters"]
    assert z3["param_persistence_threshold"] == BUCKETS["stage3_param_persistence_threshold"]
    assert z3["sub_group_size"] == BUCKETS["sub_group_size"]
    assert "sub_group_size" not in emit(zero_stage=2)["zero_optimization"]  # ZeRO-1/2 step one flat partition


def test_zero3_uses_deepspeeds_linear_for_a_full_fine_tune_and_torchs_under_lora(parsed):
    # torch's linear saves weight.t(), which pins ZeRO-3's gathered weight until the layer's backward; DeepSpeed's
    # LinearFunctionForZeroStage3 saves the Parameter (freed by free_param) but every input too. A full fine-tune
    # saves the inputs anyway: DeepSpeed's. Under LoRA torch's, whose pins the planner counts
    # (engines.deepspeed.pinned_linear_elems). DeepSpeed's parser must read the value we mean.
    assert parsed["zero3"]["memory_efficient_linear"] is True
    assert parsed["zero2"]["memory_efficient_linear"] is True  # only ZeRO-3's zero.Init reads it
    lora = emit(job_kw={"train.lora": {"r": 8, "target_modules": ["c_attn"]}}, zero_stage=3)
    assert lora["zero_optimization"]["memory_efficient_linear"] is False
    # Unless the planner released the frozen weights, counting their inputs instead.
    released = emit(job_kw={"train.lora": {"r": 8, "target_modules": ["c_attn"]}}, zero_stage=3,
                    release_frozen_weights=True)
    assert released["zero_optimization"]["memory_efficient_linear"] is True
    assert emit(zero_stage=3)["zero_optimization"]["memory_efficient_linear"] is True


@settings(max_examples=60, deadline=None)
@given(micro=st.integers(1, 64), accum=st.integers(1, 64), gpus=st.sampled_from([1, 2, 4, 8]),
       nodes=st.integers(1, 64), stage=st.sampled_from([0, 1, 2, 3]))
def test_batch_arithmetic(micro, accum, gpus, nodes, stage):
    world = gpus * nodes
    cfg = emit(dict(world_size=world, nodes=nodes), zero_stage=stage, micro_batch_size=micro, grad_accum_steps=accum)
    assert cfg["train_micro_batch_size_per_gpu"] == micro
    assert cfg["gradient_accumulation_steps"] == accum
    assert cfg["train_batch_size"] == micro * accum * world


def test_inconsistent_batch_is_rejected_with_the_numbers():
    plan = make_plan(global_batch_size=100)  # 2 * 4 * 8 = 64
    with pytest.raises(ConfigError, match=r"100 != micro_batch_size 2 \* grad_accum_steps 4 \* world_size 8 = 64"):
        ds_config(plan, make_job())


def test_buckets_reach_only_their_stage():
    z1 = emit(zero_stage=1)["zero_optimization"]
    z3 = emit(zero_stage=3)["zero_optimization"]
    for z in (z1, emit(zero_stage=2)["zero_optimization"]):
        assert z["reduce_bucket_size"] == BUCKETS["reduce_bucket_size"]
        assert z["allgather_bucket_size"] == BUCKETS["allgather_bucket_size"]
        assert not any(k.startswith("stage3_") for k in z)
        assert z["overlap_comm"] is False  # it would double the reduce bucket the planner counted once
    assert z3["reduce_bucket_size"] == BUCKETS["reduce_bucket_size"]
    for key in ("stage3_prefetch_bucket_size", "stage3_max_live_parameters", "stage3_param_persistence_threshold"):
        assert z3[key] == BUCKETS[key]
    assert z3["stage3_max_reuse_distance"] == BUCKETS["stage3_max_live_parameters"]
    assert "allgather_bucket_size" not in z3
    assert emit(zero_stage=0)["zero_optimization"] == {"stage": 0}


def test_other_bucket_values_follow_the_plan():
    other = {k: v + 7 for k, v in BUCKETS.items()}
    z3 = emit(dict(buckets=other), zero_stage=3)["zero_optimization"]
    assert z3["stage3_prefetch_bucket_size"] == other["stage3_prefetch_bucket_size"]
    assert z3["reduce_bucket_size"] == other["reduce_bucket_size"]


def test_nvme_path_reaches_offload_blocks():
    cfg = emit(job_kw={"cluster.nvme_path": "/scratch/nvme0"}, zero_stage=3, offload_optimizer="nvme",
               offload_params="nvme")
    z = cfg["zero_optimization"]
    assert z["offload_optimizer"]["device"] == z["offload_param"]["device"] == "nvme"
    assert z["offload_optimizer"]["nvme_path"] == z["offload_param"]["nvme_path"] == "/scratch/nvme0"
    assert set(cfg["aio"]) == {"block_size", "queue_depth", "intra_op_parallelism", "single_submit",
                               "overlap_events", "use_gds"}


def test_nvme_swap_buffers_are_sized_as_planned():
    world = 8
    big = 10 * BUCKETS["stage3_prefetch_bucket_size"] * world  # a layer whose shard outgrows the prefetch bucket
    plan = make_plan(zero_stage=3, offload_optimizer="nvme", offload_params="nvme")
    z = ds_config(plan, make_job(), largest_layer_params=big)["zero_optimization"]
    assert z["offload_param"]["buffer_size"] == math.ceil(big / world)
    z = ds_config(plan, make_job(), largest_layer_params=1)["zero_optimization"]
    assert z["offload_param"]["buffer_size"] == BUCKETS["stage3_prefetch_bucket_size"]
    assert z["offload_param"]["buffer_count"] == NVME_PARAM_BUFFER_COUNT
    # Pinned optimizer swap buffers are buffer_count x the largest sub-group, fp32: the plan's sub-group size.
    assert z["sub_group_size"] == BUCKETS["sub_group_size"]
    with pytest.raises(ValueError, match="largest_layer_params"):
        ds_config(plan, make_job())


# Expected buffer_size worked by hand from DeepSpeed's rule (a buffer holds the largest shard, ceil(L / N), and the
# plan makes it at least the 3_686-element prefetch bucket): max(3686, 1); 294_880 / 8 = 36_860; 65_536 / 1;
# 1e9 / 64 = 15_625_000. Host bytes = DeepSpeed's default buffer_count 5 x that x 2 bytes (bf16).
@pytest.mark.parametrize("largest_layer_params,world,buffer_size", [
    (1, 8, 3_686), (10 * 3_686 * 8, 8, 36_860), (65_536, 1, 65_536), (10**9, 64, 15_625_000)])
def test_nvme_param_buffers_are_what_the_memory_model_counts(largest_layer_params, world, buffer_size):
    """The host RAM the planner counts for parameter swap buffers is exactly what the emitted config pins."""
    from deepspeed.runtime.zero.offload_config import DeepSpeedZeroOffloadParamConfig

    m = llama_stats(num_params=200_000_000, blocks=2, h=64, vocab=1024)
    m = dataclasses.replace(m, largest_layer_params=largest_layer_params)
    inp = MemoryInputs(model=m, world_size=world, gpus_per_node=world, nodes=1, seq_len=128, precision="bf16",
                       optimizer="adamw", hardware=PROFILES["a100-80gb"], activations=analytic_constants(m, "bf16"))
    plan = make_plan(world_size=world, zero_stage=3, offload_params="nvme")
    host = deepspeed_states(inp, plan.strategy, plan.buckets).host  # the optimizer stays on the device
    z = ds_config(plan, make_job(), largest_layer_params=largest_layer_params)["zero_optimization"]["offload_param"]
    # Both sides call the same sizing helper, so agreement alone proves little: pin each to the hand-worked value.
    assert (z["buffer_count"], z["buffer_size"]) == (5, buffer_size)
    assert z["buffer_count"] == DeepSpeedZeroOffloadParamConfig.model_fields["buffer_count"].default
    assert host == 5 * buffer_size * 2  # bf16 buffers


def test_mixed_offload_tiers_keep_only_what_each_device_uses():
    cfg = emit(zero_stage=3, offload_optimizer="nvme", offload_params="cpu")
    z = cfg["zero_optimization"]
    assert z["offload_param"] == {"device": "cpu", "pin_memory": True}
    assert z["offload_optimizer"]["nvme_path"] == "/local_nvme/ds"
    cpu = emit(zero_stage=3, offload_optimizer="cpu")
    assert "offload_param" not in cpu["zero_optimization"] and "aio" not in cpu
    assert cpu["zero_optimization"]["offload_optimizer"] == {"device": "cpu", "pin_memory": True}


def test_nvme_without_path_names_the_key():
    plan = make_plan(zero_stage=3, offload_optimizer="nvme")
    with pytest.raises(ConfigError, match="cluster.nvme_path: None must name a local NVMe directory"):
        ds_config(plan, make_job(**{"cluster.nvme_path": None}))


def test_unsupported_strategies_list_every_problem():
    with pytest.raises(ConfigError) as e:
        ds_config(make_plan(zero_stage=1, offload_optimizer="nvme", offload_params="cpu"), make_job())
    assert len(e.value.problems) == 2
    assert "offload_params" in e.value.problems[0] and "offload_optimizer" in e.value.problems[1]
    with pytest.raises(ConfigError, match="set zero_stage: 2"):
        ds_config(make_plan(zero_stage=1, offload_optimizer="cpu"), make_job())
    with pytest.raises(ConfigError, match="fsdp_config"):
        ds_config(make_plan(engine="fsdp"), make_job())


@pytest.mark.parametrize("precision, bf16, fp16",
                         [("bf16", True, False), ("fp16", False, True), ("fp32", False, False)])
def test_precision_blocks(precision, bf16, fp16):
    cfg = emit(dict(precision=precision))
    assert (cfg["bf16"]["enabled"], cfg["fp16"]["enabled"]) == (bf16, fp16)


def test_optimizer_blocks():
    opt = emit()["optimizer"]
    assert opt == {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01,
                                                "torch_adam": True}}
    # With offload DeepSpeed must build DeepSpeedCPUAdam, so no torch_adam.
    assert "torch_adam" not in emit(zero_stage=2, offload_optimizer="cpu")["optimizer"]["params"]
    adam = emit(job_kw={"train.optimizer": "adam"})
    assert adam["optimizer"]["type"] == "Adam" and adam["optimizer"]["params"]["adam_w_mode"] is False
    sgd = emit(job_kw={"train.optimizer": "sgd"}, zero_stage=3)
    assert sgd["optimizer"] == {"type": "SGD", "params": {"lr": 3e-4, "momentum": 0.0, "weight_decay": 0.01}}
    assert sgd["zero_allow_untested_optimizer"] is True
    assert "zero_allow_untested_optimizer" not in emit(job_kw={"train.optimizer": "sgd"}, zero_stage=0)


def test_a_low_memory_optimizer_is_the_ranks_client_optimizer_not_a_config_block():
    # The rank side passes it to deepspeed.initialize; a config "optimizer" block would claim AdamW to HF Trainer
    # and accelerate. ZeRO wraps an untested client optimizer only when allowed.
    for stage in (1, 2):
        cfg = emit(zero_stage=stage, low_memory_optimizer="adamw8bit")
        assert "optimizer" not in cfg and cfg["zero_allow_untested_optimizer"] is True
    z0 = emit(zero_stage=0, low_memory_optimizer="adafactor")
    assert "optimizer" not in z0 and "zero_allow_untested_optimizer" not in z0
    assert "optimizer" in emit(zero_stage=2)


def test_pure_bf16_keeps_bf16_masters_and_states_and_a_rounding_client_optimizer():
    # bf16_master_weights_and_grads + bf16_optimizer_states (runtime/precision_config.py); Adam/AdamW is the rank's
    # stochastically rounding client optimizer (no "optimizer" block), SGD DeepSpeed's own (torch's, to nearest).
    for stage in (1, 2, 3):
        cfg = emit(zero_stage=stage, pure_bf16=True)
        assert cfg["bf16"] == {"enabled": True, "bf16_master_weights_and_grads": True, "bf16_optimizer_states": True}
        assert "optimizer" not in cfg and cfg["zero_allow_untested_optimizer"] is True
    sgd = emit(job_kw={"train.optimizer": "sgd"}, zero_stage=2, pure_bf16=True)
    assert sgd["optimizer"]["type"] == "SGD" and sgd["bf16"]["bf16_optimizer_states"] is True
    assert set(emit(zero_stage=2)["bf16"]) == {"enabled"}
    # DeepSpeed refuses bf16 masters at ZeRO-0 and needs its CPU Adam with offload: the emitter names both.
    for bad in (dict(zero_stage=0), dict(zero_stage=2, offload_optimizer="cpu")):
        with pytest.raises(ConfigError, match="strategy.pure_bf16: true is emitted for ZeRO-1/2/3 without optimizer "
                                              "offload"):
            emit(pure_bf16=True, **bad)


def test_scheduler_block():
    assert emit()["scheduler"] == {"type": "WarmupLR", "params": {
        "warmup_min_lr": 3e-4 / 11, "warmup_max_lr": 3e-4, "warmup_num_steps": 10, "warmup_type": "linear"}}
    assert "scheduler" not in emit(job_kw={"train.warmup_steps": 0})


@pytest.mark.parametrize("warmup", [2, 10, 37])
def test_warmup_matches_the_workers_schedule(warmup):
    """DeepSpeed's WarmupLR, built from our block, gives the worker's lr at every scheduler iteration."""
    from deepspeed.runtime.lr_schedules import WarmupLR

    from launcher.worker.engines.base import lr_lambda

    params = emit(job_kw={"train.warmup_steps": warmup})["scheduler"]["params"]
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=3e-4)
    sched = WarmupLR(opt, **params)
    factor = lr_lambda(warmup)
    for i in range(warmup + 5):
        sched.step(i)
        assert opt.param_groups[0]["lr"] == pytest.approx(3e-4 * factor(i), rel=1e-12)


ALL_SHAPES = [
    (stage, opt, par)
    for stage, opt, par in itertools.product([0, 1, 2, 3], ["none", "cpu", "nvme"], ["none", "cpu", "nvme"])
    if not (stage < 3 and (par != "none" or opt == "nvme")) and not (stage < 2 and opt != "none")
]


@pytest.mark.parametrize("stage, opt, par", ALL_SHAPES)
@pytest.mark.parametrize("optimizer", ["adamw", "adam", "sgd"])
def test_every_shape_is_concrete(stage, opt, par, optimizer):
    cfg = emit(job_kw={"train.optimizer": optimizer}, zero_stage=stage, offload_optimizer=opt, offload_params=par)
    assert '"auto"' not in json_text(cfg)
    assert template_name(make_plan(zero_stage=stage, offload_optimizer=opt, offload_params=par)) in templates()


def test_emitter_is_pure():
    before = copy.deepcopy(templates())
    a = emit(zero_stage=3, offload_optimizer="nvme", offload_params="nvme")
    a["zero_optimization"]["offload_param"]["device"] = "mutated"
    assert emit(zero_stage=3, offload_optimizer="nvme", offload_params="nvme") != a
    assert templates() == before


def _deepspeed_key_names() -> set[str]:
    """Every string constant in the modules where DeepSpeed names its config keys."""
    names: set[str] = set()
    for mod in ("deepspeed.runtime.constants", "deepspeed.runtime.zero.config", "deepspeed.runtime.precision_config",
                "deepspeed.runtime.swap_tensor.constants"):
        m = importlib.import_module(mod)
        names |= {v for v in vars(m).values() if isinstance(v, str)}
    return names


def test_top_level_keys_are_deepspeed_keys():
    # DeepSpeedConfig reads top-level keys one by one and ignores the rest, so a typo there would pass the
    # parser; check each name against DeepSpeed's own constants instead.
    known = _deepspeed_key_names()
    for name in VARIANTS:
        cfg, _ = variant_config(name)
        assert set(cfg) <= known, f"{name}: {sorted(set(cfg) - known)} not DeepSpeed config keys"
        if "aio" in cfg:
            assert set(cfg["aio"]) <= known


# The real engine, world size 1 on gloo: DeepSpeed builds the optimizer and scheduler from our blocks,
# which its config parser never checks. NVMe needs libaio (async_io), so it stays at the parser check.
ENGINE_CASES = {
    "zero0": ({}, dict(zero_stage=0), "AdamW"),
    "zero1": ({}, dict(zero_stage=1), "AdamW"),
    "zero2": ({}, dict(zero_stage=2), "AdamW"),
    "zero3": ({}, dict(zero_stage=3), "AdamW"),
    "zero2_offload_cpu": ({}, dict(zero_stage=2, offload_optimizer="cpu"), "DeepSpeedCPUAdam"),
    "zero3_offload_cpu_both": ({}, dict(zero_stage=3, offload_optimizer="cpu", offload_params="cpu"),
                               "DeepSpeedCPUAdam"),
    "zero2_sgd": ({"train.optimizer": "sgd"}, dict(zero_stage=2), "SGD"),
    "zero3_adam_no_warmup": ({"train.optimizer": "adam", "train.warmup_steps": 0}, dict(zero_stage=3), "Adam"),
    "zero1_lora_script": ({}, dict(zero_stage=1), "AdamW"),
    "zero3_lora_script": ({}, dict(zero_stage=3), "AdamW"),
    "zero3_lora": ({}, dict(zero_stage=3), "AdamW"),
}
LORA_CASES = {"zero1_lora_script": True, "zero3_lora_script": True, "zero3_lora": False}
"""The cases whose model trains peft's adapters (bf16, as every case here), added after the model is built: as a
user's script does, peft's default fp32 adapters (True), or as the launcher's ranks, in the base's dtype."""


@pytest.fixture(scope="module")
def initialized() -> dict:
    configs = {name: emit(dict(world_size=1), job_kw, **s) for name, (job_kw, s, _) in ENGINE_CASES.items()}
    return run_ds_check("initialize", configs, lora=LORA_CASES)


@pytest.mark.parametrize("name", ENGINE_CASES)
def test_deepspeed_initialize_trains(initialized, name):
    job_kw, _, optimizer = ENGINE_CASES[name]
    r = initialized[name]
    assert r["ok"], r.get("trace", r["error"])
    assert r["global_steps"] == 2 and r["loss_finite"]
    assert r["basic_optimizer"] == optimizer
    if job_kw.get("train.warmup_steps") == 0:
        assert r["scheduler"] is None and r["lr"] == pytest.approx(3e-4)
    else:
        # After two optimizer steps WarmupLR is at iteration 1 (it serves iteration 0 twice): 2/11 of the peak.
        assert r["scheduler"] == "WarmupLR" and r["lr"] == pytest.approx(3e-4 * 2 / 11)


def test_one_rank_zero3_runs_no_collective_outside_the_world_group(initialized):
    """On one GPU no device is bound, so a group holds an NCCL communicator only once a collective runs on it.
    ZeRO-0/1/2 reduce and broadcast on DeepSpeed's clone of the world group; a ZeRO-3 model built under zero.Init
    runs every collective on the world group itself, so its clone holds none (launcher.engines.deepspeed
    DEEPSPEED_COMMUNICATORS: why the plan still counts two there)."""
    for name, (_, s, _) in ENGINE_CASES.items():
        ran = initialized[name]["collectives"]
        assert (ran["other"] > 0) == (s["zero_stage"] < 3), (name, ran)


def test_bf16_lora_adapters_compute_in_the_dtype_the_spec_says(initialized):
    """peft makes the adapters fp32 by default; deepspeed.initialize casts them to bf16 at ZeRO-0/1/2 and leaves a
    zero.Init model's alone at ZeRO-3, so a script's compute in fp32 there, and the launcher's ranks, which make them
    in the base's dtype, in bf16 (DeepSpeedSpec.fp32_adapters, which adds the probe's fp32-adapter terms)."""
    spec = engine_spec("deepspeed")
    for name, script in LORA_CASES.items():
        _, s, _ = ENGINE_CASES[name]
        fp32 = spec.fp32_adapters(make_plan(world_size=1, **s).strategy, script=script)
        assert initialized[name]["adapter_dtypes"] == ["float32" if fp32 else "bfloat16"], (name, initialized[name])
    assert {initialized[n]["adapter_dtypes"][0] for n in LORA_CASES} == {"float32", "bfloat16"}


NVME_CASES = {
    "nvme_both": dict(offload_optimizer="nvme", offload_params="nvme"),
    "nvme_opt_params_cpu": dict(offload_optimizer="nvme", offload_params="cpu"),
}


def test_deepspeed_initialize_trains_on_nvme(tmp_path):
    import deepspeed.ops

    if not deepspeed.ops.__compatible_ops__.get("async_io"):
        pytest.skip("DeepSpeed's async_io op is unavailable here (needs libaio-dev: apt-get install libaio-dev)")
    width = 1024  # layers of 2M elements: above aio's 1 MiB block, so DeepSpeed really swaps them
    configs = {}
    for name, s in NVME_CASES.items():
        job = make_job(**{"cluster.nvme_path": str(tmp_path / name)})
        configs[name] = ds_config(make_plan(world_size=1, zero_stage=3, **s), job,
                                  largest_layer_params=2 * width * width)
    result = run_ds_check("initialize", configs, width=width)
    for name, s in NVME_CASES.items():
        r = result[name]
        assert r["ok"], r.get("trace", r["error"])
        assert r["global_steps"] == 2 and r["loss_finite"] and r["basic_optimizer"] == "DeepSpeedCPUAdam"
        files = r["swap_files"]
        assert any(f.startswith("zero_stage_3/optimizer/") for f in files)
        assert any(f.startswith("zero_stage_3/bfloat16params/") for f in files) == (s["offload_params"] == "nvme")


@pytest.mark.parametrize("max_grad_norm, clipping", [(None, 0.0), (0.0, 0.0), (0.25, 0.25), (1, 1.0)])
def test_gradient_clipping_is_the_jobs_max_grad_norm(max_grad_norm, clipping):
    # The same number FSDP2 clips to in the worker; 0 is DeepSpeed's "off".
    assert emit(job_kw={"train.max_grad_norm": max_grad_norm})["gradient_clipping"] == clipping
    assert emit()["gradient_clipping"] == 1.0  # the default


def test_pure_bf16_with_a_low_bit_adamw_notes_name_the_rounding_low_bit_client(tmp_path):
    # ZeRO-1/2 pair pure bf16 with a low-bit AdamW (DeepSpeedSpec.pure_bf16_optimizers): ds_config.json keeps bf16
    # masters and names no optimizer; the script builds torchao's low-bit AdamW with bf16_stochastic_round.
    from launcher.engines import ENGINES

    plan = make_plan(zero_stage=2, pure_bf16=True, low_memory_optimizer="adamw8bit")
    cfg = emit(zero_stage=2, pure_bf16=True, low_memory_optimizer="adamw8bit")
    assert "optimizer" not in cfg and cfg["bf16"]["bf16_master_weights_and_grads"] is True
    notes = " ".join(ENGINES["deepspeed"].accelerate_notes(plan, tmp_path, optimizer="adamw"))
    assert "torchao.optim.AdamW8bit(params, lr, weight_decay=..., bf16_stochastic_round=True)" in notes
    assert "_AdamW(" not in notes
