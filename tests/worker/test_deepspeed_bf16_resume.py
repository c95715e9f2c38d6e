"""DeepSpeed's pure bf16 (Strategy.pure_bf16) on a 1-rank gloo group: bf16 masters and states, the stochastically
rounding client AdamW, and a checkpoint that resumes to the same weights as the run that went on."""

import torch
import torch.distributed as dist


def ds_pure_bf16_config(stage: int) -> dict:
    """The keys of the emitted pure-bf16 ds_config (golden ds_zero3_pure_bf16.json) that the engine acts on."""
    return {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
            "bf16": {"enabled": True, "bf16_master_weights_and_grads": True, "bf16_optimizer_states": True},
            # ZeRO-3 in several sub-groups, each stepped by the one client optimizer in turn (stage3.py
            # _optimizer_step): each rounds with bits of its own, counted alike by the resumed engine.
            "zero_optimization": {"stage": stage, **({"sub_group_size": 50_000} if stage == 3 else {})},
            "steps_per_print": 10**9, "zero_allow_untested_optimizer": True}


def test_deepspeed_pure_bf16_keeps_bf16_masters_and_resumes_exactly(tmp_path, single_rank, examples_data):
    # Both partitioned optimizers in one process group: DeepSpeed caches its groups per process (deepspeed.comm),
    # so a second test's new group would be unknown to it.
    for stage in (2, 3):
        check_stage(stage, tmp_path / f"z{stage}", examples_data)
    # ZeRO-2 with the low-bit AdamW as the client optimizer over the flat bf16 master (DeepSpeedSpec
    # .pure_bf16_optimizers): torchao's AdamW8bit with bf16_stochastic_round.
    check_stage(2, tmp_path / "z2-adamw8bit", examples_data, low_memory="adamw8bit")


def check_stage(stage: int, ckpt_root, examples_data, low_memory: str = "none") -> None:
    from torchao.optim.adam import _AdamBase

    from launcher.config.job import Job
    from launcher.config.load import from_dict
    from launcher.runtime import memory_probe
    from launcher.worker import checkpoint
    from launcher.worker.engines.deepspeed import _MASTER_ATTRS, DeepSpeedEngine, _attrs
    from launcher.worker.model import build
    from launcher.worker.recipes import make_recipe
    from tests.worker.run_dirs import tiny_gpt2_job
    from tests.worker.test_checkpoint import train_step

    job = from_dict(Job, tiny_gpt2_job(str(examples_data / "causal.jsonl")))
    engines = []
    for _ in range(2):
        torch.manual_seed(0)
        e = DeepSpeedEngine(ds_pure_bf16_config(stage), pure_bf16=True)
        e.low_memory_optimizer = low_memory  # as from_plan sets it
        if not dist.is_initialized():
            e.init_process_group("gloo")
        e.before_build()
        model = build(job, make_recipe(job.task, job.data), seq_len=32, hf_checkpointing=False)
        e.setup(model, job.train, memory_probe(device="cpu", track_categories=False))
        engines.append(e)
    a, b = engines

    basic = a.optimizer.optimizer  # the client optimizer inside ZeRO's
    assert isinstance(basic, _AdamBase) and basic.bf16_stochastic_round
    assert type(basic).__name__ == {"none": "_AdamBase", "adamw8bit": "AdamW8bit"}[low_memory]
    # No fp32 master anywhere: ZeRO's master partitions (what the client optimizer steps) and every state it keeps
    # are bf16.
    masters = _attrs(a.optimizer, _MASTER_ATTRS)
    assert masters and all(m.dtype == torch.bfloat16 for m in masters)
    if stage == 3:
        assert len(a.optimizer.fp32_partitioned_groups_flat) > 1
    torch.manual_seed(3)
    train_step(a)
    states = [v for s in basic.state.values() for v in s.values() if torch.is_tensor(v) and v.numel() > 1]
    # bf16 moments, or 8-bit codes where torchao quantizes the flat partition (its block divides it).
    assert states and all(v.dtype == torch.bfloat16 or type(v).__name__ == "OptimState8bit" for v in states)
    if low_memory != "none":
        assert {type(v).__name__ for v in states} <= {"OptimState8bit", "Tensor"}

    state = checkpoint.TrainerState(global_step=1, micro_steps=1, samples_per_rank=2, world_size=1,
                                    samples_per_step_per_rank=2, engine="deepspeed", first_loss=7.0)
    tag = checkpoint.save(a, ckpt_root, state)
    checkpoint.load(b, ckpt_root, tag, world_size=1, samples_per_step_per_rank=2)
    weights = []
    for e in (a, b):
        torch.manual_seed(5)
        train_step(e)
        weights.append(e.gather_weights(torch.float32, adapter_only=False))
    wa, wb = weights
    assert len(wa) > 10 and wa.keys() == wb.keys()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
