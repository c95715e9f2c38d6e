"""A plain sbatch script from a plan, for people who submit with sbatch rather than through submitit.

Returns the text (reading only this interpreter's path and the DeepSpeed ops cache it pins). The script carries
the run's definition (job.yaml, plan.json and, for DeepSpeed, ds_config.json as written at plan time), so it is
all a cluster needs besides the launcher package, and it runs from any directory (the run dir is absolute). Each
node runs one srun task: ``$PYTHON -m torch.distributed.run`` with the c10d endpoint at the first host of the
allocation (at its NodeAddr, as scontrol knows it; no localhost fallback, pytorch #76069). PYTHON is the
interpreter `launch plan` ran under, as submitit pins the submitting one (a node's PATH may find another python,
or none); slurm.setup may set it. The DeepSpeed ops the plan loads are built before srun starts the ranks, once
(launcher.processes.ops), into the ops cache `launch` uses.

Requeue, as in the submitit path: ``--signal=B:USR2@signal_delay_s`` reaches only the batch shell, whose trap
drops RUN_DIR/control/checkpoint; the ranks save at the next optimizer step and exit 0 ('checkpointed'); the
script then runs ``scontrol requeue`` while SLURM_RESTART_COUNT < slurm.max_requeues, and the requeued job
resumes from RUN_DIR/checkpoint/latest. Otherwise the script's last step is the verdict (launcher.cli.finish):
report.json, state.json and the exit code, as `launch` writes them.

What reaches the shell: every value is checked (launcher.config.slurm_rules: no control characters, each Slurm
option's syntax) and then quoted (shlex.quote), so it stays one word on one line; the run dir is checked here too.
``slurm.setup`` is the one exception, written as given: raw shell by design. --time, --mem, --cpus-per-task and
the GPUs come from ``slurm_resources`` (the job's, or derived from the plan; the header says how), and the ranks
get OMP_NUM_THREADS to match.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import yaml

from launcher.config.job import Job
from launcher.config.slurm_rules import check_shell_path
from launcher.emit.slurm_alloc import SlurmResources, allocation_lines, slurm_resources
from launcher.errors import ConfigError
from launcher.files.rundir import MARKER
from launcher.model.offline import OFFLINE_ENV
from launcher.planner.plan import Plan
from launcher.processes.rankenv import (
    EXTENSIONS_ENV,
    PLAN_DIGEST_ENV,
    PLAN_ENV,
    RUN_DIR_ENV,
    extensions_dir,
    plan_digest,
)

EOF_MARK = "LAUNCHER_FILE_EOF"
OFFLINE_EXPORTS = " ".join(f"{k}={v}" for k, v in OFFLINE_ENV.items())
"""The ranks' Hugging Face offline switches (launcher.model.offline.OFFLINE_ENV) as the script exports them."""

HEADER = """#!/bin/bash
# {name}: {label} on {nodes} node(s) x {gpus} {ranks}; predicted peak {peak:.3f} GB of {budget:.3f} GB per rank.
# Written by `launch plan --sbatch`. The run dir must exist before `sbatch` (Slurm opens --output first):
#   mkdir -p {run_dir_q} && sbatch THIS_FILE
# What the job asks for, and how each value was reached:
{derived}
"""

BODY = """
set -euo pipefail
RUN_DIR={run_dir_q}
MAX_REQUEUES={max_requeues}
# The interpreter `launch plan --sbatch` ran under (its venv has the launcher); slurm.setup may set PYTHON.
PYTHON={python_q}
export {ext_env}={ext_dir_q}  # DeepSpeed's compiled ops, shared with `launch` on this filesystem
# Only into a run dir launch made ({marker}) or a new one (Slurm's output files only), marked then for
# launch status, --resume and --overwrite.
if [ -L "$RUN_DIR/{marker}" ] || [ ! -f "$RUN_DIR/{marker}" ]; then
  for entry in "$RUN_DIR"/* "$RUN_DIR"/.[!.]* "$RUN_DIR"/..?*; do
    [ -e "$entry" ] || [ -L "$entry" ] || continue
    case "${{entry##*/}}" in
      slurm-*.out) ;;
      *) echo "launch: $RUN_DIR holds ${{entry##*/}} and was not made by launch (no {marker}): nothing written;" \\
           "give the script an empty or new run dir (launch plan --sbatch --out DIR)" >&2; exit 2 ;;
    esac
  done
  made='{{"made_by": "sbatch job %s", "created": %s}}\\n'
  printf "$made" "${{SLURM_JOB_ID:-}}" "$(date +%s)" > "$RUN_DIR/{marker}"
fi
mkdir -p "$RUN_DIR/logs" "$RUN_DIR/ranks" "$RUN_DIR/steps" "$RUN_DIR/control"

# The run as planned when this script was written; the ranks read these files.
write_file() {{ local tmp; tmp=$(mktemp "$RUN_DIR/.$1.XXXXXX.launcher-tmp"); cat > "$tmp"; mv -f "$tmp" "$RUN_DIR/$1"; }}
{files}
{setup}
command -v "$PYTHON" >/dev/null \\
  || {{ echo "launch: $PYTHON not found on $(hostname): set PYTHON in slurm.setup" >&2; exit 2; }}

# Rendezvous at the first host of the allocation, at the address Slurm reaches it by.
command -v scontrol >/dev/null || {{ echo "launch: scontrol not found: cannot find the head node" >&2; exit 1; }}
hosts=$(scontrol show hostnames "$SLURM_JOB_NODELIST")  # no `| head`: its early exit fails the pipe
head_host=${{hosts%%$'\\n'*}}
head_addr=$(scontrol show node "$head_host" -o | tr ' ' '\\n' | sed -n 's/^NodeAddr=//p')
head_addr=${{head_addr:-$head_host}}
port=$((20000 + SLURM_JOB_ID % 20000))
# srun of Slurm 22.05 to 23.02 does not pass the job's --cpus-per-task on to its step: say it again.
SRUN_CPUS=${{SLURM_CPUS_PER_TASK:+--cpus-per-task=$SLURM_CPUS_PER_TASK}}

export {run_dir_env}="$RUN_DIR" {plan_env}="$RUN_DIR/plan.json" {offline} TOKENIZERS_PARALLELISM=false
export {digest_env}={digest}  # the ranks refuse a plan.json other than the one this script writes
export OMP_NUM_THREADS="${{OMP_NUM_THREADS:-{threads}}}"  # --cpus-per-task shared by the node's ranks
{ds_export}{build_ops}
# USR2 comes here only (B:); the ranks poll the control file at every optimizer step.
rm -f "$RUN_DIR/control/checkpoint"
trap 'touch "$RUN_DIR/control/checkpoint"' USR2
# torchrun's agents keep their error files here (else a /tmp/torchelastic_* dir on every node, never removed).
# 0700 first: torchrun makes its own dirs under it 0755, and the run dir's are private.
elastic_dir="$RUN_DIR/.torchelastic.$SLURM_JOB_ID.launcher-tmp"
mkdir -m 700 -p "$elastic_dir"
srun --ntasks-per-node=1 --kill-on-bad-exit=1 $SRUN_CPUS "$PYTHON" -m torch.distributed.run --nnodes={nodes} \\
  --nproc-per-node={gpus} --max-restarts=0 --rdzv-backend=c10d --rdzv-endpoint="$head_addr:$port" \\
  --rdzv-id="$SLURM_JOB_ID-${{SLURM_RESTART_COUNT:-0}}" --log-dir="$elastic_dir" \\
  -m launcher.worker.rank_entry "$RUN_DIR" &
srun_pid=$!
# A trapped signal ends `wait` early; keep waiting until srun itself has exited.
while :; do
  wait "$srun_pid" && rc=0 || rc=$?
  kill -0 "$srun_pid" 2>/dev/null || break
done
rm -rf "$elastic_dir"
rm -f "$RUN_DIR/control/checkpoint"
if [ "$rc" -eq 0 ] && grep -Eqs '"status": *"checkpointed"' "$RUN_DIR/ranks/rank-0.json" \\
    && [ "${{SLURM_RESTART_COUNT:-0}}" -lt "$MAX_REQUEUES" ]; then
  echo "launch: ranks checkpointed; requeueing job $SLURM_JOB_ID" >&2
  scontrol requeue "$SLURM_JOB_ID"
  exit 0
fi
# The verdict, as `launch` gives it: report.json, memory.png, state.json; the job exits with the verdict's code.
"$PYTHON" -m launcher.cli.finish "$RUN_DIR" "$rc" && rc=0 || rc=$?
exit "$rc"
"""  # noqa: E501 - write_file's shell line: 119 columns as written, its braces escaped here


def _flag(key: str, value: object) -> str:
    key = key.replace("_", "-")
    return f"#SBATCH --{key}" if value is True else f"#SBATCH --{key}={shlex.quote(str(value))}"


def heredoc(name: str, text: str) -> str:
    """The sbatch script's lines that write ``text`` to ``name`` in the run dir through a quoted heredoc; ValueError
    when the text holds the end marker."""
    if any(line == EOF_MARK for line in text.splitlines()):
        raise ValueError(f"{name} contains the line {EOF_MARK}; it cannot be embedded")
    return f"write_file {shlex.quote(name)} <<'{EOF_MARK}'\n{text.rstrip()}\n{EOF_MARK}"


def run_files(plan: Plan, job: Job) -> dict[str, str]:
    """The files the ranks need in the run dir, as launch would write them."""
    from launcher.config.jobfile import job_to_data

    files = {"job.yaml": yaml.safe_dump(job_to_data(job), sort_keys=False),
             "plan.json": json.dumps(plan.to_json(), indent=2)}
    from launcher.engines import engine_spec

    files.update(engine_spec(plan.strategy.engine).rank_files(plan, job))
    return files


BUILD_OPS = """# DeepSpeed's ops this plan loads, built once on each node before the ranks start (a line each).
srun --ntasks-per-node=1 $SRUN_CPUS "$PYTHON" -m launcher.processes.ops {ops}
"""


def sbatch_text(plan: Plan, job: Job, run_dir: Path, *, run_dir_flag: str = "run dir",
                resources: SlurmResources | None = None, python: str | None = None, ops_dir: str | None = None) -> str:
    """The sbatch script for ``plan``, run dir ``run_dir`` (absolute); ConfigError (exit 2) if the slurm: section
    or the run dir (given by ``run_dir_flag``, named in the message) has a problem. ``resources``: the allocation
    (default: what the plan alone derives, launcher.emit.slurm_alloc); ``python``: the interpreter the nodes run
    (default: this one, as submitit pins it); ``ops_dir``: DeepSpeed's ops cache (default: the one `launch` uses)."""
    from launcher.emit.slurm_params import directives

    if not run_dir.is_absolute():
        raise ValueError(f"the sbatch script needs an absolute run dir, not {str(run_dir)!r}")
    python, ops_dir = python or sys.executable, ops_dir or extensions_dir()
    bad = check_shell_path(run_dir, run_dir_flag) + check_shell_path(python, "the interpreter (sys.executable)") \
        + check_shell_path(ops_dir, EXTENSIONS_ENV)
    if bad:
        raise ConfigError(bad)
    res = resources or slurm_resources(job, plan)
    flags = directives(job, plan, resources=res)  # checks the slurm: section and the name first
    run_dir_q = shlex.quote(str(run_dir))
    derived = "\n".join(f"#   {option:<19} {how}" for option, how in allocation_lines(res, plan.hardware))
    out = [HEADER.format(name=" ".join(job.name.split()), label=plan.strategy.label(), nodes=plan.nodes,
                         gpus=plan.gpus_per_node, ranks="GPU(s)" if res.gpus_per_node else "CPU rank(s)",
                         peak=plan.estimate.peak_bytes / 1e9, budget=plan.budget_bytes / 1e9, run_dir_q=run_dir_q,
                         derived=derived)]
    flags["signal"] = f"B:USR2@{job.slurm.signal_delay_s}"
    flags["requeue"] = True
    flags["open-mode"] = "append"
    # Slurm expands %j, %u, ... in the file name; a % of the path itself is written %%.
    flags["output"] = f"{str(run_dir).replace('%', '%%')}/slurm-%j.out"
    out += [_flag(k, v) for k, v in flags.items()]
    files_by_name = run_files(plan, job)
    files = "\n".join(heredoc(name, text) for name, text in files_by_name.items())
    setup = "\n# setup (slurm.setup)\n" + "\n".join(job.slurm.setup) + "\n" if job.slurm.setup else ""
    from launcher.engines import engine_spec
    from launcher.processes.ops import plan_ops

    spec = engine_spec(plan.strategy.engine)
    ds_export = "".join(f'export {var}="$RUN_DIR/{name}"\n' for var, name in spec.config_env)
    ops = plan_ops(plan)
    out.append(BODY.format(run_dir_q=run_dir_q, max_requeues=job.slurm.max_requeues, files=files, setup=setup,
                           nodes=plan.nodes, gpus=plan.gpus_per_node, ds_export=ds_export, threads=res.threads_per_rank,
                           run_dir_env=RUN_DIR_ENV, marker=MARKER, plan_env=PLAN_ENV, offline=OFFLINE_EXPORTS,
                           digest_env=PLAN_DIGEST_ENV,
                           digest=plan_digest(files_by_name["plan.json"].rstrip() + "\n"),
                           python_q=shlex.quote(python), ext_env=EXTENSIONS_ENV,
                           ext_dir_q=shlex.quote(ops_dir),
                           build_ops=BUILD_OPS.format(ops=" ".join(ops)) if ops else ""))
    return "\n".join(out).replace("\n\n\n", "\n\n")
