import json

import pytest
import torch

from launcher.records.rankreport import RankReport
from launcher.runtime import memory_probe, read_jsonl
from launcher.runtime.probe import MemoryProbe


def tiny():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def run_steps(probe: MemoryProbe, model, opt, steps=2, batch=8):
    for step in range(1, steps + 1):
        with probe.phase("forward"):
            loss = model(torch.randn(batch, 16)).pow(2).mean()
        with probe.phase("backward"):
            loss.backward()
            del loss
        with probe.phase("optimizer_step"):
            opt.step()
            opt.zero_grad()
        probe.step_done(step, 1.0 / step, tokens=batch)


def test_adamw_state_is_two_fp32_copies_of_the_params(tmp_path):
    model = tiny()
    n = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    probe = memory_probe(device="cpu", run_dir=tmp_path)
    with probe:
        probe.track(model, opt)
        run_steps(probe, model, opt)
    report = probe.write()
    after = report.after_step_by_category
    step_counters = 4 * len(list(model.parameters()))  # AdamW keeps one fp32 'step' scalar per param
    assert after["optimizer"] == 2 * 4 * n + step_counters
    assert after["params"] == 4 * n and after["grads"] == 0
    peak = report.peak_by_category
    assert report.measured_peak_bytes == sum(peak.values())
    assert set(report.phases) >= {"forward", "backward", "optimizer_step"}
    assert report.phase_breakdown["backward"]["grads"] > 0
    assert report.phase_breakdown["forward"]["activations"] > 0
    assert report.peak_rss_bytes > 0


def test_rank_report_and_step_log_are_written(tmp_path):
    model = tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    probe = memory_probe(device="cpu", run_dir=tmp_path)
    with probe:
        probe.track(model, opt)
        run_steps(probe, model, opt, steps=3)
    probe.record(eval_loss=0.5)
    written = probe.write(status="completed")
    report = json.loads((tmp_path / "ranks" / "rank-0.json").read_text())
    assert RankReport.from_json(report) == written  # the file reads back as the probe's typed report
    for key in ("rank", "local_rank", "host", "device", "world_size", "phases", "measured_peak_bytes",
                "peak_by_category", "peak_rss_bytes", "final_loss", "first_loss", "steps_done", "status", "error"):
        assert key in report
    assert report["status"] == "completed" and report["steps_done"] == 3 and report["eval_loss"] == 0.5
    assert report["first_loss"] == 1.0 and report["final_loss"] == pytest.approx(1 / 3)
    lines = read_jsonl(tmp_path / "steps" / "rank-0.jsonl")
    assert [r["step"] for r in lines] == [1, 2, 3]
    assert {"step", "loss", "tokens_per_s", "mem_current_bytes", "mem_peak_bytes", "time"} <= set(lines[0])


def test_cap_raises_out_of_memory_at_the_crossing_op():
    model = tiny()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    probe = memory_probe(device="cpu", enforce_bytes=4 * sum(p.numel() for p in model.parameters()) + 1)
    with pytest.raises(torch.OutOfMemoryError, match="enforced cap"):
        with probe:
            probe.track(model, opt)
            run_steps(probe, model, opt)
    details = probe.oom_details()
    assert details.phase == "forward" and details.crossed_at_bytes > probe.enforce_bytes


def test_frozen_parameters_are_tracked_without_hooks():
    model = tiny()
    model[0].requires_grad_(False)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3, foreach=False)
    probe = memory_probe(device="cpu")
    with probe:
        probe.track(model, opt)
        run_steps(probe, model, opt, steps=1)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert probe.report(status="completed").after_step_by_category["optimizer"] == 2 * 4 * trainable + 8


def test_label_and_relabel_move_bytes_between_categories():
    probe = memory_probe(device="cpu")
    with probe:
        buf = torch.zeros(256)  # made during "other": counted as activations
        assert probe.tracker.current_snap()
        probe.track(other=[buf])
        snap = probe.report(status="running")
        moved = probe.relabel("other", "buffers")
    assert moved == 1024
    assert snap.measured_peak_bytes >= 1024


def test_init_phase_allocations_count_as_other_until_labelled():
    probe = memory_probe(device="cpu")
    with probe:
        with probe.phase("init"):
            w = torch.randn(100)
        assert probe.report(status="running").phase_breakdown["init"]["other"] == 400
        probe.track(params=[w])
        assert probe.tracker.total_bytes() == 400


def test_memory_snapshot_is_for_cuda_ranks_only(tmp_path, monkeypatch):
    monkeypatch.setenv("LAUNCHER_MEMORY_SNAPSHOT", "1")
    probe = MemoryProbe(device="cpu", run_dir=tmp_path)
    assert probe.snapshot is False  # CPU ranks have no allocator history; their breakdown is in ranks/rank-K.json
    model = tiny()
    with probe:
        run_steps(probe, model, torch.optim.AdamW(model.parameters(), foreach=False), steps=1)
    assert not (tmp_path / "memory-snapshot").exists()


@pytest.mark.gpu
def test_memory_snapshot_covers_init_and_the_first_step(tmp_path, monkeypatch):
    import pickle

    monkeypatch.setenv("LAUNCHER_MEMORY_SNAPSHOT", "1")
    probe = MemoryProbe(device="cuda:0", run_dir=tmp_path)
    with probe:
        model = tiny().cuda()
        opt = torch.optim.AdamW(model.parameters())
        for step in (1, 2):
            loss = model(torch.randn(8, 16, device="cuda")).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            probe.step_done(step, loss.item(), tokens=8)
    snap = pickle.loads((tmp_path / "memory-snapshot" / "rank-0.pickle").read_bytes())
    assert snap["segments"] and snap["device_traces"][0], "no allocation recorded"
    assert probe.snapshot is False and probe.fields["memory_snapshot"].endswith("rank-0.pickle")


def test_cpu_ranks_report_tensor_bytes_as_their_basis(tmp_path):
    probe = MemoryProbe(device="cpu", run_dir=tmp_path)
    model = tiny()
    with probe:
        run_steps(probe, model, torch.optim.AdamW(model.parameters(), foreach=False), steps=1)
    rep = probe.report(status="completed")
    assert rep.basis == "cpu_tensor_bytes"
    assert rep.measured_peak_bytes == max(probe.tracker.phase_peak_bytes.values()) > 0
    assert rep.outside_allocator_bytes is None and "outside_allocator_bytes" not in rep.to_json()


@pytest.mark.gpu
def test_cuda_phases_are_reserved_plus_what_lives_outside_the_allocator(tmp_path):
    probe = MemoryProbe(device="cuda:0", run_dir=tmp_path)
    with probe:
        model = tiny().cuda()
        opt = torch.optim.AdamW(model.parameters())
        for step in (1, 2):
            with probe.phase("forward"):
                loss = model(torch.randn(8, 16, device="cuda")).pow(2).mean()
            with probe.phase("backward"):
                loss.backward()
            with probe.phase("optimizer_step"):
                opt.step()
                opt.zero_grad()
            probe.step_done(step, loss.item(), tokens=8)
    rep = probe.report(status="completed")
    free, total = torch.cuda.mem_get_info(0)
    assert rep.basis == "cuda_reserved_plus_context"
    # The CUDA context alone is hundreds of MiB; nothing else runs on the rank's GPU.
    assert 50 * 2**20 < rep.outside_allocator_bytes <= total - free
    for phase, peak in rep.phases.items():
        assert peak == probe.cuda_phase_reserved[phase] + rep.outside_allocator_bytes
        assert rep.phases_allocated[phase] <= probe.cuda_phase_reserved[phase]
    assert rep.measured_peak_bytes >= rep.max_memory_reserved_bytes >= rep.max_memory_allocated_bytes > 0


def test_the_enforce_cap_follows_the_bytes_outside_the_allocator(monkeypatch):
    """--enforce on CUDA caps the allocator at the budget less what lives outside it; that part grows after the
    start (kernels at first use, NCCL communicators at their first collective), so the cap shrinks with it. The
    CUDA calls are replaced by a ledger: the arithmetic is what is under test (tests/gpu runs the real cap)."""
    gib = 2**30
    ledger = {"used_outside": 1 * gib, "fractions": []}
    total = 80 * gib
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (total - ledger["used_outside"], total))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: type("P", (), {"total_memory": total}))
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction",
                        lambda fraction, device=None: ledger["fractions"].append(fraction))
    probe = MemoryProbe(device="cuda:0", enforce_bytes=10 * gib, track_categories=False)
    probe.start()
    assert ledger["fractions"] == [9 / 80]  # 10 GiB budget, 1 GiB context outside
    ledger["used_outside"] = 2 * gib  # NCCL's first communicator came
    probe.sample_outside_allocator()
    assert ledger["fractions"] == [9 / 80, 8 / 80]
    ledger["used_outside"] = 1 * gib  # what is outside never shrinks the cap's reckoning back (the largest seen)
    probe.sample_outside_allocator()
    assert ledger["fractions"] == [9 / 80, 8 / 80]


def test_an_oom_wrapped_by_a_hook_or_a_scripts_handler_is_still_an_oom():
    from launcher.runtime.probe import is_oom

    try:
        try:
            raise torch.OutOfMemoryError("CUDA out of memory")
        except torch.OutOfMemoryError as e:
            raise RuntimeError("in a backward hook") from e
    except RuntimeError as wrapped:
        assert is_oom(wrapped)
    assert not is_oom(RuntimeError("other")) and not is_oom(None)
