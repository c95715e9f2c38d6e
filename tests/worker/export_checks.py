"""Reload a run's export the way a user would (transformers / peft from_pretrained) and redo its eval loss.

The run's eval loss (rank report, report.json) is the mean over ranks of each rank's mean micro-batch loss on the
eval split (launcher.worker.loop.Trainer.evaluate); ``eval_loss_of`` recomputes exactly that with the reloaded
model in one process, so a match to 1e-4 means the export holds the weights the run evaluated.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import torch

from launcher.model.build import model_class
from launcher.worker.data import eval_batches, read_records, split
from launcher.worker.main import load_run_dir
from launcher.worker.recipes import make_recipe
from launcher.worker.tokenizer import load_tokenizer


def reported_eval_loss(run_dir: Path) -> float:
    return json.loads((run_dir / "ranks" / "rank-0.json").read_text())["eval_loss"]


def load_export(run_dir: Path, export_dir: Path | None = None, *, merged: bool = False):
    """The exported model, as a user loads it: Auto class per task, PeftModel over its base for an adapter."""
    job, plan = load_run_dir(run_dir)[:2]
    d = export_dir or run_dir / "model"
    record = json.loads((d / "export.json").read_text())
    dtype = getattr(torch, record["dtype"])
    if merged:
        d = d / "merged"
    if record["format"] == "lora_adapter" and not merged:
        from peft import PeftModel

        base_dir = json.loads((d / "adapter_config.json").read_text())["base_model_name_or_path"]
        base = model_class(job.task).from_pretrained(base_dir, dtype=dtype)
        # The run trained the adapters in the run's dtype (DeepSpeed casts the whole module): keep it.
        model = PeftModel.from_pretrained(base, str(d), autocast_adapter_dtype=False)
    else:
        model = model_class(job.task).from_pretrained(str(d), dtype=dtype)
    return model.eval()


@torch.no_grad()
def eval_loss_of(run_dir: Path, model, world_size: int = 2) -> float:
    job, plan = load_run_dir(run_dir)[:2]
    recipe = make_recipe(job.task, job.data)
    rows = read_records(job.data.path)
    recipe.fit_labels(rows)
    _, eval_rows = split(rows, job.data.eval_fraction)
    from launcher.worker.model import model_config, model_dir

    tok = load_tokenizer(model_dir(job), model_config(job).vocab_size)
    data = recipe.encode(eval_rows, tok, plan.seq_len)
    n = next(iter(data.values())).shape[0]
    means = []
    for rank in range(world_size):
        batches = eval_batches(n, micro_batch_size=plan.strategy.micro_batch_size, world_size=world_size, rank=rank)
        total = 0.0
        for idx in batches:
            index = torch.tensor(idx, dtype=torch.long)
            loss, _ = recipe.loss(model, {k: v.index_select(0, index) for k, v in data.items()})
            total += loss.float().item()
        means.append(total / max(len(batches), 1))
    return sum(means) / world_size


def check_export(run_dir: Path, *, merged: bool = False, tol: float = 1e-4) -> float:
    """The export reloads and gives the run's eval loss; returns it."""
    reported = reported_eval_loss(run_dir)
    got = eval_loss_of(run_dir, load_export(run_dir, merged=merged))
    assert abs(got - reported) <= tol, f"export eval loss {got} vs the run's {reported}"
    return got


def safetensors_of(d: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out = {}
    for f in sorted(d.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def same_tensors(a: Path, b: Path) -> None:
    ta, tb = safetensors_of(a), safetensors_of(b)
    assert ta.keys() == tb.keys() and ta, f"{sorted(ta)[:5]} vs {sorted(tb)[:5]}"
    for k in ta:
        assert torch.equal(ta[k], tb[k]), k


def export_in_process(run: Path, *argv) -> tuple[int, str, str]:
    """`launch export RUN ARGV` in this process: (exit code, stdout, stderr). A `launch export` process would pay
    again the imports the test process has paid (torch, transformers, DeepSpeed: about 5.5 s of CPU each)."""
    from launcher.cli.main import main

    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        code = main(["export", str(run), *map(str, argv)])
    return code, out.getvalue(), err.getvalue()
