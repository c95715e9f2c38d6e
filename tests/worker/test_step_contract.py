"""One step contract for every engine: the same seeded fp32 job trains the same math on ZeRO-2, on FSDP2 (there
with chunked cross-entropy, which is exact) and on the plain engine's DDP replicas.

The two engines share the data order, rank 0's init, torch's AdamW (same betas, eps, weight decay), the warm-up
schedule, the mean over micro-batches and ranks, and clipping to train.max_grad_norm (set low here so that every
step clips). Their loss curves must agree step by step.
"""

import json
import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

from launcher.config.job import TrainConfig
from launcher.engines.deepspeed import emit as emit_ds
from launcher.errors import ConfigError
from launcher.worker.engines.base import ADAM_BETAS, ADAM_EPS, build_optimizer
from launcher.worker.engines.deepspeed import check_clipping
from tests.cli.test_run_cli import job_file, launch
from tests.conftest import REPO
from tests.shared_runs import CURVE_ENGINES, CURVE_TRAIN

MAX_GRAD_NORM = CURVE_TRAIN["max_grad_norm"]
"""Far below the tiny GPT-2's gradient norm (about 1 to 5 at these steps): every step clips."""
AGREE = 1e-4
"""Relative agreement of the two loss curves on CPU ranks (fp32; only the order of float sums differs)."""
LOSS_CURVE = (6.948003, 6.730979, 6.404036, 6.137257, 5.846473, 5.521133)
"""The loss at steps 1-6 of test_zero2_and_fsdp2_train_the_same_loss_curve_with_clipping's seeded job, as both
engines trained it (2026-11-29, torch 2.13 CPU; the two agreed to 1e-7)."""
PINNED = 1e-4
"""Relative tolerance on LOSS_CURVE: CPUs that sum in another order move it by about 1e-6."""


def step_rows(run_dir):
    lines = (run_dir / "steps" / "rank-0.jsonl").read_text().splitlines()
    return [json.loads(ln) for ln in lines if ln.strip()]


def test_zero2_and_fsdp2_train_the_same_loss_curve_with_clipping(curve_runs):
    curves = {}
    for name, strategy in CURVE_ENGINES.items():
        plan = json.loads((curve_runs / name / "plan.json").read_text())
        assert (plan["engine"], plan["micro_batch_size"], plan["grad_accum_steps"], plan["loss_chunks"]) == (
            strategy["engine"], 2, 2, strategy["loss_chunks"])
        curves[name] = step_rows(curve_runs / name)
    z, f, d = curves["zero2"], curves["fsdp2"], curves["ddp"]
    assert [r["step"] for r in z] == [r["step"] for r in f] == [r["step"] for r in d] == [1, 2, 3, 4, 5, 6]
    # Both curves, absolutely (torchtune's recipe tests pin theirs): the engines agreeing is not enough, a change
    # to the data order, the init, the schedule or the loss shared by both would move both together.
    for name, curve in curves.items():
        assert [r["loss"] for r in curve] == pytest.approx(LOSS_CURVE, rel=PINNED), (name, [r["loss"] for r in curve])
    for a, b in [*zip(z, f, strict=True), *zip(z, d, strict=True)]:
        # Clipping was active: the norm each engine measured before clipping is over the limit.
        assert a["grad_norm"] > 10 * MAX_GRAD_NORM and b["grad_norm"] > 10 * MAX_GRAD_NORM
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=AGREE), (a, b)
        assert b["lr"] == pytest.approx(a["lr"], rel=1e-12), ("warm-up schedules differ", a, b)
        assert b["loss"] == pytest.approx(a["loss"], rel=AGREE), (z, f)
    assert z[-1]["loss"] < z[0]["loss"]  # and it trains


IN_BACKWARD_AGREE = 1e-6
"""The step in backward runs the same per-tensor AdamW on the same reduce-scattered shards: fp32 curves agree to
rounding (in practice bit for bit)."""


def test_fsdp2_optimizer_in_backward_trains_the_normal_step_curve(tmp_path):
    # Clipping off (it needs every gradient before any step) and no accumulation: otherwise the same math.
    train = {"global_batch_size": 4, "precision": "fp32", "lr": 3e-3, "max_steps": 4, "seed": 7,
             "weight_decay": 0.01, "warmup_steps": 2, "max_grad_norm": 0}
    pins = {"engine": "fsdp", "fsdp_reshard_after_forward": True, "micro_batch_size": 2,
            "activation_checkpointing": False, "offload_optimizer": "none", "offload_params": "none"}
    curves, step_phase, step_grads = {}, {}, {}
    for name, in_backward in (("step", False), ("in-backward", True)):
        job = job_file(tmp_path, name, strategy={**pins, "optimizer_in_backward": in_backward}, train=train)
        res = launch(job, "--run-dir", tmp_path / name, "--quiet")
        assert res.returncode == 0, res.stdout + res.stderr
        plan = json.loads((tmp_path / name / "plan.json").read_text())
        assert (plan["optimizer_in_backward"], plan["grad_accum_steps"]) == (in_backward, 1)
        # It saved its checkpoint at the end: the per-parameter optimizers' state through DCP on 2 ranks.
        assert (tmp_path / name / "checkpoint" / "latest").read_text().strip() == "step-00000004"
        curves[name] = step_rows(tmp_path / name)
        rank = json.loads((tmp_path / name / "ranks" / "rank-0.json").read_text())
        step_phase[name] = rank["phases"]["optimizer_step"]
        step_grads[name] = rank["phase_breakdown"]["optimizer_step"]["grads"]
    # The steps really ran in backward: no gradient is left for the step phase to hold, where the plain step holds
    # this rank's fp32 shard of every gradient (4 bytes x trainable / 2 ranks). Exact in the breakdown at the phase's
    # peak; the phase totals only to half the shard, because either run's step phase can start with the root unit's
    # reduce-scatter input still alive (+328,192 B: its 82,048 fp32 unsharded gradients, the last collective of
    # backward). FSDP2 drops its reference in its final backward callback, but gloo's worker thread still holds the
    # finished collective, with its input, until that thread next runs; on busy CPUs that can be after the phase
    # boundary (measured: freed during a 100 ms sleep with no Python work and no garbage collection; by chance, in
    # either run). The in-backward run then measures 1,420,404 B against the plain 1,718,388 B (or the plain one
    # 2,046,580 B).
    shard = 4 * plan["trainable_params"] // 2
    assert (step_grads["step"], step_grads["in-backward"]) == (shard, 0)
    assert step_phase["step"] - step_phase["in-backward"] >= shard / 2
    a, b = curves["step"], curves["in-backward"]
    assert [r["step"] for r in a] == [r["step"] for r in b] == [1, 2, 3, 4]
    for x, y in zip(a, b, strict=True):
        assert y["lr"] == pytest.approx(x["lr"], rel=1e-12), ("warm-up schedules differ", a, b)
        assert y["loss"] == pytest.approx(x["loss"], rel=IN_BACKWARD_AGREE), (a, b)
        assert y.get("grad_norm") is None  # no global norm is measured
    assert a[-1]["loss"] < a[0]["loss"] and len({r["lr"] for r in a}) > 1  # it trains, through the warm-up


@pytest.mark.parametrize("precision, accum, message", [("fp32", 2, "needs grad_accum_steps 1"),
                                                       ("fp16", 1, "fp16 needs loss scaling")])
def test_fsdp2_refuses_the_step_in_backward_where_it_cannot_step_each_gradient(precision, accum, message):
    from launcher.worker.engines.fsdp import FsdpEngine
    from launcher.worker.engines.plain import PlainEngine

    with pytest.raises(ConfigError, match=message):
        FsdpEngine(reshard_after_forward=True, offload_params="none", offload_optimizer="none",
                   activation_checkpointing=False, precision=precision, grad_accum_steps=accum,
                   device=torch.device("cpu"), optimizer_in_backward=True)
    with pytest.raises(ConfigError, match=message):  # the same refusal, one engine that steps its own optimizer more
        PlainEngine(precision=precision, grad_accum_steps=accum, device=torch.device("cpu"),
                    optimizer_in_backward=True)


def test_the_worker_optimizer_is_the_one_the_ds_config_names():
    # Both engines run torch's AdamW; FSDP2 builds it here, DeepSpeed from ds_config.json's params.
    assert list(ADAM_BETAS) == list(emit_ds.ADAM_BETAS) and ADAM_EPS == emit_ds.ADAM_EPS
    opt = build_optimizer(TrainConfig(global_batch_size=1, weight_decay=0.1), [torch.nn.Parameter(torch.zeros(1))])
    group = opt.param_groups[0]
    assert type(opt) is torch.optim.AdamW
    assert (group["betas"], group["eps"], group["weight_decay"]) == (ADAM_BETAS, ADAM_EPS, 0.1)


def test_deepspeed_refuses_a_ds_config_optimizer_beside_the_plans_low_memory_one():
    # The ranks build the plan's low-memory optimizer as DeepSpeed's client optimizer only when ds_config.json
    # names none; one that does (an old or hand-edited file) would train with AdamW under a low-bit plan.
    from launcher.worker.engines.deepspeed import check_ds_config
    from tests.emit.emit_helpers import make_job, make_plan

    plan = make_plan(low_memory_optimizer="adamw8bit")
    ds = emit_ds.ds_config(plan, make_job())
    check_ds_config(ds, plan)
    with pytest.raises(ConfigError, match="low_memory_optimizer is 'adamw8bit'"):
        check_ds_config({**ds, "optimizer": {"type": "AdamW", "params": {}}}, plan)


def test_deepspeed_refuses_a_pure_bf16_plan_whose_ds_config_keeps_fp32_masters():
    # Without the two bf16 keys DeepSpeed would keep fp32 masters and states: not the plan's memory nor its math.
    from launcher.worker.engines.deepspeed import check_ds_config
    from tests.emit.emit_helpers import make_job, make_plan

    plan = make_plan(zero_stage=2, pure_bf16=True)
    ds = emit_ds.ds_config(plan, make_job())
    check_ds_config(ds, plan)
    with pytest.raises(ConfigError) as err:
        check_ds_config({**ds, "bf16": {"enabled": True}}, plan)
    assert err.value.problems == [
        f"ds_config.json bf16.{key}: absent (DeepSpeed's default False) but plan.json strategy.pure_bf16 is True; "
        "re-emit the run dir (launch --overwrite)"
        for key in ("bf16_master_weights_and_grads", "bf16_optimizer_states")]


def _without(ds: dict, key: str) -> dict:
    out = json.loads(json.dumps(ds))
    *parents, last = key.split(".")
    node = out
    for part in parents:
        node = node[part]
    del node[last]
    return out


def _with(ds: dict, key: str, value) -> dict:
    out = json.loads(json.dumps(ds))
    *parents, last = key.split(".")
    node = out
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
    return out


@pytest.mark.parametrize("strategy, precision", [
    (dict(zero_stage=0), "fp32"), (dict(zero_stage=1), "bf16"), (dict(zero_stage=2, offload_optimizer="cpu"), "bf16"),
    (dict(zero_stage=3, offload_optimizer="nvme", offload_params="cpu"), "bf16"),
    (dict(zero_stage=2, pure_bf16=True), "bf16"), (dict(zero_stage=2, low_memory_optimizer="adamw4bit"), "fp32")])
def test_the_emitted_ds_config_carries_out_its_plan(strategy, precision):
    from launcher.worker.engines.deepspeed import check_ds_config
    from tests.emit.emit_helpers import make_job, make_plan

    plan = make_plan(precision=precision, **strategy)
    check_ds_config(emit_ds.ds_config(plan, make_job()), plan)


@pytest.mark.parametrize("plan_kw, edit, line", [
    # What the plan needs that the config lacks: DeepSpeed would derive the micro-batch from train_batch_size, run
    # ZeRO-0 without a stage, and keep fp32 masters without the bf16 keys.
    (dict(), ("drop", "train_micro_batch_size_per_gpu"),
     "train_micro_batch_size_per_gpu: absent but plan.json strategy.micro_batch_size is 2"),
    (dict(), ("drop", "gradient_accumulation_steps"),
     "gradient_accumulation_steps: absent but plan.json strategy.grad_accum_steps is 4"),
    (dict(), ("drop", "zero_optimization.stage"),
     "zero_optimization.stage: absent (DeepSpeed's default 0) but plan.json strategy.zero_stage is 2"),
    (dict(), ("drop", "bf16"), "bf16.enabled: absent (DeepSpeed's default False) but plan.json precision is 'bf16', "
                               "which needs True"),
    (dict(offload_optimizer="cpu"), ("drop", "zero_optimization.offload_optimizer"),
     "zero_optimization.offload_optimizer.device: absent (DeepSpeed's default 'none') but plan.json "
     "strategy.offload_optimizer is 'cpu'"),
    # What the config sets that the plan contradicts: bf16 masters, an offload or a batch the plan does not count,
    # HF Trainer's "auto", DeepSpeed's own AdamW where pure bf16 steps the rounding client optimizer.
    (dict(), ("set", "bf16.bf16_master_weights_and_grads", True),
     "bf16.bf16_master_weights_and_grads: True but plan.json strategy.pure_bf16 is False"),
    (dict(), ("set", "fp16.enabled", True), "fp16.enabled: True but plan.json precision is 'bf16', which needs False"),
    (dict(), ("set", "zero_optimization.offload_param", {"device": "cpu"}),
     "zero_optimization.offload_param.device: 'cpu' but plan.json strategy.offload_params is 'none'"),
    (dict(), ("set", "train_batch_size", 32), "train_batch_size: 32 but plan.json global_batch_size is 64"),
    (dict(), ("set", "train_micro_batch_size_per_gpu", "auto"),
     "train_micro_batch_size_per_gpu: 'auto' but plan.json strategy.micro_batch_size is 2"),
    (dict(pure_bf16=True), ("set", "optimizer", {"type": "AdamW", "params": {}}),
     "optimizer: 'AdamW' but plan.json's strategy.pure_bf16 is True, whose Adam/AdamW the ranks build as the "
     "stochastically rounding client optimizer (DeepSpeed's own rounds each bf16 weight to nearest)"),
])
def test_deepspeed_checks_the_ds_config_against_the_plan_both_ways(plan_kw, edit, line):
    from launcher.worker.engines.deepspeed import check_ds_config
    from tests.emit.emit_helpers import make_job, make_plan

    plan = make_plan(**plan_kw)
    ds = emit_ds.ds_config(plan, make_job())
    check_ds_config(ds, plan)
    bad = _without(ds, edit[1]) if edit[0] == "drop" else _with(ds, edit[1], edit[2])
    with pytest.raises(ConfigError) as err:
        check_ds_config(bad, plan)
    assert err.value.problems == [f"ds_config.json {line}; re-emit the run dir (launch --overwrite)"]


def test_every_ds_config_disagreement_is_in_one_error():
    from launcher.worker.engines.deepspeed import check_ds_config
    from tests.emit.emit_helpers import make_job, make_plan

    plan = make_plan()
    without_accum = _without(emit_ds.ds_config(plan, make_job()), "gradient_accumulation_steps")
    ds = _with(without_accum, "zero_optimization.stage", 3)
    with pytest.raises(ConfigError) as err:
        check_ds_config(ds, plan)
    assert [p.split(":")[0] for p in err.value.problems] == [
        "ds_config.json gradient_accumulation_steps", "ds_config.json zero_optimization.stage"]


@pytest.mark.parametrize("ds_clip, job_clip, ok", [(1.0, 1.0, True), (0.0, None, True), (0.0, 0.0, True),
                                                   (1.0, 0.5, False), (0.0, 1.0, False)])
def test_deepspeed_clips_to_the_jobs_max_grad_norm(ds_clip, job_clip, ok):
    train = TrainConfig(global_batch_size=1, max_grad_norm=job_clip)
    if ok:
        check_clipping({"gradient_clipping": ds_clip}, train)
    else:
        with pytest.raises(ConfigError, match="gradient_clipping.*max_grad_norm.*re-emit"):
            check_clipping({"gradient_clipping": ds_clip}, train)


def test_fsdp_clip_uses_the_global_norm_of_dtensor_shards(single_rank):
    from torch.distributed.fsdp import fully_shard

    from launcher.worker.engines.base import clip_grad_norm

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    ref = [p.detach().clone() for p in model.parameters()]
    fully_shard(model)
    x = torch.randn(3, 4)
    model(x).square().sum().backward()
    plain = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    with torch.no_grad():
        for p, r in zip(plain.parameters(), ref, strict=True):
            p.copy_(r)
    plain(x).square().sum().backward()
    want = torch.nn.utils.clip_grad_norm_(plain.parameters(), 0.5)
    got = clip_grad_norm(list(model.parameters()), 0.5, dist.group.WORLD, torch.device("cpu"))
    assert float(got) == pytest.approx(float(want), rel=1e-6) and float(want) > 0.5
    for p, q in zip(model.parameters(), plain.parameters(), strict=True):
        torch.testing.assert_close(p.grad.full_tensor(), q.grad)


OFFLOADS = ("none", "cpu")


@pytest.fixture(scope="module")
def clipped(tmp_path_factory):
    """Both offload cases, clipped in one torchrun of 2 ranks (clip_ranks.py): its start-up is most of the cost."""
    out = tmp_path_factory.mktemp("clip")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          str(REPO / "tests" / "worker" / "clip_ranks.py"), str(out), *OFFLOADS],
                         env=env, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert res.returncode == 0, res.stderr[-3000:]
    return out


@pytest.mark.parametrize("offload", OFFLOADS)
def test_fsdp_clip_norm_is_global_across_ranks(clipped, offload):
    """Each rank holds half of every gradient: the norm must be the whole gradient's, on the host shards too."""
    ranks = [json.loads((clipped / f"rank-{r}-{offload}.json").read_text()) for r in (0, 1)]
    for r in ranks:
        assert r["want"] > 0.5  # the averaged gradient is over the limit: clipping acts
        assert r["norm"] == pytest.approx(r["want"], rel=1e-6) and r["grads_match"], r
    assert ranks[0]["local_elems"] < ranks[0]["total_elems"]  # sharded: no rank alone sees the whole norm
