"""Plan quality's bookkeeping: candidate ids, the pick-vs-best ratio and the breach check."""

from types import SimpleNamespace

from benchmarks.plan_quality.run import evaluate_budgets, key


def strat(engine="deepspeed", zero=2, reshard=None, opt="none", par="none", mb=1, ac=False):
    return SimpleNamespace(engine=engine, zero_stage=zero, fsdp_reshard_after_forward=reshard, offload_optimizer=opt,
                           offload_params=par, micro_batch_size=mb, activation_checkpointing=ac)


def test_keys_are_distinct_and_readable():
    assert key(strat()) == "z2-mb1"
    assert key(strat(zero=3, opt="cpu", par="cpu", mb=2, ac=True)) == "z3-optcpu-parcpu-mb2-ac"
    assert key(strat("fsdp", None, True)) == "fsdp-mb1"
    assert key(strat("fsdp", None, False)) == "fsdpnr-mb1"


def test_ratio_best_and_breaches():
    cands = {k: {"fits": f, "label": k} for k, f in (("a", True), ("b", True), ("c", False))}
    budgets = {"tight": {"budget_bytes": 100, "pick": "b", "candidates": cands}}
    screen = {"a": {"median_step_s": 1.0, "measured_peak_bytes": 90},
              "b": {"median_step_s": 1.2, "measured_peak_bytes": 120},
              "c": {"median_step_s": 0.5, "measured_peak_bytes": 500}}
    confirm = {"b": {"median_step_s": 1.05}}
    r = evaluate_budgets(budgets, screen, confirm)["tight"]
    assert r["best"] == "a" and r["pick_step_s"] == 1.05  # confirmation replaces screening
    assert r["ratio"] == 1.05
    assert [b["candidate"] for b in r["breaches"]] == ["b"]  # c does not fit, so its peak is no breach
    assert r["fitting"] == 2 and r["measured"] == 2
