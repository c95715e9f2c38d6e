"""The accuracy matrix: which configurations run, and the job file each one becomes.

Axes (values): sharding (ZeRO-1, ZeRO-2, ZeRO-3, ZeRO-3 + CPU optimizer offload, FSDP2 full-shard, FSDP2
grad-op-shard), activation checkpointing (off, on), model (tiny GPT-2, MiniLM), micro-batch (1, 2) and sequence
length (32, 128 tokens). The full product is 96 runs; on 2 cores that is hours, so:

  - every sharding gets 4 cells: model x checkpointing in full (so each engine's error is seen on both
    models, with and without recompute);
  - micro-batch and sequence length follow a fractional design inside those 4: micro-batch is the parity of
    (model, checkpointing, sharding index), sequence length the parity of (model, sharding index // 2); each
    sharding sees both micro-batches and both lengths, and each model sees every sharding at both lengths;
  - the GPT-2 cells alternate two sizes (h 64 / 2 layers / vocab 1024 and h 128 / 4 layers / vocab 4096) so
    a refit sees more than one width.

24 runs in all. Each runs 3 optimizer steps with no gradient accumulation (global batch = 2 ranks x
micro-batch) and no held-out evaluation (eval_fraction 0: the eval passes would only add time and a peak the
planner does not model), under a 4 GB budget nobody comes near, so every run completes and reports its peak.
"""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks.accuracy.harness import DATA

RANKS = 2
STEPS = 3
BUDGET = "4GB"

SHARDINGS: dict[str, dict] = {
    "z1": {"engine": "deepspeed", "zero_stage": 1, "offload_optimizer": "none", "offload_params": "none"},
    "z2": {"engine": "deepspeed", "zero_stage": 2, "offload_optimizer": "none", "offload_params": "none"},
    "z3": {"engine": "deepspeed", "zero_stage": 3, "offload_optimizer": "none", "offload_params": "none"},
    "z3off": {"engine": "deepspeed", "zero_stage": 3, "offload_optimizer": "cpu", "offload_params": "none"},
    "fsdp": {"engine": "fsdp", "fsdp_reshard_after_forward": True, "offload_optimizer": "none",
             "offload_params": "none"},
    "fsdp-noreshard": {"engine": "fsdp", "fsdp_reshard_after_forward": False, "offload_optimizer": "none",
                       "offload_params": "none"},
}
SHARDING_LABEL = {"z1": "ZeRO-1", "z2": "ZeRO-2", "z3": "ZeRO-3", "z3off": "ZeRO-3 +opt->cpu",
                  "fsdp": "FSDP2 reshard", "fsdp-noreshard": "FSDP2 no-reshard"}
GPT2 = {
    "gpt2s": {"family": "gpt2", "hidden_size": 64, "num_layers": 2, "num_heads": 4, "vocab_size": 1024,
              "max_position_embeddings": 256},
    "gpt2m": {"family": "gpt2", "hidden_size": 128, "num_layers": 4, "num_heads": 4, "vocab_size": 4096,
              "max_position_embeddings": 256},
}
MICRO_BATCHES = (1, 2)
SEQ_LENS = (32, 128)


@dataclass(frozen=True, slots=True)
class Cell:
    sharding: str
    model: str
    """gpt2s, gpt2m or minilm."""
    checkpointing: bool
    micro_batch: int
    seq_len: int

    @property
    def name(self) -> str:
        ac = "ac" if self.checkpointing else "noac"
        return f"{self.sharding}-{self.model}-{ac}-mb{self.micro_batch}-s{self.seq_len}"

    def job(self) -> dict:
        strategy = {**SHARDINGS[self.sharding], "micro_batch_size": self.micro_batch,
                    "activation_checkpointing": self.checkpointing}
        if self.model == "minilm":
            model, task = "all-MiniLM-L6-v2", "sentence_embedding"
            data = {"path": str(DATA / "pairs.jsonl"), "text_field": "text", "pair_field": "positive"}
        else:
            model, task = dict(GPT2[self.model]), "causal_lm"
            data = {"path": str(DATA / "causal.jsonl"), "text_field": "text"}
        data.update(max_seq_len=self.seq_len, eval_fraction=0.0)
        return {
            "name": self.name, "model": model, "task": task, "data": data,
            "train": {"global_batch_size": RANKS * self.micro_batch, "precision": "bf16", "lr": 1.0e-4,
                      "max_steps": STEPS},
            "strategy": strategy, "cluster": {"hardware": "cpu"},
        }


def full_matrix() -> list[Cell]:
    cells = []
    for i, sharding in enumerate(SHARDINGS):
        for j in range(4):
            is_minilm, ac = j // 2, j % 2
            mb = MICRO_BATCHES[is_minilm ^ ac ^ (i % 2)]
            seq = SEQ_LENS[is_minilm ^ ((i // 2) % 2)]
            model = "minilm" if is_minilm else ("gpt2s" if (i + ac) % 2 == 0 else "gpt2m")
            cells.append(Cell(sharding, model, bool(ac), mb, seq))
    return cells


QUICK = ("z2-gpt2s-ac-mb1-s32", "z3off-gpt2m-noac-mb2-s128", "fsdp-gpt2s-noac-mb1-s32", "z2-minilm-noac-mb1-s128")
"""--quick: 4 cells, both engines, offload, checkpointing and both models (about 4 minutes on 2 idle cores)."""


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
