"""The low-memory optimizers of Strategy.low_memory_optimizer (docs/memory-model.md "Low-memory optimizers").

adamw8bit / adamw4bit  torchao.optim.AdamW8bit / AdamW4bit: AdamW whose two moments are stored block-wise
                       quantized (8-bit codes per element, or 4-bit packed two to a byte, with one fp32 scale per
                       block of 256 / 128 elements); a tensor under 4096 elements, or one whose (local) size the
                       block does not divide, keeps fp32 moments (torchao/optim/adam.py _AdamBase._new_buffer).
                       lr, betas, eps and weight_decay mean what they mean for AdamW: the job's train.lr and
                       train.weight_decay, base.ADAM_BETAS and base.ADAM_EPS, the same numbers as the plain run.
paged_adamw8bit        bitsandbytes.optim.PagedAdamW8bit: AdamW with 8-bit moments (one fp32 absmax per block of 256,
                       fp32 moments under 4096 elements), the large ones in CUDA managed memory, paged to the device
                       for each tensor's step (on CPU ranks plain tensors: bitsandbytes pages only on CUDA). The same
                       lr, betas, eps and weight_decay. Over FSDP2's DTensors it steps the local shards
                       (local_shards); bf16 weights are rounded to nearest by its kernel.
adafactor              torch.optim.Adafactor: no first moment (torch's has no beta1, so betas do not apply), a
                       factored second moment (a row and a column vector per matrix, the full vector for 1-D
                       tensors) decaying by beta2_t = 1 - t^-0.8 (beta2_decay). train.lr is its lr, which caps the
                       relative step size rho_t = min(lr, 1/sqrt(t)) that scales each update by the parameter's RMS:
                       not AdamW's absolute step. eps keeps torch's (None: the dtype's eps; 1e-3 for the RMS floor).

On FSDP2 all three step DTensor shards. torchao builds each state on the local shard and wraps it back into a
DTensor (_new_buffer). torch's Adafactor does not run on them (its in-place square_ of a column norm is refused
by DTensor's sharding propagation, torch 2.13), so ShardedAdafactor runs its single-tensor step on the local
shard and all-reduces over the shard group what spans rows (column means, the row variance's mean and the two
RMS norms): the same update as on the whole tensor. All of them run on CPU ranks.

Pure bf16 (Strategy.pure_bf16) steps the job's Adam or AdamW with stochastic rounding: torchao's _AdamBase with
no quantized state (block_size inf, as torchao.optim._AdamW; the states zeros_like the bf16 parameter) and
bf16_stochastic_round=True. single_param_adam computes the update in fp32 and rounds the new bf16 weight up or
down with the probability of its distance to each (quant_utils._fp32_to_bf16_sr), so an update under half a bf16
ulp of the weight, which rounding to nearest drops every step, is kept in expectation. It runs on FSDP2's DTensor
shards as the low-bit ones do, and eagerly on CPU (_eager). Its random bits come from a seed that replicas of a
shard share (rounding_seed), so hybrid sharding's replicas stay equal. SGD keeps torch's step (round to nearest):
torchao has no stochastically rounded SGD.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from launcher.levers.low_memory_optimizer import PAGED

LOW_BIT_BLOCK = {"adamw8bit": 256, "adamw4bit": 128}
"""torchao's default block sizes (AdamW8bit, AdamW4bit), which these optimizers use."""


def _eager(cls):
    """``cls`` whose step runs eagerly on CPU: torchao compiles its step (torch.compile(single_param_adam,
    dynamic=False)) once per parameter shape, which took 170 s for three shapes on a 2-core CPU host; eager costs
    a few seconds per step instead and holds its fp32 working copies (counted by the memory model)."""

    class Eager(cls):
        def step(self, closure=None):
            if any(p.device.type == "cpu" for g in self.param_groups for p in g["params"]):
                with torch.compiler.set_stance("force_eager"):
                    return super().step(closure)
            return super().step(closure)

    Eager.__name__ = Eager.__qualname__ = cls.__name__
    return Eager


def _fp32_appearance(cls, name: str):
    """``cls`` (a torchao low-bit AdamW) whose quantized moments appear as fp32 over bf16 weights.

    torchao gives a quantized state the weight's dtype as its appearance (adam.py _subclass_zeros: dtype=p.dtype).
    Over bf16 DTensor shards single_param_adam's exp_avg.float() then stays a bf16 DTensor while the gradient's
    .float() is fp32, and DTensor's sharding propagation refuses their lerp (torch 2.13, torchao 0.18). An fp32
    appearance, what they have over fp32 weights, makes .float() a no-op there; the codes and scales stored are
    the same (uint8, fp32 scales), and the moments torchao does not quantize stay in the weights' bf16."""
    from torchao.optim.subclass_4bit import OptimState4bit
    from torchao.optim.subclass_8bit import OptimState8bit

    state = OptimState8bit if name == "adamw8bit" else OptimState4bit

    class Fp32Appearance(cls):
        @staticmethod
        def _subclass_zeros(p: torch.Tensor, signed: bool, block_size: int):
            return state.zeros(p.shape, signed, block_size, p.device, dtype=torch.float32)

    Fp32Appearance.__name__ = Fp32Appearance.__qualname__ = cls.__name__
    return Fp32Appearance


def _shard_group(p: torch.Tensor):
    """The process group a DTensor parameter is sharded over along dim 0 (None: a plain or replicated tensor)."""
    from torch.distributed.tensor import DTensor, Shard

    if not isinstance(p, DTensor):
        return None
    dims = [i for i, pl in enumerate(p.placements) if isinstance(pl, Shard)]
    if not dims:
        return None
    if len(dims) > 1 or p.placements[dims[0]].dim != 0:
        raise NotImplementedError(f"adafactor: a parameter sharded as {p.placements} (FSDP2 shards dim 0 once)")
    return p.device_mesh.get_group(dims[0])


def _summed(t: torch.Tensor, group) -> torch.Tensor:
    if group is not None:
        dist.all_reduce(t, group=group)
    return t


class ShardedAdafactor(torch.optim.Adafactor):
    """torch.optim.Adafactor whose step runs on FSDP2's DTensor shards (and on plain tensors, the same math).

    The step is torch's _single_tensor_adafactor (torch/optim/_adafactor.py) with each whole-tensor reduction
    summed over the shard group; the states are the same (row_var, col_var, variance, step), kept as DTensors
    (row_var and variance sharded like the parameter, col_var replicated) so a distributed checkpoint saves them.
    """

    @torch.no_grad()
    def step(self, closure=None):
        """One Adafactor step over every parameter with a gradient; returns the closure's loss, if one was given."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self._step_param(p, group)
        return loss

    def _init_state(self, p: torch.Tensor, g: torch.Tensor) -> dict:
        from torch.distributed.tensor import DTensor, Replicate

        def like_param(t, shape):
            if not isinstance(p, DTensor):
                return t
            stride = torch.empty(shape, device="meta").stride()
            return DTensor.from_local(t, p.device_mesh, p.placements, run_check=False, shape=shape, stride=stride)

        def replicated(t):
            if not isinstance(p, DTensor):
                return t
            return DTensor.from_local(t, p.device_mesh, [Replicate()] * p.device_mesh.ndim, run_check=False)

        state = self.state[p]
        state["step"] = torch.tensor(0.0)
        if p.dim() == 2:
            state["row_var"] = like_param(g.new_zeros(g.shape[0], 1), (p.shape[0], 1))
            state["col_var"] = replicated(g.new_zeros(1, g.shape[1]))
        elif p.dim() == 1:
            state["variance"] = like_param(torch.zeros_like(g), tuple(p.shape))
        else:
            raise NotImplementedError(f"adafactor: a {p.dim()}-D parameter (transformers' are 1-D or 2-D)")
        return state

    def _step_param(self, p: torch.Tensor, group: dict) -> None:
        from torch.distributed.tensor import DTensor

        def local(t):
            return t.to_local() if isinstance(t, DTensor) else t

        pg = _shard_group(p)
        x, g = local(p), local(p.grad)
        if group["maximize"]:
            g = -g
        state = self.state[p] or self._init_state(p, g)
        lr, d, wd = float(group["lr"]), group["d"], group["weight_decay"]
        eps1, eps2 = group["eps"]
        eps1 = torch.finfo(x.dtype).eps if eps1 is None else eps1
        state["step"] += 1
        t = state["step"].item()
        one_minus_beta2_t = t ** group["beta2_decay"]
        rho_t = min(lr, 1 / t**0.5)
        numel = p.numel()  # the whole tensor's, for RMS norms over every shard
        rms = (_summed(torch.linalg.vector_norm(x).square(), pg) / numel).sqrt().item()
        alpha = max(eps2, rms) * rho_t
        if wd != 0:
            x.mul_(1 - lr * wd)
        if p.dim() == 2:
            row_var, col_var = local(state["row_var"]), local(state["col_var"])
            row_var.lerp_(torch.norm(g, dim=-1, keepdim=True).square_().div_(g.size(-1)), one_minus_beta2_t)
            col = _summed(torch.norm(g, dim=-2, keepdim=True).square_(), pg).div_(p.size(0))
            col_var.lerp_(col, one_minus_beta2_t)
            var_estimate = row_var @ col_var
            row_mean = _summed(row_var.sum(dim=-2, keepdim=True), pg).div_(p.size(0))
            var_estimate.div_(row_mean.clamp_(min=eps1))
        else:
            variance = local(state["variance"])
            variance.lerp_(g * g, one_minus_beta2_t)
            var_estimate = variance.clone()
        update = var_estimate.clamp_(min=eps1 * eps1).rsqrt_()
        update.mul_(g)
        update_rms = (_summed(torch.linalg.vector_norm(update).square(), pg) / numel).sqrt().item()
        x.add_(update, alpha=-alpha / max(1.0, update_rms / d))


def low_memory_optimizer(name: str, train, params: list, *, betas: tuple[float, float], eps: float,
                         stochastic_round: bool = False, salt: int = 0) -> torch.optim.Optimizer:
    """Strategy.low_memory_optimizer ``name`` over ``params`` with the job's lr and weight decay.

    ``stochastic_round`` (pure bf16, the engines of EngineSpec.pure_bf16_optimizers): the low-bit AdamW steps the
    bf16 weights with torchao's bf16_stochastic_round, the same single_param_adam rounding as
    stochastic_round_adam, with replica-consistent bits (rounding_seed, ``salt``); its moments stay quantized
    (the few tensors torchao does not quantize keep moments in the weights' bf16: _new_buffer's zeros_like).
    Adafactor has no stochastically rounding step: refused."""
    if name == "adafactor":
        if stochastic_round:
            raise ValueError("adafactor has no stochastically rounding step; pure bf16 pairs with adamw8bit or "
                             "adamw4bit")
        return ShardedAdafactor(params, lr=train.lr, weight_decay=train.weight_decay, foreach=False)
    if name == PAGED:
        # bitsandbytes' kernel steps bf16 weights itself, rounding to nearest: no stochastic rounding to ask for.
        return local_shards(_paged_class())(params, lr=train.lr, betas=betas, eps=eps,
                                            weight_decay=train.weight_decay)
    if name not in LOW_BIT_BLOCK:
        raise ValueError(f"unknown low_memory_optimizer {name!r}")
    from torchao.optim import AdamW4bit, AdamW8bit

    cls = _eager(AdamW8bit if name == "adamw8bit" else AdamW4bit)
    if stochastic_round:
        cls = _replica_consistent(_fp32_appearance(cls, name))
    opt = cls(params, lr=train.lr, betas=betas, eps=eps, weight_decay=train.weight_decay,
              block_size=LOW_BIT_BLOCK[name], bf16_stochastic_round=stochastic_round)
    if stochastic_round:
        opt.rounding_salt = salt
    return opt


def _paged_class():
    """bitsandbytes.optim.PagedAdamW8bit (imported on use: only its ranks need bitsandbytes)."""
    from bitsandbytes.optim import PagedAdamW8bit

    return PagedAdamW8bit


def _evict(state: dict) -> None:
    """Send a paged state's pages back to the host once its tensor has stepped (bitsandbytes' prefetch_tensor with
    to_cpu: cudaMemPrefetchAsync to the host, on the stream the step ran on), so the device holds one tensor's pages
    at a time whatever room the card has: the working set the plan counts (terms.page_state), and no managed pages
    left resident where the rank measures device memory outside the allocator. Plain tensors (CPU ranks, tensors
    under bitsandbytes' paging size) stay where they are."""
    paged = [t for t in (state.get("state1"), state.get("state2")) if getattr(t, "is_paged", False)]
    if paged:
        from bitsandbytes import functional as F

        for t in paged:
            F.prefetch_tensor(t, to_cpu=True)


def local_shards(cls):
    """``cls`` (a bitsandbytes optimizer) stepping FSDP2's DTensor parameters through their local shards.

    bitsandbytes' kernels are custom ops DTensor has no sharding rule for, so each tensor's state is built and
    stepped on the plain local tensor (DTensor.to_local under no_grad is the shard's own storage, which FSDP2 steps
    in place) with the local gradient; the state stays keyed by the DTensor parameter, as get_state_dict reads it.
    Plain tensors (DeepSpeed's, a test's) step as they are. On CUDA the large states are paged (managed memory) and
    sent back to the host after each tensor's step (_evict); on CPU bitsandbytes keeps plain tensors and steps them
    with its CPU kernel (it warns once that it does not page)."""

    class LocalShards(cls):
        def _local(self, p: torch.Tensor):
            from torch.distributed.tensor import DTensor

            if not isinstance(p, DTensor):
                return p
            q = p.to_local()
            q.grad = p.grad.to_local() if p.grad is not None else None
            self.state[q] = self.state[p]  # the same dict: what bitsandbytes writes under q is p's
            return q

        def _on_local(self, method, group, p, gindex, pindex) -> None:
            q = self._local(p)
            try:
                method(group, q, gindex, pindex)
            finally:
                if q is not p:
                    del self.state[q]
                    q.grad = None

        @torch.no_grad()
        def init_state(self, group, p, gindex, pindex):
            self._on_local(super().init_state, group, p, gindex, pindex)

        @torch.no_grad()
        def update_step(self, group, p, gindex, pindex):
            self._on_local(super().update_step, group, p, gindex, pindex)
            _evict(self.state[p])

    LocalShards.__name__ = LocalShards.__qualname__ = cls.__name__
    return LocalShards


def rounding_seed(opt: torch.optim.Optimizer, salt: int, part: int = 0) -> int:
    """The seed of one stochastically rounded step: the same on every replica of a shard, different per shard.

    torchao draws the rounding bits from the global generator, which the worker seeds per rank (distinct dropout
    masks). Under hybrid sharding the ranks that hold the same shard on different nodes must round it alike, or
    the replicas drift apart; so each step draws from a seed of (salt, the step count, the shard's coordinates on
    the mesh's sharded dimensions): ``salt`` tells apart optimizers stepped one at a time (the step in backward),
    ``part`` the tensors one optimizer steps one after another at the same step count (ZeRO-3's sub-groups).
    The step count is the optimizer's own state, so a resumed run goes on with the seeds it would have used.
    """
    import hashlib

    from torch.distributed.tensor import DTensor, Shard

    p = next((p for g in opt.param_groups for p in g["params"] if p.grad is not None), None)
    step = int(opt.state[p]["step"]) if p is not None and opt.state[p] else 0
    coord: tuple[int, ...] = ()
    if isinstance(p, DTensor):
        where = p.device_mesh.get_coordinate() or []
        coord = tuple(where[i] for i, pl in enumerate(p.placements) if isinstance(pl, Shard))
    digest = hashlib.sha256((f"{salt}:{step}:{coord}" + (f":{part}" if part else "")).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def _replica_consistent(cls):
    """``cls`` whose step rounds with bits from rounding_seed, leaving the caller's random state as it was."""

    class Consistent(cls):
        rounding_salt = 0
        _last_seed, _part = None, 0

        def step(self, closure=None):
            seed = rounding_seed(self, self.rounding_salt)
            # DeepSpeed's ZeRO-3 steps its one client optimizer once per sub-group, each time over that sub-group's
            # flat partition alone (stage3.py _optimizer_step swaps it into the group's params), all at the same
            # step count: each later one in a step is a part of its own, or every sub-group of a rank would round
            # with the same bits. The order of the sub-groups is fixed, so a resumed run counts them alike.
            self._part = self._part + 1 if seed == self._last_seed else 0
            self._last_seed = seed
            if self._part:
                seed = rounding_seed(self, self.rounding_salt, self._part)
            cuda = [p.device for g in self.param_groups for p in g["params"] if p.device.type == "cuda"]
            with torch.random.fork_rng(devices=cuda[:1]):
                torch.manual_seed(seed)
                return super().step(closure)

    Consistent.__name__ = Consistent.__qualname__ = cls.__name__
    return Consistent


def stochastic_round_adam(train, params: list, *, betas: tuple[float, float], eps: float,
                          salt: int = 0) -> torch.optim.Optimizer:
    """Pure bf16's Adam or AdamW (train.optimizer), with the job's lr and weight decay, rounding stochastically
    with replica-consistent bits (rounding_seed; ``salt``: this optimizer's index among one-parameter ones)."""
    if train.optimizer not in ("adam", "adamw"):
        raise ValueError(f"stochastic rounding: train.optimizer {train.optimizer!r} is not adam or adamw")
    from torchao.optim.adam import _AdamBase

    # torchao.optim._AdamW is this with is_adamw=True; Adam adds the decay to the gradient (torch.optim.Adam's L2).
    opt = _replica_consistent(_eager(_AdamBase))(
        params, train.lr, betas, eps, train.weight_decay, False, block_size=float("inf"),
        bf16_stochastic_round=True, is_adamw=train.optimizer == "adamw")
    opt.rounding_salt = salt
    return opt
