"""The accuracy matrix: which configurations run, the job file each becomes, and the fit / held-out split.

Axes (values): precision (fp32, bf16), task (causal_lm, seq_cls, sentence_embedding), model (tiny GPT-2 1.3M,
tiny Llama 7M with GQA and a SwiGLU MLP, MiniLM 22.7M, GPT-2 124M), LoRA (off, on), gradient accumulation
(1, 2), sequence length (64 to 1024 tokens), ranks (2, 4), sharding (ZeRO-1, ZeRO-2, ZeRO-3, ZeRO-3 + CPU
optimizer offload, FSDP2 full-shard and grad-op-shard, FSDP2 with CPU offload) and activation checkpointing.
The full product is thousands of runs; on 2 shared cores the matrix is a hand-laid list (MATRIX) in which
every axis value appears several times, fp32 in most cells (bf16 may be slow on a CPU without native bf16),
the 124M and 1024-token cells sized so that two ranks stay under ~5 GB of host RAM.

The split (split()) is a hash of the cell's name with a salt: the smallest salt for which both halves hold
every axis value and neither half is more than 60 % of the cells. It depends on the names alone, so adding a
cell never moves another cell across the split unless the salt has to change (the results file names it).
Every constant fitted to measurements (launcher/calibrate/fit.py, `launch calibrate --from`) is fitted on the
"fit" cells only; the headline error is the "held-out" cells'.

Each run takes STEPS optimizer steps (global batch = ranks x micro-batch x accumulation) with no evaluation
(eval_fraction 0) under a budget nobody comes near, so every run completes and reports its peak (BUDGET; a cell
that sets its own budget, to size DeepSpeed's reduce bucket below the model, still sets it above its peak).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from benchmarks.accuracy.harness import DATA
from launcher.levers import EXACT, LEVERS_OFF

RANKS = 2
"""Default ranks of a cell."""
STEPS = 2
"""Optimizer steps per run: the second step's backward starts with the optimizer state allocated."""
BUDGET = "16GB"

SHARDINGS: dict[str, dict] = {
    "z0": {"engine": "deepspeed", "zero_stage": 0, "offload_optimizer": "none", "offload_params": "none"},
    "z1": {"engine": "deepspeed", "zero_stage": 1, "offload_optimizer": "none", "offload_params": "none"},
    "z2": {"engine": "deepspeed", "zero_stage": 2, "offload_optimizer": "none", "offload_params": "none"},
    "z3": {"engine": "deepspeed", "zero_stage": 3, "offload_optimizer": "none", "offload_params": "none"},
    "z3off": {"engine": "deepspeed", "zero_stage": 3, "offload_optimizer": "cpu", "offload_params": "none"},
    "fsdp": {"engine": "fsdp", "fsdp_reshard_after_forward": True, "offload_optimizer": "none",
             "offload_params": "none"},
    "fsdp-noreshard": {"engine": "fsdp", "fsdp_reshard_after_forward": False, "offload_optimizer": "none",
                       "offload_params": "none"},
    "fsdpoff": {"engine": "fsdp", "fsdp_reshard_after_forward": True, "offload_optimizer": "cpu",
                "offload_params": "cpu"},
    # One rank: no wrapper; more: DDP replicas (the layout follows the ranks).
    "plain": {"engine": "plain", "offload_optimizer": "none", "offload_params": "none"},
}
SHARDING_LABEL = {"z0": "ZeRO-0", "z1": "ZeRO-1", "z2": "ZeRO-2", "z3": "ZeRO-3", "z3off": "ZeRO-3 +opt->cpu",
                  "fsdp": "FSDP2 reshard", "fsdp-noreshard": "FSDP2 no-reshard", "fsdpoff": "FSDP2 +offload",
                  "plain": "plain (1 rank) / DDP"}
MODELS: dict[str, dict | str] = {
    "gpt2s": {"family": "gpt2", "hidden_size": 128, "num_layers": 4, "num_heads": 4, "vocab_size": 4096,
              "max_position_embeddings": 1024},
    "llama": {"family": "llama", "hidden_size": 256, "num_layers": 4, "num_heads": 4, "num_kv_heads": 2,
              "vocab_size": 8192, "max_position_embeddings": 1024},
    "minilm": "all-MiniLM-L6-v2",
    "gpt2-124m": "gpt2-124m",
    # Validation-only models (VALIDATION): widths, depths and vocabularies no earlier cell used.
    "gpt2m": {"family": "gpt2", "hidden_size": 256, "num_layers": 6, "num_heads": 8, "vocab_size": 16384,
              "max_position_embeddings": 1024},
    "llama6": {"family": "llama", "hidden_size": 192, "num_layers": 6, "num_heads": 6, "num_kv_heads": 2,
               "vocab_size": 6144, "max_position_embeddings": 1024},
    # BWDEND_VALIDATION_2 only: a GPT-2 of 0.38M parameters, under the planner's 1M-element bucket floor
    # (planner/buckets.py MIN_BUCKET), so its reduce bucket is larger than the model (every other cell's is the model).
    "gpt2xs": {"family": "gpt2", "hidden_size": 64, "num_layers": 3, "num_heads": 4, "vocab_size": 3072,
               "max_position_embeddings": 512},
}
LORA_TARGETS = {"gpt2s": ["c_attn"], "gpt2-124m": ["c_attn"], "llama": ["q_proj", "v_proj"],
                "minilm": ["query", "value"], "gpt2m": ["c_attn"], "llama6": ["q_proj", "v_proj"], "gpt2xs": ["c_attn"]}
"""Each family's usual attention targets (peft's defaults for these architectures)."""


@dataclass(frozen=True, slots=True)
class Cell:
    sharding: str
    model: str
    """A key of MODELS."""
    checkpointing: bool
    micro_batch: int
    seq_len: int
    task: str = "causal_lm"
    precision: str = "fp32"
    ranks: int = RANKS
    accum: int = 1
    """Gradient accumulation steps."""
    lora: bool = False
    levers: tuple[tuple[str, object], ...] = ()
    """(strategy field, value) of the levers beyond sharding (launcher.planner.levers), pinned; the math-changing
    ones are allowed in train.allow_levers."""
    budget: str = BUDGET
    """The run's per-rank budget (`launch --budget`). The plan sizes DeepSpeed's reduce bucket from it (2 % of the
    usable budget, launcher.planner.buckets): BUDGET clamps it to the trainable parameters (one flush at the end
    of backward); a smaller budget gives a bucket smaller than the model, flushed during backward."""

    @property
    def name(self) -> str:
        ac = "ac" if self.checkpointing else "noac"
        task = {"causal_lm": "clm", "seq_cls": "cls", "sentence_embedding": "emb"}[self.task]
        extra = "".join([f"-ga{self.accum}" if self.accum > 1 else "", "-lora" if self.lora else "",
                         *(f"-{LEVER_WORDS[k](v)}" for k, v in self.levers),
                         f"-b{self.budget}" if self.budget != BUDGET else ""])
        return (f"{self.sharding}-{self.model}-{task}-{self.precision}-{ac}-mb{self.micro_batch}-s{self.seq_len}"
                f"-r{self.ranks}{extra}")

    def axes(self) -> dict[str, object]:
        """The axis values the split must show on both sides."""
        return {"precision": self.precision, "task": self.task, "model": self.model, "lora": self.lora,
                "accum": self.accum > 1, "ranks": self.ranks, "sharding": self.sharding,
                "checkpointing": self.checkpointing, "long": self.seq_len >= 512}

    def job(self) -> dict:
        # A cell without levers ran (or runs) with every lever off: pinned, so the planner's free choice of an exact
        # lever (e.g. every 2nd block checkpointed, faster than every block) cannot change what it measures. A
        # lever cell pins its own levers and leaves the others to the planner (its label says what ran).
        off = {} if self.levers else {name: LEVERS_OFF[name] for name in EXACT}
        strategy = {**SHARDINGS[self.sharding], "micro_batch_size": self.micro_batch,
                    "activation_checkpointing": self.checkpointing, **off, **dict(self.levers)}
        model = MODELS[self.model]
        model = dict(model) if isinstance(model, dict) else model
        if self.task == "sentence_embedding":
            data = {"path": str(DATA / "pairs.jsonl"), "text_field": "text", "pair_field": "positive"}
        elif self.task == "seq_cls":
            data = {"path": str(DATA / "sentiment.jsonl"), "text_field": "text", "label_field": "label"}
        else:
            data = {"path": str(DATA / "causal.jsonl"), "text_field": "text"}
        data.update(max_seq_len=self.seq_len, eval_fraction=0.0)
        train = {"global_batch_size": self.ranks * self.micro_batch * self.accum, "precision": self.precision,
                 "lr": 1.0e-4, "max_steps": STEPS}
        if self.lora:
            train["lora"] = {"r": 8, "alpha": 16, "target_modules": LORA_TARGETS[self.model]}
        allow = [str(v) if k == "low_memory_optimizer" else k for k, v in self.levers
                 if k in ("low_memory_optimizer", "pure_bf16", "qlora") and v not in (False, "none")]
        if allow:
            train["allow_levers"] = allow
        return {"name": self.name, "model": model, "task": self.task, "data": data, "train": train,
                "strategy": strategy, "cluster": {"hardware": "cpu"}}


LEVER_WORDS = {
    "loss_chunks": lambda v: f"ce{v}", "checkpoint_every": lambda v: f"k{v}", "activation_offload": lambda v: "aoff",
    "optimizer_in_backward": lambda v: "oib", "low_memory_optimizer": lambda v: str(v),
    "pure_bf16": lambda v: "pbf16", "qlora": lambda v: "qlora", "checkpoint_policy": lambda v: f"sac{v}",
    "release_frozen_weights": lambda v: "relw",
}
"""How each lever shows in a cell's name."""


def _c(sharding, model, task, precision, ac, mb, seq, ranks=2, accum=1, lora=False, budget=BUDGET, **levers) -> Cell:
    return Cell(sharding, model, ac, mb, seq, task, precision, ranks, accum, lora, tuple(levers.items()), budget)


MATRIX: tuple[Cell, ...] = (
    # tiny GPT-2 causal LM: every sharding, short and long sequences, fp32 mostly
    _c("z1", "gpt2s", "causal_lm", "fp32", False, 2, 256),
    _c("z2", "gpt2s", "causal_lm", "fp32", False, 1, 1024),
    _c("z2", "gpt2s", "causal_lm", "bf16", False, 2, 128),
    _c("z3", "gpt2s", "causal_lm", "fp32", True, 2, 512),
    _c("z3off", "gpt2s", "causal_lm", "fp32", False, 1, 512, accum=2),
    _c("fsdp", "gpt2s", "causal_lm", "fp32", False, 2, 512),
    _c("fsdp-noreshard", "gpt2s", "causal_lm", "fp32", True, 1, 1024),
    _c("fsdp", "gpt2s", "causal_lm", "bf16", True, 2, 256, ranks=4),
    _c("z2", "gpt2s", "causal_lm", "fp32", False, 1, 256, ranks=4, accum=2),
    _c("z1", "gpt2s", "causal_lm", "fp32", True, 1, 1024, lora=True),
    _c("fsdpoff", "gpt2s", "causal_lm", "fp32", False, 1, 256, lora=True),
    # tiny Llama (GQA, SwiGLU, untied head)
    _c("z1", "llama", "causal_lm", "fp32", False, 1, 512),
    _c("z2", "llama", "causal_lm", "fp32", True, 2, 512, accum=2),
    _c("z3", "llama", "causal_lm", "bf16", False, 1, 256),
    _c("fsdp", "llama", "causal_lm", "fp32", False, 1, 1024),
    _c("fsdp-noreshard", "llama", "causal_lm", "fp32", False, 2, 256, lora=True),
    _c("z3", "llama", "causal_lm", "fp32", False, 1, 256, ranks=4),
    _c("fsdpoff", "llama", "causal_lm", "fp32", True, 1, 512, lora=True),
    _c("z2", "llama", "causal_lm", "fp32", False, 1, 1024, lora=True, accum=2),
    # MiniLM: sentence embedding and classification
    _c("z2", "minilm", "seq_cls", "fp32", False, 4, 128),
    _c("z1", "minilm", "seq_cls", "bf16", False, 4, 64),
    _c("fsdp", "minilm", "seq_cls", "fp32", True, 4, 256),
    _c("z3", "minilm", "seq_cls", "fp32", False, 2, 128, ranks=4),
    _c("z3off", "minilm", "seq_cls", "fp32", False, 4, 128, lora=True),
    _c("fsdp-noreshard", "minilm", "seq_cls", "fp32", False, 8, 256, accum=2),
    _c("z2", "minilm", "sentence_embedding", "fp32", False, 2, 256),
    _c("z3", "minilm", "sentence_embedding", "fp32", True, 4, 128),
    _c("fsdp", "minilm", "sentence_embedding", "bf16", False, 2, 128),
    _c("z1", "minilm", "sentence_embedding", "fp32", False, 2, 512, ranks=4, lora=True),
    _c("fsdp-noreshard", "minilm", "sentence_embedding", "fp32", False, 4, 256, accum=2),
    # GPT-2 124M: real widths, LoRA at long sequences
    _c("z2", "gpt2-124m", "causal_lm", "fp32", True, 1, 1024, lora=True),
    _c("fsdp", "gpt2-124m", "causal_lm", "fp32", False, 1, 512, lora=True),
    _c("z3", "gpt2-124m", "causal_lm", "fp32", False, 1, 256),
    _c("z1", "gpt2-124m", "causal_lm", "bf16", False, 1, 256, lora=True),
)


SEEN_VALIDATION: tuple[Cell, ...] = (
    # The first validation split (2026-11-24): committed before any of them ran and out of sample for the planner
    # of that day. Its three MiniLM misses (ZeRO-3 init, ZeRO-3 LoRA activations, FSDP2's root re-gather) informed
    # the fixes of 2026-11-25, so it is reported as "validation-1 (seen)", no longer out of sample.
    _c("z3", "minilm", "seq_cls", "fp32", False, 2, 64, lora=True),
    _c("z3off", "gpt2m", "causal_lm", "fp32", False, 2, 256),
    _c("z3off", "minilm", "sentence_embedding", "fp32", False, 2, 96, ranks=4, lora=True),
    _c("z3", "gpt2m", "causal_lm", "fp32", False, 1, 384, accum=2),
    _c("fsdp", "minilm", "seq_cls", "fp32", False, 4, 96),
    _c("fsdp", "gpt2m", "causal_lm", "fp32", True, 2, 512, ranks=4),
    _c("z1", "llama6", "causal_lm", "fp32", True, 2, 384, lora=True),
    _c("z3", "llama6", "causal_lm", "fp32", True, 1, 768),
    _c("fsdp", "llama6", "causal_lm", "bf16", False, 2, 256),
)
"""The first validation split, seen since (see above)."""

VALIDATION: tuple[Cell, ...] = (
    # Decided and committed (2026-11-25) before any of them ran, after the init, ZeRO-3 memory_efficient_linear and
    # FSDP2 root re-gather fixes: the cells out of sample for the current planner; never read by any fit. Each
    # pairs a sharding, model, task, length and micro-batch no earlier cell used; the three kinds of cell the first
    # validation split missed (pretrained MiniLM under ZeRO-3 + LoRA and under FSDP2) are here again, new.
    _c("z3", "minilm", "sentence_embedding", "fp32", False, 4, 80, lora=True),
    _c("fsdp", "minilm", "seq_cls", "fp32", False, 2, 160, ranks=4),
    _c("z2", "gpt2-124m", "causal_lm", "fp32", False, 1, 384, accum=2, lora=True),
    _c("fsdp", "llama6", "causal_lm", "fp32", False, 1, 1024, lora=True),
    _c("z1", "minilm", "seq_cls", "bf16", False, 8, 48, lora=True),
    _c("z3off", "gpt2m", "causal_lm", "bf16", True, 2, 512, accum=2),
    _c("fsdpoff", "minilm", "sentence_embedding", "fp32", False, 2, 192, lora=True),
    _c("z2", "llama6", "seq_cls", "fp32", False, 4, 256, ranks=4),
    _c("fsdp-noreshard", "gpt2m", "causal_lm", "bf16", False, 1, 768),
    _c("z3", "gpt2-124m", "causal_lm", "fp32", True, 1, 512, lora=True),
)
"""The validation split: run once, with the planner as it stands, to judge it where nothing was tuned."""


LEVER_DEV: tuple[Cell, ...] = (
    # The levers of issue 21 (launcher.planner.levers), one or two cells each, on the matrix's models: what each
    # lever's memory term was built against (seen, like the fit side).
    _c("z2", "gpt2s", "causal_lm", "fp32", False, 2, 256, loss_chunks=8),
    _c("fsdp", "llama", "causal_lm", "fp32", False, 1, 512, loss_chunks=8),
    _c("fsdp", "llama", "causal_lm", "fp32", True, 1, 512, checkpoint_every=2),
    _c("z2", "gpt2s", "causal_lm", "fp32", True, 2, 512, checkpoint_every=2),
    _c("fsdp", "gpt2s", "causal_lm", "fp32", True, 2, 512, activation_offload=True),
    _c("z3", "gpt2s", "causal_lm", "fp32", False, 2, 256, activation_offload=True),
    _c("fsdp", "gpt2s", "causal_lm", "fp32", False, 2, 256, optimizer_in_backward=True),
    _c("fsdp", "gpt2s", "causal_lm", "fp32", False, 2, 256, low_memory_optimizer="adamw8bit"),
    _c("fsdp", "llama", "causal_lm", "fp32", False, 1, 256, low_memory_optimizer="adamw4bit"),
    _c("fsdp", "minilm", "seq_cls", "fp32", False, 4, 128, low_memory_optimizer="adafactor"),
    _c("z2", "gpt2s", "causal_lm", "fp32", False, 2, 256, low_memory_optimizer="adamw8bit"),
    # DeepSpeed's client optimizer (issue 21): a flat partition torchao quantizes (GPT-2-small's 724,352 elements
    # per rank: a multiple of 128, not of 256, so the 8-bit cell above keeps fp32 moments), and ZeRO-0's per-tensor
    # Adafactor.
    _c("z1", "gpt2s", "causal_lm", "fp32", False, 2, 256, low_memory_optimizer="adamw4bit"),
    _c("z0", "gpt2s", "causal_lm", "fp32", False, 2, 256, low_memory_optimizer="adafactor"),
    _c("z0", "gpt2s", "causal_lm", "fp32", False, 2, 256),  # its AdamW twin: ZeRO-0's fp32 terms, never measured before
    _c("fsdp", "llama", "causal_lm", "bf16", False, 1, 256, pure_bf16=True),
    _c("fsdp", "llama", "causal_lm", "fp32", False, 2, 256, lora=True, qlora=True),
    _c("fsdp", "llama", "causal_lm", "fp32", True, 1, 512, checkpoint_policy="ops"),
    _c("fsdp", "llama", "causal_lm", "fp32", True, 2, 256, checkpoint_policy="ops", checkpoint_every=2),
)
"""Lever cells the implementation was developed and checked against (seen)."""

LEVER_VALIDATION: tuple[Cell, ...] = (
    # Decided and committed (2026-11-25 18:55 UTC) before any lever was implemented: out of sample for every lever
    # term, never run before the terms were final. Models, lengths and engines the development cells did not use.
    _c("fsdp", "gpt2m", "causal_lm", "fp32", False, 1, 768, loss_chunks=8),
    _c("z3", "llama6", "causal_lm", "fp32", True, 2, 512, checkpoint_every=2),
    _c("fsdp", "llama6", "causal_lm", "fp32", True, 1, 1024, activation_offload=True),
    _c("fsdp", "gpt2m", "causal_lm", "fp32", False, 2, 384, ranks=4, optimizer_in_backward=True),
    _c("z2", "gpt2m", "causal_lm", "fp32", False, 1, 512, low_memory_optimizer="adamw8bit"),
    _c("fsdp", "minilm", "sentence_embedding", "fp32", False, 4, 96, low_memory_optimizer="adafactor"),
    _c("fsdp", "gpt2m", "causal_lm", "bf16", False, 1, 256, pure_bf16=True),
    _c("fsdp", "llama6", "causal_lm", "fp32", False, 2, 384, lora=True, qlora=True),
    _c("fsdp", "llama6", "causal_lm", "fp32", False, 2, 384, low_memory_optimizer="adamw4bit", loss_chunks=8),
    _c("fsdp", "gpt2-124m", "causal_lm", "fp32", True, 1, 512, lora=True, loss_chunks=8, checkpoint_every=2),
)
"""The levers' validation split: run once, at the end, to judge the lever terms where nothing was tuned."""

PURE_BF16_SR_VALIDATION: tuple[Cell, ...] = (
    # Decided and committed (2026-11-25 22:45 UTC) before pure bf16's stochastically rounded step and its memory
    # term (terms.SR_STEP_COPIES) ran on any rank: out of sample for that term. A model and length no pure-bf16
    # cell used, and the step in backward with pure bf16 (the rounding copies in the root's gradient hook).
    _c("fsdp", "llama6", "causal_lm", "bf16", False, 1, 128, pure_bf16=True),
    _c("fsdp", "gpt2s", "causal_lm", "bf16", True, 2, 384, pure_bf16=True, optimizer_in_backward=True),
)
"""The stochastic-rounding validation split: run once, after the change, to judge its step term."""

EXPORT_VALIDATION: tuple[Cell, ...] = (
    # Decided and committed (2026-11-25 23:22 UTC) before either ran: the CPU-rank export moment (memory.py,
    # rank 0's saved copy beside the state the step leaves) was checked only on plan_quality's tiny GPT-2 and the
    # MiniLM CLI test. Full fp32 fine-tunes at 32 tokens, where the weights dwarf the activations and the export is
    # expected to be the peak: FSDP2's one-tensor-at-a-time gather and ZeRO-2's replicated copy.
    _c("fsdp", "gpt2m", "causal_lm", "fp32", False, 1, 32),
    _c("z2", "llama6", "causal_lm", "fp32", False, 1, 32),
)
"""The export moment's validation split: run once, to judge the moment where it is the peak."""

EXPORT_VALIDATION_2: tuple[Cell, ...] = (
    # Decided and committed (2026-11-25 23:26 UTC) after the export moment was changed to start from the state that
    # outlives the step (EXPORT_VALIDATION showed it over by 37-50 %) and before either cell ran: an untied head
    # gathered last (FSDP2, the Llama's lm_head) and ZeRO-3's module-by-module gather, neither in the first split.
    _c("fsdp", "llama6", "causal_lm", "fp32", False, 1, 32),
    _c("z3", "gpt2m", "causal_lm", "fp32", False, 1, 32),
)
"""The export moment's second validation split, for the changed term."""

SAC_VALIDATION: tuple[Cell, ...] = (
    # Op-level selective checkpointing (Strategy.checkpoint_policy "ops"), decided and committed (2026-11-25 23:10
    # UTC) before its memory term existed: run once when the term is final. Development used tiny llama only.
    _c("fsdp", "llama6", "causal_lm", "fp32", True, 2, 512, checkpoint_policy="ops"),
    _c("fsdp", "llama6", "causal_lm", "fp32", True, 1, 1024, checkpoint_policy="ops", checkpoint_every=2),
    _c("fsdp", "gpt2m", "causal_lm", "fp32", True, 1, 768, checkpoint_policy="ops"),
)
"""Op-level selective checkpointing's validation split (out of sample, run once)."""

SAC_DS_DEV: tuple[Cell, ...] = (
    # Op-level selective checkpointing on DeepSpeed (issue 21: transformers' checkpointing with the op policy's
    # context_fn), development cells: the tiny Llama on ZeRO-2 and ZeRO-3.
    _c("z2", "llama", "causal_lm", "fp32", True, 1, 512, checkpoint_policy="ops"),
    _c("z3", "llama", "causal_lm", "fp32", True, 2, 256, checkpoint_policy="ops"),
)
"""Op-level selective checkpointing on DeepSpeed, development cells (seen)."""

SAC_DS_VALIDATION: tuple[Cell, ...] = (
    # Decided and committed (2026-11-26 05:00 UTC) before DeepSpeed offered checkpoint_policy "ops": run once when
    # its rank side and terms are final. Models, stages and lengths its development cells did not use.
    _c("z1", "gpt2m", "causal_lm", "fp32", True, 1, 768, checkpoint_policy="ops"),
    _c("z3", "llama6", "causal_lm", "fp32", True, 1, 1024, checkpoint_policy="ops", checkpoint_every=2),
)
"""Op-level selective checkpointing on DeepSpeed, validation split (out of sample, run once)."""


BWDEND_DEV: tuple[Cell, ...] = (
    # The end-of-backward moment at short sequences (issue 21: FSDP2 -13.8 % and ZeRO-3 -9.6 % on the tied GPT-2,
    # ZeRO-2 -13.0 % on the Llama, EXPORT_VALIDATION/_2): development cells on the matrix's models, 32 tokens, fp32,
    # where the weights dwarf the activations. Tied embeddings (tiny GPT-2) on FSDP2, ZeRO-2 and ZeRO-3; untied (tiny
    # Llama) on ZeRO-2.
    _c("fsdp", "gpt2s", "causal_lm", "fp32", False, 1, 32),
    _c("z3", "gpt2s", "causal_lm", "fp32", False, 1, 32),
    _c("z2", "llama", "causal_lm", "fp32", False, 1, 32),
    _c("z2", "gpt2s", "causal_lm", "fp32", False, 1, 32),
    # ZeRO-1's end of backward (issue 21, 2026-11-26 04:30): never measured before; tied and untied.
    _c("z1", "gpt2s", "causal_lm", "fp32", False, 1, 32),
    _c("z1", "llama", "causal_lm", "fp32", False, 1, 32),
)
"""End-of-backward development cells (seen)."""

BWDEND_VALIDATION: tuple[Cell, ...] = (
    # Decided and committed (2026-11-26 01:53 UTC) before the end-of-backward terms (FSDP2's and ZeRO-2's tied
    # embedding gradient, ZeRO-2's flattened bucket) ran on any cell: out of sample for them, run once when they are
    # final. Models, lengths, rank counts and a precision the development cells (BWDEND_DEV) did not use: the 16k
    # vocabulary GPT-2 on FSDP2 over 4 ranks and on ZeRO-2 at micro-batch 2, and the 6-block Llama in bf16.
    _c("fsdp", "gpt2m", "causal_lm", "fp32", False, 1, 64, ranks=4),
    _c("z2", "gpt2m", "causal_lm", "fp32", False, 2, 48),
    _c("z2", "llama6", "causal_lm", "bf16", False, 1, 64),
)
"""The end-of-backward validation split (out of sample, run once)."""

BWDEND_VALIDATION_2: tuple[Cell, ...] = (
    # Decided and committed (2026-11-26 04:35 UTC) before ZeRO-3's and ZeRO-1's end-of-backward terms were written
    # or any ZeRO-1 cell of BWDEND_DEV ran: out of sample for them, run once when they are final. Models, lengths,
    # micro-batches and buckets the development cells did not use: ZeRO-3 on a GPT-2 smaller than its reduce bucket
    # (gpt2xs, the 1M-element floor) at micro-batch 2, and ZeRO-1 on the untied 6-block Llama over 4 ranks.
    _c("z3", "gpt2xs", "causal_lm", "fp32", False, 2, 24),
    _c("z1", "llama6", "causal_lm", "fp32", False, 1, 40, ranks=4),
)
"""The second end-of-backward validation split (ZeRO-3 and ZeRO-1; out of sample, run once)."""


DS_PURE_BF16_DEV: tuple[Cell, ...] = (
    # Pure bf16 on DeepSpeed (issue 21: bf16_master_weights_and_grads + bf16_optimizer_states, the stochastically
    # rounding client optimizer): development cells on the matrix's small models at 32 tokens, where the model states
    # dwarf the activations. ZeRO-1 and ZeRO-2 on the tied GPT-2 (one flat partition), ZeRO-3 on the untied Llama.
    _c("z2", "gpt2s", "causal_lm", "bf16", False, 1, 32, pure_bf16=True),
    _c("z1", "gpt2s", "causal_lm", "bf16", False, 1, 32, pure_bf16=True),
    _c("z3", "llama", "causal_lm", "bf16", False, 1, 32, pure_bf16=True),
)
"""DeepSpeed pure-bf16 development cells (seen)."""

DS_PURE_BF16_VALIDATION: tuple[Cell, ...] = (
    # Decided and committed (2026-11-26 04:35 UTC) before DeepSpeed's pure bf16 ran on any rank or its terms were
    # written: out of sample for them, run once when they are final. Models, micro-batches and lengths the
    # development cells (DS_PURE_BF16_DEV) did not use: the 6-block Llama on ZeRO-2, the 16k-vocabulary GPT-2 on
    # ZeRO-3.
    _c("z2", "llama6", "causal_lm", "bf16", False, 2, 48, pure_bf16=True),
    _c("z3", "gpt2m", "causal_lm", "bf16", False, 1, 64, pure_bf16=True),
)
"""DeepSpeed pure bf16's validation split (out of sample, run once)."""

CURRENT_VALIDATION: tuple[Cell, ...] = (
    # Decided and committed (2026-11-26 07:50 UTC) before any of them ran, on the planner of stop 26 (memory.py
    # 5ea69a23dab3): the whole-space check of the current planner, out of sample for everything since VALIDATION
    # (2026-11-25), whose headline no longer described it. Each cell pairs a sharding, model, task, length and
    # micro-batch no earlier cell used, and together they take the gaps stop 26 left: ZeRO-3's end of backward under
    # LoRA, ZeRO-1 in bf16 (full and LoRA), DeepSpeed's pure bf16 at ZeRO-1 and its op-level checkpointing on a
    # GPT-2; then one cell per FSDP2 lever on a model or length its development and validation cells did not use.
    _c("z3", "llama6", "causal_lm", "fp32", False, 2, 192, lora=True),
    _c("z1", "gpt2m", "causal_lm", "bf16", False, 1, 320),
    _c("z1", "llama6", "causal_lm", "bf16", False, 2, 160, lora=True),
    _c("z2", "minilm", "seq_cls", "bf16", False, 8, 96),
    _c("z3off", "llama6", "causal_lm", "fp32", True, 1, 640, accum=2),
    _c("z1", "gpt2m", "causal_lm", "bf16", False, 2, 96, pure_bf16=True),
    _c("z3", "gpt2m", "causal_lm", "fp32", True, 1, 448, checkpoint_policy="ops"),
    # Was ZeRO-2 + Adafactor, which the planner refuses (ZeRO-1/2 hand the optimizer one flat partition): replaced
    # by ZeRO-0 + Adafactor before any measurement of it (its run stopped at planning, exit 2).
    _c("z0", "llama6", "causal_lm", "fp32", False, 1, 288, low_memory_optimizer="adafactor"),
    _c("fsdp", "gpt2-124m", "causal_lm", "bf16", False, 1, 320, loss_chunks=4),
    _c("fsdp-noreshard", "llama6", "causal_lm", "fp32", True, 2, 256, checkpoint_policy="ops", checkpoint_every=3),
    _c("fsdpoff", "gpt2m", "causal_lm", "fp32", False, 2, 192, lora=True),
    _c("fsdp", "minilm", "sentence_embedding", "fp32", False, 8, 64, ranks=4, optimizer_in_backward=True),
    _c("fsdp", "gpt2m", "causal_lm", "fp32", False, 2, 320, activation_offload=True),
    _c("fsdp", "llama", "causal_lm", "fp32", False, 1, 640, lora=True, qlora=True),
)
"""The current planner's validation split (stop 27): run once, to say how the planner as it stands does where
nothing was tuned."""

Z3_PIN_VALIDATION: tuple[Cell, ...] = (
    # Decided and committed (2026-11-26 08:38 UTC) before the ZeRO-3 change it judges was written: CURRENT_VALIDATION's
    # ZeRO-3 + LoRA Llama miss (-11.1 %) traced to autograd keeping weight.t() of every frozen nn.Linear, a view that
    # pins DeepSpeed's gathered storage past free_param until that layer's backward (memory_efficient_linear off).
    # The change: the pinned linears counted under LoRA, and DeepSpeed's default linear (no pin) for full
    # fine-tunes. Models, lengths and micro-batches no ZeRO-3 cell used: LoRA on the 4-block Llama without and with
    # checkpointing, LoRA on MiniLM (whose largest layer, the word table, outweighs its linears), a full fine-tune
    # of the 6-block Llama, and LoRA on GPT-2's Conv1D blocks (no nn.Linear but the head).
    _c("z3", "llama", "causal_lm", "fp32", False, 2, 176, lora=True),
    _c("z3", "llama", "causal_lm", "fp32", True, 1, 352, lora=True),
    _c("z3", "minilm", "seq_cls", "fp32", False, 8, 40, lora=True),
    _c("z3", "llama6", "causal_lm", "fp32", False, 1, 224),
    _c("z3", "gpt2m", "causal_lm", "fp32", False, 2, 112, lora=True),
)
"""ZeRO-3's pinned-linear validation split (out of sample for that change, run once)."""

Z3_RELEASE_VALIDATION: tuple[Cell, ...] = (
    # Decided and committed (2026-11-26 11:10 UTC) before the lever it judges was written: under LoRA, ZeRO-3's
    # frozen linears run DeepSpeed's LinearFunctionForZeroStage3 (memory_efficient_linear), which saves the Parameter
    # and every input instead of torch's weight.t(), so the gathered weights go after forward and the frozen linears'
    # inputs are saved instead (Strategy.release_frozen_weights). Shapes no ZeRO-3 cell used: the 4-block Llama
    # without checkpointing, the 6-block Llama in bf16 with every 2nd block checkpointed, MiniLM's classifier,
    # GPT-2's Conv1D blocks (only its head is an nn.Linear), and the Llama with its parameters offloaded.
    _c("z3", "llama", "causal_lm", "fp32", False, 1, 288, lora=True, release_frozen_weights=True),
    _c("z3", "llama6", "causal_lm", "bf16", True, 2, 160, lora=True, release_frozen_weights=True,
       checkpoint_every=2),
    _c("z3", "minilm", "seq_cls", "fp32", False, 4, 96, lora=True, release_frozen_weights=True),
    _c("z3", "gpt2m", "causal_lm", "fp32", False, 1, 208, lora=True, release_frozen_weights=True),
    _c("z3off", "llama", "causal_lm", "fp32", False, 2, 136, lora=True, release_frozen_weights=True),
)
"""ZeRO-3's released frozen weights validation split (out of sample for that lever, run once)."""

SAC_Z3LORA_VALIDATION: tuple[Cell, ...] = (
    # Decided and committed (2026-11-26 13:50 UTC) before ZeRO-3 under LoRA offered op-level selective checkpointing
    # again (refused since stop 28: its replay counted ZeRO-3's parameter fetch and release): the SAC terms are the
    # fake-tensor probe's, engine-independent, but this combination never ran on real ranks. Shapes no ZeRO-3 cell
    # used: the 4-block Llama in fp32 on torch's linear, the 6-block Llama in bf16 with every 2nd block checkpointed on
    # DeepSpeed's memory_efficient_linear, GPT-2's Conv1D blocks (addmm: the policy saves attention's outputs only).
    _c("z3", "llama", "causal_lm", "fp32", True, 1, 320, lora=True, checkpoint_policy="ops"),
    _c("z3", "llama6", "causal_lm", "bf16", True, 2, 144, lora=True, checkpoint_policy="ops", checkpoint_every=2,
       release_frozen_weights=True),
    _c("z3", "gpt2m", "causal_lm", "fp32", True, 1, 400, lora=True, checkpoint_policy="ops"),
)
"""Op-level selective checkpointing at ZeRO-3 under LoRA, validation split (out of sample, run once)."""


PLAIN_VALIDATION: tuple[Cell, ...] = (
    # Decided and committed (2026-11-29 08:40 UTC) before any of them ran: the plain engine (issue 37 §5) had run
    # only the tiny GPT-2 of tests/cli/test_plain_cli.py (fp32, one rank and two) and the step contract's job. One
    # cell per path of its memory terms, on models, lengths and micro-batches those did not use: one rank with no
    # wrapper at fp32 (the optimizer over the parameters), bf16 LoRA with checkpointing (fp32 masters of the
    # adapters), QLoRA's NF4 base, the step in backward with masters; DDP's persistent buckets at fp32 on MiniLM's
    # classifier, with bf16 masters and accumulation (no_sync), and under pure bf16.
    _c("plain", "llama6", "causal_lm", "fp32", False, 2, 200, ranks=1),
    _c("plain", "gpt2m", "causal_lm", "bf16", True, 1, 264, ranks=1, lora=True),
    _c("plain", "llama", "causal_lm", "bf16", False, 1, 328, ranks=1, lora=True, qlora=True),
    _c("plain", "llama6", "causal_lm", "bf16", False, 1, 192, ranks=1, optimizer_in_backward=True),
    _c("plain", "minilm", "seq_cls", "fp32", False, 4, 104),
    _c("plain", "gpt2s", "causal_lm", "bf16", False, 2, 136, accum=2),
    _c("plain", "gpt2m", "causal_lm", "bf16", False, 2, 104, pure_bf16=True),
)
"""The plain engine's validation split (out of sample, run once)."""


GC_VALIDATION: tuple[Cell, ...] = (
    # Decided and committed (2026-11-29 11:20 UTC) before any of them ran: the fake-tensor probe's peaks depended on
    # when Python's cyclic collector ran, i.e. on what the planning process imported before (MiniLM's embedding
    # block 46-55 kB per token, its head 18.8-21.8 kB, op-level checkpointing 3-6 kB, all from one job in three
    # processes). The change collects first and holds the collector off during each fake run. One cell per probed
    # task and engine, on micro-batches and lengths no earlier cell used: MiniLM's embedding (the constants that
    # moved) with checkpointing, its classifier unsharded on FSDP2, the tiny GPT-2 on the plain engine with
    # checkpointing, the tiny Llama's LoRA at ZeRO-3, the 6-block Llama with op-level checkpointing at ZeRO-1, the
    # 6-block GPT-2 in bf16 on FSDP2.
    _c("z2", "minilm", "sentence_embedding", "fp32", True, 3, 96),
    _c("fsdp", "minilm", "seq_cls", "fp32", False, 3, 160),
    _c("plain", "gpt2s", "causal_lm", "fp32", True, 3, 384),
    _c("z3", "llama", "causal_lm", "fp32", False, 2, 320, lora=True),
    _c("z1", "llama6", "causal_lm", "fp32", True, 1, 480, checkpoint_policy="ops"),
    _c("fsdp", "gpt2m", "causal_lm", "bf16", False, 2, 216),
)
"""The probe's collector held off (its constants independent of the process's history), validation split (out of
sample, run once)."""


def full_matrix() -> list[Cell]:
    """The fit / held-out matrix (the split is computed over these only)."""
    return list(MATRIX)


def every_cell() -> list[Cell]:
    """The matrix, the validation splits and the levers' cells."""
    return [*MATRIX, *SEEN_VALIDATION, *VALIDATION, *LEVER_DEV, *LEVER_VALIDATION, *PURE_BF16_SR_VALIDATION,
            *EXPORT_VALIDATION, *EXPORT_VALIDATION_2, *SAC_VALIDATION, *BWDEND_DEV,
            *BWDEND_VALIDATION, *BWDEND_VALIDATION_2, *SAC_DS_DEV, *SAC_DS_VALIDATION, *DS_PURE_BF16_DEV,
            *DS_PURE_BF16_VALIDATION, *CURRENT_VALIDATION, *Z3_PIN_VALIDATION,
            *Z3_RELEASE_VALIDATION, *SAC_Z3LORA_VALIDATION, *Z3_RELEASE_VALIDATION_2, *SAC_DS_VALIDATION_2,
            *ONE_RANK_VALIDATION, *LORA_DTYPE_VALIDATION, *Z3_BF16_ADAPTER_VALIDATION,
            *PURE_BF16_LOW_BIT_VALIDATION, *DS_PURE_BF16_LOW_BIT_VALIDATION, *ZERO2_FLUSH_DEV,
            *ZERO2_FLUSH_VALIDATION, *COMPOSE_VALIDATION, *PLAIN_VALIDATION, *GC_VALIDATION]


def sides_of_all() -> dict[str, str]:
    """Cell name -> "fit", "held-out", "validation-1" (the first validation split, seen), "validation",
    "lever-dev", "lever-validation", "sr-validation" (pure bf16's stochastic rounding), "export-validation",
    "sac-validation" (op-level selective checkpointing), "sac-ds-dev" or "sac-ds-validation" (the same on
    DeepSpeed), "bwdend-dev", "bwdend-validation" or "bwdend-validation-2" (end of backward), "dsbf16-dev" or
    "dsbf16-validation" (DeepSpeed's pure bf16), "validation-3" (the current planner's whole-space split),
    "z3pin-validation" (ZeRO-3's pinned linears), "z3release-validation" (ZeRO-3's released frozen weights),
    "sac-z3lora-validation" (op-level selective checkpointing at ZeRO-3 under LoRA), "z3release-validation-2" (the
    released weights' gathered count), "sac-ds-validation-2" (op-level selective checkpointing on DeepSpeed in mixed
    layouts), "one-rank-validation" (ZeRO-3 and QLoRA on a single rank), "lora-dtype-validation" (bf16 LoRA, adapters in
    the working dtype), "z3-bf16-adapter-validation" (ZeRO-3's LoRA adapters in bf16), "pbf16-lowbit-validation" (pure
    bf16 with a low-bit AdamW on FSDP2), "ds-pbf16-lowbit-validation" (the same on DeepSpeed ZeRO-1/2),
    "zero2-flush-dev" or "zero2-flush-validation" (ZeRO-2 with a bucket smaller than the model), "compose-validation"
    (the levers combined, the in-place chunked loss), "plain-validation" (the plain engine: one rank, or DDP),
    "gc-validation" (the probe with the cyclic collector held off)."""
    return {**split(list(MATRIX)), **{c.name: "validation-1" for c in SEEN_VALIDATION},
            **{c.name: "validation" for c in VALIDATION}, **{c.name: "lever-dev" for c in LEVER_DEV},
            **{c.name: "lever-validation" for c in LEVER_VALIDATION},
            **{c.name: "sr-validation" for c in PURE_BF16_SR_VALIDATION},
            **{c.name: "export-validation" for c in EXPORT_VALIDATION},
            **{c.name: "export-validation-2" for c in EXPORT_VALIDATION_2},
            **{c.name: "sac-validation" for c in SAC_VALIDATION},
            **{c.name: "sac-ds-dev" for c in SAC_DS_DEV},
            **{c.name: "sac-ds-validation" for c in SAC_DS_VALIDATION},
            **{c.name: "bwdend-dev" for c in BWDEND_DEV},
            **{c.name: "bwdend-validation" for c in BWDEND_VALIDATION},
            **{c.name: "bwdend-validation-2" for c in BWDEND_VALIDATION_2},
            **{c.name: "dsbf16-dev" for c in DS_PURE_BF16_DEV},
            **{c.name: "dsbf16-validation" for c in DS_PURE_BF16_VALIDATION},
            **{c.name: "validation-3" for c in CURRENT_VALIDATION},
            **{c.name: "z3pin-validation" for c in Z3_PIN_VALIDATION},
            **{c.name: "z3release-validation" for c in Z3_RELEASE_VALIDATION},
            **{c.name: "sac-z3lora-validation" for c in SAC_Z3LORA_VALIDATION},
            **{c.name: "z3release-validation-2" for c in Z3_RELEASE_VALIDATION_2},
            **{c.name: "sac-ds-validation-2" for c in SAC_DS_VALIDATION_2},
            **{c.name: "one-rank-validation" for c in ONE_RANK_VALIDATION},
            **{c.name: "lora-dtype-validation" for c in LORA_DTYPE_VALIDATION},
            **{c.name: "z3-bf16-adapter-validation" for c in Z3_BF16_ADAPTER_VALIDATION},
            **{c.name: "pbf16-lowbit-validation" for c in PURE_BF16_LOW_BIT_VALIDATION},
            **{c.name: "ds-pbf16-lowbit-validation" for c in DS_PURE_BF16_LOW_BIT_VALIDATION},
            **{c.name: "zero2-flush-dev" for c in ZERO2_FLUSH_DEV},
            **{c.name: "zero2-flush-validation" for c in ZERO2_FLUSH_VALIDATION},
            **{c.name: "compose-validation" for c in COMPOSE_VALIDATION},
            **{c.name: "plain-validation" for c in PLAIN_VALIDATION},
            **{c.name: "gc-validation" for c in GC_VALIDATION}}


def _side(name: str, salt: int) -> str:
    digest = hashlib.sha256(f"{salt}:{name}".encode()).digest()
    return "fit" if digest[0] % 2 == 0 else "held-out"


def balanced(cells: list[Cell], sides: dict[str, str]) -> bool:
    """Both sides hold every axis value that two or more cells share, and neither side has over 60 %."""
    held = sum(s == "held-out" for s in sides.values())
    if not 0.4 * len(cells) <= held <= 0.6 * len(cells):
        return False
    values: dict[tuple[str, object], set[str]] = {}
    counts: dict[tuple[str, object], int] = {}
    for c in cells:
        for axis, v in c.axes().items():
            values.setdefault((axis, v), set()).add(sides[c.name])
            counts[(axis, v)] = counts.get((axis, v), 0) + 1
    return all(len(s) == 2 for k, s in values.items() if counts[k] >= 2)


def split_salt(cells: list[Cell] | None = None) -> int:
    cells = list(MATRIX) if cells is None else cells
    for salt in range(10_000):
        if balanced(cells, {c.name: _side(c.name, salt) for c in cells}):
            return salt
    raise ValueError("no salt balances the split; add cells")


def split(cells: list[Cell] | None = None) -> dict[str, str]:
    """Cell name -> "fit" or "held-out": a salted hash, the salt the smallest that balances every axis."""
    cells = list(MATRIX) if cells is None else cells
    salt = split_salt(cells)
    return {c.name: _side(c.name, salt) for c in cells}


QUICK = ("z2-gpt2s-clm-bf16-noac-mb2-s128-r2", "z3off-minilm-cls-fp32-noac-mb4-s128-r2-lora",
         "fsdp-llama-clm-fp32-noac-mb1-s1024-r2")
"""--quick: 3 cells, both engines, offload, LoRA and both precisions."""


def select(cells: list[Cell], patterns: list[str] | None) -> list[Cell]:
    """Cells named exactly a pattern, or containing every comma-separated part of it.

    "z3-,minilm" is ZeRO-3 without offload on MiniLM; "z3" alone also matches z3off; "ac-" only checkpointed.
    """
    if not patterns:
        return cells
    out = []
    for c in cells:
        if any(all(part in c.name for part in p.split(",")) for p in patterns):
            out.append(c)
    return out


Z3_RELEASE_VALIDATION_2: tuple[Cell, ...] = (
    # Decided and committed (2026-11-26 14:40 UTC) before the term it judges was written: what ZeRO-3's coordinator
    # keeps gathered at the backward start under memory_efficient_linear with LoRA (release_frozen_weights), where
    # the plan counted w.min(live cap, the whole model) (docs/memory-model.md "ZeRO-3's released frozen weights").
    # Shapes Z3_RELEASE_VALIDATION did not use: GPT-2 with its embedding tied to the head (the 4-block GPT-2, and the
    # 16k-vocabulary one with checkpointing), MiniLM's sentence embedding (its largest layer, the word table, the cap),
    # the 4-block Llama in bf16 and the 6-block Llama (its untied head the cap) at a longer length.
    _c("z3", "gpt2s", "causal_lm", "fp32", False, 2, 160, lora=True, release_frozen_weights=True),
    _c("z3", "gpt2m", "causal_lm", "fp32", True, 1, 320, lora=True, release_frozen_weights=True),
    _c("z3", "minilm", "sentence_embedding", "fp32", False, 2, 72, lora=True, release_frozen_weights=True),
    _c("z3", "llama", "causal_lm", "bf16", False, 2, 96, lora=True, release_frozen_weights=True),
    _c("z3", "llama6", "causal_lm", "fp32", False, 1, 448, lora=True, release_frozen_weights=True),
)
"""ZeRO-3's released frozen weights, second validation split: the gathered weights at the backward start (out of
sample for that term, run once)."""

SAC_DS_VALIDATION_2: tuple[Cell, ...] = (
    # Decided and committed (2026-11-26 14:45 UTC) before any term for what a mixed layout's backward start holds
    # beyond the probe's constants (docs/memory-model.md "Op-level selective checkpointing", findings: the checkpointed
    # layers' kwargs kept by torch.utils.checkpoint's recompute closure), run once after it. DeepSpeed with the op
    # policy, every k-th block checkpointed and the last one not (the backward start is the moment), on shapes no SAC
    # split used: the 6-block Llama on ZeRO-2 at 640 tokens (k 4), the 4-block Llama in bf16 on ZeRO-1 at micro-batch
    # 2 (k 2), the tiny GPT-2 (attention dropout: the CPU's math path) on ZeRO-3 at 576 tokens (k 2).
    _c("z2", "llama6", "causal_lm", "fp32", True, 1, 640, checkpoint_policy="ops", checkpoint_every=4),
    _c("z1", "llama", "causal_lm", "bf16", True, 2, 384, checkpoint_policy="ops", checkpoint_every=2),
    _c("z3", "gpt2s", "causal_lm", "fp32", True, 1, 576, checkpoint_policy="ops", checkpoint_every=2),
)
"""Op-level selective checkpointing on DeepSpeed in mixed layouts, validation split 2 (out of sample, run once)."""

ONE_RANK_VALIDATION: tuple[Cell, ...] = (
    # Decided and committed (2026-11-26 17:50 UTC) before any of it ran, with the terms it judges, which came from the
    # second GPU check (benchmarks/results/gpu-validation.md) and DeepSpeed's and torch's sources, and from two
    # one-rank ZeRO-3 GPT-2 dev runs (/tmp, 128 tokens, with and without optimizer offload: over by exactly the
    # gathered copy, then exact): no cell ran on a single rank before. ZeRO-3 alone gathers nothing (NoGatherHandle
    # views the partition); QLoRA alone keeps its NF4 base outside FSDP2 (whose one-rank shortcut cannot gather
    # NF4Tensor), on the device even with CPU offload. Shapes no cell used: ZeRO-3 under LoRA on the 4-block Llama,
    # ZeRO-3 with its optimizer offloaded on the 9M GPT-2 with checkpointing, ZeRO-3 on MiniLM's classifier, QLoRA on
    # the 4-block Llama without and with CPU offload.
    _c("z3", "llama", "causal_lm", "fp32", False, 2, 208, ranks=1, lora=True),
    _c("z3off", "gpt2m", "causal_lm", "fp32", True, 1, 416, ranks=1),
    _c("z3", "minilm", "seq_cls", "fp32", False, 4, 56, ranks=1),
    _c("fsdp", "llama", "causal_lm", "fp32", False, 2, 232, ranks=1, lora=True, qlora=True),
    _c("fsdpoff", "llama", "causal_lm", "fp32", False, 1, 296, ranks=1, lora=True, qlora=True),
)
"""One rank, validation split (out of sample for the one-rank ZeRO-3 and QLoRA terms, run once)."""

LORA_DTYPE_VALIDATION: tuple[Cell, ...] = (
    # Decided and committed (2026-11-26 21:24 UTC) before the probe builds LoRA's adapters in the working dtype, run
    # once after it. Found verifying LitGPT's tiny-llama row (benchmarks/published/litgpt_tinyllama.py): the probe
    # wraps its bf16 model with get_peft_model's default autocast_adapter_dtype, so the adapters are fp32 and PEFT
    # casts each adapted linear's input to fp32 for them (a saved fp32 copy per adapter), while ZeRO-0/1/2's and
    # FSDP2's ranks compute the adapters in bf16 (DeepSpeed's engine casts the module, engine.py
    # _cast_module_mixed_precision; FSDP2's MixedPrecisionPolicy gathers bf16) and ZeRO-3's in fp32 (that cast skips
    # a zero.Init model, and peft adds the adapters after it): checked on one-rank ZeRO-1, ZeRO-3, FSDP2 and FSDP2
    # offload runs. bf16 LoRA on shapes no cell used: the 6-block Llama on ZeRO-1, the 4-block Llama on FSDP2, the 9M
    # GPT-2 with checkpointing on ZeRO-2, and the 4-block Llama on ZeRO-3, whose fp32 adapters the change must keep.
    _c("z1", "llama6", "causal_lm", "bf16", False, 2, 176, lora=True),
    _c("fsdp", "llama", "causal_lm", "bf16", False, 2, 304, lora=True),
    _c("z2", "gpt2m", "causal_lm", "bf16", True, 1, 368, lora=True),
    _c("z3", "llama", "causal_lm", "bf16", False, 1, 392, lora=True),
)
"""bf16 LoRA with the adapters in the working dtype, validation split (out of sample for that change, run once:
2026-11-26 23:08, probe version 9; benchmarks/results/accuracy-lora-dtype-validation.md)."""

Z3_BF16_ADAPTER_VALIDATION: tuple[Cell, ...] = (
    # Decided and committed (2026-11-26 23:25 UTC, 8e8c2d6) before the launcher's ZeRO-3 ranks keep LoRA's adapters in
    # the working dtype (apply_lora without peft's fp32 autocast, as ZeRO-0/1/2 and FSDP2 already compute them) and the
    # plan stops adding the fp32-adapter terms there for the launcher's recipes (a user's script keeps peft's default
    # and its terms); run once after. bf16 ZeRO-3 LoRA on shapes no cell used: the 6-block Llama on torch's linear,
    # GPT-2's Conv1D blocks on DeepSpeed's memory_efficient_linear (the frozen inputs beside bf16 adapters), the
    # 4-block Llama with offload and op-level checkpointing.
    _c("z3", "llama6", "causal_lm", "bf16", False, 2, 208, lora=True),
    _c("z3", "gpt2m", "causal_lm", "bf16", False, 1, 272, lora=True, release_frozen_weights=True),
    _c("z3off", "llama", "causal_lm", "bf16", True, 1, 344, lora=True, checkpoint_policy="ops"),
)
"""ZeRO-3's LoRA adapters in bf16, validation split (out of sample for that change, run once)."""


PURE_BF16_LOW_BIT_VALIDATION: tuple[Cell, ...] = (
    # Decided and committed (2026-11-27 02:11 UTC, 7140c3d) before pure bf16 and a low-bit AdamW ran together on any
    # rank (FsdpSpec.pure_bf16_optimizers: torchao's AdamW8bit / 4bit with bf16_stochastic_round over FSDP2's bf16
    # shards, the quantized moments with an fp32 appearance; terms.low_bit_rounds), run once after. The terms it judges:
    # the bf16 shards and gradients beside the quantized moments, the unquantized moments in bf16, and the eager step's
    # SR_STEP_COPIES fp32 copies of the largest trainable shard (measured 10.25 on one 2^20 tensor, 8- and 4-bit).
    # Shapes no cell used: the 6-block Llama (untied head) with 8-bit, the 9M GPT-2 keeping its parameters after
    # forward with checkpointing and accumulation under 4-bit, the 4-block Llama with CPU offload under 8-bit.
    _c("fsdp", "llama6", "causal_lm", "bf16", False, 2, 168, pure_bf16=True, low_memory_optimizer="adamw8bit"),
    _c("fsdp-noreshard", "gpt2m", "causal_lm", "bf16", True, 1, 288, accum=2, pure_bf16=True,
       low_memory_optimizer="adamw4bit"),
    _c("fsdpoff", "llama", "causal_lm", "bf16", False, 1, 240, pure_bf16=True, low_memory_optimizer="adamw8bit"),
)
"""Pure bf16 with a low-bit AdamW on FSDP2, validation split (out of sample for that pairing, run once)."""

DS_PURE_BF16_LOW_BIT_VALIDATION: tuple[Cell, ...] = (
    # Decided and committed (2026-11-27 02:52 UTC) before DeepSpeed's ZeRO-1/2 stepped pure bf16 with a low-bit
    # AdamW on any multi-rank run (DeepSpeedSpec.pure_bf16_optimizers: the client optimizer is torchao's AdamW8bit /
    # 4bit with bf16_stochastic_round over the flat bf16 master), run once after. The terms it judges: the bf16
    # master and the flat partition's moments (quantized whole, or bf16 where the block does not divide it), the
    # step's SR_STEP_COPIES fp32 copies of the partition. Shapes no cell used: the 6-block Llama on ZeRO-2 with 8-bit,
    # the 9M GPT-2 on ZeRO-1 with checkpointing and accumulation under 4-bit.
    _c("z2", "llama6", "causal_lm", "bf16", False, 2, 184, pure_bf16=True, low_memory_optimizer="adamw8bit"),
    _c("z1", "gpt2m", "causal_lm", "bf16", True, 1, 176, accum=2, pure_bf16=True, low_memory_optimizer="adamw4bit"),
)
"""Pure bf16 with a low-bit AdamW on DeepSpeed ZeRO-1/2, validation split (out of sample for that pairing, run
once)."""

ZERO2_FLUSH_DEV: tuple[Cell, ...] = (
    # The examples' MiniLM seq-cls job (examples/seq-cls.yaml: 48 tokens, its 2 GB budget, fp32 on 2 CPU ranks) where
    # rank 1 measured 16.9 % over the plan at micro-batch 2 x accumulation 2 and 9.5 % at accumulation 1: what the
    # terms for a bucket smaller than the model were built against (seen).
    _c("z2", "minilm", "seq_cls", "fp32", False, 2, 48, accum=2, budget="2GB"),
    _c("z2", "minilm", "seq_cls", "fp32", False, 2, 48, budget="2GB"),
)
"""ZeRO-2 with a reduce bucket smaller than the model, development cells (seen)."""

ZERO2_FLUSH_VALIDATION: tuple[Cell, ...] = (
    # Decided and committed (2026-11-29 05:50 UTC) before any of it ran and before the memory model changed for what
    # ZeRO-2's gradient reduce holds when its bucket is smaller than the model (every earlier cell ran under BUDGET,
    # which clamps the bucket to the trainable parameters: one flush, at the end of backward). Found on the examples'
    # MiniLM seq-cls job at a 2-4 GB budget: rank 1 -16.9 % (accumulation 2), -9.5 % (accumulation 1), rank 0 within
    # 1 %; and on tests/cli's tiny GPT-2 ZeRO-2 run at its 16 MB near budget (-5.1 %, the reduce during the last
    # block's backward). Each cell sets a budget whose 2 % bucket is below its trainable parameters, so the bucket is
    # flushed during backward; every rank is judged (compare.analyze: the largest per-rank peak). Shapes no cell used:
    # MiniLM's sentence embedding (its word table, first in the flat order, larger than a rank's half), the 9M GPT-2
    # with accumulation 2 (tied head), the 6-block Llama in bf16 (untied head), the 4-block Llama's classifier with
    # checkpointing and accumulation 2, and GPT-2 124M (seven flushes per backward).
    _c("z2", "minilm", "sentence_embedding", "fp32", False, 2, 80, budget="2GB"),
    _c("z2", "gpt2m", "causal_lm", "fp32", False, 2, 80, accum=2, budget="1GB"),
    _c("z2", "llama6", "causal_lm", "bf16", False, 2, 128, budget="500MB"),
    _c("z2", "llama", "seq_cls", "fp32", True, 4, 64, accum=2, budget="1GB"),
    _c("z2", "gpt2-124m", "causal_lm", "fp32", False, 1, 64, budget="4GB"),
)
"""ZeRO-2 with a reduce bucket smaller than the model, validation split (out of sample for that change, run
once)."""

COMPOSE_VALIDATION: tuple[Cell, ...] = (
    # Decided and committed (2026-11-29 08:20 UTC) before any of it ran (issue 37 §3, §7): the optimizer step in
    # backward beside torchao's 8-/4-bit AdamW, with and without pure bf16 (each parameter's own low-bit AdamW in its
    # gradient hook; on CPU ranks the eager step's fp32 copies in the root's and the blocks' hooks), and the chunked
    # loss with the head's weight gradient accumulated in place (one piece's logits and one gradient). FSDP2 only
    # (DeepSpeed's engine owns the step). Shapes no cell used: the 9M GPT-2 (tied head, 16k vocabulary) in bf16 with
    # checkpointing, every lever of torchtune's low-memory recipe (activation offload moves nothing on CPU ranks);
    # the 6-block Llama in bf16 with 4-bit AdamW; the 4-block Llama in fp32 with 8-bit AdamW (no pure bf16: the
    # 6-copy step); the 9M GPT-2 in fp32 with chunked loss alone at 464 tokens.
    _c("fsdp", "gpt2m", "causal_lm", "bf16", True, 2, 240, loss_chunks=8, activation_offload=True,
       optimizer_in_backward=True, low_memory_optimizer="adamw8bit", pure_bf16=True),
    _c("fsdp", "llama6", "causal_lm", "bf16", False, 1, 320, optimizer_in_backward=True,
       low_memory_optimizer="adamw4bit", pure_bf16=True),
    _c("fsdp", "llama", "causal_lm", "fp32", False, 2, 224, optimizer_in_backward=True,
       low_memory_optimizer="adamw8bit"),
    _c("fsdp", "gpt2m", "causal_lm", "fp32", False, 1, 464, loss_chunks=8),
)
"""The levers combined and the in-place chunked loss, validation split (out of sample for both changes, run
once)."""
