"""Submission through submitit with sbatch mocked: what reaches sbatch, slurm.json, and how results are read."""

from __future__ import annotations

import itertools
import json

import pytest
import yaml

from launcher.backends.slurm import SlurmBackend, job_outcome, task_for
from launcher.backends.slurm_array import array_exit_code
from launcher.cli.main import main
from launcher.emit import slurm_params
from launcher.files.rundir import RunDir
from launcher.session.options import RunOptions
from launcher.session.prepare import launch_spec


@pytest.fixture
def fake_sbatch(monkeypatch):
    """sbatch answers 'Submitted batch job N'; returns the submission scripts it was given."""
    import submitit.core.utils as su
    import submitit.slurm.slurm as ss

    scripts: list[str] = []
    ids = itertools.count(1000)

    def call(self, *args, **kwargs):
        assert self.command[0] == "sbatch"
        scripts.append(open(self.command[1]).read())
        return f"Submitted batch job {next(ids)}\n"

    monkeypatch.setattr(su.CommandFunction, "__call__", call)
    monkeypatch.setattr(ss.SlurmExecutor, "affinity", classmethod(lambda cls: 2))  # "srun is on PATH"
    monkeypatch.setattr(slurm_params, "sbatch_long_options", lambda: frozenset({"reservation"}))
    return scripts


def test_submit_writes_slurm_json_and_an_sbatch_with_one_task_per_node(tmp_path, fake_sbatch, make_job, make_plan):
    job = make_job(**{"slurm.timeout_min": 20, "slurm.signal_delay_s": 45, "slurm.max_requeues": 2,
                      "slurm.additional_parameters": {"reservation": "maint", "comment": "hi"}})
    plan = make_plan(nodes=2, gpus_per_node=4)
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    sjob = SlurmBackend(job, plan).submit(run, task_for(run, job, plan, launch_spec(RunOptions(), job, plan, run)))
    assert sjob.job_id == "1000" and sjob.num_tasks == 2
    script = fake_sbatch[0]
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1",
                 "#SBATCH --cpus-per-task=4", "#SBATCH --time=20", "#SBATCH --signal=USR2@45",
                 "#SBATCH --reservation=maint", "#SBATCH --comment=hi", "#SBATCH --job-name=unit"):
        assert line in script, line
    assert "gpus" not in script  # the plan is for CPU ranks: Slurm holds no GPU for them
    rec = json.loads((run.path / "slurm.json").read_text())
    assert rec["kind"] == "job" and rec["job_ids"] == ["1000"] and rec["nodes"] == 2 and rec["max_requeues"] == 2
    assert rec["submitit_folder"] == str(run.path / "submitit")
    assert run.state()["state"] == "submitted" and run.state()["slurm_job_id"] == "1000"
    task = sjob.submission().function  # what the nodes will run, as pickled
    assert (task.nodes, task.gpus_per_node, task.max_requeues, task.requeues) == (2, 4, 2, 0)
    assert task.env["LAUNCHER_RUN_DIR"] == str(run.path)


def test_outcome_from_the_tasks_result_pickles(tmp_path, make_job, make_plan):
    from submitit.core.utils import JobPaths, cloudpickle_dump

    class FakeJob:
        job_id, num_tasks = "42", 2

        class paths:
            folder = tmp_path

        class watcher:
            @staticmethod
            def get_state(job_id, mode="standard"):
                return "COMPLETED"

    for t in range(2):
        cloudpickle_dump(("success", {"node_rank": t, "ok": t == 0, "interrupted": False, "message": "",
                                      "failures": [] if t == 0 else [{"rank": 1, "exitcode": 1, "host": "node2"}]}),
                         JobPaths(tmp_path, job_id="42", task_id=t).result_pickle)
    out = job_outcome(FakeJob())
    assert not out.ok and [f.rank for f in out.failures] == [1]
    cloudpickle_dump(("error", "Traceback...\nRendezvousError: nodes disagree"),
                     JobPaths(tmp_path, job_id="42", task_id=1).result_pickle)
    out = job_outcome(FakeJob())
    assert not out.ok and "task 1 failed: RendezvousError: nodes disagree" in out.message


def test_no_result_after_a_cancel_is_an_interruption(tmp_path):
    class FakeJob:
        job_id, num_tasks = "43", 1

        class paths:
            folder = tmp_path

        class watcher:
            @staticmethod
            def get_state(job_id, mode="standard"):
                return "CANCELLED by 0"

    out = job_outcome(FakeJob())
    assert out.interrupted and not out.ok and "ended CANCELLED by 0 without a result" in out.message


def test_array_exit_code_priority():
    assert array_exit_code([0, 0]) == 0
    assert array_exit_code([0, 2]) == 2
    assert array_exit_code([3, 2]) == 3
    assert array_exit_code([3, 130, 2]) == 130
    assert array_exit_code([0, 3, 1]) == 1


# -- through the CLI (real planner, mocked sbatch) -------------------------------------------------------------
def _sweep_job(tmp_path, data_file, **sweep) -> str:
    job = {"name": "sw", "model": {"family": "gpt2", "hidden_size": 64, "num_layers": 2, "num_heads": 4,
                                   "vocab_size": 1024, "max_position_embeddings": 256},
           "task": "causal_lm", "data": {"path": str(data_file), "max_seq_len": 64},
           "train": {"global_batch_size": 8, "max_steps": 2, "precision": "fp32"}, "strategy": {"engine": "fsdp"},
           "gpus": 1, "budget": "1GB", "launcher": "slurm", "sweep": sweep}
    p = tmp_path / "job.yaml"
    p.write_text(yaml.safe_dump(job))
    return str(p)


def test_sweep_plans_each_variant_and_reports_the_unplannable(tmp_path, data_file, fake_sbatch, capsys):
    job = _sweep_job(tmp_path, data_file, grid={"train.lr": [1e-4, 3e-4], "train.seed": [0, 1]},
                     list=[{"budget": "16MB", "model": "gpt2-124m"}])
    code = main([job, "--run-dir", str(tmp_path / "arr"), "--array-parallelism", "2"])
    out, err = capsys.readouterr()
    assert code == 2, err  # submitted, but one variant could not be planned: a script must notice
    assert "variant 4 (budget=16MB,model=gpt2-124m) not submitted:" in err
    assert "submitted slurm array 1000: 4 variant(s), 1 not planned, at most 2 at once" in out
    assert len(fake_sbatch) == 1 and "#SBATCH --array=0-3%2" in fake_sbatch[0]
    rec = json.loads((tmp_path / "arr" / "slurm.json").read_text())
    assert rec["kind"] == "array" and rec["job_ids"] == [f"1000_{k}" for k in range(4)]
    assert [v["name"] for v in rec["variants"]] == ["lr=0.0001,seed=0", "lr=0.0001,seed=1", "lr=0.0003,seed=0",
                                                    "lr=0.0003,seed=1"]
    assert rec["unplanned"][0]["index"] == 4 and rec["unplanned"][0]["reason"]
    # The no-plan answer is typed; the CLI's words (RunOptions.error_lines) reach the sweep whole, on one line.
    reason = rec["unplanned"][0]["reason"]
    assert reason.startswith("no plan fits 16.00 MB per GPU on 1 GPUs") and " / what would fit: / " in reason
    v1 = tmp_path / "arr" / "variants" / "1-lr-0.0001-seed-1"
    assert yaml.safe_load((v1 / "job.yaml").read_text())["train"]["seed"] == 1
    assert "sweep" not in yaml.safe_load((v1 / "job.yaml").read_text()) or \
        yaml.safe_load((v1 / "job.yaml").read_text())["sweep"] is None
    assert json.loads((v1 / "slurm.json").read_text())["job_ids"] == ["1000_1"]
    assert (v1 / "plan.json").is_file()


def test_sweep_with_no_plannable_variant_submits_nothing(tmp_path, data_file, fake_sbatch, capsys):
    job = _sweep_job(tmp_path, data_file, list=[{"budget": "16MB", "model": "gpt2-124m"}])
    code = main([job, "--run-dir", str(tmp_path / "arr")])
    _, err = capsys.readouterr()
    assert code == 2 and "sweep: variant 0 (budget=16MB,model=gpt2-124m):" in err
    assert fake_sbatch == [] and not (tmp_path / "arr").exists()


def test_sweep_needs_slurm(tmp_path, data_file, capsys):
    p = _sweep_job(tmp_path, data_file, grid={"train.lr": [1e-4]})
    data = yaml.safe_load(open(p))
    data["launcher"] = "local"
    open(p, "w").write(yaml.safe_dump(data))
    assert main([p]) == 2
    assert "sweep: a sweep runs as a Slurm array; add --slurm" in capsys.readouterr().err


def test_bad_slurm_section_exits_2_before_any_run_dir(tmp_path, data_file, fake_sbatch, capsys):
    job = _sweep_job(tmp_path, data_file, grid={"train.lr": [1e-4]})
    data = yaml.safe_load(open(job))
    data.pop("sweep")
    data["slurm"] = {"additional_parameters": {"not_an_option": 1}}
    open(job, "w").write(yaml.safe_dump(data))
    code = main([job, "--run-dir", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == 2 and "slurm.additional_parameters.not_an_option: unknown key" in err and "valid keys:" in err
    assert fake_sbatch == [] and not (tmp_path / "r").exists()


def test_single_job_cli_prints_the_job_id_and_run_dir(tmp_path, data_file, fake_sbatch, capsys):
    job = _sweep_job(tmp_path, data_file, grid={"train.lr": [1e-4]})
    data = yaml.safe_load(open(job))
    data.pop("sweep")
    open(job, "w").write(yaml.safe_dump(data))
    code = main([job, "--run-dir", str(tmp_path / "r")])
    out = capsys.readouterr().out
    assert code == 0
    # No slurm.timeout_min: the limit is derived from the plan (2 short steps + the 2 min start-up of a tiny inline
    # model that reads no weights and builds no op = 3 min), and the message, slurm.json and submitit's script all
    # say the same.
    assert f"submitted slurm job 1000 (1 node(s) x 1 rank(s), time limit 3 min); run dir {tmp_path / 'r'}" in out
    record = json.loads((tmp_path / "r" / "slurm.json").read_text())
    assert record["job_id"] == "1000" and record["timeout_min"] == 3
    assert "#SBATCH --time=3\n" in fake_sbatch[0] and "#SBATCH --mem=" in fake_sbatch[0]
    assert (tmp_path / "r" / "plan.json").is_file() and (tmp_path / "r" / "job.yaml").is_file()


def test_the_ranks_of_a_slurm_task_get_the_run_flags(tmp_path, make_job, make_plan):
    job, plan = make_job(), make_plan(nodes=1, gpus_per_node=2)
    run = RunDir(tmp_path / "run")
    plain = task_for(run, job, plan, launch_spec(RunOptions(), job, plan, run))
    flagged = task_for(run, job, plan, launch_spec(RunOptions(enforce=True, memory_snapshot=True, hang_timeout_s=30),
                                                   job, plan, run))
    assert "LAUNCHER_ENFORCE_BYTES" not in plain.env and "LAUNCHER_MEMORY_SNAPSHOT" not in plain.env
    assert flagged.env["LAUNCHER_ENFORCE_BYTES"] == str(plan.budget_bytes)
    assert flagged.env["LAUNCHER_MEMORY_SNAPSHOT"] == "1"
    assert (plain.hang_timeout_s, flagged.hang_timeout_s) == (0.0, 30.0)


def test_a_compute_node_never_loads_the_cli(tmp_path, make_job, make_plan):
    """What submitit ships to a node (cloudpickle of the SlurmTask, its report callable included) imports the
    backends and the session's finish there, never launcher.cli."""
    import subprocess
    import sys

    import cloudpickle

    from launcher.session.finish import finish

    job, plan = make_job(), make_plan(nodes=1, gpus_per_node=2)
    run = RunDir(tmp_path / "run")
    task = task_for(run, job, plan, launch_spec(RunOptions(), job, plan, run), report=finish)
    code = ("import pickle, sys; t = pickle.loads(sys.stdin.buffer.read()); "
            "print(t.report.__module__, sorted(m for m in sys.modules if m.startswith('launcher.cli')))")
    out = subprocess.run([sys.executable, "-c", code], input=cloudpickle.dumps(task), capture_output=True,
                         check=True)
    assert out.stdout.decode().split(maxsplit=1) == ["launcher.session.finish", "[]\n"]
