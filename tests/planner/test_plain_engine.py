"""The plain engine's plan side: one GPU pays no sharding wrapper, DDP wins where the model fits whole, and its
memory terms are the states of an unsharded rank (issue 37 §5)."""

import dataclasses
from pathlib import Path

import pytest
import yaml

from launcher.config.job import StrategyConfig
from launcher.config.jobfile import job_from_data
from launcher.engines import ENGINES, LAYOUTS, engine_spec
from launcher.engines.plain.layout import PlainLayout
from launcher.engines.plain.memory import plain_states
from launcher.inputs.plan_inputs import plan_job, plan_request
from launcher.planner.hardware import PROFILES
from launcher.planner.memory import estimate_memory
from launcher.planner.plan import Strategy
from launcher.planner.scoring import memory_inputs
from launcher.planner.search import make_plan
from launcher.units import GiB
from tests.conftest import REPO


def lora_job(**train) -> dict:
    """examples/llama-7b-lora.yaml on one 24 GiB A10G (its data in the repository)."""
    doc = yaml.safe_load((REPO / "examples" / "llama-7b-lora.yaml").read_text())
    doc.update(gpus=1, budget=24 * GiB, cluster={"hardware": "a10g", "host_ram_per_node": "256GB"})
    doc["data"]["path"] = str(REPO / "examples" / "data" / "causal.jsonl")
    doc["train"].update(train)
    return doc


def plan_of(doc: dict, **pins):
    d = {**doc, "strategy": pins} if pins else doc
    return plan_job(job_from_data(d, Path(".")))


def test_the_plain_engine_is_one_package_and_one_registry_line():
    assert list(LAYOUTS)[-1] == "plain" and LAYOUTS["plain"] is PlainLayout
    assert ENGINES["plain"] is engine_spec("plain") and ENGINES["plain"].rank_engine == "PlainEngine"


@pytest.mark.parametrize("qlora", [False, True], ids=["lora", "qlora"])
def test_single_gpu_lora_plans_the_plain_engine_and_pays_no_fsdp_root_or_block(qlora):
    train = {"allow_levers": ["qlora"]} if qlora else {}
    pins = {"qlora": True} if qlora else {}
    doc = lora_job(**train)
    plan = plan_of(doc, **pins)
    assert plan.strategy.engine == "plain" and plan.strategy.layout == PlainLayout(ddp=False)
    assert plan.strategy.qlora is qlora
    fsdp = plan_of(doc, engine="fsdp", **pins)
    req = plan_request(job_from_data(doc, Path(".")))
    inp, m = memory_inputs(req), req.model
    # The same strategy on each engine: FSDP2's one-rank states hold the unsharded root (embeddings, head) and one
    # block beside the shards; the plain engine holds the model once, in bf16, and no buffer.
    same = dataclasses.replace(plan.strategy, layout=fsdp.strategy.layout)
    assert plain_states(inp, plan.strategy).buffers == 0
    assert engine_spec("fsdp").states(inp, same, plan.buckets).buffers > 2 * m.non_block_params
    saved = estimate_memory(inp, same, plan.buckets).peak_bytes - estimate_memory(inp, plan.strategy,
                                                                                  plan.buckets).peak_bytes
    print(f"{plan.strategy.label()}: FSDP2's peak at the same strategy is {saved / GiB:.2f} GiB higher")
    assert saved >= 2 * m.non_block_params  # at least the bf16 root (0.52 GB on the 7B Llama)


def test_single_gpu_plain_params_are_the_model_once_in_bf16():
    doc = lora_job()
    req = plan_request(job_from_data(doc, Path(".")))
    inp, m = memory_inputs(req), req.model
    s = Strategy(layout=PlainLayout(ddp=False), micro_batch_size=1, grad_accum_steps=1,
                 activation_checkpointing=False)
    st = plain_states(inp, s)
    assert st.params == 2 * m.num_params  # every parameter in bf16, adapters included
    assert st.optimizer == (4 + 8) * m.trainable_params  # fp32 masters + AdamW's moments
    assert st.grads == 0 and st.step_extra >= (2 + 4) * m.trainable_params  # bf16 grads + the masters' fp32 ones
    ddp = plain_states(dataclasses.replace(inp, world_size=2, gpus_per_node=2),
                       dataclasses.replace(s, layout=PlainLayout(ddp=True)))
    assert ddp.grads == 2 * m.trainable_params  # DDP's buckets are the gradients, held from construction on


def test_ddp_is_chosen_where_the_model_fits_whole_and_is_fastest(request_for):
    # The 7B Llama in bf16 with AdamW does not fit whole on an 80 GB GPU (16 bytes a parameter): sharding wins.
    plan = make_plan(request_for(gpus_per_node=4, budget_bytes=80 * 10**9, global_batch_size=64, seq_len=512))
    assert plan.strategy.engine != "plain"
    # Two CPU ranks, whose profile carries every engine's measured fixed cost a step: DDP is the fastest there.
    cpu = gpt2_request(hardware="cpu", gpus=2, budget="8GB")
    plan = make_plan(cpu)
    assert plan.strategy.layout == PlainLayout(ddp=True), plan.strategy.label()
    for engine in ("deepspeed", "fsdp"):
        other = make_plan(dataclasses.replace(cpu, pins=StrategyConfig(engine=engine)))
        assert plan.estimate.step_time_s < other.estimate.step_time_s, (engine, other.strategy.label())


def test_ddp_all_reduces_less_than_fsdp_gathers_where_the_traffic_shows():
    # 2 nodes of 8 A100s, a small batch: the traffic outlasts the compute. DDP all-reduces the gradients once a step
    # (2 x (n-1)/n of them); FSDP2 gathers the parameters twice and reduce-scatters the gradients (3 x).
    req = gpt2_request(hardware="a100-80gb", gpus=8, nodes=2, budget="80GB", global_batch_size=16)
    ddp = make_plan(dataclasses.replace(req, pins=StrategyConfig(engine="plain", micro_batch_size=1)))
    fsdp = make_plan(dataclasses.replace(req, pins=StrategyConfig(engine="fsdp", fsdp_sharding="full",
                                                                   micro_batch_size=1)))
    assert ddp.strategy.layout == PlainLayout(ddp=True)
    assert ddp.estimate.step_time_s < fsdp.estimate.step_time_s


def gpt2_request(*, hardware: str, gpus: int, budget: str, nodes: int = 1, global_batch_size: int = 32):
    """GPT-2 small (124M) full fine-tune, fp32 on CPU ranks: it fits whole on each rank."""
    doc = yaml.safe_load((REPO / "examples" / "tiny-gpt2.yaml").read_text())
    doc["model"] = {"family": "gpt2", "hidden_size": 768, "num_layers": 12, "num_heads": 12, "vocab_size": 50257,
                    "max_position_embeddings": 1024}
    doc["data"]["path"] = str(REPO / "examples" / "data" / "causal.jsonl")
    doc.update(gpus=gpus, nodes=nodes, budget=budget, cluster={"hardware": hardware, "host_ram_per_node": "1TB"})
    doc["train"]["global_batch_size"] = global_batch_size
    return plan_request(job_from_data(doc, Path(".")))


def test_ddp_refuses_the_step_in_backward_and_qlora_in_its_words():
    spec = ENGINES["plain"]
    limits = spec.lever_values(PlainLayout(ddp=True))
    assert limits["optimizer_in_backward"][0] == (False,) and limits["qlora"][0] == (False,)
    assert spec.lever_values(PlainLayout(ddp=False)) == {}
    assert spec.candidates(nodes=1, nvme=False, world_size=1) == [PlainLayout(ddp=False)]
    assert spec.candidates(nodes=2, nvme=True, world_size=16) == [PlainLayout(ddp=True)]
    for rung in ("sharding", "optimizer_offload", "param_offload", "nvme"):
        assert spec.rung_options(rung, Strategy(layout=PlainLayout(ddp=True), micro_batch_size=1,
                                                grad_accum_steps=1, activation_checkpointing=False), nvme=True) == []


def test_ddp_traffic_is_one_ring_all_reduce_of_the_gradients():
    req = gpt2_request(hardware="a100-80gb", gpus=4, budget="80GB")
    inp = memory_inputs(req)
    s = Strategy(layout=PlainLayout(ddp=True), micro_batch_size=1, grad_accum_steps=4, activation_checkpointing=False)
    t = ENGINES["plain"].communication(inp, s, 0)
    grads = (4 if req.precision == "fp32" else 2) * req.model.trainable_params  # the working dtype's gradients
    assert t.intra_node_bytes == pytest.approx(2 * 3 / 4 * grads)  # 2(n-1)/n, once per step, not per micro-batch
    assert t.calls == -(-grads // (25 * 2**20))
    one = ENGINES["plain"].communication(dataclasses.replace(inp, world_size=1, gpus_per_node=1),
                                         dataclasses.replace(s, layout=PlainLayout(ddp=False)), 0)
    assert one.intra_node_bytes == one.inter_node_bytes == one.calls == 0
    assert PROFILES["a100-80gb"].step_overhead("plain") == 0.0
