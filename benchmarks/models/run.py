"""Plans for public model configs at their real sizes, built from transformers' config classes on the meta device.

    .venv/bin/python benchmarks/models/run.py      # writes benchmarks/results/models.md and models.json

Each model is planned the way `launch plan` plans it (launcher.inputs.plan_inputs.plan_job: meta-device introspection,
the fake-tensor activation probe, the hardware profile), for one setting stated in the table's header. The
parameter counts are the meta model's own; the published counts are given beside them as a check.
Nothing is trained here: peak and step time are the planner's predictions.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

SETTING = {"hardware": "h100-80gb", "gpus": 8, "nodes": 1, "budget": "75GB", "seq": 2048, "global_batch": 64,
           "precision": "bf16", "host_ram": "2TB"}
# name -> (config class, kwargs as in the model's config.json on the Hub, published total / active parameters)
MODELS = {
    "Llama-3.1-8B": ("LlamaConfig", dict(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, max_position_embeddings=131072, tie_word_embeddings=False,
        rope_parameters={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192, "rope_theta": 500000.0}), "8.03B"),
    "Mistral-7B-v0.1": ("MistralConfig", dict(
        vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, max_position_embeddings=32768), "7.24B"),
    "Qwen2-7B": ("Qwen2Config", dict(
        vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
        num_key_value_heads=4, max_position_embeddings=131072, tie_word_embeddings=False), "7.62B"),
    "Gemma-7B": ("GemmaConfig", dict(
        vocab_size=256000, hidden_size=3072, intermediate_size=24576, num_hidden_layers=28, num_attention_heads=16,
        num_key_value_heads=16, head_dim=256, max_position_embeddings=8192), "8.54B"),
    "Phi-3-mini-4k": ("Phi3Config", dict(
        vocab_size=32064, hidden_size=3072, intermediate_size=8192, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=32, max_position_embeddings=4096, pad_token_id=32000), "3.82B"),
    "Mixtral-8x7B": ("MixtralConfig", dict(
        vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, max_position_embeddings=32768, num_local_experts=8, num_experts_per_tok=2),
        "46.7B / 12.9B"),
    "Qwen1.5-MoE-A2.7B": ("Qwen2MoeConfig", dict(
        vocab_size=151936, hidden_size=2048, intermediate_size=5632, moe_intermediate_size=1408,
        shared_expert_intermediate_size=5632, num_hidden_layers=24, num_attention_heads=16, num_key_value_heads=16,
        num_experts=60, num_experts_per_tok=4, max_position_embeddings=8192, tie_word_embeddings=False),
        "14.3B / 2.7B"),
}


def plan_one(name: str, root: Path) -> dict:
    import transformers

    from launcher.config.job import Job
    from launcher.config.load import from_dict
    from launcher.inputs.plan_inputs import plan_job
    from launcher.units import parse_bytes

    cls, kwargs, published = MODELS[name]
    model_dir = root / name
    getattr(transformers, cls)(**kwargs).save_pretrained(str(model_dir))
    (root / "d.jsonl").write_text('{"text": "a"}\n')
    job = from_dict(Job, {
        "name": name, "model": str(model_dir), "task": "causal_lm",
        "data": {"path": str(root / "d.jsonl"), "max_seq_len": SETTING["seq"]},
        "train": {"global_batch_size": SETTING["global_batch"], "precision": SETTING["precision"], "max_steps": 1},
        "cluster": {"hardware": SETTING["hardware"], "host_ram_per_node": SETTING["host_ram"]},
        "gpus": SETTING["gpus"], "nodes": SETTING["nodes"], "budget": SETTING["budget"]})
    job.budget_bytes = parse_bytes(SETTING["budget"])
    job.cluster.host_ram_per_node_bytes = parse_bytes(SETTING["host_ram"])
    t = time.perf_counter()
    plan = plan_job(job)
    from launcher.inputs.plan_inputs import model_stats

    m = model_stats(job)
    return {"model": name, "published": published, "total_params": m.num_params, "active_params": m.active_params,
            "experts": f"top-{m.experts_per_token} of {m.num_experts}" if m.num_experts else "",
            "strategy": plan.strategy.label(), "peak_bytes": plan.estimate.peak_bytes,
            "host_bytes_per_node": plan.estimate.host_bytes_per_node, "step_time_s": plan.estimate.step_time_s,
            "compute_s": plan.estimate.step_time_terms.get("compute", 0.0),
            "activations": plan.constants["activations"]["source"], "plan_s": time.perf_counter() - t}


def render(rows: list[dict]) -> str:
    from launcher.units import format_bytes

    s = SETTING
    out = [
        "# Plans for public model configs",
        "",
        f"Setting: full fine-tune, causal LM, {s['precision']}, AdamW, {s['gpus']} x {s['hardware']} on "
        f"{s['nodes']} node, budget {s['budget']} per GPU, host RAM {s['host_ram']} per node, max_seq_len {s['seq']}, "
        f"global batch {s['global_batch']} sequences.",
        "Configs are the models' config.json values, built with transformers' config classes on the meta device "
        "(no weights). Peak, host RAM and step time are the planner's predictions, not measurements.",
        "",
        "Rerun: `.venv/bin/python benchmarks/models/run.py` (writes this file and models.json).",
        "",
        "| model | params total (published) | active | routing | chosen strategy | predicted peak / GPU | "
        "host RAM / node | predicted step | of which compute |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        out.append(f"| {r['model']} | {r['total_params'] / 1e9:.2f}B ({r['published']}) | "
                   f"{r['active_params'] / 1e9:.2f}B | {r['experts'] or 'dense'} | {r['strategy']} | "
                   f"{format_bytes(r['peak_bytes'])} | {format_bytes(r['host_bytes_per_node'])} | "
                   f"{r['step_time_s']:.3g} s | {r['compute_s']:.3g} s |")
    out += ["", "Activation constants per model:", ""]
    out += [f"- {r['model']}: {r['activations']}" for r in rows]
    out += ["", "Mixture of experts: memory counts every expert; compute (6 x active parameters x tokens) counts the "
                "shared parameters plus top-k of E experts, which is why Mixtral's compute term is about "
                f"{rows_ratio(rows)} of its all-expert figure.", ""]
    by = {r["model"]: r for r in rows}
    if "Mixtral-8x7B" in by and "Mistral-7B-v0.1" in by:
        a, b = by["Mixtral-8x7B"], by["Mistral-7B-v0.1"]
        out += [f"Mixtral-8x7B against Mistral-7B (same width and depth): active parameters "
                f"{a['active_params'] / b['active_params']:.2f}x, compute term {a['compute_s'] / b['compute_s']:.2f}x "
                "(the two plans may differ in activation checkpointing, which adds 2 of the 6-8 FLOPs per parameter "
                "and token).", ""]
    return "\n".join(out)


def rows_ratio(rows: list[dict]) -> str:
    r = next((r for r in rows if r["model"] == "Mixtral-8x7B"), None)
    return f"{r['active_params'] / r['total_params']:.2f}" if r else "n/a"


def main() -> None:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["LAUNCHER_CACHE"] = str(Path(tmp) / "cache")
        for name in MODELS:
            rows.append(plan_one(name, Path(tmp)))
            print(json.dumps(rows[-1]), flush=True)
    results = REPO / "benchmarks" / "results"
    (results / "models.json").write_text(json.dumps({"setting": SETTING, "rows": rows}, indent=1) + "\n")
    (results / "models.md").write_text(render(rows))


if __name__ == "__main__":
    main()
