"""Verdicts, exit codes and the CLI say one thing (issue 20, points 8 and 9).

The table: flags that cannot work together, or a --resume that would be refused later, are refused up front with
one line (exit 2, nothing written; tests/faults/harness.py). Then the verdict itself: an interrupted run is
`interrupted` in the table, in report.json and in the message, never "within budget", and the message offers
--resume only where --resume will be accepted.
"""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from launcher.cli.main import main
from launcher.files.rundir import MARKER
from launcher.records.runreport import RankFailure
from tests.faults.harness import Case, Sandbox, check_refused, entries, one_error_block

# Tiny GPT-2 at seq 128, global batch 16 on 2 ranks: micro-batch 8 without checkpointing is predicted at 36 MB.
OVER_16MB = {"budget": "16MB", "data.max_seq_len": 128, "train.global_batch_size": 16, "train.precision": "bf16",
             "strategy": {"engine": "fsdp", "fsdp_reshard_after_forward": False, "offload_optimizer": "none",
                          "offload_params": "none", "micro_batch_size": 8, "activation_checkpointing": False}}


def run_dir_with(state: str | None = None, checkpoint: bool = False):
    """A run dir left by an earlier launch: its state.json, and a checkpoint or not."""

    def setup(s: Sandbox) -> None:
        s.run_dir.mkdir()
        (s.run_dir / MARKER).write_text("{}\n")  # launch made it
        (s.run_dir / "plan.json").write_text("{}\n")
        if state:
            (s.run_dir / "state.json").write_text(json.dumps({"state": state}) + "\n")
        if checkpoint:
            (s.run_dir / "checkpoint").mkdir()
            (s.run_dir / "checkpoint" / "latest").write_text("step-00000004\n")

    return setup


CASES = [
    # -- --resume: refused at once when it cannot work, with what does -----------------------------------------------
    Case("resume-interrupted-run-without-checkpoint", lambda s: [s.job(), "--resume"],
         ["--resume: ", "has no checkpoint to resume from (state.json: interrupted)",
          "start it again with --overwrite instead of --resume"],
         setup=run_dir_with("interrupted"), keeps=["run"]),
    Case("resume-failed-run-without-checkpoint", lambda s: [s.job(), "--resume"],
         ["has no checkpoint to resume from (state.json: failed)", "--overwrite instead of --resume"],
         setup=run_dir_with("failed"), keeps=["run"]),
    Case("resume-with-overwrite", lambda s: [s.job(), "--resume", "--overwrite"],
         ["--resume with --overwrite: one continues the run dir, the other deletes it", "pass only one of them"],
         setup=run_dir_with("interrupted", checkpoint=True), keeps=["run"]),
    Case("resume-with-the-jobs-auto-fallback", lambda s: [s.job(auto_fallback=2), "--resume"],
         ["--auto-fallback: 2 with --resume would restart the checkpointed run", "resume with --auto-fallback 0"],
         setup=run_dir_with("interrupted", checkpoint=True), keeps=["run"]),
    Case("resume-with-auto-fallback-flag", lambda s: [s.job(), "--resume", "--auto-fallback", "1"],
         ["--auto-fallback: 1 with --resume", "resume with --auto-fallback 0"],
         setup=run_dir_with("interrupted", checkpoint=True), keeps=["run"]),
    # -- --enforce: a plan predicted over the cap would only run out of memory ---------------------------------------
    Case("enforce-forced-plan-over-budget", lambda s: [s.job(**OVER_16MB), "--enforce", "--force"],
         ["--enforce with --force: the plan is predicted at", "over the budget of 16.00 MB",
          "drop --enforce", "add --auto-fallback N"]),
    # -- the ladder relaunches this node's ranks only -----------------------------------------------------------------
    Case("auto-fallback-on-two-nodes",
         lambda s: [s.job(auto_fallback=1), "--nodes", "2", "--rdzv-endpoint", "localhost:29400"],
         ["auto_fallback: 1 relaunches the ranks of this node only", "set auto_fallback: 0"]),
    Case("auto-fallback-on-a-later-node",
         lambda s: [s.job(), "--auto-fallback", "1", "--nodes", "2", "--node-rank", "1", "--rdzv-endpoint",
                    "localhost:29400"],
         ["auto_fallback: 1 relaunches the ranks of this node only", "--auto-fallback 0"]),
    Case("auto-fallback-flag-with-slurm", lambda s: [s.job(), "--auto-fallback", "3", "--slurm"],
         ["auto_fallback: 3 relaunches the ranks of this node only", "for --slurm"]),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_refused(case, sandbox):
    check_refused(case, sandbox)


def test_resume_without_run_dir_names_the_flag_it_needs(sandbox):
    """Not in the table: the harness adds --run-dir to every case, and this one must not have it."""
    job = sandbox.job()
    before = entries(sandbox.root)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()) as out:
        code = main(["run", str(job), "--resume", "--quiet"])
    assert code == 2, err.getvalue()
    (line,) = one_error_block(err.getvalue())
    assert "--resume: needs --run-dir, the run dir to continue" in line and "pass --run-dir RUN" in line
    assert out.getvalue() == "" and entries(sandbox.root) == before


def test_enforce_with_force_is_allowed_when_the_ladder_may_step_down(sandbox):
    """--enforce --force --auto-fallback is the ladder's own use (tests/faults/test_fault_runs.py): no refusal."""
    from launcher.config.jobfile import load_job
    from launcher.inputs.plan_inputs import plan_job
    from launcher.session.checks import check_runnable
    from launcher.session.options import RunOptions

    job = load_job(sandbox.job(auto_fallback=2, **OVER_16MB))
    plan = plan_job(job, force=True)
    assert plan.status == "forced"
    check_runnable(job, plan, RunOptions(enforce=True, force=True))


# -- the verdict of an interrupted run -----------------------------------------------------------------------------

def interrupted_run(tmp_path, *, checkpoint: bool, auto_fallback: int = 0):
    """A run dir whose two ranks measured within budget and then wrote "failed" as a signal stopped them."""
    from launcher.config.jobfile import job_from_data, job_to_data
    from launcher.files.rundir import RunDir
    from launcher.inputs.plan_inputs import plan_job
    from tests.conftest import base_job

    data = tmp_path / "data.jsonl"
    data.write_text("".join(f'{{"text": "sentence number {i}"}}\n' for i in range(32)))
    job = job_from_data(base_job(str(data), auto_fallback=auto_fallback), tmp_path)
    plan = plan_job(job)
    run = RunDir.create(tmp_path / "run")
    run.write_yaml("job.yaml", job_to_data(job))
    for r in range(2):
        run.write_json(f"ranks/rank-{r}.json", {
            "rank": r, "host": "h", "status": "failed", "error": "KeyboardInterrupt",
            "measured_peak_bytes": plan.budget_bytes // 4, "peak_by_category": {"activations": plan.budget_bytes // 4}})
    if checkpoint:
        run.checkpoint.mkdir()
        (run.checkpoint / "latest").write_text("step-00000003\n")
    return run, plan


def finish_interrupted(run, plan, capsys) -> tuple[int, str, str]:
    from launcher.records.runreport import RunOutcome
    from launcher.session.finish import finish

    code = finish(run, plan, RunOutcome(ok=False, interrupted=True, message="interrupted by SIGINT"))
    out, err = capsys.readouterr()
    return code, out, err


def test_an_interrupted_run_says_interrupted_in_the_table_the_report_and_the_message(tmp_path, capsys):
    run, plan = interrupted_run(tmp_path, checkpoint=False)
    code, out, err = finish_interrupted(run, plan, capsys)
    assert code == 130
    report = json.loads((run.path / "report.json").read_text())
    assert (report["verdict"], report["within_budget"]) == ("interrupted", False)
    assert [(r["verdict"], r["within_budget"]) for r in report["ranks"]] == [("interrupted", False)] * 2
    rows = [ln.split() for ln in out.splitlines() if ln.split()[:1] in (["0"], ["1"])]
    assert len(rows) == 2 and all("interrupted" in row for row in rows), out
    assert "verdict: interrupted" in out and "every rank within budget" not in out
    assert json.loads((run.path / "state.json").read_text())["state"] == "interrupted"
    assert "no checkpoint was saved, so --resume cannot continue it" in err and "--overwrite" in err
    assert "resume with --resume" not in err


@pytest.mark.parametrize("auto_fallback, hint", [
    (0, "--resume"),
    (2, "--resume --auto-fallback 0"),  # the job's ladder would make --resume refuse
])
def test_resume_is_offered_only_where_it_will_be_accepted(tmp_path, capsys, auto_fallback, hint):
    from launcher.session.checks import check_launch
    from launcher.session.options import RunOptions

    run, plan = interrupted_run(tmp_path, checkpoint=True, auto_fallback=auto_fallback)
    run.unlock()
    code, _, err = finish_interrupted(run, plan, capsys)
    assert code == 130
    offered = err.split(f"--run-dir {run.path} ")[1].split()
    assert " ".join(offered) == hint, err
    # What the message offers passes the checks --resume goes through before anything starts (the flag
    # --auto-fallback 0 overrides the job's auto_fallback), and without the flag the job's ladder is refused.
    import dataclasses

    from launcher.config.jobfile import load_job
    from launcher.errors import ConfigError

    job = load_job(run.path / "job.yaml")
    offered_job = dataclasses.replace(job, auto_fallback=0) if "--auto-fallback 0" in hint else job
    check_launch(offered_job, RunOptions(run_dir=run.path, resume=True))
    if auto_fallback:
        with pytest.raises(ConfigError, match="resume with --auto-fallback 0"):
            check_launch(job, RunOptions(run_dir=run.path, resume=True))


# -- how a run ended, told by its ranks: issue 35 §2 ----------------------------------------------------------------

def ended_run(tmp_path, statuses: dict[int, dict], *, steps: int = 0, checkpoint: str | None = None):
    """A run dir whose two ranks measured within budget and wrote ``statuses`` (rank -> extra rank-file fields),
    with ``steps`` step lines each; the plan."""
    run, plan = interrupted_run(tmp_path, checkpoint=False)
    for r, extra in statuses.items():
        run.write_json(f"ranks/rank-{r}.json", {
            "rank": r, "host": "h", "measured_peak_bytes": plan.budget_bytes // 8,
            "peak_by_category": {"activations": plan.budget_bytes // 8}, "steps_done": 0, **extra})
        with (run.steps / f"rank-{r}.jsonl").open("w") as f:
            for s in range(1, steps + 1):  # the peak grows past what the rank file recorded when training began
                f.write(json.dumps({"step": s, "mem_peak_bytes": plan.budget_bytes // 8 + s}) + "\n")
    if checkpoint:
        run.checkpoint.mkdir()
        (run.checkpoint / "latest").write_text(checkpoint + "\n")
    return run, plan


def finish_with(run, plan, capsys, **outcome) -> tuple[int, dict, dict, str, str]:
    """finish() on an RunOutcome(**outcome): (exit code, report.json, state.json, stdout, stderr)."""
    from launcher.records.runreport import RunOutcome
    from launcher.session.finish import finish

    code = finish(run, plan, RunOutcome(**outcome))
    out, err = capsys.readouterr()
    report = json.loads((run.path / "report.json").read_text()) if (run.path / "report.json").exists() else {}
    return code, report, json.loads((run.path / "state.json").read_text()), out, err


def test_ranks_that_checkpointed_on_a_sigterm_are_an_interrupted_run_never_a_finished_one(tmp_path, capsys):
    """A scheduler's SIGTERM to one rank: the ranks agree, save and exit 0. Every process exited 0, yet the run
    stopped at step 3 of 4: interrupted (130), and --resume is offered because a checkpoint exists."""
    run, plan = ended_run(tmp_path, {0: {"status": "checkpointed", "stop_reason": "another rank asked",
                                         "steps_done": 3},
                                     1: {"status": "checkpointed", "stop_reason": "SIGTERM", "steps_done": 3}},
                          checkpoint="step-00000003")
    code, report, state, out, err = finish_with(run, plan, capsys, ok=True)
    assert code == 130 and state["state"] == "interrupted"
    assert (report["verdict"], report["within_budget"]) == ("interrupted", False)
    assert [(r["verdict"], r["within_budget"], r["stop_reason"]) for r in report["ranks"]] == [
        ("interrupted", False, "another rank asked"), ("interrupted", False, "SIGTERM")]
    assert "verdict: interrupted" in out and "every rank within budget" not in out
    assert "rank 1 stopped on SIGTERM after step 3; the ranks saved checkpoint step-00000003" in err
    assert "rank 1 stopped on SIGTERM after step 3" in state["message"]
    assert f"--run-dir {run.path} --resume" in err


def test_a_rank_file_left_running_is_a_rank_that_died_never_ok(tmp_path, capsys):
    """SIGKILL (or the OOM killer) mid-checkpoint: the rank's file still says running, from when training began.
    It is failed, named with its signal, and its row shows the peak its last step line measured."""
    run, plan = ended_run(tmp_path, {0: {"status": "failed", "error": "gloo: connection closed by peer"},
                                     1: {"status": "running"}}, steps=3, checkpoint="step-00000002")
    code, report, state, out, err = finish_with(
        run, plan, capsys, ok=False, failures=[RankFailure(rank=1, exitcode=-9, host="h"),
                                               RankFailure(rank=0, exitcode=-15, host="h")])
    assert code == 1 and state["state"] == "failed" and report["verdict"] == "failed"
    rows = {r["rank"]: r for r in report["ranks"]}
    assert [(rows[r]["verdict"], rows[r]["within_budget"]) for r in (0, 1)] == [("failed", False)] * 2
    assert rows[1]["ended"] == "killed by SIGKILL" and rows[0]["ended"] == "killed by SIGTERM"
    assert rows[1]["measured_peak_bytes"] == plan.budget_bytes // 8 + 3 and rows[1]["steps_done"] == 3
    assert "rank 1 on h was killed by SIGKILL (the OOM killer, a kill -9" in err
    assert "every rank within budget" not in out


def test_ranks_killed_only_by_stop_signals_are_a_preempted_run(tmp_path, capsys):
    """A --script rank killed by a scheduler's SIGTERM (no handler of its own), torchrun stopping the other the
    same way: interrupted, not failed. One SIGKILL among them would make it failed (the test above)."""
    run, plan = ended_run(tmp_path, {0: {"status": "running"}, 1: {"status": "running"}}, steps=2)
    code, report, state, _, err = finish_with(
        run, plan, capsys, ok=False, failures=[RankFailure(rank=1, exitcode=-15, host="h"),
                                               RankFailure(rank=0, exitcode=-15, host="h")])
    assert (code, report["verdict"], state["state"]) == (130, "interrupted", "interrupted")
    assert "rank 1 killed by SIGTERM after step 2" in err and "no checkpoint was saved" in err


def no_new_files(monkeypatch):
    """A full disk for every new file (atomic_write's temporaries): what is already there can still be
    rewritten in the blocks it holds."""
    import errno
    import tempfile

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tempfile, "mkstemp", full)


def test_a_full_disk_at_the_end_gives_a_verdict_not_a_traceback(tmp_path, capsys, monkeypatch):
    """report.json cannot be written: the run is failed, said in the table, state.json (rewritten in the room it
    kept) and the exit code; a --resume of the dir is then one clear line (nothing to resume from)."""
    from launcher.errors import ConfigError
    from launcher.session.checks import check_resume
    from launcher.session.options import RunOptions
    from launcher.session.prepare import mark_running

    run, plan = ended_run(tmp_path, {r: {"status": "completed", "steps_done": 4} for r in (0, 1)})
    mark_running(run)
    no_new_files(monkeypatch)
    code, report, state, out, err = finish_with(run, plan, capsys, ok=True)
    assert code == 1 and report == {} and not (run.path / "memory.png").exists()
    assert state["state"] == "failed" and "report.json could not be written (No space left on device)" in \
        state["message"]
    assert "verdict: NOT within budget: the run failed" in out and "every rank within budget" not in out
    assert "launch: error: report.json could not be written (No space left on device)" in err
    assert "Traceback" not in out + err
    with pytest.raises(ConfigError, match="has no checkpoint to resume from .state.json: failed."):
        check_resume(RunOptions(run_dir=run.path, resume=True))


def test_a_full_disk_before_the_run_is_one_line_and_no_rank(tmp_path, monkeypatch):
    """--resume (or any launch) on a run dir the disk has no room for: exit 2 with one line, nothing started."""
    from launcher.config.jobfile import job_from_data
    from launcher.errors import ConfigError
    from launcher.inputs.plan_inputs import plan_job
    from launcher.session.options import RunOptions
    from launcher.session.prepare import prepare_run_dir
    from tests.conftest import base_job

    data = tmp_path / "data.jsonl"
    data.write_text("".join(f'{{"text": "sentence number {i}"}}\n' for i in range(32)))
    job = job_from_data(base_job(str(data)), tmp_path)
    plan = plan_job(job)
    no_new_files(monkeypatch)
    with pytest.raises(ConfigError) as e:
        prepare_run_dir(RunOptions(run_dir=tmp_path / "run"), job, plan)
    assert str(e.value).startswith(f"--run-dir: {str(tmp_path / 'run')!r} cannot be written (No space left on device)")
    assert "choose another --run-dir" in str(e.value) and "\n" not in str(e.value)
