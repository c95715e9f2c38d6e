"""What is checked before anything is written or started: the flags (--resume, the ladder), runnable here, NVMe."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from launcher.backends import backend_spec
from launcher.config.job import Job
from launcher.config.problem import Problem
from launcher.errors import ConfigError
from launcher.files.fsutil import not_a_file
from launcher.files.rundir import RunDir, contents, few, is_marked, latest_checkpoint_tag, unmarked_for_resume
from launcher.planner.plan import Plan
from launcher.records.datasummary import DataSummary
from launcher.session.endpoint import check_rendezvous
from launcher.session.options import RunOptions
from launcher.units import format_bytes


def cuda_available() -> bool:
    """True when this machine has an NVIDIA or AMD GPU (detect_gpu_name finds one)."""
    from launcher.inputs.machine import detect_gpu_name

    return detect_gpu_name() is not None


def check_runnable(job: Job, plan: Plan, opts: RunOptions | None = None) -> None:
    """Refuse (ConfigError) what the plan cannot run here: fp16 on CPU ranks, --memory-snapshot without CUDA,
    --enforce on a forced over-budget plan, and for a local run missing NVMe space or flash-attn."""
    if plan.precision == "fp16" and plan.hardware == "cpu":
        raise ConfigError("train.precision: 'fp16' is refused on CPU ranks (no fp16 kernels); use bf16 or fp32")
    here = not backend_spec(job.launcher).queued  # the ranks run on this machine
    if opts is not None and opts.memory_snapshot and here and not cuda_available():
        raise ConfigError("--memory-snapshot: records the CUDA allocator's history, and this machine has no CUDA "
                          "GPU; drop the flag (CPU ranks already write their breakdown to ranks/rank-K.json)")
    if opts is not None and opts.enforce and plan.status == "forced" and not job.auto_fallback:
        raise ConfigError(
            f"--enforce with --force: the plan is predicted at {format_bytes(plan.estimate.peak_bytes)}, over the "
            f"budget of {format_bytes(plan.budget_bytes)} that --enforce caps each rank at, so it would stop out of "
            "memory; drop --enforce to measure how far over it goes, or add --auto-fallback N to let the ladder "
            "find a strategy that fits")
    if here:  # a queued job's NVMe is on the compute nodes, not here
        problems = check_nvme(job, plan) + check_flash_attn(job, plan)
        if problems:
            raise ConfigError(problems)


def plan_attention(job: Job, plan: Plan) -> str | None:
    """The attention kernel the ranks build the model with: the plan's (its activation constants), else the job's."""
    activations = plan.constants.get("activations")
    found = activations.get("attention") if isinstance(activations, dict) else None
    return found or job.train.attn_implementation


def package_installed(name: str) -> bool:
    """True when the module ``name`` can be imported here (found, not imported)."""
    import importlib.util

    return importlib.util.find_spec(name) is not None


def check_flash_attn(job: Job, plan: Plan) -> list[str]:
    """flash_attention_2 is planned without the package (as sdpa: launcher.model.build.planning_attention), but the
    ranks build the model with it: ranks started here need it here, said before anything is written or started."""
    if plan_attention(job, plan) != "flash_attention_2" or package_installed("flash_attn"):
        return []
    return ["train.attn_implementation: 'flash_attention_2' needs the flash-attn package on the ranks, and this "
            "machine, where they would run, does not have it; pip install flash-attn (or use "
            "train.attn_implementation: sdpa)"]


def check_nvme(job: Job, plan: Plan) -> list[str]:
    """A plan that swaps to NVMe needs cluster.nvme_path creatable, writable and with the room the plan uses."""
    s = plan.strategy
    if "nvme" not in (s.layout.offload_optimizer, s.layout.offload_params):
        return []
    if not job.cluster.nvme_path:
        return ["cluster.nvme_path: missing, but the plan offloads to NVMe; set it to a directory on a local NVMe "
                "drive"]
    raw = job.cluster.nvme_path
    try:
        path = Path(raw).expanduser().absolute()
    except RuntimeError as e:  # '~nosuchuser/...'
        return [f"cluster.nvme_path: {raw!r} cannot be expanded ({e}); give an absolute path"]
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return [f"cluster.nvme_path: {raw!r} cannot be created: {str(existing)!r} is a file, not a directory; "
                "point nvme_path at a directory on the NVMe drive"]
    # access() also answers for root: EROFS on a read-only mount, and it needs no file written to find out.
    if not os.access(existing, os.W_OK | os.X_OK):
        return [f"cluster.nvme_path: {raw!r} is not writable ({str(existing)!r} is read-only or not yours); "
                "point nvme_path at a directory you can write"]
    need = plan.estimate.nvme_bytes_per_node
    free = shutil.disk_usage(existing).free
    if need > free:
        return [f"cluster.nvme_path: {raw!r} has {format_bytes(free)} free, the plan swaps {format_bytes(need)} "
                "to NVMe per node; free space there, use a larger drive, or unpin the NVMe offload"]
    return []


def cluster_hints(job: Job, short_of: str) -> list[Problem]:
    """The job fields behind a host-RAM or NVMe refusal (``short_of``: the resource the smallest candidate
    overruns, NoPlanError.short_of), for a no-plan answer that names only the resource."""
    if short_of == "host_ram":
        have = job.cluster.host_ram_per_node_bytes
        return [Problem("cluster.host_ram_per_node", f"{format_bytes(have)} is less than the offload needs; raise it"
                        if have else "this machine's RAM is less than the offload needs; run where there is more, "
                        "or offload less")]
    if short_of == "nvme":
        free = job.cluster.nvme_free_bytes
        return [Problem("cluster.nvme_free", f"{format_bytes(free)} is less than the NVMe offload needs; free space "
                        "at cluster.nvme_path or point it at a larger drive") if free else
                Problem("cluster.nvme_path", f"{job.cluster.nvme_path!r} has less free space than the NVMe offload "
                        "needs; free space there or point it at a larger drive")]
    return []


def check_fallback(job: Job, opts: RunOptions) -> None:
    """Refuse --auto-fallback where the ladder cannot work: on Slurm, several nodes, or with --resume."""
    if not job.auto_fallback:
        return
    if backend_spec(job.launcher).queued or job.nodes > 1 or opts.node_rank > 0:
        raise ConfigError(f"auto_fallback: {job.auto_fallback} relaunches the ranks of this node only, so it works "
                          "with the local launcher on one node; set auto_fallback: 0 (or --auto-fallback 0) for "
                          "--slurm and --nodes > 1")
    if opts.resume:
        raise ConfigError(f"--auto-fallback: {job.auto_fallback} with --resume would restart the checkpointed run "
                          "from step 0 on another rung; resume with --auto-fallback 0 (it overrides the job's "
                          "auto_fallback)")


def check_resume(opts: RunOptions) -> None:
    """--resume continues one run dir from its checkpoint; what it cannot do is refused before planning."""
    if not opts.resume:
        return
    if opts.overwrite:
        raise ConfigError("--resume with --overwrite: one continues the run dir, the other deletes it first; "
                          "pass only one of them")
    if opts.run_dir is None:
        raise ConfigError("--resume: needs --run-dir, the run dir to continue (a new run dir has no checkpoint); "
                          "pass --run-dir RUN, or run without --resume")
    path = opts.run_dir
    if latest_checkpoint_tag(path / "checkpoint"):
        unmarked = unmarked_for_resume(path)  # a checkpoint/latest alone does not make a dir launch's
        if unmarked:
            raise unmarked
        return
    names = _listing(path)
    if names and not is_marked(path):  # --overwrite would be refused there too: never advise it
        raise ConfigError(f"--resume: {str(path)!r} is not a run dir launch made (it holds {few(names)}) and has "
                          "no checkpoint; give the --run-dir of the run to continue, or run without --resume")
    if names:
        state = _state_of(path)
        was = f" (state.json: {state})" if state else ""
        raise ConfigError(f"--resume: {str(path)!r} has no checkpoint to resume from{was}; start it again with "
                          "--overwrite instead of --resume, or choose another --run-dir")
    raise ConfigError(f"--resume: {str(path)!r} has no checkpoint to resume from; run without --resume")


def _listing(path: Path) -> list[str]:
    """What ``path`` holds besides the lock ([] when it is missing, not a directory, or cannot be listed)."""
    try:
        return contents(path) if path.is_dir() else []
    except OSError:
        return []


def _state_of(path: Path) -> str | None:
    return RunDir(path).run_state().state or None


def check_script(script: str | None) -> None:
    """--script names a file (launch run, and launch plan planning for it)."""
    kind = not_a_file(script) if script else None
    if kind == "missing":
        raise ConfigError(f"--script: {script!r} does not exist; give the path of your training script")
    if kind:
        raise ConfigError(f"--script: {script!r} is {kind}, not a file; give the path of your training script")


def check_launch(job: Job, opts: RunOptions) -> None:
    """The flags against the job, before planning (the data is checked once the plan knows the model:
    check_data)."""
    check_script(opts.script)
    if not backend_spec(job.launcher).queued and job.nodes > 1 and not opts.rdzv_endpoint:
        raise ConfigError("--nodes: a multi-node run needs --rdzv-endpoint host:port (the first node's address)")
    check_rendezvous(job, opts)
    check_resume(opts)
    check_fallback(job, opts)


def count_train_examples(job: Job, data: DataSummary | None = None) -> tuple[int | None, str]:
    """(training sequences, "") for the total-time prediction of a train.epochs job, or (None, why not): the data
    summary's count when there is one (packed sequences included), else the rows read less the eval split."""
    if data is not None:
        return data.sequences, ""
    if job.data.packing:
        return None, ("data.packing: the sequences per epoch are known only once the data is counted; give "
                      "train.max_steps for a predicted total")
    from launcher.worker.data import eval_count, read_records

    try:
        n = len(read_records(job.data.path))
    except (ConfigError, OSError) as e:
        return None, f"the data cannot be read at plan time ({str(e).splitlines()[0]})"
    return n - eval_count(n, job.data.eval_fraction), ""


def check_data(job: Job) -> DataSummary:
    """Every row has what the job reads (the row number and the field if not), the examples the ranks would drop
    are counted (refused only when none is left) and one step's worth reaches every rank, before any rank starts:
    found by the ranks, each would be a failed run (exit 1) instead of refused input (exit 2). The summary."""
    from launcher.inputs.plan_inputs import model_stats
    from launcher.session.datacheck import check_job_data

    summary = check_job_data(job, model_stats(job).vocab_size)
    if job.data.packing and job.train.attn_implementation != "flash_attention_2":
        print(f"launch: warning: data.packing with attention {job.train.attn_implementation or 'sdpa (default)'}: "
              "a token also attends to the earlier examples packed into its sequence (positions restart and labels "
              "never cross); set train.attn_implementation: flash_attention_2 to keep examples apart",
              file=sys.stderr)
    return summary


def lora_base_warning(job: Job) -> str | None:
    """The warning for LoRA on a base without weights (an inline architecture, a bundled or config-only model:
    a random init): its adapter cannot be loaded with PeftModel.from_pretrained later, since no base weights
    exist to load it onto. None with weights, without LoRA, or with train.lora.merge (the merged export holds the
    base the run trained on)."""
    if job.train.lora is None or job.train.lora.merge:
        return None
    from launcher.inputs.plan_inputs import model_stats

    if model_stats(job).checkpoint_bytes:
        return None
    return ("train.lora on a model without weights (a random init): the adapter this run saves cannot be loaded "
            "with PeftModel.from_pretrained later, as no base weights exist to load it onto; set "
            "train.lora.merge: true (launch export then writes base and adapter merged, a full model), or point "
            "model at a dir with weights")
