"""The low-memory optimizers the rank side builds (launcher.worker.engines.optimizers)."""

import pytest
import torch

from launcher.config.job import TrainConfig
from launcher.worker.engines.base import ADAM_BETAS, ADAM_EPS, build_optimizer
from launcher.worker.engines.fsdp import FsdpEngine
from launcher.worker.engines.optimizers import ShardedAdafactor

TRAIN = TrainConfig(global_batch_size=1, lr=3e-3, weight_decay=0.1)


def _params(*shapes):
    torch.manual_seed(0)
    return [torch.nn.Parameter(torch.randn(*s)) for s in shapes]


@pytest.mark.parametrize(("name", "state_class", "block"), [("adamw8bit", "OptimState8bit", 256),
                                                            ("adamw4bit", "OptimState4bit", 128)])
def test_low_bit_adamw_takes_the_jobs_hyperparameters_and_quantizes_by_torchaos_rule(name, state_class, block):
    # 64 x 64 quantizes; 63 x 65 (not a multiple of the block) and a 64-vector (under 4096) keep fp32 moments,
    # the rule the memory model counts (launcher.planner.terms.optimizer_state_bytes).
    ps = _params((64, 64), (63, 65), (64,))
    opt = build_optimizer(TRAIN, ps, name)
    g = opt.param_groups[0]
    assert float(g["lr"]) == pytest.approx(TRAIN.lr)  # torchao keeps lr as an fp32 tensor
    assert (g["betas"], g["eps"], g["weight_decay"]) == (ADAM_BETAS, ADAM_EPS, 0.1)
    assert opt.block_size == block
    before = [p.detach().clone() for p in ps]
    for p in ps:
        p.grad = torch.ones_like(p)
    opt.step()  # eager on CPU: no compile
    kinds = [type(opt.state[p]["exp_avg"]).__name__ for p in ps]
    assert kinds == [state_class, "Tensor", "Tensor"]
    assert all(not torch.equal(a, b) for a, b in zip(before, ps, strict=True))


def test_adafactor_is_torchs_adafactor_step_for_plain_tensors():
    a, b = _params((48, 32), (32,)), _params((48, 32), (32,))
    ref = torch.optim.Adafactor(a, lr=TRAIN.lr, weight_decay=TRAIN.weight_decay, foreach=False)
    ours = build_optimizer(TRAIN, b, "adafactor")
    assert isinstance(ours, ShardedAdafactor)
    for _ in range(4):
        grads = [torch.randn_like(p) for p in a]
        for p, q, g in zip(a, b, grads, strict=True):
            p.grad, q.grad = g.clone(), g.clone()
        ref.step()
        ours.step()
    for p, q in zip(a, b, strict=True):
        torch.testing.assert_close(q, p, rtol=1e-6, atol=1e-6)
    assert sorted(ours.state[b[0]]) == ["col_var", "row_var", "step"] and sorted(ours.state[b[1]]) == ["step",
                                                                                                    "variance"]


def test_without_a_low_memory_optimizer_the_jobs_adamw_is_built():
    assert type(build_optimizer(TRAIN, _params((4,)))) is torch.optim.AdamW


@pytest.mark.parametrize("name", ["adamw8bit", "adafactor"])
def test_fsdp_checkpoint_round_trip_keeps_the_low_memory_state(name, tmp_path, single_rank, examples_data):
    # DCP saves torchao's quantized DTensor states and ShardedAdafactor's row/column DTensors; a resumed engine
    # steps exactly as the one that saved.
    import torch.distributed as dist

    from launcher.config.job import Job
    from launcher.config.load import from_dict
    from launcher.worker import checkpoint
    from tests.worker.run_dirs import tiny_gpt2_job
    from tests.worker.test_checkpoint import fsdp_engine, train_step

    dist.init_process_group("gloo")
    job = from_dict(Job, tiny_gpt2_job(str(examples_data / "causal.jsonl")))
    engines = []
    for _ in range(2):
        FsdpEngine.low_memory_optimizer = name  # from_plan sets it per engine; fsdp_engine builds directly
        try:
            engines.append(fsdp_engine(job))
        finally:
            FsdpEngine.low_memory_optimizer = "none"
    a, b = engines
    assert type(a.optimizer).__name__ == {"adamw8bit": "AdamW8bit", "adafactor": "ShardedAdafactor"}[name]
    train_step(a)
    state = checkpoint.TrainerState(global_step=1, micro_steps=1, samples_per_rank=2, world_size=1,
                                    samples_per_step_per_rank=2, engine="fsdp", first_loss=7.0)
    tag = checkpoint.save(a, tmp_path, state)
    checkpoint.load(b, tmp_path, tag, world_size=1, samples_per_step_per_rank=2)
    for engine in (a, b):
        torch.manual_seed(5)
        train_step(engine)
    sa, sb = a.model.state_dict(), b.model.state_dict()
    assert all(torch.equal(sa[k].full_tensor(), sb[k].full_tensor()) for k in sa)
