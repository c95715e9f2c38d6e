"""The no-plan answer is typed (launcher.planner.advice.NoFit) and worded here only: the exact lines users and
scripts read (launch plan, launch run, --json's reasons and suggestions)."""

from launcher.cli.render import error_lines, no_fit_lines, suggestion_line
from launcher.config.problem import Problem
from launcher.errors import ConfigError, NoPlanError
from launcher.planner.advice import NoFit, Suggestion
from launcher.planner.scoring import Problem as Overrun

PLAN = {"label": "ZeRO-3 +opt->cpu, mb=1x8, AC", "peak_bytes": 18_520_000_000, "step_time_s": 65.06}


def no_fit(*suggestions: Suggestion) -> NoFit:
    return NoFit(budget_bytes=20 * 10**9, world_size=2, tried=1120, smallest_label="FSDP2 full-shard, mb=1x32",
                 smallest_peak_bytes=3_610_000_000, suggestions=list(suggestions),
                 smallest=Overrun(resource="host_ram", need_bytes=203_490_000_000, have_bytes=50 * 10**9))


def test_each_change_is_worded_with_its_flag_and_the_plan_it_gets():
    plan = "ZeRO-3 +opt->cpu, mb=1x8, AC, peak 18.52 GB per GPU, 65.1 s/step"
    cases = [
        (Suggestion(change="budget", value=64_600_000_000, card="a100-80gb", card_bytes=85_899_345_920, **PLAN),
         "a budget of 64.60 GB per GPU (a100-80gb holds 85.90 GB) (--budget 64.60GB)"),
        (Suggestion(change="budget", value=59 * 10**9, **PLAN), "a budget of 59.00 GB per GPU (--budget 59.00GB)"),
        (Suggestion(change="unpin", names=("engine", "loss_chunks"), **PLAN), "unpinning engine, loss_chunks"),
        (Suggestion(change="gpus", value=8, world_size=8, **PLAN), "8 GPUs, 8 per node (--gpus 8)"),
        (Suggestion(change="nodes", value=4, world_size=8, gpus_per_node=2, **PLAN),
         "4 nodes of 2 GPUs, 8 in all (--nodes 4)"),
        (Suggestion(change="seq_len", value=4096, **PLAN), "a shorter sequence: max_seq_len 4096 (--seq-len 4096)"),
        (Suggestion(change="lora", value=4_194_304, names=("q_proj", "v_proj"), lora_rank=8, **PLAN),
         "LoRA (train.lora: {r: 8, target_modules: [q_proj, v_proj]}, ~4,194,304 trainable)"),
        (Suggestion(change="micro_batch", **PLAN), "a smaller micro-batch"),
        (Suggestion(change="host_ram", value=122 * 10**9, **PLAN),
         "more host RAM per node: 122.00 GB (cluster.host_ram_per_node)"),
    ]
    for s, change in cases:
        assert suggestion_line(s) == f"{change}: {plan}"
    nvme = Suggestion(change="nvme", nvme_bytes_per_node=107_810_000_000, **PLAN)
    assert suggestion_line(nvme) == (f"NVMe offload (set cluster.nvme_path and nvme_free): {plan}, "
                                     "107.81 GB of NVMe per node")


def test_the_answer_reads_as_before_with_the_sessions_hints_last():
    e = NoPlanError(no_fit(Suggestion(change="gpus", value=8, world_size=8, **PLAN)))
    e = e.with_hints([Problem("cluster.host_ram_per_node", "50.00 GB is less than the offload needs; raise it")])
    assert e.short_of == "host_ram"
    assert error_lines(e) == no_fit_lines(e) == [
        "no plan fits 20.00 GB per GPU on 2 GPUs (1120 candidates tried); smallest footprint: 3.61 GB with FSDP2 "
        "full-shard, mb=1x32 (host RAM: needs 203.49 GB per node, has 50.00 GB)",
        "what would fit:",
        "  - 8 GPUs, 8 per node (--gpus 8): ZeRO-3 +opt->cpu, mb=1x8, AC, peak 18.52 GB per GPU, 65.1 s/step",
        "  - cluster.host_ram_per_node: 50.00 GB is less than the offload needs; raise it",
    ]
    assert no_fit_lines(NoPlanError(no_fit()))[2:] == [
        "  - nothing within reach by one change; combine more GPUs with LoRA or a shorter sequence"]
    assert error_lines(ConfigError(["a: b", Problem("c", "d")])) == ["a: b", "c: d"]
