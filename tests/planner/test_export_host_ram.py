"""Rank 0's host RAM at the end-of-run export (launcher.worker.export): the gathered model in the saved dtype plus
the largest layer being gathered; a LoRA adapter alone for LoRA runs."""

import dataclasses

from launcher.planner.memory import export_host_bytes
from tests.planner.test_advice import LLAMA_405B
from tests.planner.test_load_host_ram import load_host_bytes


def test_full_model_in_the_saved_dtype_plus_one_layer():
    m = LLAMA_405B
    assert export_host_bytes(m, "bf16") == 2 * (m.num_params + m.largest_layer_params)
    assert export_host_bytes(m, "fp32") == 4 * (m.num_params + m.largest_layer_params)


def test_lora_gathers_the_adapter_alone():
    m = dataclasses.replace(LLAMA_405B, trainable_params=10**8, lora_params=10**8)
    assert export_host_bytes(m, "bf16") == 2 * (10**8 + m.largest_layer_params)


def test_the_node_counts_the_export_on_top_of_what_its_ranks_hold():
    # ZeRO-3 on GPUs without offload: nothing else is on the host at the end, so the node's host RAM is the export.
    assert load_host_bytes("deepspeed", 3) == export_host_bytes(LLAMA_405B, "bf16")


def test_on_cpu_ranks_the_export_is_a_moment_beside_the_training_state():
    # Where the host is the device, rank 0's export copy is measured with the rank: a 7B fp32 full fine-tune with
    # short sequences peaks there, and the plan's peak (the sum of its breakdown) is that moment.
    from launcher.levers import LEVERS_OFF
    from launcher.planner.hardware import PROFILES
    from launcher.planner.memory import MemoryInputs, analytic_constants, estimate_memory
    from launcher.planner.plan import Strategy
    from launcher.planner.search import PlanRequest, size_buckets
    from tests.planner.test_advice import llama_stats

    m = llama_stats(num_params=6_738_415_616, blocks=32, h=4096, inter=11008, vocab=32000)
    hw = PROFILES["cpu"]
    inp = MemoryInputs(model=m, world_size=2, gpus_per_node=2, nodes=1, seq_len=16, precision="fp32",
                       optimizer="adamw", hardware=hw, activations=analytic_constants(m, "fp32"))
    s = Strategy.from_json(dict(engine="fsdp", zero_stage=None, fsdp_reshard_after_forward=True,
                                offload_optimizer="none", offload_params="none", micro_batch_size=1, grad_accum_steps=1,
                                activation_checkpointing=True, **LEVERS_OFF))
    req = PlanRequest(model=m, gpus_per_node=2, nodes=1, budget_bytes=10**12, seq_len=16, global_batch_size=2,
                      precision="fp32", optimizer="adamw", hardware=hw)
    est = estimate_memory(inp, s, size_buckets(req))
    mb = est.moment_bytes
    # The state that outlives the step: its gradients and AdamW's working copies are gone by then, and FSDP2's
    # root is resharded (measured on EXPORT_VALIDATION's FSDP2 cell: shards plus Adam's states).
    from launcher.engines.fsdp.memory import fsdp_states

    st = fsdp_states(inp, s)
    kept = st.params + st.grads + st.optimizer + (0.0 if st.step_frees_buffers else st.buffers)
    assert st.step_extra > 0 and abs(mb["export"] - kept - export_host_bytes(m, "fp32")) <= 1
    assert est.peak_moment == "export" and abs(est.peak_bytes - mb["export"]) <= 8
    # Training's own largest moment keeps its breakdown: the OOM ladder corrects a training OOM on it
    # (launcher.planner.fallback), which the export's breakdown (no activations) would not let it do.
    from launcher.planner.memory import TRAINING_MOMENTS

    assert abs(sum(est.training_breakdown.values()) - max(mb[k] for k in TRAINING_MOMENTS)) <= 8
    assert est.training_breakdown["activations"] > 0 or est.training_breakdown["grads"] > 0
    # On GPUs the copy is host RAM only: no device moment.
    gpu = estimate_memory(dataclasses.replace(inp, hardware=PROFILES["h100-80gb"]), s, size_buckets(req))
    assert "export" not in gpu.moment_bytes
