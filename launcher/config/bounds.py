"""The largest size each input may have, defined once and checked before anything is built, probed or allocated.

A job file, a KEY=VALUE override or a model's config.json can ask for sizes that no real job has (a 10^9-token
sequence, 10^5 layers, a 50 MB name); unchecked, each becomes real work (a meta-device build of 10^6 modules, an
8 GB input tensor for the fake-tensor probe, a 157 MB sbatch script) before any rule refuses it. Every bound here
is a few times the largest real model or job (405B-class configs, 1M-token contexts where the model's position
table allows, 256k vocabularies, 512-expert MoEs), so no real job meets one, and each is small enough that a
refused input costs well under 10 s and 1 GB (docs/reliability/bounds.md has the measurements).

The checks run in this order: the job file's size before YAML reads it (config.load.load_yaml), each override's
length before YAML reads it (config.jobfile.parse_overrides), every string's length and every list's or mapping's
item count while the types are checked (config.load), the numbers of the job (job_problems, beside the job's other
rules), and the numbers of a model dir's config.json (config_problems, in model.build.model_config, before the
meta build). The sequence against the model's own position table comes before the activation probe
(plan_inputs.plan_request).
"""

from __future__ import annotations

from typing import Any

from launcher.config.problem import Problem
from launcher.units import KB, MB

# -- text ------------------------------------------------------------------------------------------------------------
JOB_FILE_BYTES = 256 * KB
"""A job file is 1-3 KB; a sweep listing SWEEP_VARIANTS variants is under 100 KB. PyYAML's pure-Python loader (the
one that reports line and column) reads about 100 KB/s of nested mappings here, so 256 KB is read in ~3 s."""
MODEL_CONFIG_BYTES = 1 * MB
"""A model's config.json is a few KB (Llama 3.1 405B: 1 KB; with id2label for 1000 classes, ~40 KB)."""
SAFETENSORS_HEADER_BYTES = 100 * MB
"""safetensors' own limit on its JSON header (its MAX_HEADER_SIZE): a file past it is no safetensors file."""
STRING_CHARS = 4096
"""Any string in a job: the longest path Linux takes (PATH_MAX) is 4096 bytes, and no name, partition, module name
or shell line comes near it."""
NAME_CHARS = 128
"""The job name: a run dir is named after it plus a 16-character timestamp, and a file name holds 255 bytes
(NAME_MAX); 128 leaves room for the sweep variant and attempt parts of the names built from it."""
OVERRIDE_CHARS = 16 * 1024
"""One KEY=VALUE from the command line, read as YAML: four times STRING_CHARS, enough for a list of module names."""
LIST_ITEMS = 1024
"""Items in any list or mapping of the job (LoRA target modules, Slurm setup lines and extra options, sweep grid
values): a model has a few dozen distinct linear-layer names, a setup script a few dozen lines."""
ROW_BYTES = 16 * MB
"""One data row's text (its JSON Lines line, or the strings the job reads from it): 4M tokens of text, the
longest sequence (SEQ_LEN) at about 4 bytes a token. A longer document is several examples: split it. Strings
within the bound are still clipped to the sequence before tokenizing (launcher.worker.examples.clip)."""
SWEEP_VARIANTS = 1000
"""Variants of one sweep: Slurm's default MaxArraySize is 1001 (array indices 0 to 1000)."""

# -- the model ------------------------------------------------------------------------------------------------------
HIDDEN = 2**16
"""Model width, features: Llama 3.1 405B has 16384, PaLM 540B 18432; 65536 is 3.5x the widest."""
LAYERS = 512
"""Transformer blocks: Llama 3.1 405B has 126, PaLM 118, MT-NLG 530B 105; 512 is 4x the deepest. A meta-device
build costs ~3.5 ms per Llama block here (13 modules each), so 512 blocks build in ~2 s; 10^5 took 140 s and 5 GB."""
HEADS = 1024
"""Attention heads (and key/value heads): Llama 3.1 405B has 128; 1024 is 8x."""
INTERMEDIATE = 2**18
"""MLP width, features: Llama 3.1 405B has 53248; 262144 is ~5x."""
VOCAB = 2**20
"""Vocabulary, tokens: Gemma's and PaLM's 256k are the largest; 1048576 is 4x. Also the most classes of a seq_cls
head (each class is a row like a token's)."""
POSITIONS = 2**26
"""Position table, tokens: Llama 4 Scout's config says 10485760 (10M); 67108864 is 6x. A learned table (GPT-2,
BERT) holds positions x hidden parameters, which the planner counts; a RoPE table holds nothing per position."""
SEQ_LEN = 2**22
"""Tokens per training sequence: 4x the 1M-token contexts of long-context fine-tunes, and never past the model's
own position table (checked against it before the activation probe). The probe feeds this many real token ids
(8 bytes each: 32 MB at the bound) through fake tensors."""
EXPERTS = 2048
"""Routed experts per MoE layer: Qwen3-Next has 512, Kimi K2 384, DeepSeek-V3 256; 2048 is 4x."""
LORA_RANK = HIDDEN
"""LoRA rank, features: an adapter wider than the model is no low-rank adapter; real ones are 4 to 256."""

# -- the batch and the machines ------------------------------------------------------------------------------------
GLOBAL_BATCH = 2**20
"""Sequences per optimizer step: Llama 3's 16M-token batches are 2048 sequences of 8k; 1048576 is 500x. The planner
lists the divisors of the per-rank batch one by one (10^12 took longer than anyone waits)."""
GPUS_PER_NODE = 1024
"""Ranks per node: GPU nodes hold 4 to 16; CPU ranks up to a machine's cores (a 2-socket node has up to 384)."""
NODES = 2**16
"""Nodes: the largest training clusters have ~100k GPUs, 12.5k nodes of 8; 65536 is 5x."""
CPUS_PER_NODE = 4096
"""CPUs of one node (slurm.cpus_per_task, cluster.cpus_per_node): the largest 2-socket nodes have 384 cores, 768
hardware threads; 4096 is 5x."""
HOST_RAM_GB = 2**16
"""Host RAM of one node in Slurm's GB (GiB; slurm.mem_gb): the largest single-image machines hold 32 TB; 65536 is
2x. A larger one is a unit slip (MB for GB)."""
HOST_RAM_GB_MIN = 1.0
"""The least slurm.mem_gb taken: one rank's process alone peaks at 0.43 GB (docs/reliability/slurm.md), and
below 1 MB Slurm reads --mem=0 as the whole node."""


def over(where: str, value: int, limit: int, unit: str, why: str, fix: str) -> Problem | None:
    """The refusal of ``value`` past ``limit`` (``where``: the field), or None within it."""
    if value <= limit:
        return None
    return Problem(where, f"{value} {unit} is over the {limit} launcher plans for ({why}); {fix}")


def job_problems(job: Any) -> list[Problem]:
    """The job's numbers against the bounds: sequence, batch, micro-batch, ranks, the inline architecture, LoRA.

    Runs beside the job's other rules (config.jobfile.check_job), before anything reads a model or plans.
    """
    from launcher.config.job import InlineArch

    checks = [
        ("data.max_seq_len", job.data.max_seq_len, SEQ_LEN, "tokens", "4M-token sequences",
         "use a length the model's position table holds, e.g. --seq-len 4096"),
        ("train.global_batch_size", job.train.global_batch_size, GLOBAL_BATCH, "sequences",
         "a million sequences per step", "use e.g. global_batch_size: 512"),
        ("strategy.micro_batch_size", job.strategy.micro_batch_size or 0, GLOBAL_BATCH, "sequences",
         "a million sequences per step", "use e.g. micro_batch_size: 4 or leave it out"),
        ("gpus", job.gpus or 0, GPUS_PER_NODE, "ranks per node", "the densest nodes", "use e.g. --gpus 8"),
        ("cluster.gpus_per_node", job.cluster.gpus_per_node or 0, GPUS_PER_NODE, "ranks per node",
         "the densest nodes", "use e.g. gpus_per_node: 8"),
        ("nodes", job.nodes, NODES, "nodes", "5x the largest training clusters", "use e.g. --nodes 16"),
        ("cluster.cpus_per_node", job.cluster.cpus_per_node or 0, CPUS_PER_NODE, "CPUs",
         "5x the CPUs of the largest nodes", "give the CPUs `sinfo -o %c` lists for a node, e.g. 64"),
        ("data.num_labels", job.data.num_labels or 0, VOCAB, "classes", "4x the largest vocabularies",
         "leave it out to count the labels in the data"),
    ]
    if job.train.lora is not None:
        checks.append(("train.lora.r", job.train.lora.r, LORA_RANK, "features", "no adapter is wider than a model",
                       "use e.g. r: 16"))
    if isinstance(job.model, InlineArch):
        checks += arch_checks("model", {
            "hidden_size": job.model.hidden_size, "num_layers": job.model.num_layers,
            "num_heads": job.model.num_heads, "num_kv_heads": job.model.num_kv_heads,
            "intermediate_size": job.model.intermediate_size, "vocab_size": job.model.vocab_size,
            "max_position_embeddings": job.model.max_position_embeddings})
    return [p for p in (over(*c) for c in checks if c[1] is not None) if p]


_ARCH = {
    # kind: (bound, unit, why, fix)
    "hidden": (HIDDEN, "features", "3.5x the widest real model", "use a real model's width, e.g. 4096"),
    "layers": (LAYERS, "layers", "4x the deepest real model", "use a real model's depth, e.g. 32"),
    "heads": (HEADS, "heads", "8x a 405B model's", "use e.g. 32"),
    "intermediate": (INTERMEDIATE, "features", "5x a 405B model's MLP", "use e.g. 4x the hidden size"),
    "vocab": (VOCAB, "tokens", "4x the largest vocabularies", "use the tokenizer's size, e.g. 32000"),
    "positions": (POSITIONS, "tokens", "6x the longest real position table", "use e.g. 131072"),
    "experts": (EXPERTS, "experts", "4x the most experts of a real MoE", "use e.g. 64"),
}

# The config keys of each size, by the names transformers' families use (GPT-2's n_embd, T5's d_model, ...).
CONFIG_KEYS = {
    "hidden": ("hidden_size", "n_embd", "d_model", "dim"),
    "layers": ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "encoder_layers", "decoder_layers"),
    "heads": ("num_attention_heads", "n_head", "num_heads", "num_key_value_heads", "n_heads",
              "encoder_attention_heads", "decoder_attention_heads"),
    "intermediate": ("intermediate_size", "n_inner", "ffn_dim", "moe_intermediate_size",
                     "shared_expert_intermediate_size", "d_ff", "hidden_dim", "encoder_ffn_dim", "decoder_ffn_dim"),
    "vocab": ("vocab_size",),
    "positions": ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx"),
    "experts": ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts"),
}

_INLINE_KIND = {"hidden_size": "hidden", "num_layers": "layers", "num_heads": "heads", "num_kv_heads": "heads",
                "intermediate_size": "intermediate", "vocab_size": "vocab", "max_position_embeddings": "positions"}


def arch_checks(prefix: str, values: dict[str, Any]) -> list[tuple]:
    """``over`` arguments for an inline architecture's fields (``model.hidden_size`` ...)."""
    out = []
    for key, value in values.items():
        if isinstance(value, int) and not isinstance(value, bool):
            bound, unit, why, fix = _ARCH[_INLINE_KIND[key]]
            out.append((f"{prefix}.{key}", value, bound, unit, why, fix))
    return out


def _ints(value: Any) -> list[int]:
    """The whole numbers in a config value: itself, or the items of a per-layer list (OpenELM's widths)."""
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, (list, tuple)) and len(value) <= 100_000:
        return [v for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []


def _get(config: Any, key: str) -> Any:
    return config.get(key) if isinstance(config, dict) else getattr(config, key, None)


def config_problems(config: Any, where: str = "model") -> list[str]:
    """A model config's sizes against the bounds, before anything is built from it: the plain data of a config.json
    (checked before transformers is imported) or a transformers config; its text config too (a multimodal model
    keeps its language model's sizes there)."""
    problems: list[str] = []
    configs = [config]
    if isinstance(config, dict):
        inner = config.get("text_config")
    else:
        text = getattr(config, "get_text_config", None)
        try:
            inner = text() if callable(text) else None
        except Exception:  # a config class whose text-config lookup fails has no separate text config to check
            inner = None
    if isinstance(inner, dict) or inner is not None and not isinstance(config, dict) and inner is not config:
        configs.append(inner)
    seen: set[str] = set()
    for cfg in configs:
        for kind, keys in CONFIG_KEYS.items():
            bound, unit, why, fix = _ARCH[kind]
            for key in keys:
                values = _ints(_get(cfg, key))
                if not values or key in seen:
                    continue
                problem = over(f"{where}: config.json's {key}", max(values), bound, unit, why,
                               f"{fix} (is this config.json the model's own?)")
                if problem:
                    seen.add(key)
                    problems.append(str(problem))
    return problems
