import inspect
import math

import pytest
from submitit.slurm import slurm as submitit_slurm

from launcher.config.problem import Problem
from launcher.emit.slurm_params import (
    check_additional,
    check_slurm,
    directives,
    executor_parameters,
    sbatch_long_options,
    submitit_parameters,
)
from launcher.errors import ConfigError
from launcher.planner.plan import Strategy

SBATCH = frozenset({"reservation", "licenses", "mail_type", "comment", "time", "nodes", "begin"})
NO_SBATCH = frozenset()


def test_valid_keys_come_from_submitits_own_signature():
    sig = set(inspect.signature(submitit_slurm._make_sbatch_string).parameters) - {"command", "folder", "map_count"}
    assert set(submitit_parameters()) == sig == submitit_slurm.SlurmExecutor._valid_parameters()


def test_unknown_additional_key_lists_the_valid_ones(make_job):
    job = make_job(**{"slurm.additional_parameters": {"reservaton": "maint"}})
    problems = check_slurm(job.slurm, sbatch_options=SBATCH)
    assert [p.field for p in problems] == ["slurm.additional_parameters.reservaton"]
    line = str(problems[0])
    assert line.startswith("slurm.additional_parameters.reservaton: unknown key")
    assert "did you mean 'reservation'?" in line
    for key in ("reservation", "licenses", "wckey", "mail_user", "exclude"):  # sbatch's and submitit's
        assert key in line


def test_without_sbatch_only_submitit_keys_are_valid(make_job):
    job = make_job(**{"slurm.additional_parameters": {"reservation": "x", "comment": "ok"}})
    problems = check_slurm(job.slurm, sbatch_options=NO_SBATCH)
    assert [p.field for p in problems] == ["slurm.additional_parameters.reservation"]
    assert "sbatch is not installed" in problems[0].text


def test_owned_keys_point_to_the_field_that_sets_them(make_job):
    job = make_job(**{"slurm.additional_parameters": {"time": 5, "gpus-per-node": 4, "array": "0-3"}})
    said = {p.field: p.text for p in check_slurm(job.slurm, sbatch_options=SBATCH)}
    assert said["slurm.additional_parameters.time"] == "is set by the launcher; set slurm.timeout_min instead"
    assert said["slurm.additional_parameters.gpus-per-node"] == "is set by the launcher; set gpus (or --gpus) instead"
    assert said["slurm.additional_parameters.array"].startswith("is set by the launcher; set sweep:")


def test_values_must_be_scalars():
    assert check_additional({"comment": None}, sbatch_options=SBATCH)
    assert check_additional({"comment": ["a"]}, sbatch_options=SBATCH)
    assert not check_additional({"comment": "a b", "begin": 3, "licenses": True}, sbatch_options=SBATCH)


@pytest.mark.parametrize("field,value,needle", [
    ("timeout_min", 0, "slurm.timeout_min: 0 must be at least 1"),
    ("signal_delay_s", 60, "slurm.signal_delay_s: 60 must be in [0, timeout_min*60 = 60)"),
    ("max_requeues", -1, "slurm.max_requeues: -1 must not be negative"),
    ("array_parallelism", 0, "slurm.array_parallelism: 0 must be at least 1"),
    ("cpus_per_task", 0, "slurm.cpus_per_task: 0 must be from 1 to 4096"),
    ("cpus_per_task", 10**8, "slurm.cpus_per_task: 100000000 must be from 1 to 4096"),
    ("mem_gb", -2.0, "slurm.mem_gb: -2.0 must be from 1 to 65536"),
    ("mem_gb", 0.0001, "slurm.mem_gb: 0.0001 must be from 1 to 65536"),  # was --mem=0MB: the whole node
    ("mem_gb", 1e30, "slurm.mem_gb: 1e+30 must be from 1 to 65536"),
])
def test_field_rules(make_job, field, value, needle):
    job = make_job(**{"slurm.timeout_min": 1, f"slurm.{field}": value} if field != "timeout_min"
                   else {f"slurm.{field}": value})
    problems = check_slurm(job.slurm, sbatch_options=SBATCH)
    assert any(p.field == f"slurm.{field}" and str(p).startswith(needle) for p in problems), problems


def test_every_problem_in_one_error(make_job, make_plan):
    job = make_job(**{"slurm.max_requeues": -1, "slurm.array_parallelism": 0,
                      "slurm.additional_parameters": {"bogus": 1}})
    with pytest.raises(ConfigError) as e:
        executor_parameters(job, make_plan(), sbatch_options=SBATCH)
    assert [p.field for p in e.value.found] == ["slurm.max_requeues", "slurm.array_parallelism",
                                                "slurm.additional_parameters.bogus"]
    assert e.value.problems == [str(p) for p in e.value.found]


def test_problems_are_typed_with_the_fields_they_read(make_job):
    """check_slurm returns config Problems: callers act on the field and the fields a rule read, never on words;
    str() is the line the user reads."""
    job = make_job(**{"slurm.timeout_min": 1, "slurm.signal_delay_s": 60, "slurm.qos": "a b",
                      "slurm.additional_parameters": {"time": 5}})
    problems = check_slurm(job.slurm, sbatch_options=SBATCH)
    assert all(isinstance(p, Problem) for p in problems)
    assert [(p.field, p.reads) for p in problems] == [("slurm.qos", ()),
                                                      ("slurm.signal_delay_s", ("slurm.timeout_min",)),
                                                      ("slurm.additional_parameters.time", ())]
    signal = problems[1]
    assert str(signal) == ("slurm.signal_delay_s: 60 must be in [0, timeout_min*60 = 60) so the checkpoint signal "
                           "comes before the limit; e.g. 90")
    # A refused slurm.timeout_min would make the signal rule moot, as the loader's Problem.judges decides.
    assert signal.judges(["slurm.timeout_min"]) and not problems[2].judges(["slurm.timeout_min"])
    assert [p.field for p in check_additional({"comment": None}, sbatch_options=SBATCH)] == [
        "slurm.additional_parameters.comment"]


def gpu_plan(plan):
    """``plan`` for GPU ranks (the fixtures' plans are for CPU ranks)."""
    import dataclasses

    return dataclasses.replace(plan, hardware="a100-80gb", estimate=dataclasses.replace(
        plan.estimate, basis="cuda_reserved_plus_context"))


def test_executor_parameters_one_task_per_node_with_the_plans_gpus(make_job, make_plan):
    job = make_job(**{"slurm.partition": "debug", "slurm.mem_gb": 1.5, "slurm.exclusive": True,
                      "slurm.setup": ["module load cuda"], "slurm.timeout_min": 30,
                      "slurm.additional_parameters": {"comment": "x", "reservation": "r1"}})
    params = executor_parameters(job, gpu_plan(make_plan(nodes=2, gpus_per_node=4)), sbatch_options=SBATCH)
    assert params["nodes"] == 2 and params["ntasks_per_node"] == 1 and params["gpus_per_node"] == 4
    assert params["cpus_per_task"] == 32  # the a100-80gb profile's 8 CPUs per GPU by default
    assert params["time"] == 30 and params["mem"] == "1536MB" and params["exclusive"] is True
    assert params["comment"] == "x"  # submitit's own parameter goes through its own checks
    assert params["additional_parameters"] == {"reservation": "r1"}
    assert params["setup"] == ["module load cuda"] and params["job_name"] == "unit"
    # submitit accepts all of it (this is what update_parameters runs)
    submitit_slurm._make_sbatch_string(command="true", folder="/tmp/x", **params)


def test_directives_use_sbatch_spelling(make_job, make_plan):
    job = make_job(**{"slurm.additional_parameters": {"mail_type": "END", "reservation": "r1"}})
    d = directives(job, gpu_plan(make_plan(nodes=1, gpus_per_node=2)), sbatch_options=SBATCH)
    assert d["job-name"] == "unit" and d["ntasks-per-node"] == 1 and d["gpus-per-node"] == 2
    assert d["mail-type"] == "END" and d["reservation"] == "r1" and "signal-delay-s" not in d


def test_sbatch_help_is_parsed_when_sbatch_exists(monkeypatch):
    import launcher.emit.slurm_params as sp

    class Out:
        stdout = "Parallel run options:\n  -a, --array=indexes   job array\n      --reservation=name  allocate\n"

    monkeypatch.setattr(sp.shutil, "which", lambda name: "/usr/bin/sbatch")
    monkeypatch.setattr(sp.subprocess, "run", lambda *a, **k: Out())
    # The function under its cache: the cache keeps the real sbatch's options, read once at the session's start
    # (tests/conftest.py), so no later test starts `sbatch --help` again.
    assert sbatch_long_options.__wrapped__() == frozenset({"array", "reservation"})


def _offload(plan, **estimate):
    import dataclasses

    offloaded = Strategy.from_json(plan.strategy.to_json() | dict(offload_optimizer="cpu"))
    plan = dataclasses.replace(plan, strategy=offloaded, hardware="a100-80gb")
    values = {"host_bytes_per_node": 20 * 10**9, "step_time_s": 3.0, "basis": "cuda_reserved_plus_context", **estimate}
    return dataclasses.replace(plan, estimate=dataclasses.replace(plan.estimate, **values))


def test_submitit_parameters_carry_the_derived_allocation(make_job, make_plan):
    """The --slurm path asks for what the plan needs, as the sbatch script does (point 15 of issue 20)."""
    job = make_job(**{"train.max_steps": 1000})
    params = executor_parameters(job, _offload(make_plan(nodes=1, gpus_per_node=4)), sbatch_options=SBATCH)
    # 1000 x 3.0 s x 1.5 + start-up: 120 s + the first step's extra 2 x 3.0 s (an inline model reads no weights,
    # FSDP2 builds no op) = 4626 s
    assert params["time"] == 78
    assert params["mem"] == "39G"  # 20 GB x 1.25 + 4 ranks x 4 GB = 41 GB = 38.2 GiB, rounded up
    assert params["cpus_per_task"] == 32 and params["gpus_per_node"] == 4  # the a100-80gb profile: 8 per GPU
    submitit_slurm._make_sbatch_string(command="true", folder="/tmp/x", **params)


def test_a_known_node_size_caps_the_derived_memory(make_job, make_plan):
    from launcher.emit.slurm_params import slurm_resources

    job = make_job(**{"cluster.host_ram_per_node": "32GB"})
    res = slurm_resources(job, _offload(make_plan(nodes=1, gpus_per_node=4)))
    assert res.mem_capped and res.mem_bytes == 29 * 2**30  # 32 GB is 29.8 GiB: whole GiB, down


def test_a_sweep_asks_for_the_largest_variant(make_job, make_plan):
    from launcher.emit.slurm_params import combined, slurm_resources

    small = slurm_resources(make_job(**{"train.max_steps": 10}), make_plan())
    big = slurm_resources(make_job(**{"train.max_steps": 10_000}), _offload(make_plan()))
    both = combined([small, big])
    assert (both.time_min, both.mem_bytes, both.cpus_per_task) == (big.time_min, big.mem_bytes, big.cpus_per_task)
    assert combined([big, small]) == both


@pytest.mark.parametrize("field,value,needle", [
    ("slurm.partition", "gpu\n#SBATCH --wrap=id", "slurm.partition: 'gpu\\n#SBATCH --wrap=id' holds a newline"),
    ("slurm.qos", "a b", "slurm.qos: 'a b' is not one QOS name"),
    ("name", "x\ry", "name: 'x\\ry' holds a carriage return"),
    ("slurm.additional_parameters", {"comment": "a\nb"}, "slurm.additional_parameters.comment: 'a\\nb' holds"),
])
def test_submitit_never_gets_a_value_with_a_line_break(make_job, make_plan, field, value, needle):
    with pytest.raises(ConfigError) as e:
        executor_parameters(make_job(**{field: value}), make_plan(), sbatch_options=SBATCH)
    where = needle.split(": ")[0]
    assert any(p.field == where and str(p).startswith(needle) for p in e.value.found), e.value.problems


def test_cpu_ranks_ask_for_no_gpus_and_gpu_ranks_for_theirs(make_job, make_plan):
    """Issue 36 section 3: a plan for CPU ranks wrote --gpus-per-node=2 (Slurm held GPUs nothing used)."""
    job = make_job(**{"slurm.timeout_min": 30})
    cpu = executor_parameters(job, make_plan(gpus_per_node=2), sbatch_options=SBATCH)
    gpu = executor_parameters(job, gpu_plan(make_plan(gpus_per_node=2)), sbatch_options=SBATCH)
    assert "gpus_per_node" not in cpu and cpu["cpus_per_task"] == 2  # the cpu profile: one CPU per rank
    assert gpu["gpus_per_node"] == 2 and gpu["cpus_per_task"] == 16  # 8 per GPU, the low end of GPU nodes


@pytest.mark.parametrize("node_cpus,ranks,cpus,threads", [(64, 8, 64, 8), (48, 5, 45, 9), (2, 4, 2, 1)])
def test_the_nodes_cpus_are_shared_by_its_ranks(make_job, make_plan, node_cpus, ranks, cpus, threads):
    """cluster.cpus_per_node, when given, is what --cpus-per-task shares (never more than the node has)."""
    from launcher.emit.slurm_params import slurm_resources

    res = slurm_resources(make_job(**{"cluster.cpus_per_node": node_cpus}), gpu_plan(make_plan(gpus_per_node=ranks)))
    assert (res.cpus_per_task, res.threads_per_rank, res.cpus_per_rank_from) == (cpus, threads, "cluster")


def test_node_sizes_bound_the_pinned_memory_and_cpus(make_job):
    job = make_job(**{"slurm.mem_gb": 600, "slurm.cpus_per_task": 96, "cluster.host_ram_per_node": "512GB",
                      "cluster.cpus_per_node": 64})
    said = {p.field: str(p) for p in check_slurm(job.slurm, cluster=job.cluster, sbatch_options=SBATCH)}
    assert said["slurm.mem_gb"].startswith("slurm.mem_gb: 600.0 GB is more than cluster.host_ram_per_node (476.8 GiB)")
    assert said["slurm.cpus_per_task"].startswith("slurm.cpus_per_task: 96 is more than cluster.cpus_per_node (64)")


def test_the_start_up_counts_the_weights_the_ops_and_the_first_step(make_job, make_plan):
    """Issue 36 section 3: --time added 10 minutes whatever the model; now what this model's start costs."""
    from launcher.emit.slurm_alloc import RunFacts, slurm_resources

    job, plan = make_job(**{"train.max_steps": 1000}), _offload(make_plan(nodes=1, gpus_per_node=4))
    bare = RunFacts(train_steps=1000, steps_basis="train.max_steps", weight_bytes=0, weights_measured=True,
                    ops_to_build=())
    heavy = RunFacts(train_steps=1000, steps_basis="train.max_steps", weight_bytes=140 * 10**9,
                     weights_measured=True, ops_to_build=("cpu_adam", "async_io"))
    light, slow = slurm_resources(job, plan, bare), slurm_resources(job, plan, heavy)
    assert light.startup.total_s == 120 + 2 * 3.0  # the base and the first step's extra
    assert slow.startup.load_s == 700.0 and slow.startup.build_s == 50 + 160  # 140 GB at 200 MB/s; measured builds
    assert (light.time_min, slow.time_min) == (math.ceil((4500 + 126) / 60), math.ceil((4500 + 1036) / 60))


def test_an_epoch_job_gets_the_time_of_its_counted_steps_or_none(make_job, make_plan):
    """Issue 35 section 3: a train.epochs job got --time=60 beside a plan predicting 5.6 days."""
    from launcher.emit.slurm_alloc import RunFacts, slurm_resources

    job = make_job(**{"train.max_steps": None, "train.epochs": 3})
    plan = _offload(make_plan(nodes=1, gpus_per_node=4))
    counted = RunFacts(train_steps=160_000, steps_basis="train.epochs 3 x 53334 steps", weight_bytes=0,
                       weights_measured=True, ops_to_build=())
    res = slurm_resources(job, plan, counted)
    assert res.time_source == "plan" and res.time_min == math.ceil((160_000 * 3.0 * 1.5 + 126) / 60)  # 8.3 days
    unknown = slurm_resources(job, plan)  # the plan alone cannot count an epoch
    assert unknown.time_min is None and unknown.time_source == "none"
    with pytest.raises(ConfigError, match=r"slurm.timeout_min: not set, and the plan cannot derive it: train.epochs"):
        executor_parameters(job, plan, sbatch_options=SBATCH)
    assert executor_parameters(job, plan, sbatch_options=SBATCH, resources=res)["time"] == res.time_min
