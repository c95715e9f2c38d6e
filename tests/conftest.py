import copy
import os
from pathlib import Path

import pytest
import yaml

from launcher.processes.rankenv import use_local_tools
from tests.shared_runs import curve_runs, single_rank_runs, terminal_run  # noqa: F401  (runs several modules share)
from tests.slurm_fixtures import make_job, make_plan  # noqa: F401  (fixtures for tests/backends and tests/emit)
from tests.tiers import GUARD, mark_slow

REPO = Path(__file__).resolve().parents[1]
TINY_GPT2 = {"family": "gpt2", "hidden_size": 64, "num_layers": 2, "num_heads": 4, "vocab_size": 1024,
             "max_position_embeddings": 256}

# Every test process shares one DeepSpeed op cache and reads no model hub.
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".cache" / "torch_extensions"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# ... and one matplotlib font list (a fresh config dir costs a font scan and `fc-list`, per process that plots).
os.environ.setdefault("MPLCONFIGDIR", str(REPO / ".cache" / "matplotlib"))
# ... built with the ninja beside this interpreter, as set-up built it (launcher.processes.rankenv.use_local_tools says
# why), by every subprocess a test starts (accelerate launch, a script, a DeepSpeed check), not only the launcher's
# ranks.
use_local_tools()


def base_job(data_path: str, **over) -> dict:
    job = {
        "name": "t",
        "model": copy.deepcopy(TINY_GPT2),
        "task": "causal_lm",
        "data": {"path": data_path, "max_seq_len": 64},
        "train": {"global_batch_size": 8, "precision": "fp32", "lr": 1e-3, "max_steps": 4},
        "gpus": 2,
        "budget": "1GB",
    }
    for dotted, value in over.items():
        node = job
        keys = dotted.split(".")
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        if value is None:
            node.pop(keys[-1], None)
        else:
            node[keys[-1]] = value
    return job


def relative_project(root, *, nvme: bool = False):
    """A job dir with a relative model dir (config.json only: random weights), data file and NVMe path."""
    import json

    (root / "models" / "tiny").mkdir(parents=True)
    (root / "models" / "tiny" / "config.json").write_text(json.dumps({
        "model_type": "gpt2", "n_embd": TINY_GPT2["hidden_size"], "n_layer": TINY_GPT2["num_layers"],
        "n_head": TINY_GPT2["num_heads"], "vocab_size": TINY_GPT2["vocab_size"],
        "n_positions": TINY_GPT2["max_position_embeddings"]}))
    (root / "data").mkdir()
    (root / "data" / "d.jsonl").write_text("".join(f'{{"text": "line {i} of the data"}}\n' for i in range(32)))
    doc = base_job("data/d.jsonl", model="models/tiny")
    if nvme:
        doc["cluster"] = {"nvme_path": "scratch/nvme", "nvme_free": "1TB"}
    (root / "job.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return root / "job.yaml"


@pytest.fixture
def data_file(tmp_path) -> Path:
    p = tmp_path / "data.jsonl"
    p.write_text("".join(f'{{"text": "sentence number {i} about memory"}}\n' for i in range(64)))
    return p


@pytest.fixture
def write_job(tmp_path, data_file):
    """write_job(**dotted_overrides) -> path of a job file whose data exists."""

    def _write(doc: dict | None = None, name: str = "job.yaml", **over) -> Path:
        d = doc if doc is not None else base_job(str(data_file), **over)
        p = tmp_path / name
        p.write_text(yaml.safe_dump(d, sort_keys=False))
        return p

    return _write


def own_leftovers(tmpdir: Path) -> list[str]:
    """What a run left in the TMPDIR it was given, torch's per-user compile cache (``torchinductor_<user>``, shared
    by every later process, not the run's) aside."""
    return sorted(p.name for p in tmpdir.iterdir() if not p.name.startswith("torchinductor_"))


def require_cluster(reason: str | None) -> None:
    """A Slurm test whose cluster cannot be reached: in CI (CI=true) that is a failure, since CI starts the dev
    cluster and a silent skip would hide a broken one; elsewhere the test skips and says why."""
    if reason is None:
        return
    if os.environ.get("CI", "").strip().lower() in ("true", "1", "yes"):
        pytest.fail(f"CI=true, so the Slurm cluster must be up, but it cannot be reached: {reason}", pytrace=False)
    pytest.skip(reason)


GUARD.install()


def pytest_sessionstart(session):
    """Where sbatch is installed, the emitter checks Slurm options against `sbatch --help` once per process (cached):
    read it here, before any test, so that which test pays for that process does not depend on the order. The
    same for matplotlib's font list."""
    from launcher.emit.slurm_params import sbatch_long_options

    sbatch_long_options()
    # matplotlib scans the fonts (with `fc-list`) where its config dir has no font list yet: once, here.
    if not list(Path(os.environ["MPLCONFIGDIR"]).glob("fontlist-*.json")):
        import matplotlib.font_manager  # noqa: F401


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    """A test that is not slow starts no process (tests/tiers.py), in its fixtures' set-up ..."""
    return (yield from GUARD.guarding(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """... in its body ..."""
    return (yield from GUARD.guarding(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item):
    """... and in their tear-down."""
    return (yield from GUARD.guarding(item))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Slow tests get the `slow` marker (tests/tiers.py) before `-m` selects. `gpu` tests need CUDA: they run
    wherever a GPU is present and say why they skip elsewhere."""
    mark_slow(items, timeouts=config.pluginmanager.hasplugin("timeout"))
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False on this machine)")
    for item in gpu_items:
        item.add_marker(skip)
