"""The flags and answers around a launch (issue 35 §3): the rendezvous endpoint and node rank checked before anything
is written, a FIFO or a device named for what it is, --resume into a directory launch never made, `launch plan`
of a sweep, and every error answer at most a screen."""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import time

import pytest
import yaml

from launcher.cli.main import main
from tests.faults.harness import Case, Sandbox, check_refused, one_error_block
from tests.faults.test_fuzz import valid_base

TWO_NODES = ["--nodes", "2"]


def endpoint(value: str) -> callable:
    return lambda s: [s.job(), *TWO_NODES, f"--rdzv-endpoint={value}"]


def fifo_script(s: Sandbox) -> list:
    os.mkfifo(s.root / "train.py")
    return [s.job(), "--script", s.root / "train.py"]


def foreign_dir(s: Sandbox) -> None:
    s.run_dir.mkdir()
    (s.run_dir / "passwd").write_text("root:x:0:0\n")  # a system directory's kind of content, not a run dir


CASES = [
    Case("rdzv-port-out-of-range", endpoint("node0:99999"),
         ["--rdzv-endpoint 'node0:99999': the port '99999' is not a port (1 to 65535)", "e.g. --rdzv-endpoint"]),
    Case("rdzv-port-zero", endpoint("node0:0"), ["the port '0' is not a port (1 to 65535)"]),
    Case("rdzv-port-not-a-number", endpoint("node0:http"), ["the port 'http' is not a port"]),
    Case("rdzv-bad-host", endpoint("no_such host:29400"), ["an endpoint has no spaces and is not empty"]),
    Case("rdzv-host-with-bad-characters", endpoint("node$(id):29400"),
         ["'node$(id)' is no host name (letters, digits, hyphens and dots"]),
    Case("rdzv-ipv6-without-brackets", endpoint("fd00::1:29400"),
         ["an IPv6 address needs brackets, [address]:port"]),
    Case("rdzv-no-host", endpoint(":29400"), ["'' has no host before the port"]),
    Case("rdzv-unresolvable-name", endpoint("no-such-host.invalid:29400"),
         ["'no-such-host.invalid' does not resolve", "or its IP address"]),
    Case("node-rank-negative", lambda s: [s.job(), *TWO_NODES, "--node-rank", "-1", "--rdzv-endpoint",
                                          "127.0.0.1:29400"],
         ["--node-rank -1: node ranks run from 0 to --nodes - 1 (1 here)"]),
    Case("node-rank-past-the-nodes", lambda s: [s.job(), *TWO_NODES, "--node-rank", "2", "--rdzv-endpoint",
                                                "127.0.0.1:29400"],
         ["--node-rank 2: node ranks run from 0 to --nodes - 1"]),
    Case("node-rank-on-one-node", lambda s: [s.job(), "--node-rank", "1"],
         ["--node-rank 1: node ranks run from 0 to --nodes - 1 (0 here)"]),
    Case("script-is-a-fifo", fifo_script, ["--script: ", "train.py' is a FIFO (named pipe), not a file"]),
    Case("resume-into-a-dir-launch-never-made", lambda s: [s.job(), "--resume"],
         ["--resume: ", "is not a run dir launch made (it holds passwd) and has no checkpoint",
          "give the --run-dir of the run to continue"], setup=foreign_dir, keeps=["run"]),
    Case("plan-sweep-of-ten-thousand", lambda s: [s.job(sweep={"grid": {"train.lr": list(range(1, 101)),
                                                                        "train.seed": list(range(100))}})],
         ["sweep: 10000 variants, over the 1000 one sweep may hold"], verb="plan"),
    Case("plan-sweep-with-out", lambda s: [s.job(sweep={"grid": {"train.lr": [1e-4, 3e-4]}}), "--out", s.root / "o"],
         ["sweep: --out and --sbatch write one job's files", "plan one variant alone"], verb="plan"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_refused(case, sandbox):
    check_refused(case, sandbox)


def test_a_resolver_that_does_not_answer_is_given_up_in_seconds(monkeypatch):
    """torchrun would wait out its rendezvous timeout (99 s were seen) on a name that never resolves."""
    from launcher.session import endpoint as ep

    monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: time.sleep(30))
    t = time.monotonic()
    assert ep.resolves("slow.example", 29400, timeout_s=1.0) == "no answer from the resolver within 1 s"
    assert time.monotonic() - t < 5


def test_a_resolvable_endpoint_and_node_rank_pass():
    from launcher.config.job import Job
    from launcher.config.load import from_dict
    from launcher.session.endpoint import check_rendezvous
    from launcher.session.options import RunOptions

    job = from_dict(Job, valid_base("/tmp/x.jsonl") | {"nodes": 2})
    for value in ("127.0.0.1:29400", "[::1]:29400", "localhost", "localhost:1"):
        check_rendezvous(job, RunOptions(rdzv_endpoint=value, node_rank=1))


def test_plan_of_a_sweep_plans_every_variant_not_the_base_job(sandbox):
    """Before, `launch plan` printed the base job's plan for any sweep (a 10,000-variant grid too)."""
    job = sandbox.job(sweep={"grid": {"strategy.micro_batch_size": [1, 2, 3]}})
    for extra in ([], ["--json"]):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(["plan", str(job), *extra])
        assert code == 2, err.getvalue()  # variant 2 cannot be planned: its submission would leave it out
        if not extra:
            text = out.getvalue()
            assert text.startswith("sweep: 3 variant(s) of t, each planned for itself (2 planned, 1 not)")
            assert "micro_batch_size=1: DDP" in text and "mb=1x4" in text and "mb=2x2" in text
            assert "micro_batch_size=3: not planned: strategy.micro_batch_size: 3 does not divide" in text
        else:
            rows = json.loads(out.getvalue())["variants"]
            assert [("plan" in r, "error" in r) for r in rows] == [(True, False), (True, False), (False, True)]
            assert rows[1]["plan"]["micro_batch_size"] == 2


def test_an_alias_bomb_is_refused_in_a_screen(sandbox):
    """The billion laughs was refused in 0.8 s, with a 52 KB message: now one line for the bomb, one for the
    stray anchors, and at most a screen in all."""
    levels = "".join(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]\n" for i in range(1, 10))
    text = "l0: &l0 [lol]\n" + levels + yaml.safe_dump(valid_base(str(sandbox.data)), sort_keys=False) + \
        "sweep:\n  grid:\n    train.lr: *l9\n"
    case = Case("alias-bomb", lambda s: [s.raw(text)], ["sweep.grid.train.lr: ", "expands to over 100000 values",
                                                       "l0, l1, l2, l3, l4, l5, l6, l7 and 2 more: unknown keys"],
                verb="plan")
    err = check_refused(case, sandbox)
    assert len(err.encode()) <= 2048 and len(err.splitlines()) <= 25, (len(err), err)


def test_many_problems_are_cut_to_a_screen_with_a_count(sandbox):
    doc = valid_base(str(sandbox.data))
    doc["train"].update({f"bad_key_{i}": i for i in range(60)})  # unknown keys: one line, the names cut
    doc["train"]["lora"] = {"r": 8, "target_modules": list(range(40))}  # one line each: not a string
    err = check_refused(Case("many", lambda s: [s.raw(yaml.safe_dump(doc))], ["target_modules[0]: 0 must be a string"],
                             verb="plan"), sandbox)
    lines = one_error_block(err)
    assert len(err.encode()) <= 2048 and len(lines) <= 25, err
    assert lines[-1].startswith("launch: error: ... and ") and "more line(s) of this answer" in lines[-1], err


@pytest.mark.parametrize("merge", [False, True])
def test_lora_on_a_base_without_weights_is_warned_at_plan_time(sandbox, merge):
    """Issue 36 §4: an adapter trained on a random init cannot be loaded with PeftModel later (no base weights);
    the plan says so with the fix (train.lora.merge: true), and says nothing once merge is set."""
    job = sandbox.job(**{"train.lora": {"r": 4, "target_modules": ["c_attn"], "merge": merge}})
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["plan", str(job)])
    assert code == 0, err.getvalue()
    warned = "launch: warning: train.lora on a model without weights (a random init)" in err.getvalue()
    assert warned is not merge, err.getvalue()
    if not merge:
        assert "PeftModel.from_pretrained" in err.getvalue() and "set train.lora.merge: true" in err.getvalue()
