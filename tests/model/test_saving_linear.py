"""The probe's stand-in for DeepSpeed's ZeRO-3 linear (launcher.model.activations._saving_linear) saves what
DeepSpeed's LinearFunctionForZeroStage3 saves, and computes what torch's linear computes."""

import pytest
import torch

from launcher.model.activations import _saving_linear


def saved(fn, x, w, b):
    packed = []

    def pack(t):
        packed.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(x, w, b)
    return out, packed


def kinds(packed, x, w, b):
    """Each saved tensor as what it is: the input, the Parameter, the bias, or something else (its shape)."""
    def kind(t):
        for name, ref in (("input", x), ("weight", w), ("bias", b)):
            if ref is not None and t is ref:
                return name
        return tuple(t.shape)
    return [kind(t) for t in packed]


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("frozen", [False, True])
def test_saves_what_deepspeeds_zero3_linear_saves(bias, frozen):
    from deepspeed.runtime.zero.linear import LinearFunctionForZeroStage3

    torch.manual_seed(0)
    x = torch.randn(2, 5, 8, requires_grad=True)
    w = torch.nn.Parameter(torch.randn(6, 8), requires_grad=not frozen)
    b = torch.nn.Parameter(torch.randn(6), requires_grad=not frozen) if bias else None
    ours, ours_saved = saved(_saving_linear(), x, w, b)
    theirs, theirs_saved = saved(LinearFunctionForZeroStage3.apply, x, w, b)
    assert kinds(ours_saved, x, w, b) == kinds(theirs_saved, x, w, b)
    assert "input" in kinds(ours_saved, x, w, b)  # a frozen weight's input too: what the planner counts
    torch.testing.assert_close(ours, torch.nn.functional.linear(x, w, b))
    torch.testing.assert_close(ours, theirs)
    # Its gradients are torch's.
    (g_ours,) = torch.autograd.grad(ours.square().sum(), x)
    (g_torch,) = torch.autograd.grad(torch.nn.functional.linear(x, w, b).square().sum(), x)
    torch.testing.assert_close(g_ours, g_torch)


def test_torchs_linear_saves_no_input_for_a_frozen_weight():
    # The other side of the choice: at::linear keeps weight.t() (a view of the gathered storage), not the input.
    x = torch.randn(2, 5, 8, requires_grad=True)
    w = torch.nn.Parameter(torch.randn(6, 8), requires_grad=False)
    _, packed = saved(torch.nn.functional.linear, x, w, None)
    assert not any(t is x for t in packed)
    assert any(t.data_ptr() == w.data_ptr() for t in packed)
