"""The cost model's terms against the sources it cites: compute FLOPs, collective volumes, offload time."""

import dataclasses

import pytest

from launcher.planner.cost import communication, step_time_terms
from launcher.planner.hardware import PROFILES
from launcher.planner.memory import MemoryInputs, analytic_constants
from launcher.planner.plan import Plan, Strategy
from launcher.planner.terms import TORCH_HOST_ADAM_RATIO
from tests.planner.conftest import llama_stats

P = 6_738_415_616
TOKENS_PER_STEP = 2 * 4 * 2048  # micro-batch 2 x accumulation 4 x seq 2048, per rank


def inputs(model=None, gpus=8, nodes=1, hw="a100-80gb", precision="bf16") -> MemoryInputs:
    m = model or llama_stats()
    return MemoryInputs(model=m, world_size=gpus * nodes, gpus_per_node=gpus, nodes=nodes, seq_len=2048,
                        precision=precision, optimizer="adamw", hardware=PROFILES[hw],
                        activations=analytic_constants(m, precision))


def strategy(engine="deepspeed", stage=2, reshard=None, sharding=None, opt="none", par="none", mb=2, accum=4,
             ac=False) -> Strategy:
    if engine == "fsdp":
        stage, reshard, sharding = None, True if reshard is None else reshard, sharding or "full"
    return Strategy.from_json(dict(engine=engine, zero_stage=stage, fsdp_reshard_after_forward=reshard,
                                   fsdp_sharding=sharding, offload_optimizer=opt, offload_params=par,
                                   micro_batch_size=mb, grad_accum_steps=accum, activation_checkpointing=ac))


def no_overhead(inp: MemoryInputs) -> MemoryInputs:
    """The matmuls alone: no per-block overhead, and no memory-bound term (a bandwidth of 0 turns it off)."""
    return dataclasses.replace(inp, hardware=dataclasses.replace(inp.hardware, block_overhead_s=0.0, memory_bw=0.0))


def attention(passes: int, seq: int = 2048, d: int = 4096, causal_half: float = 0.5) -> float:
    """Attention's matmul FLOPs per token, by hand: Q·Kᵀ and scores·V, 2·2·s·d per block and pass (backward 2)."""
    return passes * 4 * seq * d * causal_half


@pytest.mark.parametrize("ac,every,recomputed", [(False, 1, 0), (True, 1, 32), (True, 2, 16), (True, 4, 8)])
def test_compute_is_6_psi_tokens_plus_2_psi_block_per_recomputed_block(ac, every, recomputed):
    # [Kaplan et al. 2020]: forward 2Ψ + backward 4Ψ per token; a recomputed block repeats its forward [Kort §5],
    # and only the checkpointed blocks recompute (every k-th of the 32; embeddings and head never do). Attention's
    # own matmuls beside Ψ: 3 passes per block, a fourth when it recomputes; sdpa on a causal LM does half.
    inp = no_overhead(inputs())
    m, hw = inp.model, inp.hardware
    s = dataclasses.replace(strategy(ac=ac), checkpoint_every=every)
    got = step_time_terms(inp, s, 10**6)["compute"]
    block = (P - m.non_block_params) / m.num_blocks
    flops = 6 * P + 2 * recomputed * block + attention(3 * 32 + recomputed)
    assert got == pytest.approx(flops * TOKENS_PER_STEP / (hw.flops_bf16 * hw.mfu))


def test_attention_matmuls_by_kernel_and_checkpointing():
    """12·s·d per token and block [PaLM App. B; torchtitan's get_num_flop_per_token], half the tiles under a fused
    causal kernel, all of them eagerly or bidirectionally; a recomputed block's forward again, except under the op
    policy with a fused kernel, whose output the policy saves."""
    from launcher.planner.cost import attention_flops_per_token

    inp = inputs()
    eager = dataclasses.replace(inp, activations=dataclasses.replace(inp.activations, attention="eager"))
    bidirectional = dataclasses.replace(inp, model=dataclasses.replace(inp.model, task="seq_cls"))
    full, ops = strategy(ac=True), dataclasses.replace(strategy(ac=True), checkpoint_policy="ops")
    assert attention_flops_per_token(inp, strategy()) == attention(96)
    assert attention_flops_per_token(inp, full) == attention(96 + 32)
    assert attention_flops_per_token(inp, ops) == attention(96)
    assert attention_flops_per_token(eager, strategy()) == attention(96, causal_half=1.0)
    assert attention_flops_per_token(eager, ops) == attention(96 + 32, causal_half=1.0)
    assert attention_flops_per_token(bidirectional, strategy()) == attention(96, causal_half=1.0)


@pytest.mark.parametrize("ac,every,blocks", [(False, 1, 32), (True, 1, 32 + 32 / 3), (True, 2, 32 + 16 / 3)])
def test_memory_bound_kernels_move_a_multiple_of_the_saved_bytes_over_the_bandwidth(ac, every, blocks):
    from launcher.planner.cost import ELEMENTWISE_BYTES_PER_SAVED_BYTE

    inp = inputs()
    a, hw = inp.activations, inp.hardware
    s = dataclasses.replace(strategy(ac=ac), checkpoint_every=every)
    flat = dataclasses.replace(inp, hardware=dataclasses.replace(hw, memory_bw=0.0))
    got = step_time_terms(inp, s, 10**6)["compute"] - step_time_terms(flat, s, 10**6)["compute"]
    saved = a.block_bytes_per_token + a.block_bytes_per_token_per_seq * 2048
    assert got == pytest.approx(ELEMENTWISE_BYTES_PER_SAVED_BYTE * saved * blocks * TOKENS_PER_STEP / hw.memory_bw)
    assert got > 0 and PROFILES["cpu"].memory_bw == 0.0  # CPU ranks: their calibrated block overhead instead


def test_overlap_hides_communication_up_to_the_computes_length():
    """A compute-bound step hides all of FSDP2's collectives (comm_overlap 1.0 on a GPU); a communication-bound
    one pays what the compute cannot cover; gloo on CPU ranks (comm_overlap 0) pays all of it."""
    s = strategy("fsdp", accum=4)
    inp = inputs(gpus=8, nodes=1)
    assert step_time_terms(inp, s, 10**9)["communication"] == 0.0
    slow_net = dataclasses.replace(inp, hardware=dataclasses.replace(inp.hardware, intra_node_bw=1e9,
                                                                     inter_node_bw=1e9))
    terms = step_time_terms(slow_net, s, 10**9)
    t = communication(slow_net, s, 10**9)
    comm = (t.intra_node_bytes + t.inter_node_bytes) / 1e9 + t.calls * slow_net.hardware.collective_latency_s
    assert comm > terms["compute"] and terms["communication"] == pytest.approx(comm - terms["compute"])
    half = dataclasses.replace(slow_net, hardware=dataclasses.replace(slow_net.hardware, comm_overlap=0.5))
    assert step_time_terms(half, s, 10**9)["communication"] == pytest.approx(max(comm / 2, comm - terms["compute"]))
    cpu = inputs(gpus=2, hw="cpu")
    t = communication(cpu, s, 10**9)
    assert step_time_terms(cpu, s, 10**9)["communication"] == pytest.approx(
        (t.intra_node_bytes + t.inter_node_bytes) / cpu.hardware.intra_node_bw
        + t.calls * cpu.hardware.collective_latency_s)


def test_block_overhead_is_paid_again_by_recomputed_blocks_only():
    inp = inputs()
    hw = inp.hardware
    flat = dataclasses.replace(hw, block_overhead_s=0.0)
    for ac, every, blocks in ((False, 1, 32), (True, 1, 48), (True, 2, 40)):
        s = dataclasses.replace(strategy(ac=ac), checkpoint_every=every)
        overhead = (step_time_terms(inp, s, 10**6)["compute"]
                    - step_time_terms(dataclasses.replace(inp, hardware=flat), s, 10**6)["compute"])
        assert overhead == pytest.approx(4 * blocks * hw.block_overhead_s)


def test_activation_offload_pays_pcie_both_ways_for_the_saved_tensors_on_cuda_only():
    from launcher.planner.memory import block_activations

    for ac in (False, True):
        s = dataclasses.replace(strategy(ac=ac), activation_offload=True)
        inp = inputs()
        saved, _ = block_activations(inp.activations, inp.model.num_blocks, 2, 2048, ac)
        saved += 2 * 2048 * inp.activations.head_bytes_per_token  # the loss's saved tensors go too
        off = step_time_terms(inp, dataclasses.replace(s, activation_offload=False), 10**6)["offload"]
        on = step_time_terms(inp, s, 10**6)["offload"]
        # Out in forward, back in backward, every micro-batch (4), over the host link, not overlapped.
        assert on - off == pytest.approx(2 * saved * 4 / inp.hardware.host_link_bw)
    cpu = inputs(hw="cpu")
    s = dataclasses.replace(strategy(), activation_offload=True)
    assert step_time_terms(cpu, s, 10**6)["offload"] == 0.0


def test_compute_uses_the_fp32_peak_for_fp32():
    bf16 = step_time_terms(no_overhead(inputs()), strategy(), 10**6)["compute"]
    fp32 = step_time_terms(no_overhead(inputs(precision="fp32")), strategy(), 10**6)["compute"]
    hw = PROFILES["a100-80gb"]
    assert fp32 / bf16 == pytest.approx(hw.flops_bf16 / hw.flops_fp32)


def test_lora_skips_the_frozen_weight_gradients():
    # Frozen weights still pass activation gradients back (2Ψ) but compute no weight gradient (2Ψ); attention
    # has no weights and runs its backward either way.
    lora = no_overhead(inputs(model=llama_stats(trainable=4_000_000)))
    full = no_overhead(inputs())
    assert step_time_terms(lora, strategy(), 10**6)["compute"] / step_time_terms(full, strategy(), 10**6)[
        "compute"] == pytest.approx((4 * P + attention(96)) / (6 * P + attention(96)))


def test_block_overhead_is_paid_per_micro_step():
    inp = inputs()
    one = step_time_terms(inp, strategy(mb=8, accum=1), 10**6)["compute"]
    four = step_time_terms(inp, strategy(mb=2, accum=4), 10**6)["compute"]
    assert four - one == pytest.approx(3 * inp.model.num_blocks * inp.hardware.block_overhead_s)


def volume(s: Strategy, **kw) -> float:
    t = communication(inputs(**kw), s, 10**9)
    return t.intra_node_bytes + t.inter_node_bytes


def test_zero_stage_volumes_follow_the_paper():
    ring, w = 7 / 8, 2
    dp = volume(strategy(stage=0, accum=1))
    # [ZeRO §7]: data parallelism all-reduces the gradients, 2Ψ per rank (reduce-scatter + all-gather).
    assert dp == pytest.approx(2 * w * P * ring)
    # ZeRO-2 moves the same volume as DP; ZeRO-3 1.5x (a second gather of the parameters) [ZeRO §7.2].
    assert volume(strategy(stage=2, accum=1)) == pytest.approx(dp)
    assert volume(strategy(stage=3, accum=1)) == pytest.approx(1.5 * dp)
    # ZeRO-1 re-gathers the updated parameters after the step: one more Ψ.
    assert volume(strategy(stage=1, accum=1)) == pytest.approx(1.5 * dp)


def test_accumulation_repeats_only_what_runs_per_micro_step():
    w, ring = 2, 7 / 8
    # ZeRO-0/1 reduce once per step; ZeRO-2 reduce-scatters every micro-step; ZeRO-3 also gathers every one.
    assert volume(strategy(stage=0, accum=4)) == volume(strategy(stage=0, accum=1))
    assert volume(strategy(stage=2, accum=4)) == pytest.approx((4 + 1) * w * P * ring)
    assert volume(strategy(stage=3, accum=4)) == pytest.approx(4 * volume(strategy(stage=3, accum=1)))


def test_fsdp_volumes_by_sharding():
    w, ring = 2, 7 / 8
    assert volume(strategy("fsdp", accum=1)) == pytest.approx(3 * w * P * ring)  # FULL_SHARD: as ZeRO-3
    assert volume(strategy("fsdp", reshard=False, accum=1)) == pytest.approx(2 * w * P * ring)  # SHARD_GRAD_OP
    t = communication(inputs(nodes=2), strategy("fsdp", sharding="hybrid", accum=1), 10**9)
    assert t.intra_node_bytes == pytest.approx(3 * w * P * ring)
    assert t.inter_node_bytes == pytest.approx(2 * (1 / 2) * w * P / 8)


def test_a_group_across_nodes_runs_at_network_speed():
    one = communication(inputs(gpus=8, nodes=1), strategy(stage=2), 10**9)
    two = communication(inputs(gpus=4, nodes=2), strategy(stage=2), 10**9)
    assert (one.inter_node_bytes, two.intra_node_bytes) == (0, 0)
    assert one.intra_node_bytes == pytest.approx(two.inter_node_bytes)
    hw = PROFILES["a100-80gb"]
    exposed = dataclasses.replace(hw, comm_overlap=0.0)  # nothing hidden: the collectives' own seconds

    def seconds(**kw) -> float:
        return step_time_terms(dataclasses.replace(inputs(**kw), hardware=exposed), strategy(stage=2),
                               10**9)["communication"]

    t_one, t_two = seconds(gpus=8, nodes=1), seconds(gpus=4, nodes=2)
    assert t_two > t_one * hw.intra_node_bw / hw.inter_node_bw * 0.99


def test_one_rank_communicates_nothing():
    t = communication(inputs(gpus=1), strategy(stage=3), 10**6)
    assert (t.intra_node_bytes, t.inter_node_bytes, t.calls) == (0, 0, 0)


def test_smaller_buckets_cost_more_calls():
    inp = inputs()
    few = communication(inp, strategy(stage=2, accum=1), 10**9).calls
    many = communication(inp, strategy(stage=2, accum=1), 10**6).calls
    # One reduce per bucket plus one gather, by hand: Ψ = 6_738_415_616 elements fill ceil(6.74) = 7 buckets of 1e9
    # and ceil(6738.4) = 6739 buckets of 1e6.
    assert (few, many) == (7 + 1, 6739 + 1)


def test_offload_is_pcie_plus_cpu_adam_on_a_gpu_profile():
    # [ZeRO-Offload, arXiv:2101.06840 §4]: 16-bit gradients down and parameters up over PCIe per step, and the
    # CPU Adam over the node's partitions (8 ranks share the node's CPUs). Round link and Adam rates so the
    # seconds can be worked by hand: shard = Ψ/8 = 842_301_952 params;
    # PCIe 2 directions x 2 bytes x 842_301_952 / 1e10 B/s = 0.3369207808 s;
    # CPU Adam 842_301_952 x 8 ranks / 1e9 params/s = 6.738415616 s; total 7.0753363968 s.
    hw = dataclasses.replace(PROFILES["a100-80gb"], host_link_bw=1e10, cpu_adam_params_per_s=1e9)
    inp = dataclasses.replace(inputs(), hardware=hw)
    got = step_time_terms(inp, strategy(stage=2, opt="cpu"), 10**6)["offload"]
    assert got == pytest.approx(7.0753363968, rel=1e-12)
    assert step_time_terms(inp, strategy(stage=2), 10**6)["offload"] == 0.0
    # Param offload (ZeRO-3) fetches each micro-step's parameters over PCIe, both ways:
    # 4 micro-steps x 2 directions x 2 bytes x 842_301_952 / 1e10 = 1.3476831232 s more.
    par = step_time_terms(inp, strategy(stage=3, opt="cpu", par="cpu"), 10**6)["offload"]
    assert par - step_time_terms(inp, strategy(stage=3, opt="cpu"), 10**6)["offload"] == pytest.approx(
        1.3476831232, rel=1e-12)


def test_offload_costs_nothing_on_cpu_ranks():
    assert step_time_terms(inputs(hw="cpu"), strategy(stage=2, opt="cpu"), 10**6)["offload"] == 0.0


def test_hybrid_fsdp_offload_runs_adam_over_the_node_shard():
    inp = inputs(nodes=2)
    hw = inp.hardware
    hybrid = step_time_terms(inp, strategy("fsdp", sharding="hybrid", opt="cpu", par="cpu"), 10**6)["offload"]
    shard = P / 8  # one node's shard, not the world's 1/16
    # grads down and params up, torch's AdamW over the shard on the host (TORCH_HOST_ADAM_RATIO times DeepSpeed's CPU
    # Adam, which cpu_adam_params_per_s rates), and the fp32 shard copied up before each of the 2 gathers (forward,
    # backward) of the 4 micro-steps
    weights = 4 * 2 * 4 * shard / hw.host_link_bw
    adam = shard * 8 * TORCH_HOST_ADAM_RATIO / hw.cpu_adam_params_per_s
    assert hybrid == pytest.approx(2 * 2 * shard / hw.host_link_bw + adam + weights)


@pytest.mark.parametrize("reshard,gathers", [(True, 2), (False, 1)])
def test_fsdp_param_offload_moves_frozen_lora_weights_every_forward_and_backward(reshard, gathers):
    # LoRA: almost nothing trains, but CPUOffloadPolicy still copies every weight shard to the device before each
    # all-gather (forward, and backward again when resharded), every micro-step: the adapters' fp32 shards and the
    # frozen base's, which the worker holds in the working dtype (bf16 here).
    lora = llama_stats(trainable=4_000_000)
    inp = inputs(model=lora)
    hw = inp.hardware
    with_par = step_time_terms(inp, strategy("fsdp", reshard=reshard, opt="cpu", par="cpu", accum=4), 10**6)
    trainable_shard = lora.trainable_params / 8
    optimizer_only = (2 * 2 * trainable_shard / hw.host_link_bw
                      + trainable_shard * 8 * TORCH_HOST_ADAM_RATIO / hw.cpu_adam_params_per_s)  # torch's AdamW
    weights = 4 * gathers * (4 * lora.trainable_params + 2 * (P - lora.trainable_params)) / 8 / hw.host_link_bw
    assert with_par["offload"] == pytest.approx(optimizer_only + weights)
    assert weights > 5 * optimizer_only  # the frozen weights, not the adapters, are what moving costs


def test_bf16_compute_uses_the_calibrated_bf16_rate_on_a_cpu_without_native_bf16():
    # An AVX2-only CPU: bf16 matmuls ~13x slower than fp32, as `launch calibrate` measures them.
    slow = dataclasses.replace(PROFILES["cpu"], flops_fp32=1.0e11, flops_bf16=1.0e11 / 13, block_overhead_s=0.0)
    terms = {}
    for precision in ("bf16", "fp32"):
        inp = dataclasses.replace(inputs(gpus=2, hw="cpu", precision=precision), hardware=slow)
        terms[precision] = step_time_terms(inp, strategy(stage=2, mb=1, accum=1), 10**6)["compute"]
    assert terms["bf16"] / terms["fp32"] == pytest.approx(13.0)


@pytest.mark.parametrize("precision,said", [("bf16", True), ("fp32", False)])
def test_a_profile_with_slow_bf16_is_said_in_the_plan(request_for, precision, said):
    from launcher.planner.search import make_plan

    slow = dataclasses.replace(PROFILES["cpu"], flops_fp32=1.0e11, flops_bf16=1.0e11 / 13)
    plan = make_plan(request_for(hardware=slow, gpus_per_node=2, budget_bytes=10**12, global_batch_size=2,
                                 seq_len=128, precision=precision))
    notes = [r for r in plan.reasons if "bf16 matmuls run 13.0x slower than fp32" in r]
    assert bool(notes) is said


def test_chunked_loss_recomputes_the_head_forward():
    # launcher.model.chunked_loss reruns each piece's lm_head matmul in backward: 2·h·V FLOPs per token more.
    inp = no_overhead(inputs())
    hw, m = inp.hardware, inp.model
    plain = step_time_terms(inp, strategy(), 10**6)["compute"]
    chunked = step_time_terms(inp, dataclasses.replace(strategy(), loss_chunks=8), 10**6)["compute"]
    assert chunked - plain == pytest.approx(2 * m.hidden_size * m.vocab_size * TOKENS_PER_STEP
                                            / (hw.flops_bf16 * hw.mfu))


def test_the_step_in_backward_costs_one_optimizer_call_per_trained_tensor():
    from launcher.planner.cost import IN_BACKWARD_CALL_S

    inp = inputs(model=dataclasses.replace(llama_stats(), trainable_tensors=291))
    plain = strategy(engine="fsdp", accum=1)
    oib = dataclasses.replace(plain, optimizer_in_backward=True)
    a, b = step_time_terms(inp, plain, 0), step_time_terms(inp, oib, 0)
    assert b["compute"] - a["compute"] == pytest.approx(291 * IN_BACKWARD_CALL_S)
    assert {k: v for k, v in a.items() if k != "compute"} == {k: v for k, v in b.items() if k != "compute"}


def test_the_step_in_backward_is_chosen_only_to_fit_and_the_plan_says_clipping_is_off(request_for):
    from launcher.config.job import StrategyConfig
    from launcher.planner.search import make_plan

    # Every other lever pinned off, so that only this one can close the gap.
    pins = StrategyConfig(engine="fsdp", fsdp_reshard_after_forward=True, offload_optimizer="none",
                          offload_params="none", micro_batch_size=1, activation_checkpointing=True,
                          checkpoint_every=1, loss_chunks=0, activation_offload=False, low_memory_optimizer="none",
                          pure_bf16=False, qlora=False)
    small = dataclasses.replace(llama_stats(), trainable_tensors=291)
    kw = dict(model=small, pins=pins, global_batch_size=8, seq_len=256, max_grad_norm=1.0)
    roomy = make_plan(request_for(**kw))
    assert not roomy.strategy.optimizer_in_backward  # it fits anyway: the plain step, with its clipping
    plain = roomy.estimate
    # A budget between the peak with the step in backward and the plain one: only the lever fits.
    with_lever = make_plan(request_for(**{**kw, "pins": dataclasses.replace(pins, optimizer_in_backward=True)}))
    with_lever = with_lever.estimate
    assert with_lever.peak_bytes < plain.peak_bytes
    budget = int((with_lever.peak_bytes + plain.peak_bytes) / 2 / 0.95)
    tight = make_plan(request_for(**kw, budget_bytes=budget))
    assert tight.strategy.optimizer_in_backward
    said = [r for r in tight.reasons if r.startswith("optimizer step in backward")]
    assert said and "gradient clipping is OFF -- train.max_grad_norm 1 is not applied" in said[0]
    decision = next(d for d in tight.levers if d.lever == "optimizer_in_backward")
    assert decision.used and decision.why == "needed_to_fit"
    assert not any(r.startswith("optimizer step in backward") for r in roomy.reasons)
    # The report repeats it from the plan's typed field (plan.json math_notes), not from the reasons' words.
    assert tight.math_notes == said and roomy.math_notes == []
    assert Plan.from_json(tight.to_json()).math_notes == said
