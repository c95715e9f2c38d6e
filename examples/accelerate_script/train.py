"""A plain accelerate training loop: no launcher import, no launcher variable, run by `launch --script` as it is.

A tiny random-weight GPT-2 learns examples/data/causal.jsonl, one byte per token. Its batch size, accumulation
and precision come from its own flags, as in accelerate's examples. Run by the launcher, the plan reaches it the
way `accelerate launch` reaches any script, through accelerate's own environment (DeepSpeed's config file, or
FSDP2's variables), and where accelerate has no variable the launcher sets the plan's value where accelerate builds
it: the DataLoader's batch size, a mixed_precision passed in code, gloo on CPU ranks, FSDP2 on CPU ranks.

    launch job.yaml --script examples/accelerate_script/train.py -- --max-steps 3
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType, DummyOptim, DummyScheduler
from transformers import GPT2Config, GPT2LMHeadModel

HERE = Path(__file__).resolve().parent


def byte_batches(path: Path, seq_len: int) -> torch.Tensor:
    """Each row's text as UTF-8 bytes, cut or padded (with 0) to seq_len tokens."""
    rows = [json.loads(line)["text"] for line in path.read_text().splitlines() if line.strip()]
    out = torch.zeros(len(rows), seq_len, dtype=torch.long)
    for i, text in enumerate(rows):
        ids = list(text.encode())[:seq_len]
        out[i, : len(ids)] = torch.tensor(ids)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", default=str(HERE.parent / "data" / "causal.jsonl"))
    p.add_argument("--max-steps", type=int, default=3)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--batch-size", type=int, default=4, help="sequences per process per step")
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--mixed-precision", choices=("no", "bf16", "fp16"), default="no")
    args = p.parse_args()

    accelerator = Accelerator(mixed_precision=args.mixed_precision, gradient_accumulation_steps=args.grad_accum)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=256, n_positions=args.seq_len))
    loader = torch.utils.data.DataLoader(byte_batches(Path(args.data), args.seq_len), batch_size=args.batch_size,
                                         shuffle=True)
    ds = accelerator.state.deepspeed_plugin if accelerator.distributed_type == DistributedType.DEEPSPEED else None
    ds_config = ds.deepspeed_config if ds else {}
    # A DeepSpeed config that names an optimizer or schedule builds them itself: accelerate wants placeholders.
    optimizer = DummyOptim(model.parameters(), lr=args.lr) if "optimizer" in ds_config \
        else torch.optim.AdamW(model.parameters(), lr=args.lr)
    scheduler = DummyScheduler(optimizer, total_num_steps=args.max_steps) if "scheduler" in ds_config else None
    prepared = accelerator.prepare(model, optimizer, loader, *([scheduler] if scheduler else []))
    model, optimizer, loader = prepared[:3]
    accelerator.print(f"world {accelerator.num_processes}, {accelerator.distributed_type.value}, precision "
                      f"{accelerator.mixed_precision}, micro-batch {loader.batch_size}, accumulation "
                      f"{accelerator.gradient_accumulation_steps}")

    model.train()
    steps = 0
    while steps < args.max_steps:
        for batch in loader:
            with accelerator.accumulate(model):
                loss = model(input_ids=batch, labels=batch).loss
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
            if accelerator.sync_gradients:
                steps += 1
                accelerator.print(f"step {steps} loss {loss.item():.4f}")
                if steps == args.max_steps:
                    break
    accelerator.end_training()


if __name__ == "__main__":
    main()
