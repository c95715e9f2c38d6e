"""The callable submitit runs on every node of a job: meet the other nodes, run the torchrun agent, requeue.

Requeue protocol (preemption or the time limit). Slurm sends USR2 ``slurm.signal_delay_s`` before the limit
(its timer runs every 30 s, so up to 30 s earlier) to every process of the step. The ranks start with USR2
blocked (see ``ranks_shielded_from``), so only this process acts on it: on node 0 submitit's handler calls
``SlurmTask.checkpoint``, which writes RUN_DIR/control/checkpoint. Every rank polls that file at each
optimizer-step boundary; they agree (all_reduce), save a checkpoint and exit 0 with status 'checkpointed'.
checkpoint() waits for that, bounded by the job's end time, removes the file, and returns the same task with
one more requeue counted; submitit pickles it and runs ``scontrol requeue``. The requeued job runs this
callable again and the ranks resume from RUN_DIR/checkpoint/latest at the next step. Past
``slurm.max_requeues`` (timeouts and preemptions together) it returns None and the run ends 'interrupted',
resumable with ``launch --slurm --resume``. Every decision is a line in RUN_DIR/requeues.jsonl.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from launcher.backends.base import LaunchSpec
from launcher.backends.slurm_rdzv import RendezvousError, agree, check_shape, node_view
from launcher.errors import ConfigError
from launcher.files.fsutil import open_private
from launcher.files.rundir import FINAL_STATUSES, RunDir
from launcher.planner.plan import Plan, read_plan
from launcher.processes.rankenv import ATTEMPT_ENV, CONTROL_FILE, RDZV_ID_ENV
from launcher.records.runreport import RankFailure, RunOutcome

REQUEUE_MARGIN_S = 3.0
"""Kept back from the job's end time for `scontrol requeue` itself."""
REPORT_WAIT_S = 60.0
"""After a good run, node 0 waits this long for the other nodes' rank files before writing report.json."""

@dataclass(kw_only=True)
class SlurmTask:
    """Pickled by submitit; holds everything a node needs, so the job never reads the submitter's memory."""

    run_dir: str
    nodes: int
    gpus_per_node: int
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment for every rank (LAUNCHER_RUN_DIR, LAUNCHER_PLAN, ...)."""
    script: str | None = None
    script_args: list[str] = field(default_factory=list)
    hang_timeout_s: float = 0.0
    signal_delay_s: int = 90
    max_requeues: int = 3
    requeues: int = 0
    """Requeues so far; carried in the pickle submitit writes at each requeue."""
    report: Callable[[RunDir, Plan, RunOutcome], int] | None = None
    """Node 0's verdict when the ranks end (the session's finish, pickled by reference); None: no report."""
    # This attempt's state, shared by __call__ and the checkpoint hook: submitit's signal handler calls
    # checkpoint() on the very object whose __call__ it interrupted (JobEnvironment._delayed.function). Not init
    # fields, so the copy made for a requeue starts fresh.
    started_at_s: float = field(default=0.0, init=False, repr=False, compare=False)
    """When this attempt's __call__ began (time.time())."""
    decision: Literal["completed", "limit", "requeue"] | None = field(default=None, init=False, repr=False,
                                                                        compare=False)
    """What the checkpoint hook decided; None until a signal came."""

    @property
    def world_size(self) -> int:
        """Ranks in the job: nodes x GPUs per node."""
        return self.nodes * self.gpus_per_node

    # -- the job -------------------------------------------------------------------------------------------
    def __call__(self) -> dict:
        self.started_at_s, self.decision = time.time(), None
        run = RunDir(Path(self.run_dir))
        try:
            return self._call(run)
        finally:
            scrub_own_logs(run)

    def _call(self, run: RunDir) -> dict:
        node_rank = int(os.environ.get("SLURM_NODEID", 0))
        endpoint = self._rendezvous(run)
        env = dict(self.env)
        env[RDZV_ID_ENV] = f"{os.environ.get('SLURM_JOB_ID', 'job')}-{os.environ.get('SLURM_RESTART_COUNT', 0)}"
        env[ATTEMPT_ENV] = str(int(os.environ.get("SLURM_RESTART_COUNT") or 0))  # stamped on every step line
        if node_rank == 0:
            # A request left from the run before a requeue would stop the resumed run at its first step.
            (run.control / CONTROL_FILE).unlink(missing_ok=True)
            run.set_state("running", slurm_job_id=os.environ.get("SLURM_JOB_ID"),
                          host=os.environ.get("SLURMD_NODENAME"),
                          attempt=int(os.environ.get("SLURM_RESTART_COUNT") or 0), requeues=self.requeues)
        spec = LaunchSpec(gpus_per_node=self.gpus_per_node, nodes=self.nodes, node_rank=node_rank,
                          rdzv_endpoint=endpoint, script=self.script, script_args=list(self.script_args), env=env,
                          hang_timeout_s=self.hang_timeout_s)
        with ranks_shielded_from(signal.SIGUSR2):
            outcome = self._run_agent(run, spec)
        if self.decision == "requeue":
            scrub_own_logs(run)  # Slurm ends this process during the wait: no finally runs
            _wait_for_requeue_kill()
        outcome = self._interpreted(run, outcome)
        result = {"node_rank": node_rank, "node": os.environ.get("SLURMD_NODENAME", ""), "ok": outcome.ok,
                  "interrupted": outcome.interrupted, "message": outcome.message, "requeues": self.requeues,
                  "failures": [dataclasses.asdict(f) for f in outcome.failures]}
        if node_rank == 0:
            result["exit_code"] = self._report(run, outcome)
        return result

    def _rendezvous(self, run: RunDir) -> str | None:
        """None on one node (torchrun's standalone rendezvous picks a free port); the head's host:port otherwise."""
        problems = self.shape_problems(run, os.environ)
        if problems:
            raise RendezvousError("\n".join(problems))
        if self.nodes == 1:
            return None
        view = node_view(os.environ, gpus_per_node=self.gpus_per_node)
        agree(run.path, view)
        return view.endpoint

    def shape_problems(self, run: RunDir, environ) -> list[str]:
        """The plan in the run dir against this task and against what Slurm allocated (``environ``)."""
        problems = []
        try:
            plan = read_plan(run.path)
            shape = {"nodes": plan.nodes, "gpus_per_node": plan.gpus_per_node, "world_size": plan.world_size}
        except (OSError, ValueError, ConfigError) as e:
            problems.append(f"plan.json in {run.path} cannot be read ({e}); the run dir was changed after "
                            "submission: resubmit with launch --slurm --overwrite")
            shape = {"nodes": self.nodes, "gpus_per_node": self.gpus_per_node, "world_size": self.world_size}
        if (shape["nodes"], shape["gpus_per_node"]) != (self.nodes, self.gpus_per_node):
            problems.append(f"plan.json: {shape['nodes']} node(s) x {shape['gpus_per_node']} GPU(s) but this job was "
                            f"submitted for {self.nodes} x {self.gpus_per_node}; the run dir was re-planned after "
                            "submission: resubmit with launch --slurm --overwrite")
        return problems + check_shape(environ, **shape)

    def _run_agent(self, run: RunDir, spec: LaunchSpec) -> RunOutcome:
        from submitit.core.utils import UncompletedJobError

        from launcher.backends.local import LocalBackend

        try:
            return LocalBackend().run(run, spec)
        except UncompletedJobError:
            # submitit's handler raises this when checkpoint() returned None: not requeued.
            if self.decision == "completed":
                return RunOutcome(ok=True)
            if self.decision == "limit":
                return RunOutcome(ok=False, interrupted=True, message=(
                    f"stopped at the time limit or by preemption after {self.requeues} requeue(s) "
                    f"(slurm.max_requeues={self.max_requeues}); resume with launch --slurm --resume "
                    f"--run-dir {run.path}"))
            raise

    def _interpreted(self, run: RunDir, outcome: RunOutcome) -> RunOutcome:
        """Ranks that saved and stopped on request, with no requeue coming, leave a resumable run."""
        if not outcome.ok or outcome.interrupted:
            return outcome
        statuses = run.rank_statuses(self.world_size)
        if "checkpointed" in statuses.values():
            return RunOutcome(ok=False, interrupted=True, message=(
                "the ranks saved a checkpoint and stopped on request; resume with launch --slurm --resume "
                f"--run-dir {run.path}"))
        return outcome

    def _report(self, run: RunDir, outcome: RunOutcome) -> int | None:
        """report.json, memory.png and the verdict, written by the job itself so a job needs no follower."""
        if self.report is None:
            return None
        # After a failure the missing files are never coming: report at once.
        run.wait_for_rank_files(self.world_size, REPORT_WAIT_S if outcome.ok else 5.0)
        plan = read_plan(run.path)
        return self.report(run, plan, outcome)

    # -- submitit's checkpoint hook (USR2, node 0's main process) ------------------------------------------
    def checkpoint(self):
        """submitit's hook on Slurm's pre-timeout or preemption signal: ask the ranks to checkpoint, wait, record the
        decision in requeues.jsonl, and return the resubmission (None when completed or out of requeues)."""
        from submitit.helpers import DelayedSubmission

        run = RunDir(Path(self.run_dir))
        started = self.started_at_s or time.time()
        budget_s = checkpoint_budget_s(self.signal_delay_s)
        t0 = time.time()
        run.control.mkdir(parents=True, exist_ok=True)
        (run.control / CONTROL_FILE).touch()
        exited = wait_for_ranks(run, self.world_size, started, budget_s)
        (run.control / CONTROL_FILE).unlink(missing_ok=True)
        statuses = run.rank_statuses(self.world_size, since=started)
        if statuses and all(s == "completed" for s in statuses.values()) and len(statuses) == self.world_size:
            decision = "completed"  # the run ended as the signal came: nothing to resume
        elif self.requeues >= self.max_requeues:
            decision = "limit"
        else:
            decision = "requeue"
        self.decision = decision
        record_requeue(run, {
            "time": time.time(), "job_id": os.environ.get("SLURM_JOB_ID"),
            "attempt": int(os.environ.get("SLURM_RESTART_COUNT") or 0), "decision": decision,
            "requeue": self.requeues + (decision == "requeue"), "max_requeues": self.max_requeues,
            "checkpoint": run.latest_checkpoint, "ranks": statuses, "ranks_exited": exited,
            "waited_s": round(time.time() - t0, 2), "budget_s": round(budget_s, 1),
        })
        if decision != "requeue":
            return None
        # `scontrol requeue` SIGTERMs this process; torchrun's handler would turn that into an ordinary return
        # and submitit would then write a result for a job that is about to run again.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        return DelayedSubmission(dataclasses.replace(self, requeues=self.requeues + 1))


def scrub_own_logs(run: RunDir) -> list[Path]:
    """Secret values out of the rank logs and out of this task's submitit .out/.err, before the job ends.

    Only this task's own submitit files: another node's task may still be appending to its own. Whatever
    submitit prints after the callable returns (its completion lines) is scrubbed again by `--wait`.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    files = []
    try:
        import submitit

        paths = submitit.JobEnvironment().paths
        files = [paths.stdout, paths.stderr]
    except Exception:  # noqa: BLE001 - outside a submitit job (a unit test): only the rank logs
        files = []
    return run.redact_logs() + run.redact_submitit_logs([Path(f) for f in files])


@contextlib.contextmanager
def ranks_shielded_from(sig: int):
    """Start the ranks with ``sig`` blocked; this process still receives it through a helper thread.

    Slurm sends USR2 to every process of the step. A rank that gets it before its handler exists (still
    importing torch) dies of it, so the ranks inherit a blocked USR2 (the mask survives fork and exec) and
    learn of the request from RUN_DIR/control/checkpoint instead, which checkpoint() writes. The mask is per
    thread: the helper thread, started before the block, leaves the signal deliverable to this process, and
    Python runs submitit's handler in the main thread as usual.
    """
    receiver = threading.Thread(target=threading.Event().wait, name="launcher-signal-receiver", daemon=True)
    receiver.start()
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {sig})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _wait_for_requeue_kill(limit_s: float = 120.0) -> None:
    """The requeue is under way: leave no result behind (the job runs again); Slurm ends this process."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        time.sleep(1)
    sys.stdout.flush()
    os._exit(1)


def checkpoint_budget_s(signal_delay_s: int) -> float:
    """Seconds the ranks get to save: until REQUEUE_MARGIN_S before the job's end time.

    Slurm may send the signal up to a minute earlier than signal_delay_s (its timer runs every 30 s), so the
    end time from scontrol is the honest bound; signal_delay_s less the margin where it cannot be read (preemption has
    no end time close by: the grace time is unknown, so at most 5 minutes).
    """
    end = job_end_time()
    if end is None:
        return max(5.0, signal_delay_s - REQUEUE_MARGIN_S)
    return max(5.0, min(300.0, end - time.time() - REQUEUE_MARGIN_S))


def job_end_time() -> float | None:
    """The job's end time from scontrol, seconds since the epoch; None outside Slurm or when it cannot be read."""
    from launcher.backends.slurm_rdzv import scontrol

    job_id = os.environ.get("SLURM_JOB_ID")
    if not job_id:
        return None
    try:
        out = scontrol(["show", "job", job_id, "-o"])
    except RendezvousError:
        return None
    for f in out.split():
        if f.startswith("EndTime="):
            try:
                return time.mktime(time.strptime(f.split("=", 1)[1], "%Y-%m-%dT%H:%M:%S"))
            except ValueError:
                return None
    return None


def wait_for_ranks(run: RunDir, world_size: int, since: float, budget_s: float, grace_s: float = 5.0) -> bool:
    """Until this node's rank processes have exited and every rank file is final for this attempt.

    Once the local ranks are gone, other nodes' ranks get ``grace_s`` to write their files (they saved together
    with ours); ranks that died before saving never write one, and waiting longer would only eat the budget.
    """
    from launcher.backends.local import alive, rank_processes

    deadline = time.monotonic() + budget_s
    gone_at = None
    while time.monotonic() < deadline:
        running = any(alive(p) for p in rank_processes().values())
        statuses = run.rank_statuses(world_size, since=since)
        if not running:
            if len(statuses) == world_size and all(s in FINAL_STATUSES for s in statuses.values()):
                return True
            gone_at = gone_at or time.monotonic()
            if time.monotonic() - gone_at > grace_s:
                return True
        time.sleep(0.2)
    return not any(alive(p) for p in rank_processes().values())


def record_requeue(run: RunDir, row: dict) -> None:
    """Append one row to the run dir's requeues.jsonl (private file)."""
    with open_private(run.path / "requeues.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")


def outcome_from_results(results: list[dict]) -> RunOutcome:
    """One RunOutcome from every node's result dict (node 0 first)."""
    failures = [RankFailure(**f) for r in results for f in r.get("failures", [])]
    messages = [r["message"] for r in results if r.get("message")]
    return RunOutcome(ok=all(r.get("ok") for r in results), failures=failures,
                   interrupted=any(r.get("interrupted") for r in results), message="; ".join(dict.fromkeys(messages)))
