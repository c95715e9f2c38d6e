"""Run by torchrun from test_loading.py: build the model the worker's way and save what each rank ended with.

Every rank seeds differently, so equal weights across ranks can only come from rank 0's broadcast.
argv: CASE... each MODEL_DIR,OUT_DIR,ENGINE (deepspeed | fsdp)[,DTYPE (bf16): DeepSpeed's cast to the working dtype],
loaded in turn by the same ranks (one torchrun for all: its start-up is most of the cost).
"""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from launcher.config.job import Job
from launcher.config.load import from_dict
from launcher.runtime.probe import memory_probe
from launcher.worker.engines.fsdp import FsdpEngine
from launcher.worker.loading import broadcast_from_rank0, is_loader, loads_on_rank0_only
from launcher.worker.model import build
from launcher.worker.recipes import make_recipe


def load_once(model_dir: Path, out: Path, engine: str, dtype: torch.dtype | None) -> None:
    """One case: rank R writes OUT_DIR/rank-R.pt (its state and buffers) and rank-R.json."""
    rank = dist.get_rank()
    job = from_dict(Job, {"name": "t", "model": str(model_dir), "task": "causal_lm",
                          "data": {"path": str(out / "unused.jsonl"), "max_seq_len": 16},
                          "train": {"global_batch_size": 2, "max_steps": 1, "precision": "fp32"}})
    torch.manual_seed(1000 + rank)
    assert loads_on_rank0_only() and not loads_on_rank0_only(partitioned_init=True)
    model = build(job, make_recipe("causal_lm", job.data), seq_len=16, hf_checkpointing=False, on_meta=not is_loader())
    built_on_meta = all(p.is_meta for p in model.parameters())
    device = torch.device("cpu")
    if engine == "deepspeed":
        model = broadcast_from_rank0(model, device, dtype)
        state, local = model.state_dict(), sum(p.numel() for p in model.parameters())
    else:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        fsdp = FsdpEngine(reshard_after_forward=True, offload_params="none", offload_optimizer="none",
                          activation_checkpointing=False, precision="fp32", grad_accum_steps=1, device=device)
        fsdp.before_build()  # the engine decides: rank 0 loads on a group of 2
        assert fsdp.rank0_load
        fsdp.setup(model, job.train, memory_probe(device=device, run_dir=out / f"probe-{rank}"))
        local = sum(p.to_local().numel() for p in model.parameters())
        # Which units reshard after forward (FSDP2 keeps a unit's post-forward mesh only if it does).
        groups = [m._get_fsdp_state()._fsdp_param_group for m in model.modules() if hasattr(m, "_get_fsdp_state")]
        reshards = [g.post_forward_mesh_info is not None for g in groups if g is not None]
        state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    torch.save({"state": {k: v.detach().clone() for k, v in state.items()},
                "buffers": {k: b.detach().clone() for k, b in model.named_buffers()}}, out / f"rank-{rank}.pt")
    info = {"built_on_meta": built_on_meta, "local_params": local}
    if engine == "fsdp":
        info["reshards_after_forward"] = reshards  # the root first (modules() order), then the blocks
    (out / f"rank-{rank}.json").write_text(json.dumps(info))


def main() -> None:
    dist.init_process_group("gloo")
    for case in sys.argv[1:]:
        model_dir, out, engine, *dtype = case.split(",")
        load_once(Path(model_dir), Path(out), engine, torch.bfloat16 if dtype == ["bf16"] else None)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # Leave as the launcher's ranks do (launcher.worker.rank_entry.exit_rank): a gloo rank's interpreter teardown after
    # destroy_process_group was seen to abort ("terminate called without an active exception").
    from launcher.worker.rank_entry import exit_rank

    exit_rank(0)
