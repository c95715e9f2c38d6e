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


def _adamw_steps(opt, ps, steps=10):
    """``steps`` steps of ``opt`` over ``ps`` with the same seeded gradients (a pull back toward zero in each)."""
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        for p in ps:
            p.grad = torch.randn(p.shape, generator=gen) + 0.1 * p.detach()
        opt.step()
    return [p.detach().clone() for p in ps]


def test_paged_adamw8bit_is_bitsandbytes_8bit_adamw_as_close_to_adamw_as_torchaos():
    # bitsandbytes' PagedAdamW8bit with the job's hyperparameters: uint8 moments with one fp32 absmax per block of
    # 256 from 4096 elements on, fp32 moments below (min_8bit_size), the rule the memory model
    # counts (launcher.planner.terms.low_bit_tensor_bytes). After 10 steps it stays as close to torch's AdamW as
    # torchao's AdamW8bit does (both quantize the moments block-wise with the same kind of dynamic map).
    shapes = ((96, 128), (64,))  # 48 blocks of 256, which torchao quantizes too
    opt = build_optimizer(TRAIN, _params(*shapes), "paged_adamw8bit")
    assert type(opt).__name__ == "PagedAdamW8bit" and opt.is_paged
    g = opt.param_groups[0]
    assert (g["lr"], g["betas"], g["eps"], g["weight_decay"]) == (TRAIN.lr, ADAM_BETAS, ADAM_EPS, 0.1)
    ps = opt.param_groups[0]["params"]
    start = [p.detach().clone() for p in ps]
    paged = _adamw_steps(opt, ps)
    big, small = (opt.state[p] for p in ps)
    assert (big["state1"].dtype, big["state2"].dtype, big["absmax1"].numel()) == (torch.uint8, torch.uint8, 48)
    assert small["state1"].dtype == torch.float32
    ref_ps = _params(*shapes)
    adamw = _adamw_steps(torch.optim.AdamW(ref_ps, lr=TRAIN.lr, betas=ADAM_BETAS, eps=ADAM_EPS,
                                           weight_decay=0.1, foreach=False), ref_ps)
    ao_ps = _params(*shapes)
    torchao = _adamw_steps(build_optimizer(TRAIN, ao_ps, "adamw8bit"), ao_ps)
    moved = (adamw[0] - start[0]).abs().mean()
    err, ao_err = (paged[0] - adamw[0]).abs().mean(), (torchao[0] - adamw[0]).abs().mean()
    assert err < 0.05 * moved and err < 2 * ao_err, (float(err), float(ao_err), float(moved))
    torch.testing.assert_close(paged[1], adamw[1], rtol=1e-5, atol=1e-6)  # fp32 moments: AdamW itself


def test_paged_adamw8bit_steps_a_dtensor_shard_as_the_plain_tensor(single_rank):
    # bitsandbytes' kernels have no DTensor sharding rule: the optimizer steps FSDP2's shards through their local
    # tensors (optimizers.local_shards), in place, with the state keyed by the DTensor parameter.
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor, init_device_mesh

    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (1,))
    (plain,) = _params((64, 128))
    sharded = torch.nn.Parameter(distribute_tensor(plain.detach().clone(), mesh, [Shard(0)]))
    local = sharded.to_local()
    a, b = build_optimizer(TRAIN, [plain], "paged_adamw8bit"), build_optimizer(TRAIN, [sharded], "paged_adamw8bit")
    for _ in range(3):
        grad = torch.randn(plain.shape)
        plain.grad, sharded.grad = grad.clone(), distribute_tensor(grad.clone(), mesh, [Shard(0)])
        a.step()
        b.step()
    assert isinstance(sharded, DTensor) and sharded.to_local().data_ptr() == local.data_ptr()
    torch.testing.assert_close(sharded.to_local(), plain.detach())
    assert list(b.state) == [sharded] and b.state[sharded]["step"] == 3
    assert local.grad is None  # the local gradient handed to the kernel is not kept


def test_without_a_low_memory_optimizer_the_jobs_adamw_is_built():
    assert type(build_optimizer(TRAIN, _params((4,)))) is torch.optim.AdamW


@pytest.mark.parametrize("name", ["adamw8bit", "adafactor", "paged_adamw8bit"])
def test_fsdp_checkpoint_round_trip_keeps_the_low_memory_state(name, tmp_path, single_rank, examples_data):
    # DCP saves torchao's quantized DTensor states and ShardedAdafactor's row/column DTensors; a resumed engine
    # steps exactly as the one that saved.
    import torch.distributed as dist

    from launcher.config.job import Job
    from launcher.config.load import from_dict
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
    assert type(a.optimizer).__name__ == {"adamw8bit": "AdamW8bit", "adafactor": "ShardedAdafactor",
                                          "paged_adamw8bit": "PagedAdamW8bit"}[name]
    train_step(a)
    assert_resumes_exactly(a, b, tmp_path)


@pytest.mark.parametrize("optimizer", ["adamw", "adam"])
def test_pure_bf16_steps_adam_with_torchaos_stochastic_rounding(optimizer):
    from torchao.optim.adam import _AdamBase

    train = TrainConfig(global_batch_size=1, lr=3e-3, weight_decay=0.1, optimizer=optimizer)
    ps = [torch.nn.Parameter(p.detach().bfloat16()) for p in _params((64, 64), (64,))]
    opt = build_optimizer(train, ps, pure_bf16=True)
    assert isinstance(opt, _AdamBase) and opt.bf16_stochastic_round and opt.is_adamw == (optimizer == "adamw")
    g = opt.param_groups[0]
    assert float(g["lr"]) == pytest.approx(train.lr)
    assert (g["betas"], g["eps"], g["weight_decay"], g["amsgrad"]) == (ADAM_BETAS, ADAM_EPS, 0.1, False)
    for p in ps:
        p.grad = torch.ones_like(p)
    opt.step()  # eager on CPU
    # No quantized state: the moments are plain tensors in the parameters' bf16 (the memory model's 4 bytes).
    assert all(type(opt.state[p][k]) is torch.Tensor and opt.state[p][k].dtype == torch.bfloat16
               for p in ps for k in ("exp_avg", "exp_avg_sq"))
    # Without pure bf16, or with SGD, the job's torch optimizer as before.
    assert type(build_optimizer(train, ps)) is (torch.optim.AdamW if optimizer == "adamw" else torch.optim.Adam)
    sgd = TrainConfig(global_batch_size=1, lr=3e-3, optimizer="sgd")
    assert type(build_optimizer(sgd, ps, pure_bf16=True)) is torch.optim.SGD


def test_stochastic_rounding_keeps_in_expectation_the_updates_rounding_to_nearest_loses():
    # Weights 1.0, where bf16's spacing is 2^-7 (2^-8 just below): AdamW's first steps move each weight by lr
    # (m/sqrt(v) = 1 for a constant gradient), 1e-3, under half a spacing. torch's AdamW on the bf16 weights rounds
    # every step back to 1.0; the stochastically rounded step lands on either neighbour with the odds that make
    # its mean the fp32 result.
    train = TrainConfig(global_batch_size=1, lr=1e-3, weight_decay=0.0)
    steps, n = 20, 32768
    torch.manual_seed(0)
    nearest = torch.nn.Parameter(torch.ones(n, dtype=torch.bfloat16))
    sr = torch.nn.Parameter(torch.ones(n, dtype=torch.bfloat16))
    exact = torch.nn.Parameter(torch.ones(n))
    opts = [build_optimizer(train, [nearest]), build_optimizer(train, [sr], pure_bf16=True),
            build_optimizer(train, [exact])]
    for _ in range(steps):
        for p, opt in zip((nearest, sr, exact), opts, strict=True):
            p.grad = torch.ones_like(p)
            opt.step()
    assert torch.equal(nearest, torch.ones_like(nearest))  # every update lost
    target = float(exact.detach().mean())
    assert target == pytest.approx(1 - steps * train.lr, rel=1e-4)
    assert float(sr.detach().float().mean()) == pytest.approx(target, abs=2e-4)  # kept: 0.98, to 1 % of the way
    assert len(torch.unique(sr)) > 1  # by rounding each weight up or down, not by one deterministic value


def test_stochastic_rounding_draws_the_same_bits_on_replicas_whatever_their_random_state():
    # The worker seeds each rank apart (dropout); hybrid sharding's replicas of a shard must still round it alike,
    # or they drift apart. Two optimizers over equal weights and gradients, from different global random states,
    # round alike step after step; another salt (a different one-parameter optimizer) rounds differently.
    train = TrainConfig(global_batch_size=1, lr=1e-3, weight_decay=0.0)

    def run(rank_seed: int, salt: int = 0) -> torch.Tensor:
        torch.manual_seed(rank_seed)
        p = torch.nn.Parameter(torch.ones(4096, dtype=torch.bfloat16))
        opt = build_optimizer(train, [p], pure_bf16=True, salt=salt)
        for _ in range(3):
            p.grad = torch.ones_like(p)
            opt.step()
        return p.detach()

    a, b = run(1), run(2)
    assert torch.equal(a, b) and len(torch.unique(a)) > 1
    assert not torch.equal(a, run(1, salt=1))
    # The step leaves the caller's random stream (dropout's) where it was.
    p = torch.nn.Parameter(torch.ones(8, dtype=torch.bfloat16))
    opt = build_optimizer(train, [p], pure_bf16=True)
    p.grad = torch.ones_like(p)
    state = torch.get_rng_state()
    opt.step()
    assert torch.equal(torch.get_rng_state(), state)


def test_zero3_sub_groups_stepped_by_one_optimizer_round_with_different_bits():
    # DeepSpeed's ZeRO-3 hands its client optimizer one sub-group's flat partition at a time (stage3.py
    # _optimizer_step), all at the same step count: two sub-groups of equal values and gradients must not round alike.
    train = TrainConfig(global_batch_size=1, lr=1e-3, weight_decay=0.0)
    parts = [torch.nn.Parameter(torch.ones(4096, dtype=torch.bfloat16)) for _ in range(2)]
    opt = build_optimizer(train, [torch.nn.Parameter(torch.ones(1, dtype=torch.bfloat16))], pure_bf16=True, salt=1)
    for _ in range(3):
        for p in parts:
            opt.param_groups[0]["params"] = [p]
            p.grad = torch.ones_like(p)
            opt.step()
    assert len(torch.unique(parts[0])) > 1 and not torch.equal(parts[0], parts[1])


@pytest.mark.parametrize(("name", "state_class"), [("adamw8bit", "OptimState8bit"), ("adamw4bit", "OptimState4bit")])
def test_pure_bf16_low_bit_adamw_rounds_stochastically_over_quantized_moments(name, state_class):
    # Pure bf16 with a low-bit AdamW (FsdpSpec.pure_bf16_optimizers): torchao's AdamW8bit / 4bit with
    # bf16_stochastic_round, the moments quantized where torchao's rule allows and in the weights' bf16 elsewhere
    # (terms.low_bit_tensor_bytes); an update under half a bf16 spacing is kept in expectation, with the same bits
    # on replicas (rounding_seed) and the caller's random stream untouched.
    train = TrainConfig(global_batch_size=1, lr=1e-3, weight_decay=0.0)

    def run(rank_seed: int) -> list[torch.Tensor]:
        torch.manual_seed(rank_seed)
        ps = [torch.nn.Parameter(torch.ones(n, dtype=torch.bfloat16)) for n in (32768, 64)]
        opt = build_optimizer(train, ps, name, pure_bf16=True)
        assert type(opt).__name__ == {"adamw8bit": "AdamW8bit", "adamw4bit": "AdamW4bit"}[name]
        assert opt.bf16_stochastic_round
        for _ in range(20):
            for p in ps:
                p.grad = torch.ones_like(p)
            state = torch.get_rng_state()
            opt.step()
            assert torch.equal(torch.get_rng_state(), state)
        kinds = [(type(opt.state[p]["exp_avg"]).__name__, opt.state[p]["exp_avg_sq"].dtype) for p in ps]
        assert kinds[0][0] == state_class and kinds[1] == ("Tensor", torch.bfloat16)
        return [p.detach() for p in ps]

    big, small = run(1)
    assert big.dtype == torch.bfloat16 and len(torch.unique(big)) > 1
    # 20 steps of lr 1e-3 from 1.0: 0.98 in fp32; rounding to nearest would stay at 1.0. The quantized moments
    # make each step's size only close to lr: 1 % of the way.
    assert float(big.float().mean()) == pytest.approx(1 - 20 * train.lr, abs=2e-4)
    assert all(torch.equal(a, b) for a, b in zip((big, small), run(2), strict=True))
    with pytest.raises(ValueError, match="adafactor has no stochastically rounding step"):
        build_optimizer(train, [torch.nn.Parameter(torch.ones(8, dtype=torch.bfloat16))], "adafactor",
                        pure_bf16=True)


@pytest.mark.parametrize(("in_backward", "low_memory"), [(False, "none"), (True, "none"), (False, "adamw8bit"),
                                                       (True, "adamw8bit")])
def test_fsdp_pure_bf16_rounds_its_dtensor_shards_and_resumes_exactly(in_backward, low_memory, tmp_path,
                                                                       single_rank, examples_data):
    # FSDP2's bf16 DTensor shards step through the stochastically rounding AdamW (one per parameter with the step
    # in backward); DCP saves its bf16 states, and the resumed engine rounds with the same bits (rounding_seed
    # reads the restored step count), so it steps exactly as the one that saved.
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor
    from torchao.optim.adam import _AdamBase

    from launcher.config.job import Job
    from launcher.config.load import from_dict
    from launcher.runtime import memory_probe
    from launcher.worker.model import build
    from launcher.worker.recipes import make_recipe
    from tests.worker.run_dirs import tiny_gpt2_job
    from tests.worker.test_checkpoint import train_step

    dist.init_process_group("gloo")
    job = from_dict(Job, tiny_gpt2_job(str(examples_data / "causal.jsonl")))

    def engine() -> FsdpEngine:
        torch.manual_seed(0)
        model = build(job, make_recipe(job.task, job.data), seq_len=32, hf_checkpointing=False)
        e = FsdpEngine(reshard_after_forward=True, offload_params="none", offload_optimizer="none",
                       activation_checkpointing=False, precision="bf16", grad_accum_steps=1,
                       device=torch.device("cpu"), pure_bf16=True, optimizer_in_backward=in_backward)
        e.low_memory_optimizer = low_memory  # as from_plan sets it
        e.setup(model, job.train, memory_probe(device="cpu", track_categories=False))
        return e

    a, b = engine(), engine()
    assert all(isinstance(opt, _AdamBase) and opt.bf16_stochastic_round for opt in a.optimizers)
    assert {type(opt).__name__ for opt in a.optimizers} == {"AdamW8bit" if low_memory == "adamw8bit" else "_AdamBase"}
    assert len(a.optimizers) == (len(list(a.model.parameters())) if in_backward else 1)
    before = {k: v.full_tensor().clone() for k, v in a.model.state_dict().items()}
    train_step(a)
    after = a.model.state_dict()
    assert all(isinstance(v, DTensor) and v.dtype == torch.bfloat16 for v in after.values())
    assert len(after) > 10 and all(not torch.equal(before[k], after[k].full_tensor()) for k in after)  # all stepped
    assert_resumes_exactly(a, b, tmp_path)


def assert_resumes_exactly(a, b, tmp_path):
    """Engine ``a`` (stepped once) saved and loaded into ``b``: the next step, same data, gives equal weights."""
    from launcher.worker import checkpoint
    from tests.worker.test_checkpoint import train_step

    state = checkpoint.TrainerState(global_step=1, micro_steps=1, samples_per_rank=2, world_size=1,
                                    samples_per_step_per_rank=2, engine="fsdp", first_loss=7.0)
    tag = checkpoint.save(a, tmp_path, state)
    checkpoint.load(b, tmp_path, tag, world_size=1, samples_per_step_per_rank=2)
    for engine in (a, b):
        torch.manual_seed(5)
        train_step(engine)
    sa, sb = a.model.state_dict(), b.model.state_dict()
    assert all(torch.equal(sa[k].full_tensor(), sb[k].full_tensor()) for k in sa)
