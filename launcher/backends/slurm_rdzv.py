"""Where the nodes of a Slurm job meet: head node, c10d port, and a check that every node agrees.

The head is the first host of ``scontrol show hostnames $SLURM_JOB_NODELIST``, resolved to the address Slurm
itself uses for it (``scontrol show node`` NodeAddr; node names need not resolve in DNS, and on the dev cluster
both nodes are 127.0.0.1). Without scontrol there is no honest answer: falling back to localhost makes every
node form a world of its own and wait forever (pytorch #76069), so this fails instead.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from launcher.errors import LauncherError
from launcher.fsutil import atomic_write

PORT_BASE = 20000
PORT_SPAN = 20000
AGREE_TIMEOUT_S = 120.0
"""How long a node waits for the others' views before failing (Slurm starts a step's tasks together)."""

Runner = Callable[[list[str]], str]


class RendezvousError(LauncherError):
    """The nodes of a job cannot meet: fail the job with the reason instead of hanging in the rendezvous."""


def scontrol(argv: list[str]) -> str:
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
        return f"{self.head_addr}:{self.port}"


def node_view(env: Mapping[str, str], *, gpus_per_node: int, run: Runner = scontrol) -> NodeView:
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


def check_shape(env: Mapping[str, str], *, nodes: int, gpus_per_node: int, world_size: int) -> list[str]:
    """The allocation must be the plan's shape: nodes x GPUs = world size, one task per node."""
    p = []
    seen = int(env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or 1)
    node_name = env.get("SLURMD_NODENAME") or os.uname().nodename
    if seen != nodes:
        p.append(f"SLURM_JOB_NUM_NODES: {seen} but the plan is for {nodes} node(s); resubmit with nodes: {nodes}")
    if nodes * gpus_per_node != world_size:
        p.append(f"world size: plan.json says {world_size} but nodes x GPUs per node = {nodes} x {gpus_per_node}; "
                 "re-plan the run dir")
    tasks = env.get("SLURM_NTASKS")
    if tasks is not None and int(tasks) != nodes:
        p.append(f"SLURM_NTASKS: {tasks} but one task per node is needed ({nodes}); leave ntasks out of "
                 "slurm.additional_parameters")
    gpus_on_node = env.get("SLURM_GPUS_ON_NODE")
    if gpus_on_node and int(gpus_on_node) != gpus_per_node:
        p.append(f"SLURM_GPUS_ON_NODE: {gpus_on_node} on {node_name} but the plan runs {gpus_per_node} "
                 "rank(s) per node; request gpus_per_node to match")
    return p


def views_dir(run_dir: Path, view: NodeView) -> Path:
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
