"""The plain engine's rank side on one gloo rank: fp32 masters under mixed precision, the step in backward, pure bf16,
and its checkpoint round trip (resume through the worker's entry point: tests/worker/test_checkpoint.py)."""


import pytest
import torch
import torch.distributed as dist

from launcher.config.job import Job
from launcher.config.load import from_dict
from launcher.runtime import memory_probe
from launcher.worker import checkpoint
from launcher.worker.engines.plain import PlainEngine
from launcher.worker.model import build
from launcher.worker.recipes import make_recipe
from tests.worker.run_dirs import tiny_gpt2_job


def plain_engine(job: Job, **kw) -> PlainEngine:
    torch.manual_seed(0)
    recipe = make_recipe(job.task, job.data)
    model = build(job, recipe, seq_len=32, hf_checkpointing=False)
    engine = PlainEngine(device=torch.device("cpu"), **{"precision": "fp32", "grad_accum_steps": 1, **kw})
    engine.before_build()
    engine.setup(model, job.train, memory_probe(device="cpu", track_categories=False))
    return engine


def train_step(engine: PlainEngine) -> None:
    ids = torch.randint(3, 1024, (2, 32))
    engine.backward(engine.forward(input_ids=ids, labels=ids).loss)
    assert engine.step()


@pytest.mark.parametrize("kw", [{}, {"precision": "bf16"}, {"optimizer_in_backward": True},
                                {"precision": "bf16", "optimizer_in_backward": True},
                                {"precision": "bf16", "pure_bf16": True}],
                         ids=["fp32", "bf16-masters", "fp32-in-backward", "bf16-in-backward", "pure-bf16"])
def test_plain_checkpoint_round_trip_and_the_next_step_agree(tmp_path, single_rank, examples_data, kw):
    dist.init_process_group("gloo")
    job = from_dict(Job, tiny_gpt2_job(str(examples_data / "causal.jsonl")))
    a = plain_engine(job, **kw)
    if kw.get("precision") == "bf16" and not kw.get("pure_bf16"):
        # The model computes in bf16; the optimizer steps fp32 masters taken from the fp32 build.
        assert all(p.dtype == torch.bfloat16 for p in a.module.parameters())
        assert a.masters and all(m.dtype == torch.float32 for m in a.masters)
        assert len(a.masters) == len(a.params)
    before = [p.detach().clone() for p in a.params]
    for _ in range(2):
        train_step(a)
    assert all(not torch.equal(b, p) for b, p in zip(before, a.params, strict=True) if b.numel() > 1)
    for p, m in zip(a.params, a.masters, strict=False):
        assert torch.equal(p, m.to(p.dtype))  # the working copy is the master's rounding
    state = checkpoint.TrainerState(global_step=2, micro_steps=2, samples_per_rank=4, world_size=1,
                                    samples_per_step_per_rank=2, engine="plain", first_loss=7.0)
    tag = checkpoint.save(a, tmp_path, state)
    b = plain_engine(job, **kw)
    assert checkpoint.load(b, tmp_path, tag, world_size=1, samples_per_step_per_rank=2) == state
    assert PlainEngine.checkpoint_problem(tmp_path / tag, None, 1) is None
    for x, y in zip(a.masters + a.params, b.masters + b.params, strict=True):
        assert torch.equal(x, y)
    assert all(s.state_dict()["last_epoch"] == 2 for s in a.schedulers + b.schedulers)
    torch.manual_seed(5)
    train_step(a)
    torch.manual_seed(5)
    train_step(b)
    sa, sb = a.module.state_dict(), b.module.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    # `launch export`'s reader: the model's tensors, on the host.
    saved = PlainEngine.read_checkpoint(tmp_path, tag, None)
    assert saved.keys() == a.module.state_dict().keys()


def test_a_damaged_checkpoint_is_named(tmp_path):
    (tmp_path / "step-1").mkdir()
    assert PlainEngine.checkpoint_problem(tmp_path / "step-1", None, 1) == "plain.pt is missing"
    (tmp_path / "step-1" / "plain.pt").write_bytes(b"PK\x03\x04 cut short")
    assert "plain.pt is damaged" in PlainEngine.checkpoint_problem(tmp_path / "step-1", None, 1)
