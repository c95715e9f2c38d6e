"""The `launch` binary and `python -m launcher` leave through os._exit: exit codes and output must survive that."""

import json
import subprocess
import sys

import pytest

from launcher.engines import ENGINES
from tests.conftest import REPO

LAUNCH = str(REPO / ".venv" / "bin" / "launch")


def test_help_exits_0_and_prints_everything():
    res = subprocess.run([LAUNCH, "--help"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0
    assert "GiB is 2^30" in res.stdout and "Exit codes:" in res.stdout
    assert res.stdout.rstrip().endswith("show program's version number and exit")  # the last line, flushed


def test_bad_flag_exits_2_with_usage(tmp_path):
    res = subprocess.run([sys.executable, "-m", "launcher", "plan", "--no-such-flag", "job.yaml"],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert res.returncode == 2
    assert "unrecognized arguments: --no-such-flag" in res.stderr


def test_plan_json_is_flushed_whole_and_bad_input_keeps_exit_2(write_job):
    job = write_job()
    ok = subprocess.run([LAUNCH, "plan", str(job), "--json"], capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["engine"] in ENGINES  # the whole document, not a cut buffer
    bad = subprocess.run([LAUNCH, "plan", str(job), "--gpus", "3"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2
    assert "not divisible by 3" in bad.stderr


@pytest.mark.parametrize("argv", [["plan", "JOB"], ["plan", "JOB", "--json"], ["--help"]],
                         ids=["plan", "plan-json", "help"])
def test_a_closed_pipe_is_no_traceback(write_job, argv):
    import os

    job = write_job()
    argv = [str(job) if a == "JOB" else a for a in argv]
    # The reader is gone before launch writes a byte, as with `launch plan | head -c0`: whether the text is
    # written at print() (a long plan) or only at the final flush (--help fits the buffer), the status must say
    # the output was lost, without a traceback.
    r, w = os.pipe()
    os.close(r)
    # Buffered stdout, as for a user without PYTHONUNBUFFERED (set here by the machine, it makes argparse write
    # --help at once and swallow the error itself).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    p = subprocess.Popen([LAUNCH, *argv], stdout=w, stderr=subprocess.PIPE, env=env)
    os.close(w)
    err = p.stderr.read().decode()
    assert p.wait(timeout=60) == 141  # 128 + SIGPIPE, as a shell reports a writer whose reader left
    assert "Traceback" not in err and "Exception ignored" not in err, err


def test_json_errors_belong_to_the_parser_not_its_class(capsys):
    """Building a plain parser must not change how an earlier `plan --json` parser answers (no class-wide flag)."""
    import json

    import pytest

    from launcher.cli.main import build_parser

    as_json = build_parser(json_errors=True)
    build_parser()  # a second, plain parser
    with pytest.raises(SystemExit) as e:
        as_json.parse_args(["plan", "--budget"])
    assert e.value.code == 2
    assert json.loads(capsys.readouterr().out)["status"] == "bad_input"
