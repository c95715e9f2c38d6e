"""Hostile values bound for Slurm: a job file shared by a careless or hostile colleague, through the real CLI.

Every value that reaches the sbatch script, an #SBATCH line or a submitit parameter is refused when it holds a
control character (a newline would end the #SBATCH or comment line and run the rest as a command) or breaks its
option's syntax: exit 2, one error block naming the field, the value, the rule and the fix, no traceback, and
nothing written (launcher.config.slurm_rules). Names with '..', '/' or shell metacharacters are not refused:
every path built from a name is slugged (launcher.files.rundir.slug), which the second table checks.
"""

from __future__ import annotations

import contextlib
import io
import subprocess
from pathlib import Path

import pytest
import yaml

from launcher.cli.main import main
from tests.conftest import base_job
from tests.faults.harness import Case, Sandbox, check_refused, entries


def named(s: Sandbox, job_name: str, **over):
    """A job file whose `name:` is ``job_name`` (Sandbox.job's own first parameter is the file name)."""
    return s.raw(yaml.safe_dump(base_job(str(s.data), name=job_name, **over), sort_keys=False), name="named")


CPU = {"cluster.hardware": "cpu"}
"""An sbatch script plans for a named profile: auto on this GPU-less host is refused (machine.submit_host_problem)."""


def plan_sbatch(**over):
    over = {**CPU, **over}
    if "job_name" in over:
        job_name = over.pop("job_name")
        return lambda s: [named(s, job_name, **over), "--sbatch"]
    return lambda s: [s.job(**over), "--sbatch"]


def run_slurm(**over):
    return lambda s: [s.job(**over), "--slurm"]


def extra(params: dict) -> dict:
    return {"slurm.additional_parameters": params}


ONE_LINE = "must be one line of printable text"
CASES = [
    # -- control characters in each field that reaches an #SBATCH line -------------------------------------------
    Case("partition-newline", plan_sbatch(**{"slurm.partition": "gpu\nid"}),
         ["slurm.partition: 'gpu\\nid' holds a newline ('\\n') at character 4", ONE_LINE, "give a partition name"],
         verb="plan"),
    Case("partition-carriage-return", plan_sbatch(**{"slurm.partition": "gpu\rid"}),
         ["slurm.partition: 'gpu\\rid' holds a carriage return"], verb="plan"),
    Case("account-nul", plan_sbatch(**{"slurm.account": "proj\x00x"}),
         ["slurm.account: 'proj\\x00x' holds a NUL byte"], verb="plan"),
    Case("qos-tab", plan_sbatch(**{"slurm.qos": "high\tx"}), ["slurm.qos: 'high\\tx' holds a tab"], verb="plan"),
    Case("constraint-escape", plan_sbatch(**{"slurm.constraint": "a100\x1b[2J"}),
         ["slurm.constraint: 'a100\\x1b[2J' holds an escape character", "e.g. a100&ib"], verb="plan"),
    Case("name-newline", plan_sbatch(job_name="t\n#SBATCH --wrap=id"),
         ["name: 't\\n#SBATCH --wrap=id' holds a newline", "give the job a one-line name"], verb="plan"),
    Case("name-line-separator", plan_sbatch(job_name="t\u2028id"), ["name: 't\\u2028id' holds a control character"],
         verb="plan"),
    Case("name-bidi-override", plan_sbatch(job_name="t\u202eexe.sh"),
         ["name: 't\\u202eexe.sh' holds a control character"],
         verb="plan"),
    Case("extra-key-injects-a-directive", plan_sbatch(**extra({"x\n#SBATCH --wrap": "id"})),
         ["slurm.additional_parameters: key 'x\\n#SBATCH --wrap' holds a newline", "e.g. reservation"], verb="plan"),
    Case("extra-value-newline", plan_sbatch(**extra({"comment": "ok\nid"})),
         ["slurm.additional_parameters.comment: 'ok\\nid' holds a newline", "give the value on one line"],
         verb="plan"),
    Case("extra-value-cr", plan_sbatch(**extra({"mail_user": "a@b\r\nid"})),
         ["slurm.additional_parameters.mail_user: 'a@b\\r\\nid' holds a carriage return"], verb="plan"),
    Case("setup-item-with-two-lines", plan_sbatch(**{"slurm.setup": ["module load cuda\nid"]}),
         ["slurm.setup[0]: 'module load cuda\\nid' holds a newline", "split it into several items"], verb="plan"),
    # -- syntax of each option ------------------------------------------------------------------------------------
    Case("partition-shell-metacharacters", plan_sbatch(**{"slurm.partition": "gpu;id"}),
         ["slurm.partition: 'gpu;id' is not a partition name", "sinfo -s"], verb="plan"),
    Case("account-with-space", plan_sbatch(**{"slurm.account": "my proj"}),
         ["slurm.account: 'my proj' is not one account name"], verb="plan"),
    # 1000, not more: past 4096 the job's string bound (launcher.config.bounds) answers first.
    Case("qos-absurdly-long", plan_sbatch(**{"slurm.qos": "q" * 1000}),
         ["slurm.qos: 'qqqq", "is 1000 characters, over 256"], verb="plan"),
    Case("constraint-with-spaces", plan_sbatch(**{"slurm.constraint": "a100 && ib"}),
         ["slurm.constraint: 'a100 && ib' is not a Slurm constraint", "e.g. a100&ib"], verb="plan"),
    Case("constraint-unbalanced", plan_sbatch(**{"slurm.constraint": "[rack1|rack2"}),
         ["slurm.constraint: '[rack1|rack2' is not a Slurm constraint"], verb="plan"),
    Case("extra-key-with-space", plan_sbatch(**extra({"mail type": "END"})),
         ["slurm.additional_parameters: key 'mail type' is not an option name"], verb="plan"),
    Case("extra-key-absurdly-long", plan_sbatch(**extra({"k" * 500: 1})),
         ["is 500 characters, over 64"], verb="plan"),
    Case("extra-value-absurdly-long", plan_sbatch(**extra({"comment": "c" * 5000})),
         ["slurm.additional_parameters.comment:", "is 5000 characters, over the 4096"], verb="plan"),
    Case("extra-bad-time", plan_sbatch(**extra({"time_min": "90 minutes"})),
         ["slurm.additional_parameters.time_min: '90 minutes' is not a Slurm time", "e.g. 90 or 1-12:00:00"],
         verb="plan"),
    Case("extra-bad-mem", plan_sbatch(**extra({"mem_per_cpu": "4 GB"})),
         ["slurm.additional_parameters.mem_per_cpu: '4 GB' is not a Slurm memory size", "e.g. 8G"], verb="plan"),
    Case("timeout-a-unit-slip", plan_sbatch(**{"slurm.timeout_min": 10**9}),
         ["slurm.timeout_min: 1000000000 minutes is over a year", "leave it out to derive it from the plan"],
         verb="plan"),
    Case("extra-unknown-option-with-out",
         lambda s: [s.job(**CPU, **extra({"gpu_typo": 1})), "--sbatch", "--out", s.root / "exports"],
         ["slurm.additional_parameters.gpu_typo: unknown key", "valid keys:"], verb="plan"),
    # -- paths the script names -----------------------------------------------------------------------------------
    Case("out-path-newline", lambda s: [s.job(), "--sbatch", "--out", s.root / "out\n#SBATCH --wrap=id"],
         ["--out: ", "out\\n#SBATCH --wrap=id' holds a newline", "choose a path without control characters"],
         verb="plan"),
    Case("run-dir-newline-on-slurm", lambda s: [s.job(), "--slurm", "--run-dir", s.root / "r\nid"],
         ["--run-dir: ", "r\\nid' holds a newline"]),
    # -- the same values on the submitit path (launch run --slurm), refused before anything is submitted --------------
    Case("run-slurm-partition-newline", run_slurm(**{"slurm.partition": "gpu\nid"}),
         ["slurm.partition: 'gpu\\nid' holds a newline"]),
    Case("run-slurm-extra-key-injection", run_slurm(**extra({"x\n#SBATCH --wrap": "id"})),
         ["slurm.additional_parameters: key 'x\\n#SBATCH --wrap' holds a newline"]),
    Case("plain-plan-checks-slurm-too", lambda s: [s.job(**{"slurm.account": "a\nb"})],
         ["slurm.account: 'a\\nb' holds a newline"], verb="plan"),
    # -- sizes no node has, and a plan for the wrong machine (issue 35 section 3, issue 36 section 3) ----------------
    Case("mem-gb-tiny-would-be-the-whole-node", plan_sbatch(**{"slurm.mem_gb": 0.0001}),
         ["slurm.mem_gb: 0.0001 must be from 1 to 65536", "--mem=0 as the whole node"], verb="plan"),
    Case("mem-gb-past-any-node", run_slurm(**{"slurm.mem_gb": 1e9}), ["slurm.mem_gb: 1000000000.0 must be from 1"]),
    Case("cpus-per-task-past-any-node", plan_sbatch(**{"slurm.cpus_per_task": 10**8}),
         ["slurm.cpus_per_task: 100000000 must be from 1 to 4096"], verb="plan"),
    Case("cpus-per-task-past-the-node", plan_sbatch(**{"slurm.cpus_per_task": 64, "cluster.cpus_per_node": 32}),
         ["slurm.cpus_per_task: 64 is more than cluster.cpus_per_node (32)"], verb="plan"),
    Case("hardware-auto-on-a-gpu-less-submit-host", lambda s: [s.job(), "--sbatch", "--out", s.root / "exports"],
         ["cluster.hardware: auto found no GPU on this host", "or to cpu for CPU ranks"], verb="plan"),
]


def test_the_table_is_big_enough():
    assert len(CASES) >= 15 and len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_slurm_value_exits_2_with_one_line(case: Case, sandbox: Sandbox):
    text = check_refused(case, sandbox)
    assert len([ln for ln in text.splitlines() if " error: " in ln]) == 1, text


def _plan(argv: list) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["plan", *[str(a) for a in argv]])
    return code, out.getvalue(), err.getvalue()


def _bash_n(text: str, tmp_path) -> None:
    script = tmp_path / "check.sbatch"
    script.write_text(text)
    out = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("name,slug", [
    ("../../../../tmp/x", "tmp-x"), ("..", "job"), ("a/b/../c", "a-b-..-c"), ("-rf", "rf"),
    ("$(id) `id`; rm -rf ~", "id-id-rm--rf"), (".hidden", "hidden"),
])
def test_names_are_slugged_in_every_path(sandbox: Sandbox, tmp_path, name, slug):
    before = entries(sandbox.root)
    code, out, err = _plan([named(sandbox, name, **CPU), "--sbatch"])
    assert code == 0, err
    run_dir = Path.cwd() / "runs" / slug  # absolute: the script runs from any directory
    assert f"\nRUN_DIR={run_dir}\n" in out and f"#SBATCH --job-name={slug}\n" in out
    assert f"#SBATCH --output={run_dir}/slurm-%j.out\n" in out
    _bash_n(out, tmp_path)
    assert entries(sandbox.root) == before | {"named.yaml"}


def test_an_allowed_out_path_with_spaces_and_quotes_round_trips(sandbox: Sandbox, tmp_path):
    out_dir = sandbox.root / "my runs" / "it's \"q\" $HOME `id` ;&|#x"
    code, _, err = _plan([sandbox.job(**CPU), "--sbatch", "--out", out_dir])
    assert code == 0, err
    text = (out_dir / "job.sbatch").read_text()
    _bash_n(text, tmp_path)
    run_dir_line = next(ln for ln in text.splitlines() if ln.startswith("RUN_DIR="))
    echoed = subprocess.run(["bash", "-c", f'{run_dir_line}\nprintf %s "$RUN_DIR"'], capture_output=True, text=True)
    assert echoed.stdout == str(out_dir)
