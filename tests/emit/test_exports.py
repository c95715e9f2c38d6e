"""plan --out's exports, checked by the tools that read them: DeepSpeed's parser, HF Trainer's "auto" filling,
and accelerate's own launch-config processing (config loader, launch checks, the engine plugin)."""

import json
import os

import pytest
import yaml
from emit_helpers import check_golden, json_text, make_job, make_plan, run_ds_check
from test_ds_templates import hf_fill

from launcher.engines import engine_spec
from launcher.engines.deepspeed.exports import deepspeed_accelerate_config, hf_ds_config
from launcher.engines.fsdp.emit import fsdp_config

DS_FILE = "/runs/plan/ds_config.json"


def test_hf_variant_golden():
    check_golden("ds_zero2.hf.json", json_text(hf_ds_config(make_plan(zero_stage=2), make_job())))


def test_hf_variant_keeps_pure_bf16s_master_keys():
    # The Trainer decides "enabled"; without the two keys DeepSpeed would keep fp32 masters and states.
    cfg = hf_ds_config(make_plan(zero_stage=2, pure_bf16=True), make_job())
    assert cfg["bf16"] == {"enabled": "auto", "bf16_master_weights_and_grads": True, "bf16_optimizer_states": True}


@pytest.mark.parametrize("stage,offload", [(2, "none"), (3, "cpu")])
def test_hf_trainer_fills_every_auto_and_deepspeed_accepts_it(stage, offload):
    cfg = hf_ds_config(make_plan(zero_stage=stage, offload_optimizer=offload), make_job())
    assert {cfg[k] for k in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                             "gradient_clipping")} == {"auto"}
    assert cfg["bf16"] == cfg["fp16"] == {"enabled": "auto"}
    assert cfg["scheduler"]["params"]["warmup_num_steps"] == "auto"
    filled = hf_fill(cfg)
    assert '"auto"' not in json.dumps(filled)
    # The Trainer's values landed, the plan's memory decisions stayed.
    assert filled["optimizer"]["params"]["lr"] == 3e-4 and filled["train_micro_batch_size_per_gpu"] == 2
    assert filled["zero_optimization"]["stage"] == stage
    assert filled["zero_optimization"]["reduce_bucket_size"] == make_plan().buckets.reduce_bucket_size
    parsed = run_ds_check("parse", {"hf": filled}, world_size=1)["hf"]
    assert parsed["ok"], parsed["error"]


@pytest.mark.parametrize("stage,offload", [(2, "none"), (3, "cpu")])
def test_a_scripts_config_keeps_the_plans_memory_and_leaves_the_math_to_the_script(tmp_path, stage, offload):
    """ds_config.script.json: batch shape, precision, stage, offload and the optimizer's kind concrete; no scheduler
    (the script's own); the optimizer's lr and weight decay "auto", and in the Trainer's copy its betas and eps too.
    HF Trainer fills them from a script's arguments that differ from the job's (lr 5e-5, clipping 0.5), DeepSpeed
    parses it; the run dir has it only for a script."""
    from launcher.emit.exports import trainer_ds_config
    from launcher.engines.deepspeed.exports import script_ds_config
    from launcher.engines.deepspeed.spec import SCRIPT_CONFIG

    plan, job = make_plan(zero_stage=stage, offload_optimizer=offload), make_job(**{"train.warmup_steps": 10})
    cfg = script_ds_config(plan, job)
    assert (cfg["train_micro_batch_size_per_gpu"], cfg["gradient_accumulation_steps"], cfg["bf16"]["enabled"]) \
        == (2, 4, True)
    assert "scheduler" not in cfg and cfg["gradient_clipping"] == "auto"
    assert cfg["optimizer"]["type"] == "AdamW" and ("torch_adam" in cfg["optimizer"]["params"]) == (offload == "none")
    assert cfg["optimizer"]["params"]["lr"] == cfg["optimizer"]["params"]["weight_decay"] == "auto"
    assert cfg["optimizer"]["params"]["betas"] == [0.9, 0.999]  # accelerate has no source for them
    trainer = trainer_ds_config(cfg)
    assert trainer["optimizer"]["params"]["betas"] == trainer["optimizer"]["params"]["eps"] == "auto"
    filled = hf_fill({**trainer, "train_batch_size": "auto"}, learning_rate=5e-5, max_grad_norm=0.5)
    assert filled["gradient_clipping"] == 0.5 and filled["optimizer"]["params"]["lr"] == 5e-5
    parsed = run_ds_check("parse", {"script": filled}, world_size=1)["script"]
    assert parsed["ok"], parsed["error"]
    files = engine_spec("deepspeed").config_files
    assert SCRIPT_CONFIG not in files(plan, job)
    script_plan = make_plan(zero_stage=stage, offload_optimizer=offload)
    script_plan.script = True
    assert json.loads(files(script_plan, job)[SCRIPT_CONFIG]) == cfg
    env = engine_spec("deepspeed").script_env(script_plan, job, config_dir=tmp_path)
    assert env["ACCELERATE_DEEPSPEED_CONFIG_FILE"] == str(tmp_path / SCRIPT_CONFIG)


def test_accelerate_deepspeed_golden():
    text = yaml.safe_dump(deepspeed_accelerate_config(make_plan(zero_stage=3), make_job(), ds_config_file=DS_FILE),
                          sort_keys=False)
    check_golden("accelerate_deepspeed_zero3.yaml", text)


def test_accelerate_fsdp_is_fsdp_yamls_section():
    plan, job = make_plan(engine="fsdp"), make_job()
    assert engine_spec(plan.strategy.engine).accelerate_config(plan, job) == fsdp_config(plan, job)["accelerate"]
    with pytest.raises(ValueError, match="needs ds_config_file"):
        engine_spec(make_plan().strategy.engine).accelerate_config(make_plan(), job)


def _accelerate_launch_env(path, monkeypatch) -> tuple:
    """What `accelerate launch --config_file PATH train.py` makes of the file, through accelerate's own code:
    its config loader, its launch checks, and the environment it hands the training processes."""
    from accelerate.commands.config.config_args import ClusterConfig
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_deepspeed_cmd_env, prepare_multi_gpu_env

    loaded = ClusterConfig.from_yaml_file(str(path))
    args = launch_command_parser().parse_args(["--config_file", str(path), "train.py"])
    args, defaults, mp_from_config = _validate_launch_command(args)
    if args.use_deepspeed:  # as accelerate's launch_command does before its deepspeed launcher
        args.deepspeed_fields_from_accelerate_config = ",".join(
            [*defaults.deepspeed_config, *(["mixed_precision"] if mp_from_config else [])])
        _, env = prepare_deepspeed_cmd_env(args)
    else:
        env = prepare_multi_gpu_env(args)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return loaded, args


@pytest.mark.parametrize("precision", ["bf16", "fp16", "fp32"])
def test_accelerate_launch_takes_the_deepspeed_export(tmp_path, monkeypatch, precision):
    """`plan --out`'s accelerate.yaml, as `accelerate launch` and an Accelerator's DeepSpeed plugin read it: the
    plan's precision, stage, micro-batch and accumulation, not accelerate's defaults (no mixed precision, 1)."""
    from accelerate.utils import DeepSpeedPlugin

    from launcher.session.planning import write_exports

    plan, job = make_plan(zero_stage=3, world_size=8, precision=precision), make_job()
    write_exports(tmp_path, plan, job)
    path = tmp_path / "accelerate.yaml"
    assert f"accelerate launch --config_file {path} train.py" in path.read_text()  # the documented line
    loaded, args = _accelerate_launch_env(path, monkeypatch)
    assert loaded.distributed_type.value == "DEEPSPEED" and args.use_deepspeed and args.num_processes == 8
    plugin = DeepSpeedPlugin()  # reads the file and refuses accelerate keys the file should hold
    plugin.set_mixed_precision(os.environ["ACCELERATE_MIXED_PRECISION"])  # as AcceleratorState does
    cfg = plugin.hf_ds_config.config
    assert (cfg["bf16"]["enabled"], cfg["fp16"]["enabled"]) == (precision == "bf16", precision == "fp16")
    assert plugin.zero_stage == 3 and plugin.zero3_init_flag is True
    assert (cfg["train_micro_batch_size_per_gpu"], cfg["gradient_accumulation_steps"]) == (2, 4)
    assert plugin.gradient_accumulation_steps == 4  # what the Accelerator then uses instead of its own 1
    assert cfg["zero_optimization"]["stage3_max_live_parameters"] == plan.buckets.stage3_max_live_parameters


def test_multinode_deepspeed_export_needs_the_node_flags(tmp_path, monkeypatch):
    """Two nodes: the file holds no node rank or head node; accelerate stops until the launch line gives them."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_deepspeed_cmd_env

    from launcher.session.planning import write_exports

    plan = make_plan(zero_stage=2, world_size=16, nodes=2)
    write_exports(tmp_path, plan, make_job())
    path = tmp_path / "accelerate.yaml"
    text = path.read_text()
    assert "--machine_rank $NODE_RANK --main_process_ip $HEAD_NODE" in text

    def cmd_env(*flags):
        args = launch_command_parser().parse_args(["--config_file", str(path), *flags, "train.py"])
        args, _, _ = _validate_launch_command(args)
        args.deepspeed_fields_from_accelerate_config = ""
        prepare_deepspeed_cmd_env(args)
        return args

    with pytest.raises(ValueError, match="SET_BY_--machine_rank"):
        cmd_env()
    args = cmd_env("--machine_rank", "1", "--main_process_ip", "10.0.0.1", "--main_process_port", "29511")
    assert (args.node_rank, args.nnodes, args.nproc_per_node, args.rdzv_endpoint) == (1, "2", "8", "10.0.0.1:29511")


@pytest.mark.parametrize("pins", [{}, {"offload_optimizer": "cpu", "offload_params": "cpu",
                                       "fsdp_reshard_after_forward": False}])
def test_accelerate_launch_takes_the_fsdp_export(tmp_path, monkeypatch, pins):
    from accelerate.utils import FullyShardedDataParallelPlugin

    plan, job = make_plan(engine="fsdp", world_size=4, **pins), make_job()
    path = tmp_path / "accelerate.yaml"
    path.write_text(yaml.safe_dump(engine_spec("fsdp").accelerate_config(plan, job), sort_keys=False))
    loaded, args = _accelerate_launch_env(path, monkeypatch)
    assert loaded.distributed_type.value == "FSDP" and args.use_fsdp and args.num_processes == 4
    plugin = FullyShardedDataParallelPlugin()
    assert plugin.fsdp_version == 2
    assert plugin.reshard_after_forward is plan.strategy.layout.fsdp_reshard_after_forward
    assert plugin.transformer_cls_names_to_wrap == ["GPT2Block"]
    assert (plugin.cpu_offload is not None and type(plugin.cpu_offload).__name__ == "CPUOffloadPolicy") == \
        (plan.strategy.layout.offload_params == "cpu")


@pytest.mark.parametrize("world_size", [1, 4])
def test_accelerate_launch_takes_the_plain_export(tmp_path, monkeypatch, world_size):
    # The plain engine: accelerate's DDP (MULTI_GPU) on several processes, no distribution (NO) on one; no file of
    # its own, and the header tells a script what accelerate's autocast does not hold.
    plan, job = make_plan(engine="plain", world_size=world_size), make_job()
    spec = engine_spec("plain")
    assert spec.config_files(plan, job) == {} and spec.export_files(plan, job) == {}
    path = tmp_path / "accelerate.yaml"
    path.write_text(spec.accelerate_yaml(plan, job, config_dir=tmp_path))
    loaded, args = _accelerate_launch_env(path, monkeypatch)
    assert loaded.distributed_type.value == ("MULTI_GPU" if world_size > 1 else "NO")
    assert args.num_processes == world_size and not args.use_fsdp and not args.use_deepspeed
    assert os.environ["ACCELERATE_MIXED_PRECISION"] == "bf16"
    text = path.read_text()
    assert ("# DDP," if world_size > 1 else "# one process (no wrapper),") in text
    assert "fp32 masters" in text


def test_deepspeed_parser_is_given_the_world_size():
    from launcher.engines.deepspeed.check import DeepSpeedRefused, check_ds_config
    from launcher.engines.deepspeed.emit import ds_config

    plan = make_plan(world_size=8)  # 2 x 4 x 8 = 64
    parsed = check_ds_config(ds_config(plan, make_job()), 8)
    assert (parsed.world_size, parsed.train_batch_size) == (8, 64)
    with pytest.raises(DeepSpeedRefused, match="train_batch_size is not equal to micro_batch_per_gpu"):
        check_ds_config(ds_config(plan, make_job()), 4)
    import deepspeed.comm

    assert not deepspeed.comm.is_initialized()  # checked without a process group


@pytest.mark.parametrize("engine", ["deepspeed", "fsdp", "fsdp-hybrid"])
def test_script_env_uses_accelerates_own_names_and_values(tmp_path, monkeypatch, engine):
    """launch --script hands a rank accelerate_env: every variable is one `accelerate launch` itself sets from the
    same plan's accelerate.yaml, with the same value, except the two accelerate leaves to the DeepSpeed file
    (precision, accumulation), which carry the plan's values; accelerate's plugins read the plan back from them."""
    from accelerate.parallelism_config import ParallelismConfig
    from accelerate.utils import DeepSpeedPlugin, FullyShardedDataParallelPlugin

    from launcher.emit.exports import accelerate_env
    from launcher.engines import engine_spec
    from launcher.engines.deepspeed.emit import ds_config

    pins = {"zero_stage": 3} if engine == "deepspeed" else {"engine": "fsdp", "activation_checkpointing": True}
    if engine == "fsdp-hybrid":  # HSDP over 2 nodes of 2: accelerate builds the 2-D mesh from its own variables
        pins.update(fsdp_sharding="hybrid", world_size=4, nodes=2)
    plan, job = make_plan(**{"world_size": 4, **pins}), make_job()
    ds_file = tmp_path / "ds_config.json"
    if engine == "deepspeed":
        ds_file.write_text(json.dumps(ds_config(plan, job)))
    config = engine_spec(plan.strategy.engine).accelerate_config(plan, job, config_dir=tmp_path)
    ours = accelerate_env(plan, config)
    path = tmp_path / "accelerate.yaml"
    # On several nodes the launch line gives each its rank and the head's address, as `accelerate launch` is told.
    launched = {**config, "machine_rank": 0, "main_process_ip": "127.0.0.1"} if plan.nodes > 1 else config
    path.write_text(yaml.safe_dump(launched, sort_keys=False))
    _accelerate_launch_env(path, monkeypatch)
    theirs = dict(os.environ)
    own_values = {"ACCELERATE_MIXED_PRECISION", "ACCELERATE_GRADIENT_ACCUMULATION_STEPS"} if engine == "deepspeed" \
        else {"ACCELERATE_GRADIENT_ACCUMULATION_STEPS"}  # FSDP: accelerate's line sets it by hand (not in the file)
    assert {k: theirs.get(k) for k in ours if k not in own_values} == {k: v for k, v in ours.items()
                                                                     if k not in own_values}
    assert (ours["ACCELERATE_MIXED_PRECISION"], ours["ACCELERATE_GRADIENT_ACCUMULATION_STEPS"]) == ("bf16", "4")
    for key in list(os.environ):
        if key.startswith(("ACCELERATE_", "FSDP_", "PARALLELISM_CONFIG_")):
            monkeypatch.delenv(key)
    for key, value in ours.items():
        monkeypatch.setenv(key, value)
    if engine == "deepspeed":
        plugin = DeepSpeedPlugin()
        plugin.set_mixed_precision(os.environ["ACCELERATE_MIXED_PRECISION"])
        cfg = plugin.hf_ds_config.config
        assert plugin.zero_stage == 3 and plugin.zero3_init_flag is True and cfg["bf16"]["enabled"] is True
        assert (cfg["train_micro_batch_size_per_gpu"], plugin.gradient_accumulation_steps) == (2, 4)
    else:
        plugin = FullyShardedDataParallelPlugin()
        assert plugin.fsdp_version == 2 and plugin.reshard_after_forward is True
        assert plugin.transformer_cls_names_to_wrap == ["GPT2Block"] and plugin.activation_checkpointing is True
        mesh = ParallelismConfig()
        want = (2, 2) if engine == "fsdp-hybrid" else (1, 1)
        assert (mesh.dp_replicate_size, mesh.dp_shard_size) == want


def test_accelerate_yaml_says_which_of_the_plans_levers_a_script_would_not_apply(tmp_path):
    # accelerate launch runs the user's script, which applies none of the recipes' levers: the header names them.
    spec = engine_spec("deepspeed")
    plain = spec.accelerate_yaml(make_plan(zero_stage=2), make_job(), config_dir=tmp_path)
    assert "The plan counts on levers" not in plain
    chunked = spec.accelerate_yaml(make_plan(zero_stage=2, loss_chunks=8), make_job(), config_dir=tmp_path)
    assert "# The plan counts on levers the launcher's recipes apply and this file does not carry (loss_chunks: 8)" \
        in chunked and "launch plan JOB --script train.py --out DIR" in chunked
    # ds_config.json's own lever is carried: nothing to say for it.
    released = spec.accelerate_yaml(make_plan(zero_stage=3, release_frozen_weights=True), make_job(),
                                    config_dir=tmp_path)
    assert "The plan counts on levers" not in released


def test_accelerate_yaml_says_how_a_lora_script_gets_the_adapters_the_plan_counts(tmp_path):
    # A bf16 LoRA plan counts the adapters in bf16, as the launcher's ranks make them; a script with peft's default
    # fp32 adapters computes them in fp32 at ZeRO-3 alone (DeepSpeedSpec.fp32_adapters): the header says so there.
    lora = make_job(**{"train.lora": {"r": 4, "target_modules": ["c_attn"]}})
    ds, fsdp = engine_spec("deepspeed"), engine_spec("fsdp")
    z3 = ds.accelerate_yaml(make_plan(zero_stage=3), lora, config_dir=tmp_path)
    assert "# LoRA: the plan counts the adapters in bf16" in z3 and "autocast_adapter_dtype=False" in z3
    quiet = [ds.accelerate_yaml(make_plan(zero_stage=2), lora, config_dir=tmp_path),
             ds.accelerate_yaml(make_plan(zero_stage=3), make_job(), config_dir=tmp_path),
             ds.accelerate_yaml(make_plan(zero_stage=3, precision="fp32"), lora, config_dir=tmp_path),
             fsdp.accelerate_yaml(make_plan(engine="fsdp", zero_stage=None), lora, config_dir=tmp_path)]
    assert not any("autocast_adapter_dtype" in text for text in quiet)


def test_the_deepspeed_header_names_the_ops_and_the_trainers_flags(tmp_path, monkeypatch):
    """Issue 36 section 2: the first `accelerate launch` compiled DeepSpeed's ops the launcher had built, and
    ds_config.hf.json's "auto" values took the script's own batch and fp32 without a word."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", "/opt/ops cache")
    ds, fsdp = engine_spec("deepspeed"), engine_spec("fsdp")
    text = ds.accelerate_yaml(make_plan(zero_stage=2, offload_optimizer="cpu"), make_job(), config_dir=tmp_path)
    assert f"#   TORCH_EXTENSIONS_DIR='/opt/ops cache' accelerate launch --config_file {tmp_path}" in text
    assert "# DeepSpeed compiles cpu_adam (minutes, silently) when a process first loads it" in text
    assert "build once: TORCH_EXTENSIONS_DIR='/opt/ops cache' " in text
    assert "-m launcher.processes.ops cpu_adam\n" in text
    assert ("pass the plan's: --per_device_train_batch_size 2 --gradient_accumulation_steps 4 --bf16, and "
            "TORCH_EXTENSIONS_DIR='/opt/ops cache' before torchrun.") in text
    # A plan whose script run loads no op says nothing of ops; FSDP2 has neither the ops nor the HF file.
    assert "DeepSpeed compiles" not in ds.accelerate_yaml(make_plan(zero_stage=2), make_job(), config_dir=tmp_path)
    plain = fsdp.accelerate_yaml(make_plan(engine="fsdp", zero_stage=None), make_job(), config_dir=tmp_path)
    assert "TORCH_EXTENSIONS_DIR" not in plain and "HF Trainer" not in plain
