"""The worked example of notes/adding_an_op.md: aten::hypot (functional,
in-place and out=), checked against CPU PyTorch with its gradient."""

import torch

import torchtpu  # noqa: F401


def test_hypot_values_and_grad():
    a = torch.randn(3, 4, requires_grad=True)
    b = torch.randn(4)
    at = a.detach().to("tpu").requires_grad_()
    r, rt = torch.hypot(a, b), torch.hypot(at, b.to("tpu"))
    assert rt.dtype == r.dtype and rt.shape == r.shape
    torch.testing.assert_close(rt.cpu(), r)
    (g,) = torch.autograd.grad(r.sum(), a)
    (gt,) = torch.autograd.grad(rt.sum(), at)
    torch.testing.assert_close(gt.cpu(), g)


def test_hypot_inplace_and_out():
    x = torch.randn(2, 3)
    y = torch.randn(2, 3)
    xt = x.to("tpu")
    xt.t().hypot_(y.to("tpu").t())
    torch.testing.assert_close(xt.cpu(), torch.hypot(x, y))
    out = torch.empty(2, 3, device="tpu")
    torch.hypot(x.to("tpu"), y.to("tpu"), out=out)
    torch.testing.assert_close(out.cpu(), torch.hypot(x, y))
