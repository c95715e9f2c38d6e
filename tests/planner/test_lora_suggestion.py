"""The no-fit message's LoRA suggestion names the attention projections of the model's own family."""

import dataclasses

import pytest

from launcher.config.job import Job
from launcher.config.load import from_dict
from launcher.errors import NoPlanError
from launcher.model.introspect import introspect
from launcher.model.lora import LORA_RANK, lora_suggestion
from launcher.planner.search import make_plan

FAMILIES = {  # family -> (inline architecture, task, the suggestion)
    "gpt2": ({"family": "gpt2", "hidden_size": 64, "num_layers": 2, "num_heads": 4, "vocab_size": 1024},
             "causal_lm", ["c_attn"]),
    "llama": ({"family": "llama", "hidden_size": 64, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2,
               "intermediate_size": 128, "vocab_size": 1024}, "causal_lm", ["q_proj", "v_proj"]),
    "bert": ({"family": "bert", "hidden_size": 64, "num_layers": 2, "num_heads": 4, "vocab_size": 1024},
             "sentence_embedding", ["query", "value"]),
}


def job(family: str, lora: dict | None = None) -> Job:
    arch, task, _ = FAMILIES[family]
    train = {"global_batch_size": 8, "max_steps": 1}
    if lora is not None:
        train["lora"] = lora
    return from_dict(Job, {"name": "lora", "model": dict(arch), "task": task, "data": {"path": "data.jsonl"},
                           "train": train})


@pytest.mark.parametrize("family", FAMILIES)
def test_suggested_targets_are_what_peft_adapts_with_the_count_it_trains(family):
    stats = introspect(job(family))
    targets, count = lora_suggestion(stats)
    assert targets == FAMILIES[family][2]
    # The same targets through the planner's and worker's own LoRA wrap (peft on the meta model).
    adapted = introspect(job(family, {"r": LORA_RANK, "target_modules": targets}))
    assert adapted.lora_params == count


@pytest.mark.parametrize("family", FAMILIES)
def test_no_fit_message_suggests_the_family_targets(request_for, llama7b, family):
    model = dataclasses.replace(llama7b, model_type=family)
    # 7B on one 40 GB GPU with 32 GB of host RAM: full fine-tuning needs 16Ψ of states on the device or
    # 12Ψ offloaded to the host; LoRA about 2Ψ.
    with pytest.raises(NoPlanError) as e:
        make_plan(request_for(model=model, gpus_per_node=1, global_batch_size=8, budget_bytes=40 * 10**9,
                              host_ram_per_node_bytes=32 * 10**9))
    (lora,) = [s for s in e.value.no_fit.suggestions if s.change == "lora"]
    assert (lora.names, lora.lora_rank) == (tuple(FAMILIES[family][2]), LORA_RANK)
