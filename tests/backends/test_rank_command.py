"""The command every rank (and every Slurm task) starts with: a `launcher/` dir in its working dir must not shadow the
launcher it runs (`python -m` puts the working dir first on sys.path)."""

from __future__ import annotations

import shlex
import subprocess
import sys

import pytest

from launcher.backends.base import LaunchSpec
from launcher.backends.local import torchrun_argv
from launcher.files.rundir import RunDir
from launcher.processes.rankenv import RANK_MODULE, SAFE_PATH_BOOTSTRAP

pytestmark = pytest.mark.slow  # starts the rank entry in a child


def shadowed_cwd(tmp_path):
    """A working dir holding a `launcher/` package that exits on import, and an empty run dir with its logs/."""
    (tmp_path / "launcher").mkdir()
    (tmp_path / "launcher" / "__init__.py").write_text('raise SystemExit("the shadowing launcher ran")\n')
    (tmp_path / "run" / "logs").mkdir(parents=True)
    return tmp_path


def run_from(cwd, command: list[str]) -> tuple[int, str]:
    """(exit code, stderr and the rank's log) of ``command`` started in ``cwd`` on the run dir ``cwd/run``."""
    p = subprocess.run([*command, str(cwd / "run")], cwd=cwd, capture_output=True, text=True, timeout=120)
    log = cwd / "run" / "logs" / "rank-0.log"
    return p.returncode, p.stderr + (log.read_text() if log.exists() else "")


def rank_command(tmp_path) -> list[str]:
    """The command torchrun starts on each rank from the local backend's arguments (torchrun's own parser)."""
    from torch.distributed.run import config_from_args, parse_args

    argv = torchrun_argv(RunDir(tmp_path / "run"), LaunchSpec(gpus_per_node=1, nodes=1))
    _, cmd, args = config_from_args(parse_args(argv))
    assert args[-1] == str(tmp_path / "run")
    return [cmd, *args[:-1]]


def test_a_launcher_dir_in_the_working_dir_does_not_shadow_the_ranks(tmp_path):
    cwd = shadowed_cwd(tmp_path)
    # The fixture shadows what a plain `python -m` starts: the check below can fail.
    code, out = run_from(cwd, [sys.executable, "-u", "-m", RANK_MODULE])
    assert "the shadowing launcher ran" in out and code == 1
    # The real rank entry ran: it found no plan in the empty run dir and said so in the rank's log.
    code, out = run_from(cwd, rank_command(tmp_path))
    assert "shadowing" not in out and "no job.yaml or plan.json" in out and code == 2


def test_python_3_10s_bootstrap_keeps_the_working_dir_off_sys_path_too(tmp_path):
    cwd = shadowed_cwd(tmp_path)
    code, out = run_from(cwd, [sys.executable, "-u", "-c", SAFE_PATH_BOOTSTRAP, "-u", "-m", RANK_MODULE])
    assert "shadowing" not in out and "no job.yaml or plan.json" in out and code == 2


def test_submitit_starts_the_slurm_task_with_the_same_interpreter_flags(tmp_path, monkeypatch):
    import submitit.slurm.slurm as ss

    from launcher.backends.slurm import make_executor

    monkeypatch.setattr(ss.SlurmExecutor, "affinity", classmethod(lambda cls: 2))  # "srun is on PATH"
    ex = make_executor(tmp_path / "submitit", {}, max_requeues=1)
    # submitit's command is `{python} -u -m submitit.core._submit FOLDER`; the rank entry stands in for its module.
    code, out = run_from(shadowed_cwd(tmp_path), [*shlex.split(ex.python), "-u", "-m", RANK_MODULE])
    assert "shadowing" not in out and "no job.yaml or plan.json" in out and code == 2
