import os
import socket

import pytest
import torch
import yaml
from emit_helpers import check_golden, make_job, make_plan

from launcher.engines.fsdp.emit import BLOCK_CLASS_BY_FAMILY, accelerate_yaml_text, fsdp_config, fsdp_yaml_text
from launcher.errors import ConfigError

TWO_NODES = dict(world_size=16, nodes=2)
GOLDEN = {  # name -> (Plan fields, Strategy fields)
    "fsdp_full_shard_ac": ({}, dict(fsdp_reshard_after_forward=True, activation_checkpointing=True)),
    "fsdp_grad_op_cpu_offload": ({}, dict(fsdp_reshard_after_forward=False, offload_optimizer="cpu",
                                          offload_params="cpu")),
    "fsdp_hybrid_two_nodes": (TWO_NODES, dict(fsdp_reshard_after_forward=True, fsdp_sharding="hybrid")),
}


def fsdp_plan(plan_kw: dict | None = None, **strategy):
    return make_plan(engine="fsdp", **(plan_kw or {}), **strategy)


def golden_plan(name: str):
    plan_kw, strategy = GOLDEN[name]
    return fsdp_plan(plan_kw, **strategy)


@pytest.mark.parametrize("name", GOLDEN)
def test_golden(name):
    check_golden(f"{name}.fsdp.yaml", fsdp_yaml_text(golden_plan(name), make_job()))


@pytest.mark.parametrize("name", GOLDEN)
def test_fsdp_yaml_is_one_document_with_both_sections(name):
    plan, job = golden_plan(name), make_job()
    text = fsdp_yaml_text(plan, job)
    assert list(yaml.safe_load_all(text)) == [fsdp_config(plan, job)]
    assert yaml.safe_load(accelerate_yaml_text(plan, job)) == fsdp_config(plan, job)["accelerate"]


def test_fsdp2_section_holds_the_fully_shard_settings():
    f = fsdp_config(golden_plan("fsdp_full_shard_ac"), make_job())["fsdp2"]
    assert (f["reshard_after_forward"], f["sharding"], f["activation_checkpointing"]) == (True, "full", True)
    assert f["mesh"] == {"shape": [8], "dim_names": ["shard"]}
    assert f["wrap"] == ["GPT2Block", "root"]
    f = fsdp_config(golden_plan("fsdp_hybrid_two_nodes"), make_job())["fsdp2"]
    assert f["sharding"] == "hybrid"
    assert f["mesh"] == {"shape": [2, 8], "dim_names": ["replicate", "shard"]}


def test_hybrid_needs_two_nodes():
    with pytest.raises(ConfigError, match="'hybrid' needs nodes > 1"):
        fsdp_config(fsdp_plan(fsdp_sharding="hybrid"), make_job())


def test_fsdp2_section_builds_torch_policies():
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy

    for precision, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16), ("fp32", torch.float32)):
        f = fsdp_config(fsdp_plan(dict(precision=precision)), make_job())["fsdp2"]
        mp = MixedPrecisionPolicy(param_dtype=getattr(torch, f["param_dtype"]),
                                  reduce_dtype=getattr(torch, f["reduce_dtype"]))
        assert mp.param_dtype == dtype and mp.reduce_dtype == torch.float32
    f = fsdp_config(golden_plan("fsdp_grad_op_cpu_offload"), make_job())["fsdp2"]
    assert f["cpu_offload"] is True and f["reshard_after_forward"] is False
    CPUOffloadPolicy()  # what the worker builds for cpu_offload


@pytest.mark.parametrize("family", sorted(BLOCK_CLASS_BY_FAMILY))
def test_block_class_names_a_real_module_of_the_built_model(family):
    from launcher.model.build import build_model, model_config

    # An encoder family is built for a task it supports (causal_lm on an encoder is refused by build_model).
    task = "seq_cls" if family == "bert" else "causal_lm"
    job = make_job(**{"model.family": family, "task": task})
    model = build_model(job, model_config(job))  # meta device: no weights
    block = fsdp_config(fsdp_plan(), job)["fsdp2"]["block_class"]
    assert block in {type(m).__name__ for m in model.modules()}


def test_block_class_argument_wins_and_none_defers_to_the_model():
    cfg = fsdp_config(fsdp_plan(), make_job(), block_class="MyBlock")
    assert cfg["fsdp2"]["block_class"] == "MyBlock"
    assert cfg["accelerate"]["fsdp_config"]["fsdp_transformer_layer_cls_to_wrap"] == "MyBlock"
    hub = make_job(model="some/hub-model")
    cfg = fsdp_config(fsdp_plan(), hub)
    # Unknown: the worker and accelerate both fall back to the model's _no_split_modules.
    assert cfg["fsdp2"]["block_class"] is None
    assert "fsdp_transformer_layer_cls_to_wrap" not in cfg["accelerate"]["fsdp_config"]


def test_precision_maps_to_accelerate():
    for precision, mp in (("bf16", "bf16"), ("fp16", "fp16"), ("fp32", "no")):
        assert fsdp_config(fsdp_plan(dict(precision=precision)), make_job())["accelerate"]["mixed_precision"] == mp


def test_unsupported_plans_list_every_problem():
    with pytest.raises(ConfigError) as e:
        fsdp_config(fsdp_plan(offload_optimizer="nvme", offload_params="cpu"), make_job())
    assert [p.split(":")[0] for p in e.value.problems] == ["strategy.offload_optimizer"]
    with pytest.raises(ConfigError, match="set both to cpu or both to none"):
        fsdp_config(fsdp_plan(offload_optimizer="cpu"), make_job())
    with pytest.raises(ConfigError, match="ds_config"):
        fsdp_config(make_plan(zero_stage=2), make_job())
    with pytest.raises(ConfigError, match="re-plan"):
        fsdp_config(fsdp_plan(global_batch_size=65), make_job())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


CASES = dict(GOLDEN)
CASES["two_nodes_fp32"] = (dict(world_size=16, nodes=2, precision="fp32"), dict(fsdp_reshard_after_forward=True))


@pytest.mark.parametrize("name", CASES)
def test_accelerate_launch_accepts_and_builds_the_plugin(name, tmp_path, monkeypatch):
    """fsdp.yaml's accelerate section goes through accelerate's own path: its config loader, `accelerate launch`'s
    argument merge and validation, the environment it hands to the ranks, and the FSDP plugin and parallelism
    config each rank builds from that."""
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.parallelism_config import ParallelismConfig
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.launch import prepare_multi_gpu_env
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy

    plan_kw, strategy = CASES[name]
    plan, job = fsdp_plan(plan_kw, **strategy), make_job()
    (tmp_path / "fsdp.yaml").write_text(fsdp_yaml_text(plan, job))
    # What fsdp.yaml's header tells accelerate users to run: its accelerate section, on its own.
    path = tmp_path / "accelerate.yaml"
    path.write_text(yaml.safe_dump(yaml.safe_load((tmp_path / "fsdp.yaml").read_text())["accelerate"]))

    # Top-level keys: ClusterConfig rejects unknown ones.
    loaded = load_config_from_file(str(path))
    assert loaded.num_processes == plan.world_size and loaded.num_machines == plan.nodes
    # fsdp_config keys are copied onto launch's argparse namespace without a check, so check them here.
    parser = launch_command_parser()
    dests = {a.dest for a in parser._actions}
    assert set(loaded.fsdp_config) <= dests

    argv = ["--config_file", str(path)]
    if plan.nodes > 1:
        # The file has no node rank or head node: as written, accelerate stops, naming the flag.
        args, _, _ = _validate_launch_command(parser.parse_args([*argv, "train.py"]))
        with pytest.raises(ValueError, match="SET_BY_--machine_rank"):
            prepare_multi_gpu_env(args)
        # What the documented launch line adds per node.
        argv += ["--machine_rank", "1", "--main_process_ip", "10.0.0.1", "--main_process_port", str(_free_port())]
    args, _, _ = _validate_launch_command(parser.parse_args([*argv, "train.py"]))
    env = prepare_multi_gpu_env(args)
    assert int(args.nproc_per_node) == plan.gpus_per_node
    if plan.nodes > 1:
        assert args.node_rank == 1 and args.rdzv_endpoint.startswith("10.0.0.1:")

    prefixes = ("FSDP_", "ACCELERATE_", "PARALLELISM_CONFIG_")
    for key in [k for k in os.environ if k.startswith(prefixes)]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        if key.startswith(prefixes):
            monkeypatch.setenv(key, value)
    plugin = FullyShardedDataParallelPlugin()
    # Built from the environment only when accelerate launch asked for it (Accelerator does the same).
    hsdp = ParallelismConfig() if env.get("ACCELERATE_USE_PARALLELISM_CONFIG") == "true" else None

    s = plan.strategy
    assert plugin.fsdp_version == 2
    assert plugin.reshard_after_forward is s.layout.fsdp_reshard_after_forward
    assert isinstance(plugin.cpu_offload, CPUOffloadPolicy if s.layout.offload_params == "cpu" else OffloadPolicy)
    assert plugin.activation_checkpointing is s.activation_checkpointing
    assert plugin.transformer_cls_names_to_wrap == ["GPT2Block"]
    assert plugin.state_dict_type.name == "SHARDED_STATE_DICT"
    assert env["ACCELERATE_MIXED_PRECISION"] == {"bf16": "bf16", "fp32": "no"}[plan.precision]
    if s.layout.fsdp_sharding == "hybrid":
        assert (hsdp.dp_replicate_size, hsdp.dp_shard_size) == (plan.nodes, plan.gpus_per_node)
        assert hsdp.dp_replicate_enabled and hsdp.dp_shard_enabled
    else:
        assert hsdp is None


def test_pure_bf16_reduces_in_bf16_and_says_the_params_are_bf16():
    from torch.distributed.fsdp import MixedPrecisionPolicy

    f = fsdp_config(fsdp_plan(dict(precision="bf16"), pure_bf16=True), make_job())["fsdp2"]
    assert f["pure_bf16"] is True
    mp = MixedPrecisionPolicy(param_dtype=getattr(torch, f["param_dtype"]),
                              reduce_dtype=getattr(torch, f["reduce_dtype"]))
    assert mp.param_dtype == mp.reduce_dtype == torch.bfloat16
    assert "pure_bf16" not in fsdp_config(fsdp_plan(dict(precision="bf16")), make_job())["fsdp2"]


def test_pure_bf16_notes_tell_the_script_to_round_stochastically(tmp_path):
    from launcher.engines import ENGINES

    def notes(optimizer, **kw):
        return " ".join(ENGINES["fsdp"].accelerate_notes(fsdp_plan(dict(precision="bf16"), **kw), tmp_path,
                                                         optimizer=optimizer))

    assert "torchao.optim._AdamW(" in notes("adamw", pure_bf16=True)
    assert "bf16_stochastic_round=True" in notes("adamw", pure_bf16=True)
    # The job's Adam is _AdamBase with is_adamw=False (L2 decay in the gradient), not _AdamW's decoupled decay.
    adam = notes("adam", pure_bf16=True)
    assert "is_adamw=False" in adam and "bf16_stochastic_round=True" in adam and "_AdamW" not in adam
    # SGD steps torch's SGD on the ranks (build_optimizer): no torchao optimizer to build, and it rounds to nearest.
    sgd = notes("sgd", pure_bf16=True)
    assert "torchao.optim" not in sgd and "AdamW" not in sgd and "torch.optim.SGD" in sgd and "rounds to nearest" in sgd
    assert "stochastic" not in notes("adamw")
    # Pure bf16 with a low-bit AdamW (FsdpSpec.pure_bf16_optimizers): the script builds torchao's low-bit AdamW
    # with bf16_stochastic_round, as the ranks do (optimizers.low_memory_optimizer), not _AdamW.
    low_bit = notes("adamw", pure_bf16=True, low_memory_optimizer="adamw8bit")
    assert "torchao.optim.AdamW8bit" in low_bit and "bf16_stochastic_round=True" in low_bit
    assert "_AdamW(" not in low_bit
    assert "bf16_stochastic_round" not in notes("adamw", low_memory_optimizer="adamw8bit")


def test_pure_bf16_notes_say_the_paged_adamw8bit_rounds_to_nearest(tmp_path):
    # bitsandbytes' PagedAdamW8bit steps the bf16 weights in its own kernel, rounding to nearest: the script builds
    # it as it is, with no stochastic rounding to ask for.
    from launcher.engines import ENGINES

    plan = fsdp_plan(dict(precision="bf16"), pure_bf16=True, low_memory_optimizer="paged_adamw8bit")
    notes = " ".join(ENGINES["fsdp"].accelerate_notes(plan, tmp_path, optimizer="adamw"))
    assert "bitsandbytes.optim.PagedAdamW8bit" in notes and "rounds each bf16 weight to nearest" in notes
    assert "stochastic" not in notes
