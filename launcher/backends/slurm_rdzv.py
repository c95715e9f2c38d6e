"""Where the nodes of a Slurm job meet: head node, c10d port, and a check that every node agrees.

The head is the first host of ``scontrol show hostnames $SLURM_JOB_NODELIST``, resolved to the address Slurm
itself uses for it (``scontrol show node`` NodeAddr; node names need not resolve in DNS, and on the dev cluster
both nodes are 127.0.0.1). Without scontrol there is no honest answer: falling back to localhost makes every
node form a world of its own and wait forever (pytorch #76069), so this fails instead.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from launcher.errors import LauncherError
from launcher.files.fsutil import atomic_write

PORT_BASE = 20000
PORT_SPAN = 20000
AGREE_TIMEOUT_S = 120.0
"""How long a node waits for the others' views before failing (Slurm starts a step's tasks together)."""

Runner = Callable[[list[str]], str]


class RendezvousError(LauncherError):
    """The nodes of a job cannot meet: fail the job with the reason instead of hanging in the rendezvous."""


def scontrol(argv: list[str]) -> str:
    """scontrol's stdout for ``argv``; RendezvousError when it is missing, hangs (30 s) or fails."""
    try:
        out = subprocess.run(["scontrol", *argv], capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        raise RendezvousError("scontrol is not on PATH inside the job, so the head node cannot be found; a "
                              "localhost fallback would split the job into separate worlds (pytorch #76069); "
                              "put Slurm's client tools on the nodes' PATH") from None
    except subprocess.TimeoutExpired:
        raise RendezvousError(f"scontrol {' '.join(argv)} did not answer in 30 s; is slurmctld reachable?") from None
    if out.returncode != 0:
        raise RendezvousError(f"scontrol {' '.join(argv)} failed (exit {out.returncode}): {out.stderr.strip()}")
    return out.stdout


def port_for(job_id: str | int) -> int:
    """A c10d port from the job id: the same on every node without talking, different for neighbouring jobs."""
    return PORT_BASE + int(str(job_id).split("_")[0]) % PORT_SPAN


def head_host(nodelist: str, run: Runner = scontrol) -> str:
    """The first host of the job's node list: where the c10d rendezvous runs."""
    if not nodelist:
        raise RendezvousError("SLURM_JOB_NODELIST is empty: not inside a Slurm allocation?")
    hosts = run(["show", "hostnames", nodelist]).split()
    if not hosts:
        raise RendezvousError(f"scontrol show hostnames {nodelist!r} printed no host")
    return hosts[0]


def node_addr(node: str, run: Runner = scontrol) -> str:
    """The address Slurm reaches ``node`` at (NodeAddr), else the node name itself."""
    out = run(["show", "node", node, "-o"])
    for field in out.split():
        if field.startswith("NodeAddr="):
            addr = field.split("=", 1)[1]
            if addr and addr not in ("(null)", "None"):
                return addr
    return node


@dataclass(kw_only=True, slots=True)
class NodeView:
    """What one node of the job believes about the rendezvous; every node's view must match."""

    node_rank: int
    node_name: str
    job_id: str
    attempt: int
    """SLURM_RESTART_COUNT: views of an earlier run of a requeued job must not count."""
    nodelist: str
    head_host: str
    head_addr: str
    port: int
    nodes: int
    gpus_per_node: int
    world_size: int

    @property
    def endpoint(self) -> str:
        """The c10d rendezvous endpoint, head_addr:port."""
        return f"{self.head_addr}:{self.port}"


def node_view(env: Mapping[str, str], *, gpus_per_node: int, run: Runner = scontrol) -> NodeView:
    """This node's view of the job from its Slurm environment: node rank, head host and address, port, world size."""
    nodelist = env.get("SLURM_JOB_NODELIST", "")
    head = head_host(nodelist, run)
    nodes = int(env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or 1)
    job_id = env.get("SLURM_JOB_ID", "0")
    return NodeView(
        node_rank=int(env.get("SLURM_NODEID", 0)), node_name=env.get("SLURMD_NODENAME") or os.uname().nodename,
        job_id=job_id, attempt=int(env.get("SLURM_RESTART_COUNT") or 0), nodelist=nodelist, head_host=head,
        head_addr=node_addr(head, run), port=port_for(job_id), nodes=nodes, gpus_per_node=gpus_per_node,
        world_size=nodes * gpus_per_node,
    )


def _env_int(env: Mapping[str, str], key: str) -> int | None:
    raw = env.get(key)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise RendezvousError(f"{key}={raw!r} is not an integer; Slurm sets it to a count, so something in the "
                              "job's environment overwrote it; unset it in the submitting shell") from None


def allocated_nodes(env: Mapping[str, str]) -> int | None:
    """Nodes Slurm gave the job (SLURM_JOB_NUM_NODES, or SLURM_NNODES on older Slurm)."""
    n = _env_int(env, "SLURM_JOB_NUM_NODES")
    return n if n is not None else _env_int(env, "SLURM_NNODES")


def allocated_gpus_per_node(env: Mapping[str, str]) -> int | None:
    """GPUs Slurm bound to this node of the job; None when Slurm says nothing about GPUs."""
    n = _env_int(env, "SLURM_GPUS_ON_NODE")
    if n is not None:
        return n
    per_node = env.get("SLURM_GPUS_PER_NODE", "")
    if per_node:
        # "2", "a100:2" or "gpu:a100:2": the count is the last field.
        return _env_int({"SLURM_GPUS_PER_NODE": per_node.rsplit(":", 1)[-1]}, "SLURM_GPUS_PER_NODE")
    ids = env.get("SLURM_JOB_GPUS") or env.get("SLURM_STEP_GPUS")
    return len([g for g in ids.split(",") if g]) if ids else None


def tasks_per_node(env: Mapping[str, str]) -> list[int]:
    """SLURM_TASKS_PER_NODE expanded ("2(x3),1" -> [2, 2, 2, 1]); empty when unset or unreadable."""
    out: list[int] = []
    for part in env.get("SLURM_TASKS_PER_NODE", "").split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not m:
            return []
        out += [int(m.group(1))] * int(m.group(2) or 1)
    return out


def check_shape(env: Mapping[str, str], *, nodes: int, gpus_per_node: int, world_size: int) -> list[str]:
    """What Slurm allocated must be the plan's shape: its nodes x GPUs per node = the plan's world size.

    ``nodes``, ``gpus_per_node`` and ``world_size`` come from the run dir's plan.json; the other side of each
    comparison is read from Slurm's variables, so a job that got fewer nodes or GPUs than planned (a
    heterogeneous partition, an edited sbatch line, a re-planned run dir) fails here instead of training a
    world of the wrong size or waiting in the rendezvous for ranks that never come.
    """
    p = []
    node_name = env.get("SLURMD_NODENAME") or os.uname().nodename
    seen_nodes = allocated_nodes(env)
    seen_gpus = allocated_gpus_per_node(env)
    if nodes * gpus_per_node != world_size:
        p.append(f"plan.json: world_size {world_size} but nodes x gpus_per_node = {nodes} x {gpus_per_node} = "
                 f"{nodes * gpus_per_node}; the plan is inconsistent: re-plan the run dir (launch --overwrite)")
    if seen_nodes is None:
        p.append("SLURM_JOB_NUM_NODES and SLURM_NNODES are unset: this is not running inside a Slurm job, so its "
                 "size cannot be checked against the plan; submit with launch --slurm")
        seen_nodes = nodes
    elif seen_nodes != nodes:
        p.append(f"SLURM_JOB_NUM_NODES: Slurm allocated {seen_nodes} node(s) but the plan is for {nodes}; "
                 f"resubmit with nodes: {nodes}, or re-plan for {seen_nodes} with --nodes {seen_nodes}")
    if seen_gpus is not None and seen_gpus != gpus_per_node:
        p.append(f"SLURM_GPUS_ON_NODE: Slurm allocated {seen_gpus} GPU(s) on {node_name} but the plan runs "
                 f"{gpus_per_node} rank(s) per node; resubmit with gpus: {gpus_per_node}, or re-plan with "
                 f"--gpus {seen_gpus}")
    slurm_world = seen_nodes * (gpus_per_node if seen_gpus is None else seen_gpus)
    if slurm_world != world_size:
        gpus_text = f"{seen_gpus}" if seen_gpus is not None else f"{gpus_per_node} (planned; Slurm set no GPU count)"
        p.append(f"world size: Slurm gave {seen_nodes} node(s) x {gpus_text} GPU(s) = {slurm_world} rank(s), but "
                 f"the plan needs {nodes} x {gpus_per_node} = {world_size}; resubmit with nodes: {nodes} and gpus: "
                 f"{gpus_per_node} so the allocation matches the plan, or re-plan the run dir for {slurm_world}")
    tasks = _env_int(env, "SLURM_NTASKS")
    if tasks is not None and tasks != seen_nodes:
        p.append(f"SLURM_NTASKS: {tasks} but one task per node is needed ({seen_nodes}); leave ntasks out of "
                 "slurm.additional_parameters")
    per_node = tasks_per_node(env)
    if per_node and any(t != 1 for t in per_node):
        p.append(f"SLURM_TASKS_PER_NODE: {env.get('SLURM_TASKS_PER_NODE')} but one task per node is needed (each "
                 "runs the torchrun agent for that node's ranks); leave ntasks_per_node out of "
                 "slurm.additional_parameters")
    return p


def views_dir(run_dir: Path, view: NodeView) -> Path:
    """Where the nodes publish their views for one job attempt: RUN_DIR/rdzv/<job>-<attempt>."""
    return run_dir / "rdzv" / f"{view.job_id}-{view.attempt}"


def agree(run_dir: Path, view: NodeView, *, timeout_s: float = AGREE_TIMEOUT_S, poll_s: float = 0.2) -> list[NodeView]:
    """Publish this node's view in RUN_DIR/rdzv/<job>-<attempt>/node-K.json; wait for all; fail on any mismatch."""
    folder = views_dir(run_dir, view)
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write(folder / f"node-{view.node_rank}.json", json.dumps(asdict(view), indent=2) + "\n")
    deadline = time.monotonic() + timeout_s
    while True:
        views = {}
        for k in range(view.nodes):
            p = folder / f"node-{k}.json"
            if p.is_file():
                views[k] = NodeView(**json.loads(p.read_text()))
        if len(views) == view.nodes:
            break
        if time.monotonic() > deadline:
            missing = sorted(set(range(view.nodes)) - set(views))
            raise RendezvousError(f"node(s) {missing} wrote no rendezvous view in {folder} within {timeout_s:.0f} s; "
                                  "their task did not start or cannot write the shared run dir")
        time.sleep(poll_s)
    keys = ("endpoint", "world_size", "nodes", "gpus_per_node", "nodelist")
    disagree = [f"node {k} ({v.node_name}): " + ", ".join(f"{a}={getattr(v, a)}" for a in keys)
                for k, v in sorted(views.items())
                if any(getattr(v, a) != getattr(view, a) for a in keys)]
    if disagree:
        mine = ", ".join(f"{a}={getattr(view, a)}" for a in keys)
        raise RendezvousError(f"nodes disagree on the rendezvous; node {view.node_rank} ({view.node_name}) has "
                              f"{mine}; differing: " + "; ".join(disagree))
    return [views[k] for k in sorted(views)]
