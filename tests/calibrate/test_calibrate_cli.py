"""`launch calibrate`: a short real measurement, and a refit from run dirs that recovers known constants."""

import json
from pathlib import Path

import pytest
import yaml

from launcher.cli.main import main
from tests.conftest import TINY_GPT2

pytestmark = pytest.mark.filterwarnings("ignore")
DATA = str(Path(__file__).resolve().parents[2] / "examples" / "data" / "causal.jsonl")


def test_quick_hardware_calibration_writes_sane_numbers(cache, capsys):
    assert main(["calibrate", "--hardware", "cpu", "--gpus", "2", "--quick"]) == 0
    data = json.loads((cache / "profiles" / "cpu.json").read_text())
    hw = data["hardware"]
    for key in ("flops_bf16", "flops_fp32", "intra_node_bw", "collective_latency_s", "host_link_bw",
                "cpu_adam_params_per_s", "block_overhead_s"):
        assert hw[key] > 0, key
    assert 1e8 < hw["flops_fp32"] < 1e14  # a core does 1-200 GFLOP/s; anything else is a unit slip
    assert 1e6 < hw["intra_node_bw"] < 1e12
    assert 1e-7 < hw["collective_latency_s"] < 1.0
    assert 1e-7 < hw["block_overhead_s"] < 10.0
    assert data["details"]["ranks"] == 2 and len(data["details"]["per_rank"]) == 2
    assert "wrote" in capsys.readouterr().out


ARCHS = [  # h, layers, intermediate, vocab, seq, micro-batch, checkpointing
    (64, 2, 128, 1024, 64, 2, False), (64, 4, 512, 2048, 32, 4, False), (128, 2, 256, 4096, 64, 2, True),
    (96, 3, 384, 1024, 32, 2, False), (128, 3, 1024, 2048, 64, 1, False), (64, 2, 256, 4096, 32, 4, True),
]


def make_run(root, i, arch):
    h, layers, inner, vocab, seq, mb, ac = arch
    job = {"name": f"r{i}", "task": "causal_lm",
           "model": {"family": "gpt2", "hidden_size": h, "num_layers": layers, "num_heads": 4,
                     "intermediate_size": inner, "vocab_size": vocab, "max_position_embeddings": 256},
           "data": {"path": DATA, "max_seq_len": seq},
           "train": {"global_batch_size": 2 * mb, "max_steps": 3, "precision": "fp32"},
           "strategy": {"engine": "deepspeed", "zero_stage": 2, "offload_optimizer": "none", "offload_params": "none",
                        "micro_batch_size": mb, "activation_checkpointing": ac,
                        # Every block, whole: the hand-worked coefficients below are full checkpointing's.
                        **({"checkpoint_policy": "full", "checkpoint_every": 1} if ac else {})},
           "cluster": {"hardware": "cpu"}, "gpus": 2, "budget": "4GB"}
    d = root / f"r{i}"
    src = root / f"r{i}.yaml"  # beside the dir: `plan --out` writes only into a new dir or one launch made
    src.write_text(yaml.safe_dump(job))
    assert main(["plan", str(src), "--out", str(d)]) == 0
    return d


def test_refit_from_run_dirs_recovers_constants(tmp_path, cache, capsys):
    from launcher.calibrate.runs import samples_from_run

    runs = [make_run(tmp_path, i, a) for i, a in enumerate(ARCHS)]
    coefs = {d: stub_sample(d, samples_from_run) for d in runs}
    # "True" constants: the planner's current ones for the first run, moved by a different factor each, then
    # kept to those the runs can identify (the rest must stay where they are).
    first = coefs[runs[0]]
    true = {k: v * (1.2 + 0.1 * i) if v else 100.0 for i, (k, v) in enumerate(first.current.items())}
    for d in runs:
        s = coefs[d]
        act = s.base_bytes + sum(s.coefficients[k] * true[k] for k in s.coefficients)
        (d / "ranks").mkdir()
        for rank in (0, 1):
            rec = {"rank": rank, "status": "completed", "steps_done": 3, "measured_peak_bytes": int(act * 2),
                   "phases": {"forward": int(act), "backward": int(act * 2)},
                   "phase_breakdown": {"forward": {"activations": int(act * 0.9)},
                                       "backward": {"activations": int(act * 0.7), "temp": int(act * 0.3),
                                                    "params": int(act)}}}
            (d / "ranks" / f"rank-{rank}.json").write_text(json.dumps(rec))
    # Six shapes of one model type: the per-token constants of one shape cannot serve all, so nothing is written
    # unless asked to merge.
    assert main(["calibrate", "--from", *map(str, runs)]) == 0
    assert "runs of 6 architectures" in capsys.readouterr().out
    assert not (cache / "profiles" / "activations-gpt2-cpu.json").exists()
    # The synthetic bytes come from one set of constants, so a merged fit reproduces them all.
    assert main(["calibrate", "--from", *map(str, runs), "--merge", "--force"]) == 0
    out = capsys.readouterr().out
    assert "12 rank samples from 6 runs" in out
    fitted = json.loads((cache / "profiles" / "activations-gpt2-cpu.json").read_text())
    samples = [coefs[d] for d in runs]
    for s in samples:  # every run's activation bytes are reproduced by the written constants
        got = s.base_bytes + sum(s.coefficients[k] * fitted[k] for k in s.coefficients)
        want = s.base_bytes + sum(s.coefficients[k] * true[k] for k in s.coefficients)
        assert got == pytest.approx(want, rel=0.01)
    identifiable = [k for k in true if any(s.coefficients.get(k) for s in samples)]
    assert identifiable
    # The planner now uses (and names) the refit constants.
    assert main(["plan", str(runs[0] / "job.yaml"), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["constants"]["activations"]["source"].startswith("calibrated: ")
    for k in identifiable:
        assert plan["constants"]["activations"][k] == pytest.approx(fitted[k]), k


def stub_sample(d, samples_from_run):
    """samples_from_run needs a rank file; a placeholder one gives the run's coefficients."""
    (d / "ranks").mkdir()
    (d / "ranks" / "rank-0.json").write_text(json.dumps(
        {"rank": 0, "status": "completed", "steps_done": 1, "phase_breakdown": {"forward": {"activations": 1}}}))
    try:
        (s,) = samples_from_run(d)
        return s
    finally:
        (d / "ranks" / "rank-0.json").unlink()
        (d / "ranks").rmdir()


def test_run_coefficients_are_token_counts_worked_by_hand(tmp_path, cache):
    # The refit above builds its synthetic bytes from the same coefficients it then fits, so a wrong coefficient
    # would pass it. Pin them by hand from [Kort]'s per-token form, per rank (micro-batch x seq tokens):
    # ARCHS[0]: 2 x 64 = 128 tokens, 2 blocks, no checkpointing -> each block saves block + per_seq·s per token:
    #   block 128 x 2 = 256, per_seq 256 x 64 = 16_384, head 128; the checkpoint terms unused.
    # ARCHS[2]: 128 tokens, checkpointing -> 2 block inputs kept (256) plus one block recomputed (128, and
    #   128 x 64 = 8_192 for its scores), the head's checkpointed term 128.
    from launcher.calibrate.runs import samples_from_run

    # Runs without chunked cross-entropy: the chunked head's two constants (launcher.planner.memory) never enter.
    # Nor op-level selective checkpointing's saved bytes (checkpoint_policy "full" here), nor the frozen linears'
    # inputs (full fine-tunes: release_frozen_weights off), nor a mixed layout's kwargs (every block or none
    # checkpointed), nor LoRA's fp32 adapters (full fine-tunes, the launcher's recipe).
    UNCHUNKED = {"head_logit_bytes_per_token": 0, "head_weight_grad_bytes": 0, "sac_bytes_per_token": 0,
                 "frozen_input_bytes_per_token": 0, "frozen_head_input_bytes_per_token": 0,
                 "ckpt_kwargs_bytes_per_token": 0, "fp32_adapter_bytes_per_token": 0,
                 "fp32_adapter_head_bytes_per_token": 0, "fp32_adapter_sac_bytes_per_token": 0,
                 "fp32_adapter_frozen_input_bytes_per_token": 0, "fp32_adapter_frozen_head_input_bytes_per_token": 0}
    no_ckpt = stub_sample(make_run(tmp_path, 0, ARCHS[0]), samples_from_run)
    ckpt = stub_sample(make_run(tmp_path, 2, ARCHS[2]), samples_from_run)
    assert no_ckpt.base_bytes == ckpt.base_bytes == 0
    # Exact token counts, up to the fit's float rounding (1e-12 relative, from the least squares).
    assert no_ckpt.coefficients == pytest.approx({"block_bytes_per_token": 256, "block_bytes_per_token_per_seq": 16_384,
                                    "ckpt_bytes_per_token": 0, "head_bytes_per_token": 128,
                                    "head_ckpt_bytes_per_token": 0, **UNCHUNKED}, rel=1e-9, abs=1e-6)
    assert ckpt.coefficients == pytest.approx({"block_bytes_per_token": 128, "block_bytes_per_token_per_seq": 8_192,
                                               "ckpt_bytes_per_token": 256, "head_bytes_per_token": 0,
                                               "head_ckpt_bytes_per_token": 128, **UNCHUNKED}, rel=1e-9, abs=1e-6)


def test_a_script_run_is_refit_as_the_script_it_ran(tmp_path, cache):
    # A bf16 LoRA run at ZeRO-3 under the user's script computes peft's fp32 adapters (EngineSpec.fp32_adapters),
    # the launcher's recipe does not: the refit must model the run the plan predicted, so plan.json says which.
    from launcher.calibrate.runs import samples_from_run

    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    coefs = {}
    for kind in ("recipe", "script"):
        job = {"name": kind, "task": "causal_lm", "model": dict(TINY_GPT2),
               "data": {"path": DATA, "max_seq_len": 32},
               "train": {"global_batch_size": 4, "max_steps": 3, "precision": "bf16",
                         "lora": {"r": 4, "alpha": 8, "target_modules": ["c_attn"]}},
               "strategy": {"engine": "deepspeed", "zero_stage": 3, "offload_optimizer": "none",
                            "offload_params": "none", "micro_batch_size": 2, "activation_checkpointing": False},
               "cluster": {"hardware": "cpu"}, "gpus": 2, "budget": "4GB"}
        src = tmp_path / f"{kind}.yaml"
        src.write_text(yaml.safe_dump(job))
        extra = ["--script", str(script)] if kind == "script" else []
        assert main(["plan", str(src), *extra, "--out", str(tmp_path / kind)]) == 0
        assert json.loads((tmp_path / kind / "plan.json").read_text()).get("script", False) == (kind == "script")
        coefs[kind] = stub_sample(tmp_path / kind, samples_from_run).coefficients
    fp32 = [k for k in coefs["script"] if k.startswith("fp32_adapter_")]
    assert fp32 and not any(coefs["recipe"][k] for k in fp32)
    # 2 x 32 tokens per micro-batch, each of the 2 blocks saving the fp32 copies, the head once.
    assert coefs["script"]["fp32_adapter_bytes_per_token"] == 2 * 2 * 32
    assert coefs["script"]["fp32_adapter_head_bytes_per_token"] == 2 * 32
