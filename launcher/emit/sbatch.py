"""A plain sbatch script from a plan, for people who submit with sbatch rather than through submitit.

Pure: returns the text. The script carries the run's definition (job.yaml, plan.json and, for DeepSpeed,
ds_config.json as written at plan time), so it is all a cluster needs besides the launcher package. Each node
runs one srun task: ``python -m torch.distributed.run`` with the c10d endpoint at the first host of the
allocation (at its NodeAddr, as scontrol knows it; no localhost fallback, pytorch #76069).

Requeue, as in the submitit path: ``--signal=B:USR2@signal_delay_s`` reaches only the batch shell, whose trap
drops RUN_DIR/control/checkpoint; the ranks save at the next optimizer step and exit 0 ('checkpointed'); the
script then runs ``scontrol requeue`` while SLURM_RESTART_COUNT < slurm.max_requeues, and the requeued job
resumes from RUN_DIR/checkpoint/latest.

What reaches the shell: every value is checked (launcher.config.slurm_rules: no control characters, each Slurm
option's syntax) and then quoted (shlex.quote), so it stays one word on one line; the run dir is checked here too.
``slurm.setup`` is the one exception, written as given: raw shell by design. --time, --mem and --cpus-per-task come
from ``slurm_resources`` (the job's, or derived from the plan), and the ranks get OMP_NUM_THREADS to match.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import yaml

from launcher.config.job import Job
from launcher.config.slurm_rules import check_shell_path
from launcher.errors import ConfigError
from launcher.planner.plan import Plan
from launcher.rankenv import PLAN_DIGEST_ENV, PLAN_ENV, RUN_DIR_ENV, plan_digest

EOF_MARK = "LAUNCHER_FILE_EOF"

HEADER = """#!/bin/bash
# {name}: {label} on {nodes} node(s) x {gpus} GPU(s); predicted peak {peak:.3f} GB of {budget:.3f} GB per GPU.
# Written by `launch plan --sbatch`. The run dir must exist before `sbatch` (Slurm opens --output first):
#   mkdir -p {run_dir_q} && sbatch THIS_FILE
{derived}"""

BODY = """
set -euo pipefail
RUN_DIR={run_dir_q}
MAX_REQUEUES={max_requeues}
mkdir -p "$RUN_DIR/logs" "$RUN_DIR/ranks" "$RUN_DIR/steps" "$RUN_DIR/control"

# The run as planned when this script was written; the ranks read these files.
write_file() {{ local tmp; tmp=$(mktemp "$RUN_DIR/.$1.XXXXXX.launcher-tmp"); cat > "$tmp"; mv -f "$tmp" "$RUN_DIR/$1"; }}
{files}
{setup}
# Rendezvous at the first host of the allocation, at the address Slurm reaches it by.
command -v scontrol >/dev/null || {{ echo "launch: scontrol not found: cannot find the head node" >&2; exit 1; }}
hosts=$(scontrol show hostnames "$SLURM_JOB_NODELIST")  # no `| head`: its early exit fails the pipe
head_host=${{hosts%%$'\\n'*}}
head_addr=$(scontrol show node "$head_host" -o | tr ' ' '\\n' | sed -n 's/^NodeAddr=//p')
head_addr=${{head_addr:-$head_host}}
port=$((20000 + SLURM_JOB_ID % 20000))

export {run_dir_env}="$RUN_DIR" {plan_env}="$RUN_DIR/plan.json" HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export {digest_env}={digest}  # the ranks refuse a plan.json other than the one this script writes
export OMP_NUM_THREADS="${{OMP_NUM_THREADS:-{threads}}}"  # --cpus-per-task shared by the node's ranks
{ds_export}
# USR2 comes here only (B:); the ranks poll the control file at every optimizer step.
rm -f "$RUN_DIR/control/checkpoint"
trap 'touch "$RUN_DIR/control/checkpoint"' USR2
srun --ntasks-per-node=1 --kill-on-bad-exit=1 python -m torch.distributed.run --nnodes={nodes} \\
  --nproc-per-node={gpus} --max-restarts=0 --rdzv-backend=c10d --rdzv-endpoint="$head_addr:$port" \\
  --rdzv-id="$SLURM_JOB_ID-${{SLURM_RESTART_COUNT:-0}}" -m launcher.rank_entry "$RUN_DIR" &
srun_pid=$!
# A trapped signal ends `wait` early; keep waiting until srun itself has exited.
while :; do
  wait "$srun_pid" && rc=0 || rc=$?
  kill -0 "$srun_pid" 2>/dev/null || break
done
rm -f "$RUN_DIR/control/checkpoint"
if [ "$rc" -eq 0 ] && grep -Eqs '"status": *"checkpointed"' "$RUN_DIR/ranks/rank-0.json" \\
    && [ "${{SLURM_RESTART_COUNT:-0}}" -lt "$MAX_REQUEUES" ]; then
  echo "launch: ranks checkpointed; requeueing job $SLURM_JOB_ID" >&2
  scontrol requeue "$SLURM_JOB_ID"
fi
exit "$rc"
"""


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


def sbatch_text(plan: Plan, job: Job, run_dir: Path, *, run_dir_flag: str = "run dir") -> str:
    """The sbatch script for ``plan``; ConfigError (exit 2) if the slurm: section or the run dir (given by
    ``run_dir_flag``, named in the message) has a problem."""
    from launcher.emit.slurm_params import directives, slurm_resources

    bad_path = check_shell_path(run_dir, run_dir_flag)
    if bad_path:
        raise ConfigError(bad_path)
    res = slurm_resources(job, plan)
    flags = directives(job, plan, resources=res)  # checks the slurm: section and the name first
    run_dir_q = shlex.quote(str(run_dir))
    derived = f"# From the plan: {' '.join(res.derived)} (`launch plan` says how); the rest as the job sets it.\n"
    out = [HEADER.format(name=" ".join(job.name.split()), label=plan.strategy.label(), nodes=plan.nodes,
                         gpus=plan.gpus_per_node, peak=plan.estimate.peak_bytes / 1e9,
                         budget=plan.budget_bytes / 1e9, run_dir_q=run_dir_q,
                         derived=derived if res.derived else "")]
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

    ds_export = "".join(f'export {var}="$RUN_DIR/{name}"\n' for var, name in engine_spec(plan.strategy.engine).config_env)
    out.append(BODY.format(run_dir_q=run_dir_q, max_requeues=job.slurm.max_requeues, files=files, setup=setup,
                           nodes=plan.nodes, gpus=plan.gpus_per_node, ds_export=ds_export, threads=res.threads_per_rank,
                           run_dir_env=RUN_DIR_ENV, plan_env=PLAN_ENV, digest_env=PLAN_DIGEST_ENV,
                           digest=plan_digest(files_by_name["plan.json"].rstrip() + "\n")))
    return "\n".join(out).replace("\n\n\n", "\n\n")
