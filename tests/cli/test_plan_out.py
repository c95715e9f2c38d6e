"""`launch plan --out DIR`: one complete, consistent set of exports or nothing; never into a live run dir."""

from __future__ import annotations

import json
import subprocess
import time

import yaml

from launcher.files.rundir import MARKER, RunDir
from launcher.processes.procs import ProcessRef
from launcher.session import outdir
from tests.cli.test_plan_cli import run_cli
from tests.conftest import REPO

LAUNCH = str(REPO / ".venv" / "bin" / "launch")
DS = {"engine": "deepspeed", "zero_stage": 2, "micro_batch_size": 4}
FSDP = {"engine": "fsdp", "micro_batch_size": 2}




def consistent(d) -> tuple[str, int]:
    """(engine, micro-batch) of the set in ``d``, asserting its files agree with each other."""
    plan = json.loads((d / "plan.json").read_text())
    job = yaml.safe_load((d / "job.yaml").read_text())
    engine = plan["engine"]
    assert job["strategy"]["engine"] == engine and job["strategy"]["micro_batch_size"] == plan["micro_batch_size"]
    own, other = (("ds_config.json", "fsdp.yaml") if engine == "deepspeed" else ("fsdp.yaml", "ds_config.json"))
    assert (d / own).is_file() and not (d / other).exists(), sorted(p.name for p in d.iterdir())
    assert (d / "ds_config.hf.json").exists() == (engine == "deepspeed")
    if engine == "deepspeed":
        ds_config = json.loads((d / "ds_config.json").read_text())
        assert ds_config["train_micro_batch_size_per_gpu"] == plan["micro_batch_size"]
    return engine, plan["micro_batch_size"]


def test_a_second_plan_replaces_the_set_and_removes_the_other_engines_files(capsys, write_job, tmp_path):
    out = tmp_path / "out"
    ds = write_job(name="ds.yaml", strategy=DS, **{"launcher": "slurm", "cluster.hardware": "cpu"})
    fsdp = write_job(name="fsdp.yaml", strategy=FSDP)
    assert run_cli(capsys, "plan", ds, "--out", out, "--sbatch")[0] == 0
    assert consistent(out) == ("deepspeed", 4) and (out / "job.sbatch").is_file()
    code, _, err = run_cli(capsys, "plan", fsdp, "--out", out)
    assert code == 0, err
    assert consistent(out) == ("fsdp", 2)
    assert not (out / "job.sbatch").exists()  # the script of the old set would run the old plan
    assert not list(tmp_path.glob(".out.*"))  # the staging dir is gone


def test_plan_out_into_a_locked_run_dir_is_refused_and_changes_nothing(capsys, write_job, tmp_path, monkeypatch):
    """A dir an earlier plan --out made, whose lock another holds (a launch starting there, before its first run
    file): refused after the wait, untouched."""
    monkeypatch.setattr(outdir, "LOCK_WAIT_S", 0.2)
    outdir.write_out_dir(tmp_path / "run", {"plan.json": '{"the": "live plan"}'})
    run = RunDir((tmp_path / "run").resolve())
    run.lock()
    code, out, err = run_cli(capsys, "plan", write_job(strategy=FSDP), "--out", run.path)
    assert code == 2 and out == ""
    assert f"launch: error: --out: {str(run.path)!r} is in use by another launch (lock held)" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert (run.path / "plan.json").read_text() == '{"the": "live plan"}'
    assert not (run.path / "fsdp.yaml").exists() and not (run.path / "job.yaml").exists()
    run.unlock()


def test_plan_out_into_the_dir_of_a_live_launch_is_refused_at_once(capsys, write_job, tmp_path):
    """The run dir of a launch that still runs (state.json names its pid): refused without waiting for the lock."""
    run = RunDir.create(tmp_path / "run")
    run.unlock()  # as seen from another mount: only state.json tells
    (run.path / "plan.json").write_text('{"the": "live plan"}')
    proc = subprocess.Popen(["sleep", "60"])
    try:
        run.set_state("running", launch=ProcessRef.of(proc.pid))
        t0 = time.monotonic()
        code, _, err = run_cli(capsys, "plan", write_job(strategy=FSDP), "--out", run.path)
        assert code == 2 and time.monotonic() - t0 < outdir.LOCK_WAIT_S
        assert f"--out: {str(run.path)!r} is in use by launch process {proc.pid}, which is still running; " \
               "replacing its files would have the ranks train a plan the launcher did not check" in err
        assert (run.path / "plan.json").read_text() == '{"the": "live plan"}'
    finally:
        proc.kill()
        proc.wait()


def test_two_plan_outs_at_once_leave_one_complete_set(write_job, tmp_path):
    """Two `launch plan --out` into one dir at the same moment, each of another engine and micro-batch: the
    dir ends with one set whose files agree, never plan.json of one beside job.yaml or the config of the other."""
    out = tmp_path / "out"
    jobs = [write_job(name="ds.yaml", strategy=DS), write_job(name="fsdp.yaml", strategy=FSDP)]
    for _ in range(2):
        procs = [subprocess.Popen([LAUNCH, "plan", str(j), "--out", str(out)], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for j in jobs]
        for p in procs:
            _, err = p.communicate(timeout=300)
            assert p.returncode == 0, err
        assert consistent(out) in {("deepspeed", 4), ("fsdp", 2)}
        assert {p.name for p in out.iterdir()} <= {MARKER, ".lock", "plan.json", "job.yaml", "accelerate.yaml",
                                                   "ds_config.json", "ds_config.hf.json", "fsdp.yaml"}
    assert not list(tmp_path.glob(".out.*"))


def test_swaps_under_the_lock_are_never_seen_half_done(tmp_path):
    """Whoever holds the dir's lock (a launch about to start its ranks) sees one whole set: write_out_dir from
    two threads, 20 swaps each, while a reader takes the lock and checks that every file is of one set."""
    out = tmp_path / "out"
    sets = [{"plan.json": "A", "job.yaml": "A", "fsdp.yaml": "A"},
            {"plan.json": "B", "job.yaml": "B", "ds_config.json": "B", "ds_config.hf.json": "B"}]
    outdir.write_out_dir(out, sets[0])
    errors: list[BaseException] = []

    def writer(files):
        try:
            for _ in range(20):
                outdir.write_out_dir(out, files)
        except BaseException as e:  # noqa: BLE001 - reported by the test thread
            errors.append(e)

    import threading

    threads = [threading.Thread(target=writer, args=(s,)) for s in sets]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        reader = RunDir(out.resolve())
        reader.lock(wait_s=5)
        try:
            names = {p.name for p in out.iterdir()} - {MARKER, ".lock"}
            contents = {(out / n).read_text() for n in names}
            assert len(contents) == 1, f"a mixed set: {names}"
            assert names == set(sets[0] if contents == {"A"} else sets[1])
        finally:
            reader.unlock()
    for t in threads:
        t.join()
    assert not errors, errors


def test_plan_out_replaces_a_set_but_never_a_run(capsys, write_job, tmp_path):
    """A dir made by plan --out is replaced by the next plan --out (its purpose); once a run has written there
    (launch run --overwrite into it, or the sbatch script's ranks), plan --out refuses it and changes nothing."""
    out = tmp_path / "out"
    assert run_cli(capsys, "plan", write_job(strategy=DS), "--out", out)[0] == 0
    assert run_cli(capsys, "plan", write_job(strategy=FSDP), "--out", out)[0] == 0
    assert consistent(out) == ("fsdp", 2)
    (out / "ranks").mkdir()  # what a run's first rank file goes into
    (out / "ranks" / "rank-0.json").write_text("{}")
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    code, printed, err = run_cli(capsys, "plan", write_job(strategy=DS), "--out", out)
    assert code == 2 and printed == ""
    assert err == (f"launch: error: --out: {str(out)!r} holds a run: ranks; plan --out replaces only the set an "
                   "earlier plan --out wrote, never a run's job.yaml and plan.json; choose another --out\n")
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    assert not list(tmp_path.glob(".out.*"))
