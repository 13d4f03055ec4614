"""nn family against CPU PyTorch: losses and their gradients, attention,
random ops (statistics) and FFTs."""
import math

import pytest
import torch
import torch.nn.functional as F

import torchtpu  # noqa: F401


def tpu(x):
    return x.to("tpu") if isinstance(x, torch.Tensor) else x


def rnd(*shape, seed=0, dtype=torch.float32, low=-2.0, high=2.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(shape, generator=g) * (high - low) + low).to(dtype)


def compare(fn, args, grad_args=(), atol=1e-5, rtol=1.3e-6, **kw):
    """fn on CPU vs tpu copies: values, dtype, shape; then the float32
    gradients of args listed in grad_args."""
    want = fn(*args, **kw)
    tkw = {k: tpu(v) for k, v in kw.items()}
    got = fn(*[tpu(a) for a in args], **tkw)
    assert got.device.type == "tpu"
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got.cpu(), want, atol=atol, rtol=rtol)
    if not grad_args:
        return
    ca = [a.clone().requires_grad_(i in grad_args) if isinstance(a, torch.Tensor) and a.is_floating_point() else a
          for i, a in enumerate(args)]
    ta = [tpu(a).detach().requires_grad_(i in grad_args) if isinstance(a, torch.Tensor) and a.is_floating_point()
          else tpu(a) for i, a in enumerate(args)]
    wo, go = fn(*ca, **kw), fn(*ta, **tkw)
    gw = torch.randn(wo.shape, generator=torch.Generator().manual_seed(7))
    wo.backward(gw)
    go.backward(tpu(gw))
    for i in grad_args:
        torch.testing.assert_close(ta[i].grad.cpu(), ca[i].grad, atol=atol * 10, rtol=1e-4)


RED = ["none", "mean", "sum"]


# ---- losses ---------------------------------------------------------------------------------

@pytest.mark.parametrize("red", RED)
def test_pointwise_losses(red):
    x, y = rnd(4, 5), rnd(4, 5, seed=1)
    compare(F.mse_loss, (x, y), (0, 1), reduction=red)
    compare(F.smooth_l1_loss, (x, y), (0, 1), reduction=red, beta=0.7)
    compare(F.smooth_l1_loss, (x, y), (0,), reduction=red, beta=0.0)
    compare(F.huber_loss, (x, y), (0, 1), reduction=red, delta=0.5)
    p, t = rnd(4, 5, low=0.05, high=0.95), rnd(4, 5, seed=2, low=0, high=1)
    compare(F.binary_cross_entropy, (p, t), (0,), reduction=red)
    compare(F.binary_cross_entropy, (p, t, rnd(5, seed=3, low=0.1, high=1)), (0,), reduction=red)


def test_pointwise_losses_bf16_noncontiguous_out():
    x, y = rnd(6, 4).t(), rnd(4, 6, seed=1)
    compare(F.mse_loss, (x, y), (0,))
    compare(F.mse_loss, (x.bfloat16(), y.bfloat16()), atol=1e-2, rtol=1e-2)
    out = torch.empty((), device="tpu")
    torch._C._nn.mse_loss(tpu(x), tpu(y), 1, out=out)
    torch.testing.assert_close(out.cpu(), F.mse_loss(x, y))
    with pytest.raises(RuntimeError):
        F.huber_loss(tpu(x), tpu(y), delta=-1.0)


@pytest.mark.parametrize("red", RED)
def test_class_losses(red):
    x = rnd(3, 5)
    tgt = torch.tensor([1, 0, 4])
    w = rnd(5, seed=4, low=0.1, high=1)
    compare(F.multi_margin_loss, (x, tgt), (0,), reduction=red)
    compare(F.multi_margin_loss, (x, tgt), (0,), reduction=red, p=2, margin=0.7, weight=w)
    compare(F.multi_margin_loss, (rnd(5), torch.tensor([2])), (0,), reduction=red)
    ml = torch.tensor([[3, 0, -1, 1, 2], [1, -1, 0, 0, 0], [4, 3, 2, 1, 0]])
    compare(F.multilabel_margin_loss, (x, ml), (0,), reduction=red)
    compare(F.multilabel_margin_loss, (rnd(5), ml[0]), (0,), reduction=red)
    x4, t3 = rnd(2, 4, 3, 3), torch.randint(0, 4, (2, 3, 3), generator=torch.Generator().manual_seed(0))
    compare(F.nll_loss, (x4, t3), (0,), reduction=red)
    compare(F.nll_loss, (x4, t3), (0,), reduction=red, weight=w[:4], ignore_index=2)
    compare(F.cross_entropy, (x4, t3), (0,), reduction=red, label_smoothing=0.1)


def test_class_loss_errors():
    with pytest.raises(RuntimeError):
        F.multi_margin_loss(tpu(rnd(3, 5)), tpu(torch.tensor([1, 2])))
    with pytest.raises(RuntimeError):
        F.nll_loss(tpu(rnd(2, 4, 3, 3)), tpu(torch.zeros(2, 3, 4, dtype=torch.long)))
