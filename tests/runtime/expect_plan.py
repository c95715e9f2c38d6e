"""Run an example script unchanged, then assert on this rank that the plan's values arrived where the libraries
took them (tests/runtime/test_script.py runs it through launch --script):

    expect_plan.py '{"micro_batch_size": 2, "grad_accum_steps": 2, "precision": "no", "world_size": 2,
                     "distributed_type": "DEEPSPEED", "zero_stage": 2, "offload_optimizer": "none"}' EXAMPLE ARGS...

The Accelerator the script (or its Trainer) builds is kept, and a Trainer if one is built; after the script their
state, the first prepared DataLoader and the engine must say what the plan says (a Trainer accumulates by itself:
its arguments say how much). A failed assertion fails the rank, and so the run.
"""

import json
import runpy
import sys

expect = json.loads(sys.argv[1])
example = sys.argv[2]
sys.argv = [example, *sys.argv[3:]]

from accelerate import Accelerator  # noqa: E402  (the launcher's seam patches them at these imports)
from transformers import Trainer  # noqa: E402

made = []


def keep(cls):
    init = cls.__init__

    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append(self)

    cls.__init__ = __init__


keep(Accelerator)
keep(Trainer)
runpy.run_path(example, run_name="__main__")

acc = [m for m in made if isinstance(m, Accelerator)][-1]
trainer = [m for m in made if isinstance(m, Trainer)]
loader = acc._dataloaders[0]  # the first prepared: the Trainer's training loader, a plain script's own
got = {
    "world_size": acc.num_processes,
    "distributed_type": acc.distributed_type.value,
    "precision": acc.mixed_precision,
    "grad_accum_steps": trainer[-1].args.gradient_accumulation_steps if trainer else acc.gradient_accumulation_steps,
    # accelerate's shards batch through a BatchSamplerShard: their batch_size is None, the total is over all ranks.
    "micro_batch_size": loader.batch_size or loader.total_batch_size // acc.num_processes,
}
if acc.distributed_type.value == "DEEPSPEED":
    zero = acc.state.deepspeed_plugin.deepspeed_config["zero_optimization"]
    engine = acc.deepspeed_engine_wrapped.engine
    got.update(zero_stage=zero["stage"], offload_optimizer=zero.get("offload_optimizer", {}).get("device", "none"),
               ds_micro_batch_size=engine.train_micro_batch_size_per_gpu())
if acc.distributed_type.value == "FSDP":
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    params = {n: p for m in acc._models if isinstance(m, FSDPModule) for n, p in m.named_parameters()}
    whole = [n for n, p in params.items() if not isinstance(p, DTensor) or p.to_local().numel() == p.numel()]
    got["sharded"] = bool(params) and not whole
    if whole:
        print(f"not sharded: {whole} of {len(params)}; models {[type(m).__name__ for m in acc._models]}", flush=True)
print(f"plan arrived: {json.dumps(got, sort_keys=True)}", flush=True)
wrong = {k: (got.get(k), v) for k, v in expect.items() if got.get(k) != v}
assert not wrong, f"the plan did not arrive (got, plan): {wrong}"
