import json
import subprocess
import threading
import time

import pytest

from launcher.backends import slurm_rdzv
from launcher.backends.slurm_rdzv import (
    RendezvousError,
    agree,
    check_shape,
    head_host,
    node_addr,
    node_view,
    port_for,
)

SHOW_NODE = ("NodeName=node1 Arch=x86_64 CoresPerSocket=16 CPUAlloc=0 NodeAddr=127.0.0.1 NodeHostName=vm "
             "Version=22.05.8 State=IDLE\n")


def fake_scontrol(outputs: dict[str, str], calls: list | None = None):
    def run(argv):
        if calls is not None:
            calls.append(argv)
        return outputs[" ".join(argv[:2])]
    return run


def env(**over):
    e = {"SLURM_JOB_NODELIST": "node[1-2]", "SLURM_JOB_NUM_NODES": "2", "SLURM_NODEID": "1",
         "SLURMD_NODENAME": "node2", "SLURM_JOB_ID": "20123", "SLURM_NTASKS": "2", "SLURM_GPUS_ON_NODE": "1"}
    e.update(over)
    return e


def test_head_is_the_first_host_at_its_node_addr():
    calls = []
    run = fake_scontrol({"show hostnames": "node1\nnode2\n", "show node": SHOW_NODE}, calls)
    view = node_view(env(), gpus_per_node=1, run=run)
    assert (view.head_host, view.head_addr, view.endpoint) == ("node1", "127.0.0.1", "127.0.0.1:20123")
    assert calls == [["show", "hostnames", "node[1-2]"], ["show", "node", "node1", "-o"]]
    assert (view.node_rank, view.node_name, view.world_size, view.attempt) == (1, "node2", 2, 0)


def test_node_name_when_slurm_has_no_node_addr():
    run = fake_scontrol({"show node": "NodeName=gpu7 Arch=x86_64 State=IDLE"})
    assert node_addr("gpu7", run) == "gpu7"


def test_port_is_derived_from_the_job_id():
    assert port_for("123") == 20123 and port_for("40123") == 20123 and port_for("57_3") == 20057
    assert 20000 <= port_for(987654321) < 40000


def test_missing_scontrol_fails_loudly_instead_of_localhost(monkeypatch):
    def missing(*a, **k):
        raise FileNotFoundError("scontrol")

    monkeypatch.setattr(subprocess, "run", missing)
    with pytest.raises(RendezvousError, match="pytorch #76069"):
        head_host("node[1-2]")


def test_empty_nodelist_is_an_error():
    with pytest.raises(RendezvousError, match="SLURM_JOB_NODELIST is empty"):
        head_host("", fake_scontrol({}))


def test_scontrol_failure_names_the_command(monkeypatch):
    class Failed:
        returncode, stdout, stderr = 1, "", "slurm_load_node error: Invalid node name"

    monkeypatch.setattr(subprocess, "run", lambda *a, **k: Failed())
    with pytest.raises(RendezvousError, match="scontrol show node nodeX -o failed .*Invalid node name"):
        slurm_rdzv.node_addr("nodeX")


def test_shape_checks():
    problems = check_shape(env(SLURM_GPUS_ON_NODE="8", SLURM_NTASKS="16"), nodes=1, gpus_per_node=1, world_size=3)
    text = "\n".join(problems)
    assert "SLURM_JOB_NUM_NODES: Slurm allocated 2 node(s) but the plan is for 1" in text
    assert "plan.json: world_size 3 but nodes x gpus_per_node = 1 x 1 = 1" in text
    assert "SLURM_NTASKS: 16 but one task per node is needed (2)" in text
    assert "SLURM_GPUS_ON_NODE: Slurm allocated 8 GPU(s) on node2 but the plan runs 1 rank(s) per node" in text
    assert check_shape(env(), nodes=2, gpus_per_node=1, world_size=2) == []


# The variables below are what the dev cluster's slurmd sets for `sbatch -N1 --ntasks-per-node=1
# --gpus-per-node=2` (captured with `env | grep SLURM_`), trimmed to those the check reads.
ONE_NODE_TWO_GPUS = {"SLURM_JOB_NUM_NODES": "1", "SLURM_NNODES": "1", "SLURM_NODEID": "0", "SLURMD_NODENAME": "node1",
                     "SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "node1", "SLURM_NTASKS": "1",
                     "SLURM_TASKS_PER_NODE": "1", "SLURM_GPUS_ON_NODE": "2", "SLURM_GPUS_PER_NODE": "2",
                     "SLURM_JOB_GPUS": "0,1", "CUDA_VISIBLE_DEVICES": "0,1"}


def test_the_allocation_slurm_gave_matches_the_plan():
    assert check_shape(ONE_NODE_TWO_GPUS, nodes=1, gpus_per_node=2, world_size=2) == []


def test_fewer_gpus_than_planned_fails_naming_both_world_sizes():
    # The plan wants 1 x 4 = 4 ranks; Slurm bound 2 GPUs on the node, so the world would be 2.
    problems = check_shape(ONE_NODE_TWO_GPUS, nodes=1, gpus_per_node=4, world_size=4)
    text = "\n".join(problems)
    assert "world size: Slurm gave 1 node(s) x 2 GPU(s) = 2 rank(s), but the plan needs 1 x 4 = 4" in text
    assert "resubmit with nodes: 1 and gpus: 4" in text
    assert "SLURM_GPUS_ON_NODE: Slurm allocated 2 GPU(s) on node1 but the plan runs 4 rank(s) per node" in text


def test_more_nodes_than_planned_fails_naming_both_world_sizes():
    two_nodes = {**ONE_NODE_TWO_GPUS, "SLURM_JOB_NUM_NODES": "2", "SLURM_NNODES": "2", "SLURM_NTASKS": "2",
                 "SLURM_TASKS_PER_NODE": "1(x2)", "SLURM_JOB_NODELIST": "node[1-2]"}
    text = "\n".join(check_shape(two_nodes, nodes=1, gpus_per_node=2, world_size=2))
    assert "world size: Slurm gave 2 node(s) x 2 GPU(s) = 4 rank(s), but the plan needs 1 x 2 = 2" in text
    assert "SLURM_JOB_NUM_NODES: Slurm allocated 2 node(s) but the plan is for 1" in text


def test_gpu_count_from_older_slurm_variables():
    # No SLURM_GPUS_ON_NODE: SLURM_GPUS_PER_NODE with a type ("a100:2"), then the bound GPU ids.
    typed = ({k: v for k, v in ONE_NODE_TWO_GPUS.items() if k != "SLURM_GPUS_ON_NODE"}
             | {"SLURM_GPUS_PER_NODE": "a100:2"})
    assert "2 GPU(s)" in "\n".join(check_shape(typed, nodes=1, gpus_per_node=3, world_size=3))
    ids_only = {k: v for k, v in typed.items() if k != "SLURM_GPUS_PER_NODE"}
    assert check_shape(ids_only, nodes=1, gpus_per_node=2, world_size=2) == []
    assert "= 2 rank(s)" in "\n".join(check_shape(ids_only, nodes=1, gpus_per_node=1, world_size=1))


def test_two_tasks_on_a_node_fail():
    text = "\n".join(check_shape({**ONE_NODE_TWO_GPUS, "SLURM_TASKS_PER_NODE": "2", "SLURM_NTASKS": "2"},
                                 nodes=1, gpus_per_node=2, world_size=2))
    assert "SLURM_TASKS_PER_NODE: 2 but one task per node is needed" in text
    assert "SLURM_NTASKS: 2 but one task per node is needed (1)" in text


def test_outside_a_slurm_job_the_shape_cannot_be_checked():
    assert "not running inside a Slurm job" in "\n".join(check_shape({}, nodes=1, gpus_per_node=1, world_size=1))


def test_an_overwritten_count_is_named():
    with pytest.raises(RendezvousError, match="SLURM_GPUS_ON_NODE='two' is not an integer"):
        check_shape({**ONE_NODE_TWO_GPUS, "SLURM_GPUS_ON_NODE": "two"}, nodes=1, gpus_per_node=2, world_size=2)


def _views(tmp_path, **node0_over):
    run = fake_scontrol({"show hostnames": "node1\nnode2\n", "show node": SHOW_NODE})
    v0 = node_view(env(SLURM_NODEID="0", SLURMD_NODENAME="node1"), gpus_per_node=1, run=run)
    v1 = node_view(env(), gpus_per_node=1, run=run)
    for k, v in node0_over.items():
        setattr(v0, k, v)
    return v0, v1


def test_nodes_agree_when_their_views_match(tmp_path):
    v0, v1 = _views(tmp_path)
    t = threading.Thread(target=lambda: agree(tmp_path, v1, timeout_s=10, poll_s=0.01))
    t.start()
    views = agree(tmp_path, v0, timeout_s=10, poll_s=0.01)
    t.join()
    assert [v.node_name for v in views] == ["node1", "node2"]
    files = sorted(p.name for p in (tmp_path / "rdzv" / "20123-0").iterdir())
    assert files == ["node-0.json", "node-1.json"]
    assert json.loads((tmp_path / "rdzv" / "20123-0" / "node-1.json").read_text())["head_addr"] == "127.0.0.1"


def test_disagreeing_master_address_fails_on_every_node(tmp_path):
    v0, v1 = _views(tmp_path, head_addr="localhost")
    errors = []

    def node(v):
        try:
            agree(tmp_path, v, timeout_s=10, poll_s=0.01)
        except RendezvousError as e:
            errors.append(str(e))

    threads = [threading.Thread(target=node, args=(v,)) for v in (v0, v1)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert len(errors) == 2
    assert all("nodes disagree on the rendezvous" in e for e in errors)
    assert any("endpoint=localhost:20123" in e for e in errors) and any("endpoint=127.0.0.1:20123" in e for e in errors)


def test_a_node_that_never_reports_fails_the_others_in_bounded_time(tmp_path):
    v0, _ = _views(tmp_path)
    t0 = time.monotonic()
    with pytest.raises(RendezvousError, match=r"node\(s\) \[1\] wrote no rendezvous view"):
        agree(tmp_path, v0, timeout_s=0.3, poll_s=0.01)
    assert time.monotonic() - t0 < 5


def test_views_of_an_earlier_attempt_do_not_count(tmp_path):
    v0, v1 = _views(tmp_path)
    agree_dir = tmp_path / "rdzv" / "20123-0"
    agree_dir.mkdir(parents=True)
    (agree_dir / "node-1.json").write_text("{}")  # left by the run before the requeue
    v0.attempt = 1
    with pytest.raises(RendezvousError, match="wrote no rendezvous view in .*20123-1"):
        agree(tmp_path, v0, timeout_s=0.2, poll_s=0.01)
