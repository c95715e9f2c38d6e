"""launcher.model.sac: the op policy's replay counts every op of a block, so code inside a block that runs differently
in the recompute (ZeRO-3's parameter fetch) must be unseen."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack
from torch.utils.checkpoint import checkpoint
from torch.utils.checkpoint import noop_context_fn as full_recompute

from launcher.model.sac import sac_context, unseen


def in_recompute() -> bool:
    # As DeepSpeed tells its recompute (partitioned_param_coordinator.py): a forward while autograd runs backward.
    return torch._C._current_graph_task_id() != -1


def block(x, w1, w2, side, hide, fetch_when):
    """Two matmuls and a cat, the block's own ops; before them a "fetch" (ops on ``side``, no part of the block) that
    runs only in the pass ``fetch_when`` names, inside ``unseen`` when ``hide``."""
    if fetch_when(in_recompute()):
        with unseen() if hide else torch.no_grad():
            side.append(torch.cat([side[0], side[0]]) @ torch.ones(4, 4))
    h = torch.relu(x @ w1)
    h = torch.cat([h[:, :2], h[:, 2:]], dim=1)
    return (h @ w2).sin()


def grads(context_fn, hide, fetch_when):
    torch.manual_seed(0)
    x = torch.randn(4, 4, requires_grad=True)
    w1, w2 = torch.randn(4, 4, requires_grad=True), torch.randn(4, 4, requires_grad=True)
    side = [torch.randn(2, 4)]
    out = checkpoint(block, x, w1, w2, side, hide, fetch_when, use_reentrant=False, context_fn=context_fn)
    out.square().sum().backward()
    return [t.grad for t in (x, w1, w2)]


def recompute_only(recompute: bool) -> bool:
    return recompute


def forward_only(recompute: bool) -> bool:
    return not recompute


def test_a_fetch_in_the_recompute_alone_breaks_the_replay_unless_unseen():
    with pytest.raises(RuntimeError, match="encountered during backward but not found in storage"):
        grads(sac_context, hide=False, fetch_when=recompute_only)
    want = grads(full_recompute, hide=False, fetch_when=recompute_only)
    got = grads(sac_context, hide=True, fetch_when=recompute_only)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


def test_a_fetch_in_the_forward_alone_hands_back_a_wrong_tensor_unless_unseen():
    # The fetch's matmul takes index 0 of aten.mm, which the policy saves; the recompute's first matmul, the block's
    # own, is then handed the fetch's saved output: no error, a wrong gradient.
    want = grads(full_recompute, hide=False, fetch_when=forward_only)
    wrong = grads(sac_context, hide=False, fetch_when=forward_only)
    assert not all(torch.equal(a, b) for a, b in zip(wrong, want, strict=True))
    got = grads(sac_context, hide=True, fetch_when=forward_only)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


class Count(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def test_unseen_keeps_every_other_mode_and_restores_the_stack():
    # The CPU ranks' MemTracker is such a mode, entered before the block: it must still count a fetch's tensors.
    seen = {}

    def body(x):
        before = list(_get_current_dispatch_mode_stack())
        with unseen():
            inside = list(_get_current_dispatch_mode_stack())
            n = outer.ops
            torch.ones(3).add_(1)
            seen["counted"] = outer.ops - n
        assert list(_get_current_dispatch_mode_stack()) == before
        seen.setdefault("inside", inside)
        return (x * 2).sin()

    x = torch.randn(3, requires_grad=True)
    with Count() as outer:
        checkpoint(body, x, use_reentrant=False, context_fn=sac_context).sum().backward()
    assert seen["inside"] == [outer] and seen["counted"] == 2
    with unseen():  # outside a block: nothing to hide
        assert _get_current_dispatch_mode_stack() == []
