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
