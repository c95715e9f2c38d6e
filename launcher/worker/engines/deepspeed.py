"""DeepSpeed: deepspeed.initialize with the emitted ds_config.json, ZeRO 0-3, optional CPU/NVMe offload.

ZeRO-3 builds the model inside zero.Init (through transformers' HfDeepSpeedConfig):
each parameter is partitioned as soon as it is created, and pretrained weights are
copied in one gathered tensor at a time, so the device holds its partitions plus one
tensor, never the whole model. (transformers reads the checkpoint's values into rank 0's
host memory only, the other ranks its keys and shapes on meta: modeling_utils, map_location
"cpu" on rank 0; on CPU ranks, where host is the device, that copy shows in rank 0's init-phase
peak.) Under ZeRO-0/1/2 rank 0 builds the model and the
other ranks receive it by broadcast onto their devices (launcher.worker.loading); deepspeed.initialize casts it.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from launcher.config.job import TrainConfig
from launcher.engines.deepspeed.emit import DS_CONFIG_FILE
from launcher.errors import ConfigError
from launcher.planner.plan import Plan
from launcher.worker.engines.base import WORK_DTYPES, build_optimizer, clip_setting, lr_lambda

# Attribute names of DeepSpeed's ZeRO / bf16 optimizers, by what the tensors hold.
# Used only to label memory; a missing name is skipped, so DeepSpeed versions may differ.
_PARAM_ATTRS = ("bit16_groups_flat", "fp16_partitioned_groups_flat", "bf16_groups_flat")
_MASTER_ATTRS = ("single_partition_of_fp32_groups", "fp32_partitioned_groups_flat", "fp32_groups_flat_partition")
_GRAD_ATTRS = (
    "averaged_gradients",
    "grads_in_partition",
    "grad_partitions_flat_buffer",
    "fp32_groups_gradients_flat",
    "_DeepSpeedZeroOptimizer_Stage3__param_id_to_grad_partition",
)


def _tensors(obj) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v)


def _attrs(obj, names) -> list[torch.Tensor]:
    return [t for n in names for t in _tensors(getattr(obj, n, None))]


_ABSENT = object()
"""A key the config does not give (_ds_value), and in check_ds_config's table a key with no DeepSpeed default
(DeepSpeed derives it from others): the config must give it."""

_ROUNDING_ADAM = ("adam", "adamw")
"""ds_config optimizer types (case-insensitive, as DeepSpeed reads them) that pure bf16 steps with its own rounding
client optimizer instead (launcher.engines.deepspeed.emit._fill_optimizer)."""


def _ds_value(ds: dict, key: str):
    node = ds
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return _ABSENT
        node = node[part]
    return node


def check_ds_config(ds: dict, plan: Plan) -> None:
    """The ds_config must carry out the plan, both ways: each setting the plan needs must be there with the plan's
    value (absent counts as DeepSpeed's default), and a setting the config adds must not contradict the plan (a bf16
    master the plan does not keep, an offload it does not count, an optimizer block where the plan steps its own);
    every disagreement in one error naming the key, both values and the fix."""
    s = plan.strategy
    fix = "re-emit the run dir (launch --overwrite)"
    # key -> (plan.json field, its value, the key's value it needs, DeepSpeed's value when the key is absent, or
    # _ABSENT). Defaults from DeepSpeed 0.19:
    # runtime/precision_config.py (bf16/fp16 off, no bf16 masters or states), zero/config.py (stage 0, offload_*
    # None: no offload). Micro-batch and accumulation it derives from train_batch_size and the world size, which
    # is not the plan's unless the two are given.
    want = {
        "train_micro_batch_size_per_gpu": ("strategy.micro_batch_size", s.micro_batch_size, s.micro_batch_size,
                                           _ABSENT),
        "gradient_accumulation_steps": ("strategy.grad_accum_steps", s.grad_accum_steps, s.grad_accum_steps,
                                        _ABSENT),
        "zero_optimization.stage": ("strategy.zero_stage", s.layout.zero_stage, s.layout.zero_stage, 0),
        "bf16.enabled": ("precision", plan.precision, plan.precision == "bf16", False),
        "fp16.enabled": ("precision", plan.precision, plan.precision == "fp16", False),
        "bf16.bf16_master_weights_and_grads": ("strategy.pure_bf16", s.pure_bf16, s.pure_bf16, False),
        "bf16.bf16_optimizer_states": ("strategy.pure_bf16", s.pure_bf16, s.pure_bf16, False),
        "zero_optimization.offload_optimizer.device": ("strategy.offload_optimizer", s.layout.offload_optimizer,
                                                       s.layout.offload_optimizer, "none"),
        "zero_optimization.offload_param.device": ("strategy.offload_params", s.layout.offload_params,
                                                   s.layout.offload_params,
                                                   "none"),
    }
    problems = []
    for key, (field, planned, needed, default) in want.items():
        have = _ds_value(ds, key)
        if have is _ABSENT:
            have, seen = default, "absent" if default is _ABSENT else f"absent (DeepSpeed's default {default!r})"
        else:
            seen = repr(have)
        # type() too: a JSON true is not the micro-batch 1, nor "auto" (HF Trainer's to fill) the plan's number.
        if type(have) is type(needed) and have == needed:
            continue
        needs = "" if (type(planned), planned) == (type(needed), needed) else f", which needs {needed!r}"
        problems.append(f"ds_config.json {key}: {seen} but plan.json {field} is {planned!r}{needs}; {fix}")
    # A train_batch_size, where given, must be the plan's: DeepSpeed checks it against micro-batch x accumulation x
    # world size. Absent, DeepSpeed computes it from those.
    have = _ds_value(ds, "train_batch_size")
    if have is not _ABSENT and have != plan.global_batch_size:
        problems.append(f"ds_config.json train_batch_size: {have!r} but plan.json global_batch_size is "
                        f"{plan.global_batch_size}; {fix}")
    # The optimizer block, where the ranks build a client optimizer only when the config names none (DeepSpeedEngine
    # .setup): the plan's low-memory optimizer, or pure bf16's stochastically rounding Adam/AdamW, whose place
    # DeepSpeed's own AdamW (to nearest) would take. The other way needs nothing: without a block the ranks build the
    # job's optimizer, which is the block the emitter would write (torch's AdamW, Adam or SGD).
    block = ds.get("optimizer")
    kind = block.get("type") if isinstance(block, dict) else block
    if block is not None and s.low_memory_optimizer != "none":
        problems.append(f"ds_config.json optimizer: {kind!r} but plan.json's strategy.low_memory_optimizer is "
                        f"{s.low_memory_optimizer!r}, which the ranks pass as the client optimizer; {fix}")
    elif block is not None and s.pure_bf16 and str(kind).lower() in _ROUNDING_ADAM:
        problems.append(f"ds_config.json optimizer: {kind!r} but plan.json's strategy.pure_bf16 is True, whose "
                        "Adam/AdamW the ranks build as the stochastically rounding client optimizer (DeepSpeed's "
                        f"own rounds each bf16 weight to nearest); {fix}")
    if problems:
        raise ConfigError(problems)


def check_clipping(ds_config: dict, train: TrainConfig) -> None:
    """DeepSpeed clips to ds_config.json's gradient_clipping: it must be the job's train.max_grad_norm, which every
    other engine clips to."""
    have, want = float(ds_config.get("gradient_clipping", 0.0) or 0.0), clip_setting(train.max_grad_norm)
    if have != want:
        raise ConfigError(f"ds_config.json gradient_clipping: {have} but job.yaml train.max_grad_norm is "
                          f"{train.max_grad_norm}; re-emit the run dir (launch --overwrite)")


@contextlib.contextmanager
def flatten_room(accelerator, room_bytes: int, used_bytes: Callable[[], int]) -> Iterator[None]:
    """Within the block DeepSpeed's accelerator reports at most ``room_bytes - used_bytes()`` free.

    ZeRO-1/2 flatten each parameter group on the device only if ``available_memory() >= flat_buffer_bytes``
    (runtime/zero/stage_1_and_2.py), else through host memory. CUDA's available_memory is the whole device's free
    memory (pynvml, or total - allocated): it sees neither the plan's budget nor --enforce's allocator cap, so a
    rank given less than its GPU would flatten on the device past its budget (and under --enforce, OOM). Capped at
    the plan's usable budget, DeepSpeed takes the host route exactly where the planner counts it
    (launcher.engines.deepspeed.cuda_init_bytes).
    """
    real = accelerator.available_memory
    had_own = "available_memory" in vars(accelerator)

    def capped(device_index=None):
        return max(0, min(real(device_index), room_bytes - used_bytes()))

    accelerator.available_memory = capped
    try:
        yield
    finally:
        if had_own:
            accelerator.available_memory = real
        else:
            del accelerator.available_memory


def skip_shm_comm_op() -> None:
    """Mark DeepSpeed's shared-memory all-reduce op unusable, the one write to DeepSpeed's globals on a rank.

    On CPU DeepSpeed builds (or loads) that kernel when its communication starts (deepspeed/comm/torch.py
    build_shm_op, which asks deepspeed.ops.__compatible_ops__ first); only its inference_all_reduce uses it, never
    training, so a rank saves the build and the load."""
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def ask_cpu_info_once() -> None:
    """Keep py-cpuinfo's first answer for the rest of the rank.

    DeepSpeed's CPU optimizer asks py-cpuinfo three times on every rank: OpBuilder.cpu_arch and simd_width when it
    loads cpu_adam (builder.py), then DeepSpeedCPUAdam.__init__ (cpu_adam.py). Each get_cpu_info() starts a Python
    subprocess (cpuinfo.py get_cpu_info_json: ``[sys.executable, __file__, '--json']``), about 1 s of CPU apiece
    (measured: 6 of them, 7 s of CPU, in a two-rank ZeRO-3 offload start on 2 cores). The CPU does not change
    within a process, so the first answer serves all three. Each call site imports the function at call time
    (``from cpuinfo import get_cpu_info``), so replacing the module's attribute reaches them."""
    import functools

    import cpuinfo

    if not hasattr(cpuinfo.get_cpu_info, "cache_info"):
        cpuinfo.get_cpu_info = functools.cache(cpuinfo.get_cpu_info)


def keep_optimizer_state_whole(zero_optimizer) -> None:
    """Stop ZeRO-1/2 from cutting the client optimizer's state into per-parameter fragments.

    After its first step DeepSpeedZeroOptimizer links every partition-shaped optimizer state to the parameters it
    covers (stage_1_and_2.py _lazy_init_hp_params_optimizer_state -> tensor_fragment.set_optim_state_fragment:
    ``value.narrow(0, start, numel)`` per parameter), for its safe_get_full_optimizer_state API and universal
    checkpoints, which the launcher uses neither of. torchao's quantized moments allow a narrow only on block
    boundaries, and a parameter's fragment starts anywhere (tiny GPT-2's 64-element biases: "Invalid start or end
    ... block_size=128"). Marked as linked, the states stay whole; DeepSpeed's own checkpoint saves and reloads
    them through the optimizer's state_dict (elastic_checkpoint off; a resumed ZeRO-2 run with 4-bit moments steps
    to the same loss as the one that went on)."""
    if hasattr(zero_optimizer, "_hp_optimizer_states_linked"):
        zero_optimizer._hp_optimizer_states_linked = True


def hide_zero3_fetches(zero_optimizer) -> None:
    """Run ZeRO-3's parameter fetch and release unseen by the op policy (launcher.model.sac.unseen).

    A module's pre-forward hook fetches its parameters and its post-forward hook releases them
    (parameter_offload.py pre/post_sub_module_forward_function -> PartitionedParameterCoordinator.fetch_sub_module /
    release_sub_module), so inside a checkpointed block they run in the block's forward and again in its recompute,
    but not alike: the forward finds the weights prefetched by an earlier module and releases them; the recompute, in
    backward after they were released, all-gathers them again (empty, c10d._allgather_base_, under LoRA no backward
    prefetch got there first). Counted by the policy's replay, those ops shift its per-op indices. Hidden, the block's
    own ops are the same in both passes and the recompute is exact. The wrapped methods are this optimizer's
    coordinator's own (bound on the instance), DeepSpeed's classes are untouched."""
    from launcher.model.sac import unseen

    coordinator = zero_optimizer.parameter_offload.get_param_coordinator()
    for name in ("fetch_sub_module", "release_sub_module"):
        method = getattr(coordinator, name)

        def hidden(*args, _method=method, **kwargs):
            with unseen():
                return _method(*args, **kwargs)

        setattr(coordinator, name, hidden)


class DeepSpeedEngine:
    """The rank side of DeepSpeed ZeRO: deepspeed.initialize on the run's ds_config.json, behind the step contract."""

    name = "deepspeed"

    @classmethod
    def from_plan(cls, plan: Plan, run_dir: Path, device: torch.device) -> DeepSpeedEngine:
        """The engine for a DeepSpeed plan, the run dir's ds_config.json checked against it; ConfigError without
        one."""
        path = Path(run_dir) / DS_CONFIG_FILE
        if not path.exists():
            raise ConfigError("plan.json engine is deepspeed but the run dir has no ds_config.json; re-emit the run "
                              "dir")
        ds_config = json.loads(path.read_text())
        check_ds_config(ds_config, plan)
        return cls(ds_config, device=device, activation_checkpointing=plan.strategy.activation_checkpointing,
                   usable_bytes=plan.usable_bytes, checkpoint_every=plan.strategy.checkpoint_every,
                   low_memory_optimizer=plan.strategy.low_memory_optimizer, pure_bf16=plan.strategy.pure_bf16,
                   checkpoint_policy=plan.strategy.checkpoint_policy)

    @staticmethod
    def checkpoint_problem(tag_dir: Path, plan: Plan, world_size: int) -> str | None:
        """The module file, and from ZeRO-1 on every rank's optimizer partition, there and readable
        (launcher.worker.ckpt_check.deepspeed_problem)."""
        from launcher.worker.ckpt_check import deepspeed_problem

        return deepspeed_problem(tag_dir, plan.strategy.layout.zero_stage or 0, world_size)

    @staticmethod
    def read_checkpoint(root: Path, tag: str, plan: Plan) -> dict[str, torch.Tensor]:
        """A checkpoint tag's full fp32 state dict on the CPU (`launch export`): ZeRO-0's module states, or the
        ZeRO-1/2/3 partitions gathered by DeepSpeed's zero_to_fp32."""
        if (plan.strategy.layout.zero_stage or 0) == 0:
            files = sorted((root / tag).glob("mp_rank_*_model_states.pt"))
            if not files:
                raise ConfigError(f"{root / tag}: no mp_rank_00_model_states.pt; the checkpoint is incomplete")
            return torch.load(files[0], map_location="cpu", weights_only=False)["module"]
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        return dict(get_fp32_state_dict_from_zero_checkpoint(str(root), tag=tag))

    @staticmethod
    def init_process_group(backend: str) -> None:
        """Form the process group through deepspeed.init_distributed (its CPU shared-memory kernel skipped, py-cpuinfo
        asked once)."""
        import deepspeed

        skip_shm_comm_op()
        ask_cpu_info_once()
        deepspeed.init_distributed(dist_backend=backend)

    def __init__(self, ds_config: dict, *, device: torch.device | None = None, activation_checkpointing: bool = False,
                 usable_bytes: int = 0, checkpoint_every: int = 1, low_memory_optimizer: str = "none",
                 pure_bf16: bool = False, checkpoint_policy: str = "full"):
        self.ds_config = ds_config
        self.pure_bf16 = pure_bf16
        """The plan's Strategy.pure_bf16: ds_config keeps bf16 masters and states, and Adam/AdamW is the
        stochastically rounding client optimizer built here (build_optimizer's pure_bf16)."""
        self.low_memory_optimizer = low_memory_optimizer
        """The plan's Strategy.low_memory_optimizer: built here and handed to deepspeed.initialize as its client
        optimizer (ZeRO-0 keeps it over the parameters, ZeRO-1/2 step it on their flat fp32 partitions)."""
        self.usable_bytes = usable_bytes
        """The plan's usable budget per rank, bytes: the room ZeRO-1/2's flatten may see on a GPU (0: the device's)."""
        self.stage = int(ds_config.get("zero_optimization", {}).get("stage", 0))
        self.device = device or torch.device("cpu")
        self.hf_checkpointing = activation_checkpointing
        """DeepSpeed has no block wrapper of its own: activation checkpointing is transformers'."""
        self.checkpoint_every = checkpoint_every
        """transformers' every_n_layers: its layer_index % k == 0 rule is the one FSDP copies and the plan counts."""
        self.checkpoint_policy = checkpoint_policy
        """The plan's Strategy.checkpoint_policy: "ops" gives transformers' checkpointing the op policy's context_fn
        (launcher.worker.model.build), the same policy FSDP2's checkpoint_wrapper gets."""
        self.work_dtype = next((WORK_DTYPES[p] for p in ("bf16", "fp16") if self.ds_config.get(p, {}).get("enabled")),
                               None)
        self._hf_ds_config = None
        self.engine = None
        self.rank0_load = False
        """Set by before_build: ZeRO-0/1/2 build on rank 0 and broadcast (launcher.worker.loading)."""

    def before_build(self) -> None:
        """Call before building the model: under ZeRO-3 transformers then builds it inside zero.Init, which
        partitions every parameter as it is created; ZeRO-0/1/2 build on rank 0 alone."""
        from launcher.worker.loading import loads_on_rank0_only

        self.rank0_load = loads_on_rank0_only(partitioned_init=self.stage >= 3)
        if self.stage == 3:
            from transformers.integrations import HfDeepSpeedConfig

            # transformers keeps only a weakref; holding it here keeps zero.Init on while the model is built.
            self._hf_ds_config = HfDeepSpeedConfig(self.ds_config)

    def setup(self, model: torch.nn.Module, train: TrainConfig, probe) -> None:
        """Fill the other ranks from rank 0 where only it loaded, then deepspeed.initialize with the job's optimizer
        and warm-up schedule (unless ds_config names its own optimizer)."""
        import deepspeed

        check_clipping(self.ds_config, train)
        if self.rank0_load:
            from launcher.worker.loading import broadcast_from_rank0

            model = broadcast_from_rank0(model, self.device, self.work_dtype)
        params = [p for p in model.parameters() if p.requires_grad]
        # Pure bf16: each rank steps its own partition, so each rounds with its own bits (salt: the rank).
        optimizer = None if "optimizer" in self.ds_config else build_optimizer(
            train, params, self.low_memory_optimizer, pure_bf16=self.pure_bf16,
            salt=torch.distributed.get_rank() if torch.distributed.is_initialized() else 0)
        factor = lr_lambda(train.warmup_steps)

        def schedule(opt):
            return torch.optim.lr_scheduler.LambdaLR(opt, factor)

        # The job's schedule, the one every engine runs, rather than the ds_config's WarmupLR block (kept there
        # for HF Trainer and plain DeepSpeed users): WarmupLR sets its first lr at construction and again at its
        # first step(), so its ramp runs one optimizer step behind (DeepSpeed 0.19 lr_schedules.py), and it raises
        # a warm-up of 1 step to 2. tests/worker/test_step_contract.py compares the two engines' lr step by step.
        config = {k: v for k, v in self.ds_config.items() if k != "scheduler"}
        with self._flatten_room(probe):
            self.engine, self.optimizer, _, self.scheduler = deepspeed.initialize(
                model=model, model_parameters=params, optimizer=optimizer, lr_scheduler=schedule, config=config
            )
        self.model = self.engine
        if self.low_memory_optimizer != "none" and self.stage in (1, 2):
            keep_optimizer_state_whole(self.optimizer)
        if self.stage == 3 and self.hf_checkpointing and self.checkpoint_policy == "ops":
            hide_zero3_fetches(self.optimizer)
        if probe.tracker is None:
            return  # no category tracking (CUDA without $LAUNCHER_TRACK_CATEGORIES): nothing to label
        self._label_memory(probe, grads=False)
        # Buffers DeepSpeed made during init and that are still alive (flat buffers, buckets): engine overhead.
        probe.relabel("activations", "other")
        basic = getattr(self.engine, "basic_optimizer", None) or self.optimizer
        probe.track(self.engine.module, basic)
        if hasattr(basic, "register_step_pre_hook"):
            basic.register_step_pre_hook(lambda *_: self._label_memory(probe, grads=True))
        if self.stage == 3:
            self._label_gathered_params(probe)

    def _flatten_room(self, probe) -> contextlib.AbstractContextManager:
        """On a GPU under ZeRO-1/2, DeepSpeed's flatten sees the plan's usable budget as the device (flatten_room):
        what the rank holds is the allocator's reserved bytes plus what lives outside it (context, NCCL)."""
        if self.device.type != "cuda" or self.stage not in (1, 2) or not self.usable_bytes:
            return contextlib.nullcontext()
        from deepspeed.accelerator import get_accelerator

        def used() -> int:
            return torch.cuda.memory_reserved(self.device) + getattr(probe, "cuda_outside_bytes", 0)

        return flatten_room(get_accelerator(), self.usable_bytes, used)

    def _label_memory(self, probe, *, grads: bool) -> None:
        opt = self.optimizer
        buckets = getattr(opt, "ipg_buckets", None) or {}
        masters = _attrs(opt, _MASTER_ATTRS)
        probe.track(
            params=[p.ds_tensor for p in self.engine.module.parameters() if hasattr(p, "ds_tensor")]
            + _attrs(opt, _PARAM_ATTRS),
            # fp32 master partitions count as optimizer state (ZeRO's K = 12 bytes/param includes them).
            optimizer=masters,
            # Gradient reduce buckets: sized by reduce_bucket_size, engine overhead rather than gradients.
            other=[t for b in buckets.values() for t in _tensors(getattr(b, "buffer", None))],
        )
        if grads:
            probe.track(grads=_attrs(opt, _GRAD_ATTRS) + [m.grad for m in masters if m.grad is not None])

    def _label_gathered_params(self, probe) -> None:
        # ZeRO-3 gathers a module's params in its forward pre-hook; ours runs after DeepSpeed's and
        # labels the gathered copies as params instead of activations (they are freed after the module).
        def hook(module, args):
            probe.track(params=[p.data for p in module.parameters(recurse=False)])

        for m in self.engine.module.modules():
            if any(True for _ in m.parameters(recurse=False)):
                m.register_forward_pre_hook(hook)

    def forward(self, **inputs):
        """The DeepSpeed engine's forward on one micro-batch."""
        return self.engine(**inputs)

    def backward(self, loss: torch.Tensor) -> None:
        """DeepSpeed's backward: it divides by the accumulation steps and applies the loss scale itself."""
        # DeepSpeed divides by gradient_accumulation_steps and applies the loss scale itself.
        self.engine.backward(loss)

    def step(self) -> bool:
        """DeepSpeed's step after every micro-batch (it acts at the accumulation boundary); True at the boundary."""
        # At the boundary engine.step() unscales, clips to gradient_clipping (= train.max_grad_norm, checked in
        # setup), steps the optimizer (skipped on fp16 overflow), steps the scheduler and zeroes the gradients.
        boundary = self.engine.is_gradient_accumulation_boundary()
        self.engine.step()
        return boundary

    def grad_norm(self):
        """ZeRO's global gradient norm before clipping; None when ds_config does not clip."""
        if not self.ds_config.get("gradient_clipping"):
            return None
        # ZeRO's norm before clipping, over every rank's partition (a tensor or a float by DeepSpeed version).
        return self.engine.get_global_grad_norm()

    def train(self, mode: bool = True) -> None:
        """Switch the model to training (True) or evaluation (False) mode."""
        self.engine.train(mode)

    def lr(self) -> float:
        """The current learning rate."""
        return float(self.engine.get_lr()[0])

    def gather_weights(self, dtype: torch.dtype, adapter_only: bool) -> dict[str, torch.Tensor] | None:
        """The trained weights in ``dtype`` on rank 0's host (None elsewhere; every rank calls it): ZeRO-3's
        partitions gathered, ZeRO-0/1/2's replica copied by rank 0 (adapter_only: the trainable tensors alone)."""
        from launcher.worker.export import gather_replicated, gather_zero3

        gather = gather_zero3 if self.stage == 3 else gather_replicated  # ZeRO-0/1/2: the module is replicated
        return gather(self.engine.module, dtype, adapter_only)

    def save(self, root: Path, tag: str) -> None:
        """Save DeepSpeed's checkpoint files under root/tag (the launcher writes its own "latest" afterwards)."""
        # Our own "latest" marker is written after every rank finished; DeepSpeed's would come too early.
        self.engine.save_checkpoint(str(root), tag=tag, save_latest=False)

    def load(self, root: Path, tag: str) -> None:
        """Load DeepSpeed's checkpoint root/tag with optimizer and schedule; RuntimeError when there is none."""
        path, _ = self.engine.load_checkpoint(
            str(root), tag=tag, load_optimizer_states=True, load_lr_scheduler_states=True
        )
        if path is None:
            raise RuntimeError(f"DeepSpeed found no checkpoint at {root}/{tag}")
