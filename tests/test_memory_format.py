"""Results laid out as CPU torch lays them out (issue 41): the strides of a
pointwise op's result follow its inputs' (channels_last, transposed, mixed
with broadcasts, as TensorIterator orders them), a convolution, pool, batch
norm or upsampling of channels_last input is channels_last, a cat of
channels_last tensors is channels_last, and empty/clone/contiguous/to honour
memory_format. Each case compares values, dtype, shape and strides with the
CPU's."""

import pytest
import torch
import torch.nn.functional as F
from _helpers import close, make

CL, CL3 = torch.channels_last, torch.channels_last_3d


def same(fn, *xs, grad=False):
    cpu = [x.clone(memory_format=torch.preserve_format) for x in xs]
    tpu = [x.to("tpu") for x in xs]
    for c, t in zip(cpu, tpu):
        assert c.stride() == t.stride()
        if grad and c.is_floating_point():
            c.requires_grad_()
            t.requires_grad_()
    want, got = fn(*cpu), fn(*tpu)
    wants, gots = (want, got) if isinstance(want, tuple) else ((want,), (got,))
    for w, g in zip(wants, gots):
        close(g, w)
        assert g.stride() == w.stride(), (g.stride(), w.stride())
    if grad:
        wants[0].sum().backward()
        gots[0].sum().backward()
        for c, t in zip(cpu, tpu):
            if c.grad is not None:
                close(t.grad, c.grad)


def nchw(*shape, seed=0, fmt=CL):
    return make(shape, seed=seed).contiguous(memory_format=fmt)


def t2(seed=0):
    return make((5, 3), seed=seed).t()  # a transposed view: strides (1, 3)


POINTWISE = {
    "add channels_last": (lambda a, b: a + b, lambda: [nchw(2, 3, 4, 5), nchw(2, 3, 4, 5, seed=1)]),
    "add channels_last and row-major": (lambda a, b: a + b, lambda: [nchw(2, 3, 4, 5), make((2, 3, 4, 5), seed=1)]),
    "add row-major and channels_last": (lambda a, b: a + b, lambda: [make((2, 3, 4, 5)), nchw(2, 3, 4, 5, seed=1)]),
    "mul by a per-channel broadcast": (lambda a, b: a * b, lambda: [nchw(2, 3, 4, 5), make((3, 1, 1), seed=1)]),
    "add a scalar": (lambda a: a + 1.5, lambda: [nchw(2, 3, 4, 5)]),
    "relu": (torch.relu, lambda: [nchw(2, 3, 4, 5)]),
    "exp of a transposed view": (torch.exp, lambda: [t2()]),
    "sub of transposed views": (lambda a, b: a - b, lambda: [t2(), t2(1)]),
    "transposed and row-major": (lambda a, b: a * b, lambda: [t2(), make((3, 5), seed=1)]),
    "where": (lambda a, b: torch.where(a > 0, a, b), lambda: [nchw(2, 3, 4, 5), nchw(2, 3, 4, 5, seed=1)]),
    "comparison gives bool": (lambda a: a > 0, lambda: [nchw(2, 3, 4, 5)]),
    "to int": (lambda a: a.to(torch.int32), lambda: [nchw(2, 3, 4, 5)]),
    "channels_last_3d": (lambda a: a.sigmoid(), lambda: [nchw(2, 3, 2, 4, 5, fmt=CL3)]),
    "permuted 3-d": (lambda a: a * 2, lambda: [make((4, 3, 5)).permute(2, 0, 1)]),
    "expanded": (lambda a: a + 1, lambda: [make((3, 1)).expand(3, 4)]),
    "gelu backward": (F.gelu, lambda: [nchw(2, 3, 4, 5)]),
}


@pytest.mark.parametrize("name", sorted(POINTWISE))
def test_pointwise_result_layout(name):
    fn, inputs = POINTWISE[name]
    same(fn, *inputs(), grad=name == "gelu backward")


FOLLOW = {
    "conv2d": (lambda x: F.conv2d(x, make((4, 3, 3, 3), seed=2).to(x.device), padding=1), lambda: [nchw(2, 3, 6, 6)]),
    "conv2d, channels_last weight": (
        lambda x: F.conv2d(x, make((4, 3, 3, 3), seed=2).to(x.device).contiguous(memory_format=CL)),
        lambda: [make((2, 3, 6, 6))],
    ),
    "conv3d (row-major on the CPU)": (
        lambda x: F.conv3d(x, make((2, 3, 2, 2, 2), seed=2).to(x.device)),
        lambda: [nchw(1, 3, 3, 4, 4, fmt=CL3)],
    ),
    "max_pool2d": (lambda x: F.max_pool2d(x, 2), lambda: [nchw(2, 3, 6, 6)]),
    "max_pool2d with indices": (lambda x: F.max_pool2d(x, 2, return_indices=True), lambda: [nchw(2, 3, 6, 6)]),
    "avg_pool2d": (lambda x: F.avg_pool2d(x, 2), lambda: [nchw(2, 3, 6, 6)]),
    "adaptive_avg_pool2d": (lambda x: F.adaptive_avg_pool2d(x, 3), lambda: [nchw(2, 3, 6, 6)]),
    "adaptive_max_pool2d": (lambda x: F.adaptive_max_pool2d(x, 3), lambda: [nchw(2, 3, 6, 6)]),
    "batch_norm": (lambda x: F.batch_norm(x, None, None, training=True), lambda: [nchw(2, 3, 4, 5)]),
    "interpolate nearest": (lambda x: F.interpolate(x, scale_factor=2), lambda: [nchw(2, 3, 4, 5)]),
    "interpolate bilinear": (
        lambda x: F.interpolate(x, scale_factor=2, mode="bilinear"),
        lambda: [nchw(2, 3, 4, 5)],
    ),
    "max_pool3d": (lambda x: F.max_pool3d(x, 2), lambda: [nchw(1, 3, 4, 4, 4, fmt=CL3)]),
    "avg_pool3d (row-major on the CPU)": (lambda x: F.avg_pool3d(x, 2), lambda: [nchw(1, 3, 4, 4, 4, fmt=CL3)]),
    "adaptive_avg_pool3d (row-major)": (lambda x: F.adaptive_avg_pool3d(x, 2), lambda: [nchw(1, 3, 4, 4, 4, fmt=CL3)]),
    "adaptive_avg_pool2d to 1x1": (lambda x: F.adaptive_avg_pool2d(x, 1), lambda: [nchw(2, 3, 4, 5)]),
    "max_unpool2d": (lambda x: F.max_unpool2d(*F.max_pool2d(x, 2, return_indices=True), 2), lambda: [nchw(2, 3, 4, 6)]),
    "batch_norm 3d": (lambda x: F.batch_norm(x, None, None, training=True), lambda: [nchw(1, 3, 2, 4, 5, fmt=CL3)]),
    "batch_norm eval": (
        lambda x: F.batch_norm(x, torch.zeros(3, device=x.device), torch.ones(3, device=x.device)),
        lambda: [nchw(2, 3, 4, 5)],
    ),
    "group_norm": (lambda x: F.group_norm(x, 3), lambda: [nchw(2, 6, 4, 5)]),
    "layer_norm (row-major)": (lambda x: F.layer_norm(x, [5]), lambda: [nchw(2, 3, 4, 5)]),
    "reflect pad": (lambda x: F.pad(x, (1, 1, 1, 1), mode="reflect"), lambda: [nchw(2, 3, 4, 5)]),
    "replicate pad": (lambda x: F.pad(x, (1, 1, 1, 1), mode="replicate"), lambda: [nchw(2, 3, 4, 5)]),
    "reflect pad 3d": (lambda x: F.pad(x, (1, 1, 1, 1, 1, 1), mode="reflect"), lambda: [nchw(1, 3, 2, 4, 5, fmt=CL3)]),
    "interpolate bicubic": (lambda x: F.interpolate(x, scale_factor=2, mode="bicubic"), lambda: [nchw(2, 3, 4, 5)]),
    "interpolate nearest-exact": (
        lambda x: F.interpolate(x, scale_factor=2, mode="nearest-exact"),
        lambda: [nchw(2, 3, 4, 5)],
    ),
    "interpolate antialiased": (
        lambda x: F.interpolate(x, scale_factor=0.5, mode="bilinear", antialias=True),
        lambda: [nchw(2, 3, 4, 6)],
    ),
    "interpolate nearest 3d": (lambda x: F.interpolate(x, scale_factor=2), lambda: [nchw(1, 3, 2, 3, 4, fmt=CL3)]),
    "interpolate trilinear": (
        lambda x: F.interpolate(x, scale_factor=2, mode="trilinear"),
        lambda: [nchw(1, 3, 2, 3, 4, fmt=CL3)],
    ),
    "softmax over channels (row-major)": (lambda x: x.softmax(1), lambda: [nchw(2, 3, 4, 5)]),
}


@pytest.mark.parametrize("name", sorted(FOLLOW))
def test_nn_result_layout(name):
    fn, inputs = FOLLOW[name]
    same(fn, *inputs(), grad="indices" not in name)


def test_dropout_layout():
    x = nchw(2, 3, 4, 5)
    want = F.dropout(x, 0.5).stride()
    got = F.dropout(x.to("tpu"), 0.5)
    assert got.stride() == want
    kept = got.cpu() != 0
    close(got.cpu()[kept], x[kept] * 2)


def test_cat_layout():
    same(lambda a, b: torch.cat([a, b], 1), nchw(2, 3, 4, 5), nchw(2, 2, 4, 5, seed=1))
    same(lambda a, b: torch.cat([a, b]), nchw(2, 3, 4, 5), make((1, 3, 4, 5), seed=1))  # mixed: row-major
    same(lambda a, b: torch.cat([a, b]), nchw(1, 3, 2, 4, 5, fmt=CL3), nchw(1, 3, 2, 4, 5, seed=1, fmt=CL3))


def test_explicit_memory_formats():
    for dev in ("cpu", "tpu"):
        assert torch.empty(2, 3, 4, 5, device=dev, memory_format=CL).stride() == (60, 1, 15, 3)
        assert torch.empty(2, 3, 2, 4, 5, device=dev, memory_format=CL3).stride() == (120, 1, 60, 15, 3)
        with pytest.raises(RuntimeError, match="required rank 4 tensor to use channels_last format"):
            torch.empty(2, 3, 4, device=dev, memory_format=CL)
    x = make((2, 3, 4, 5))
    same(lambda a: a.contiguous(memory_format=CL), x)
    same(lambda a: a.contiguous(memory_format=CL).contiguous(), x)
    same(lambda a: a.clone(), nchw(2, 3, 4, 5))
    same(lambda a: a.clone(), t2())  # preserve keeps a dense tensor's strides
    same(lambda a: a[:, :, ::2].clone(), nchw(2, 3, 4, 5))  # not dense: its suggested format
    same(lambda a: a.clone(memory_format=torch.contiguous_format), nchw(2, 3, 4, 5))
    same(lambda a: a.to(memory_format=CL), x)
    same(lambda a: a.to(torch.float64, memory_format=CL), x)


def test_channels_last_training_step():
    """A small CNN in channels_last: losses and gradients equal the CPU's,
    every activation keeps the format."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3, padding=1),
        torch.nn.BatchNorm2d(4),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(4, 2, 3),
    ).to(memory_format=CL)
    tnet = torch.nn.Sequential(*[m for m in __import__("copy").deepcopy(net)]).to("tpu")
    x = nchw(2, 3, 8, 8)
    want, got = net(x), tnet(x.to("tpu"))
    close(got, want, tol=1e-4)
    assert got.stride() == want.stride() and got.is_contiguous(memory_format=CL)
    want.square().mean().backward()
    got.square().mean().backward()
    for p, q in zip(net.parameters(), tnet.parameters()):
        close(q.grad, p.grad, tol=1e-4)
