"""Hostile and careless input around the run dir and `plan --out` (issue 20, points 1, 2, 3 and 10).

Each case runs through the real CLI in a sandbox (tests/faults/harness.py) and must end with exit 2, one error
block naming the directory or the values, no traceback, and nothing written: a directory of someone's files is
never emptied by --overwrite nor filled by `plan --out`, and a refused `--out --sbatch` leaves its dir as it was.
"""

from __future__ import annotations

import os

import pytest

from tests.faults.harness import Case, Sandbox, check_refused


def user_dir(s: Sandbox, name: str = "run") -> None:
    """A directory of someone's work: a note, data in a subdir and a dotfile, and no marker."""
    d = s.root / name
    (d / "sub").mkdir(parents=True)
    (d / "notes.txt").write_text("three weeks of notes")
    (d / "sub" / "data.bin").write_bytes(b"\0" * 64)
    (d / ".hidden").write_text("x")


USER = ["run", "run/notes.txt", "run/sub", "run/sub/data.bin", "run/.hidden"]
"""What user_dir makes (it must still be there, unchanged in name, after the refusal)."""


def marked_home(s: Sandbox) -> None:
    """A home directory that a careless colleague's tool dropped the marker into."""
    home = s.root / "home"
    home.mkdir()
    (home / ".bashrc").write_text("alias ll='ls -l'\n")
    (home / ".launcher-run").write_text("{}")
    os.environ["HOME"] = str(home)  # restored by the sandbox fixture's monkeypatch of HOME


def link_to_user_dir(s: Sandbox, link: str) -> None:
    user_dir(s, "userdata")
    (s.root / link).symlink_to(s.root / "userdata")


def old_plan_set(s: Sandbox) -> None:
    """A dir an earlier `plan --out` made: the marker and its files."""
    d = s.root / "out"
    d.mkdir()
    (d / ".launcher-run").write_text("{}")
    (d / "plan.json").write_text('{"old": true}')
    (d / "fsdp.yaml").write_text("old: true\n")


def deepspeed_save_dir(s: Sandbox) -> None:
    """Someone's training dir where DeepSpeed's own save_checkpoint("checkpoint") wrote: checkpoint/latest, beside
    their job.yaml and log, and no marker."""
    d = s.run_dir
    (d / "checkpoint" / "global_step5").mkdir(parents=True)
    (d / "checkpoint" / "latest").write_text("global_step5")
    (d / "job.yaml").write_text("my: own job\n")
    (d / "train.log").write_text("three days of training")


DEEPSPEED = ["run", "run/checkpoint", "run/checkpoint/latest", "run/checkpoint/global_step5", "run/job.yaml",
             "run/train.log"]


def finished_run(s: Sandbox) -> None:
    """The dir of a run that completed: marked, with its job, plan, state, report and rank files."""
    d = s.root / "out"
    (d / "ranks").mkdir(parents=True)
    (d / ".launcher-run").write_text("{}")
    for name in ("plan.json", "job.yaml", "report.json", "ranks/rank-0.json"):
        (d / name).write_text("{}")
    (d / "state.json").write_text('{"state": "completed"}')


FINISHED = ["out", "out/.launcher-run", "out/ranks", "out/ranks/rank-0.json", "out/plan.json", "out/job.yaml",
            "out/report.json", "out/state.json"]


def linked_marker(s: Sandbox, name: str) -> None:
    """A dir of someone's notes holding a link named .launcher-run to a real marker elsewhere."""
    (s.root / "real").mkdir()
    (s.root / "real" / ".launcher-run").write_text("{}")
    (s.root / name).mkdir()
    (s.root / name / "notes.txt").write_text("notes")
    (s.root / name / ".launcher-run").symlink_to(s.root / "real" / ".launcher-run")


def linked(name: str) -> list[str]:
    return ["real", "real/.launcher-run", name, f"{name}/notes.txt", f"{name}/.launcher-run"]


FOREIGN = "is not empty and was not made by launch"
# A named profile: `plan --sbatch` refuses hardware auto on this GPU-less host before it reads slurm:.
BAD_SLURM = {"launcher": "slurm", "cluster.hardware": "cpu", "slurm.additional_parameters": {"bogus_opt": "1"}}

CASES = [
    # -- 1. --overwrite and the run dir ---------------------------------------------------------------------------
    Case("overwrite-a-user-dir", lambda s: [s.job(), "--overwrite"],
         [f"--run-dir: '{'{root}'}/run' {FOREIGN} (it holds .hidden, notes.txt, sub)", "choose another --run-dir"],
         setup=user_dir, keeps=USER),
    Case("run-into-a-user-dir", lambda s: [s.job()], [FOREIGN, "(it holds .hidden, notes.txt, sub)"],
         setup=user_dir, keeps=USER),
    Case("run-dir-empty-string", lambda s: [s.job(), "--run-dir", "", "--overwrite"],
         ["argument --run-dir: '' is empty, which would mean the current directory", "give a directory path"]),
    Case("run-dir-dot-overwrite", lambda s: [s.job(), "--run-dir", ".", "--overwrite"],
         [f"--run-dir: '.' {FOREIGN} (it holds data.jsonl, job.yaml)"]),
    Case("run-dir-cwd-with-marker-overwrite", lambda s: [s.job(), "--run-dir", ".", "--overwrite"],
         ["--run-dir: '.' is the current directory or holds it", "would delete files you are working in"],
         setup=lambda s: (s.root / ".launcher-run").write_text("{}") and None, keeps=[".launcher-run"]),
    Case("run-dir-parent-of-cwd-with-marker", lambda s: [s.job(), "--run-dir", "..", "--overwrite"],
         ["--run-dir: '..' is the current directory or holds it"],
         setup=lambda s: ((s.root / "runs").mkdir(), (s.root / ".launcher-run").write_text("{}"),
                          os.chdir(s.root / "runs")) and None, keeps=[".launcher-run", "runs"]),
    Case("run-dir-is-the-job-files-dir", lambda s: [s.job(), "--run-dir", s.root],
         [FOREIGN, "(it holds data.jsonl, job.yaml)"]),
    Case("run-dir-home-overwrite", lambda s: [s.job(), "--run-dir", s.root / "home", "--overwrite"],
         ["--overwrite never clears it", "choose another --run-dir"],
         setup=marked_home, keeps=["home", "home/.bashrc", "home/.launcher-run"]),
    # NEVER add a case that points --overwrite at a real system dir ("/", /etc): run against a launcher without
    # the marker rule (today's main) it deletes the machine's /etc. That happened once while writing this table.
    Case("run-dir-symlink-to-user-dir", lambda s: [s.job(), "--run-dir", s.root / "link", "--overwrite"],
         [f"/link' {FOREIGN} (it holds .hidden, notes.txt, sub)"],
         setup=lambda s: link_to_user_dir(s, "link"),
         keeps=["link", "userdata", "userdata/notes.txt", "userdata/sub", "userdata/sub/data.bin", "userdata/.hidden"]),
    Case("run-dir-marker-is-a-link-overwrite", lambda s: [s.job(), "--overwrite"],
         [f"--run-dir: '{'{root}'}/run' {FOREIGN} (it holds .launcher-run, notes.txt)"],
         setup=lambda s: linked_marker(s, "run"), keeps=linked("run")),
    # -- issue 35: --resume takes only a dir launch made ----------------------------------------------------------
    Case("resume-a-deepspeed-save-dir", lambda s: [s.job(), "--resume"],
         [f"--resume: '{'{root}'}/run' was not made by launch (no .launcher-run in it; DeepSpeed's own "
          "save_checkpoint leaves a checkpoint/latest too)", "start afresh with another --run-dir",
          f"touch '{'{root}'}/run/.launcher-run'"], setup=deepspeed_save_dir, keeps=DEEPSPEED),
    # -- 2 and 10. plan --out: where it may write ------------------------------------------------------------------
    Case("out-is-a-file", lambda s: [s.job(), "--out", s.file("plain-file")],
         ["--out: ", "plain-file' exists and is not a directory", "choose another path"], verb="plan",
         keeps=["plain-file"]),
    Case("out-under-a-file", lambda s: [s.job(), "--out", s.file("plain-file") / "out"],
         ["--out: ", "plain-file/out' cannot be created (Not a directory)", "choose a directory you can write"],
         verb="plan", keeps=["plain-file"]),
    Case("out-under-proc", lambda s: [s.job(), "--out", "/proc/launcher-hostile-out"],
         ["--out: '/proc/launcher-hostile-out' cannot be created", "choose a directory you can write"], verb="plan"),
    Case("out-is-the-job-files-dir", lambda s: [s.job(), "--out", s.root],
         [f"--out: '{'{root}'}' {FOREIGN} (it holds data.jsonl, job.yaml)", "choose another --out"], verb="plan"),
    Case("out-is-a-user-dir", lambda s: [s.job(), "--out", s.root / "run"], [FOREIGN, "notes.txt"], verb="plan",
         setup=user_dir, keeps=USER),
    Case("out-empty-string", lambda s: [s.job(), "--out", ""], ["argument --out: '' is empty"], verb="plan"),
    Case("out-symlink-to-user-dir", lambda s: [s.job(), "--out", s.root / "link"], [FOREIGN, "notes.txt"],
         verb="plan", setup=lambda s: link_to_user_dir(s, "link"),
         keeps=["link", "userdata", "userdata/notes.txt", "userdata/sub", "userdata/sub/data.bin", "userdata/.hidden"]),
    Case("out-marker-is-a-link", lambda s: [s.job(), "--out", s.root / "out"],
         [f"--out: '{'{root}'}/out' {FOREIGN} (it holds .launcher-run, notes.txt)"], verb="plan",
         setup=lambda s: linked_marker(s, "out"), keeps=linked("out")),
    # issue 35: a run's job.yaml and plan.json are what export, status and --resume read.
    Case("out-into-a-finished-run", lambda s: [s.job(), "--out", s.root / "out"],
         [f"--out: '{'{root}'}/out' holds a run (state.json: completed): ranks, report.json, state.json",
          "plan --out replaces only the set an earlier plan --out wrote", "choose another --out"], verb="plan",
         setup=finished_run, keeps=FINISHED),
    Case("out-sbatch-into-a-finished-run", lambda s: [s.job(**{"cluster.hardware": "cpu"}), "--out", s.root / "out",
                                                      "--sbatch"],
         [f"--out: '{'{root}'}/out' holds a run (state.json: completed)"], verb="plan", setup=finished_run,
         keeps=FINISHED),
    # -- 3. refused input leaves nothing behind ---------------------------------------------------------------------
    Case("sbatch-bad-param-new-out", lambda s: [s.job(**BAD_SLURM), "--out", s.root / "out", "--sbatch"],
         ["slurm.additional_parameters.bogus_opt: unknown key"], verb="plan"),
    Case("sbatch-bad-param-keeps-the-old-set", lambda s: [s.job(**BAD_SLURM), "--out", s.root / "out", "--sbatch"],
         ["slurm.additional_parameters.bogus_opt: unknown key"], verb="plan", setup=old_plan_set,
         keeps=["out", "out/.launcher-run", "out/plan.json", "out/fsdp.yaml"]),
    # -- 10. conflicts name both values -----------------------------------------------------------------------------
    Case("gpus-and-nproc-per-node-disagree", lambda s: [s.job(), "--gpus", "2", "--nproc-per-node", "4"],
         ["argument --nproc-per-node: --gpus 2 and --nproc-per-node 4: both set the ranks per node and they "
          "disagree; give one of them"]),
    Case("gpus-and-nproc-per-node-disagree-plan", lambda s: [s.job(), "--nproc_per_node", "4", "--gpus", "2"],
         ["argument --gpus: --nproc_per_node 4 and --gpus 2: both set the ranks per node"], verb="plan"),
    Case("gpus-given-twice", lambda s: [s.job(), "--gpus", "2", "--gpus", "4"], ["--gpus 2 and --gpus 4"]),
    Case("gpus-above-gpus-per-node", lambda s: [s.job(**{"cluster.gpus_per_node": 8}), "--gpus", "16"],
         ["gpus: 16 per node is more than cluster.gpus_per_node 8", "use --gpus 8 --nodes 2"],
         verb="plan"),
    Case("gpus-above-gpus-per-node-in-file", lambda s: [s.job(gpus=16, **{"cluster.gpus_per_node": 8})],
         ["gpus: 16 per node is more than cluster.gpus_per_node 8"]),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_rundir_input_is_refused_and_touches_nothing(case, sandbox):
    case.expect = [e.replace("{root}", str(sandbox.root)) for e in case.expect]
    check_refused(case, sandbox)


def test_table_is_large_enough():
    assert len(CASES) >= 15 and len({c.id for c in CASES}) == len(CASES)


def test_launch_with_no_arguments_is_one_line_not_a_traceback(capsys):
    from launcher.cli.main import main

    assert main([]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" not in err
    assert err.strip().splitlines() == [
        "launch: error: no job file given; use launch [run|plan] JOB.yaml --gpus N --budget SIZE (launch --help "
        "for more)"]
