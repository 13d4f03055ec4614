"""Conv family against CPU PyTorch: convolutions (plain, transposed, grouped,
dilated, strided), pooling, normalization and upsampling: values, dtypes,
shapes, float32 gradients, non-contiguous inputs, out= variants and errors."""

import pytest
import torch
import torch.nn.functional as F
from _helpers import close, make

import torchtpu  # noqa: F401


def tpu(x):
    return x.to("tpu") if isinstance(x, torch.Tensor) else x


def check(fn, *args, grad=True, **kw):
    """fn on CPU and tpu: outputs, and float32 gradients of every float input."""
    cpu = [
        a.detach().clone().requires_grad_(grad and a.is_floating_point()) if isinstance(a, torch.Tensor) else a
        for a in args
    ]
    dev = [
        a.detach().to("tpu").requires_grad_(grad and a.is_floating_point()) if isinstance(a, torch.Tensor) else a
        for a in args
    ]
    want, got = fn(*cpu, **kw), fn(*dev, **kw)
    wants = want if isinstance(want, tuple) else (want,)
    gots = got if isinstance(got, tuple) else (got,)
    for w, g in zip(wants, gots):
        close(g, w)
    w0 = wants[0]
    if grad and w0.is_floating_point() and w0.dtype == torch.float32:
        go = make(w0.shape, seed=7)
        w0.backward(go)
        gots[0].backward(go.to("tpu"))
        for c, d in zip(cpu, dev):
            if isinstance(c, torch.Tensor) and c.requires_grad:
                close(d.grad, c.grad)


# ---- convolution ----------------------------------------------------------------------------

CONVS = [
    (F.conv1d, (2, 4, 9), (6, 4, 3), dict(stride=3)),
    (F.conv1d, (2, 4, 9), (6, 2, 3), dict(padding=2, dilation=2, groups=2)),
    (F.conv2d, (2, 4, 7, 8), (6, 2, 3, 3), dict(stride=2, padding=1, groups=2)),
    (F.conv2d, (2, 4, 7, 8), (6, 4, 3, 2), dict(stride=(2, 3), padding=(0, 2), dilation=(2, 1))),
    (F.conv2d, (2, 4, 7, 8), (6, 4, 3, 3), dict(padding="same", dilation=2)),
    (F.conv3d, (1, 2, 5, 6, 7), (4, 1, 2, 3, 2), dict(groups=2, stride=2, padding=1)),
    (F.conv_transpose1d, (2, 4, 5), (4, 3, 3), dict(stride=3, padding=2, output_padding=1, dilation=2)),
    (F.conv_transpose2d, (2, 4, 5, 6), (4, 3, 3, 3), dict(stride=2, padding=1, output_padding=1, groups=2)),
    (F.conv_transpose2d, (2, 2, 4, 4), (2, 2, 3, 3), dict(stride=1, output_padding=1, dilation=2)),
    (F.conv_transpose3d, (1, 2, 3, 4, 3), (2, 2, 2, 3, 2), dict(stride=(1, 2, 2), padding=1)),
]


@pytest.mark.parametrize("case", range(len(CONVS)))
def test_conv(case):
    fn, xs, ws, kw = CONVS[case]
    transposed = "transpose" in fn.__name__
    groups = kw.get("groups", 1)
    bias = make((ws[1] * groups if transposed else ws[0],), seed=3)
    check(fn, make(xs, seed=1), make(ws, seed=2), bias, **kw)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.int64, torch.float64])
def test_conv_dtypes(dtype):
    x, w = make((2, 4, 6, 6), dtype, 1), make((3, 4, 3, 3), dtype, 2)
    close(F.conv2d(tpu(x), tpu(w), padding=1), F.conv2d(x, w, padding=1))


def test_conv_noncontiguous_and_errors():
    x = make((2, 6, 4, 8), seed=1).transpose(2, 3)
    w = make((4, 6, 2, 3), seed=2)
    check(F.conv2d, x, w, None, stride=(1, 2))
    with pytest.raises(RuntimeError):
        F.conv2d(tpu(make((1, 3, 5, 5))), tpu(make((2, 4, 3, 3))))
    with pytest.raises(RuntimeError):
        F.conv2d(tpu(make((1, 3, 5, 5))), tpu(make((2, 3, 3, 3), torch.float64)))


# ---- pooling ---------------------------------------------------------------------------------

POOLS = [
    (F.max_pool2d, (2, 3, 7, 8), dict(kernel_size=3, stride=2, padding=1, return_indices=True)),
    (
        F.max_pool2d,
        (3, 7, 8),
        dict(kernel_size=(2, 3), stride=(2, 1), dilation=(2, 1), ceil_mode=True, return_indices=True),
    ),
    (F.max_pool1d, (2, 3, 9), dict(kernel_size=2, ceil_mode=True)),
    (F.max_pool3d, (1, 2, 5, 6, 5), dict(kernel_size=2, stride=2, padding=1, return_indices=True)),
    (F.avg_pool2d, (2, 3, 7, 8), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, count_include_pad=False)),
    (F.avg_pool2d, (2, 3, 7, 8), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)),
    (F.avg_pool2d, (2, 3, 7, 8), dict(kernel_size=2, divisor_override=3)),
    (F.avg_pool3d, (1, 2, 5, 6, 5), dict(kernel_size=3, stride=2, padding=1)),
    (F.avg_pool1d, (2, 3, 9), dict(kernel_size=3, stride=2)),
    (F.adaptive_avg_pool2d, (2, 3, 7, 8), dict(output_size=(3, 5))),
    (F.adaptive_avg_pool3d, (1, 2, 5, 6, 5), dict(output_size=(2, 4, 3))),
    (F.adaptive_max_pool2d, (2, 3, 7, 8), dict(output_size=(3, 5), return_indices=True)),
    (F.adaptive_max_pool3d, (2, 5, 6, 5), dict(output_size=(2, 4, 3), return_indices=True)),
    (F.adaptive_max_pool1d, (2, 3, 9), dict(output_size=4)),
]


@pytest.mark.parametrize("case", range(len(POOLS)))
def test_pool(case):
    fn, shape, kw = POOLS[case]
    check(fn, make(shape, seed=case), **kw)


def test_max_pool_ties_nan_and_dtypes():
    x = torch.tensor([[[[1.0, 1.0, 0.0], [1.0, float("nan"), 2.0], [float("nan"), 3.0, 3.0]]]])
    for dt in (torch.float32, torch.bfloat16):
        v, i = F.max_pool2d(tpu(x.to(dt)), 2, 1, return_indices=True)
        wv, wi = F.max_pool2d(x.to(dt), 2, 1, return_indices=True)
        close(v, wv)
        assert torch.equal(i.cpu(), wi)
    xi = make((2, 3, 6, 6), torch.int64)
    v, i = F.max_pool2d(tpu(xi), 2, return_indices=True)
    wv, wi = F.max_pool2d(xi, 2, return_indices=True)
    assert torch.equal(v.cpu(), wv) and torch.equal(i.cpu(), wi)
    close(F.avg_pool2d(tpu(xi), 2, padding=1), F.avg_pool2d(xi, 2, padding=1))


NONFINITE_POOLS = [
    (F.avg_pool1d, dict(kernel_size=2, stride=2)),
    (F.avg_pool1d, dict(kernel_size=2, stride=1)),
    (F.avg_pool1d, dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, count_include_pad=False)),
    (F.adaptive_avg_pool1d, dict(output_size=3)),
    (F.adaptive_avg_pool1d, dict(output_size=4)),
    (lambda x, **kw: F.avg_pool2d(x.view(1, 2, 5), **kw), dict(kernel_size=(1, 2), stride=(1, 2))),
    (lambda x, **kw: F.adaptive_avg_pool2d(x.view(1, 2, 5), **kw), dict(output_size=(1, 2))),
    (lambda x, **kw: F.avg_pool3d(x.view(1, 1, 2, 5), **kw), dict(kernel_size=(1, 1, 2))),
    (lambda x, **kw: F.lp_pool1d(x, **kw), dict(norm_type=1.5, kernel_size=2)),
]


@pytest.mark.parametrize("case", range(len(NONFINITE_POOLS)))
def test_average_pools_keep_nan_and_inf_in_their_windows(case):
    """A window's sum is taken over its own elements only: a nan (or +inf and
    -inf) makes its window nan, one infinity makes it that infinity, and the
    other windows of the row keep their values, as on the CPU; so do the
    gradients of a non-finite output gradient."""
    fn, kw = NONFINITE_POOLS[case]
    nan, inf = float("nan"), float("inf")
    x = torch.tensor([[[nan, 1.0, 2.0, 3.0, inf, 5.0, -inf, inf, 7.0, -inf]]])
    want, got = fn(x, **kw), fn(tpu(x), **kw).cpu()
    torch.testing.assert_close(got, want, equal_nan=True)
    xc = torch.arange(10.0).view(1, 1, 10).requires_grad_()
    xt = tpu(xc.detach()).requires_grad_()
    yc, yt = fn(xc, **kw), fn(xt, **kw)
    g = torch.full_like(yc, 1.0)
    g.view(-1)[0], g.view(-1)[-1] = nan, -inf
    yc.backward(g)
    yt.backward(tpu(g))
    torch.testing.assert_close(xt.grad.cpu(), xc.grad, equal_nan=True)


def test_pool_noncontiguous_out_and_errors():
    x = make((2, 8, 3, 7), seed=3).transpose(1, 2)
    check(F.max_pool2d, x, 2)
    check(F.avg_pool2d, x, 3, 2, 1)
    out = torch.empty(0, device="tpu")
    torch._C._nn.avg_pool2d(tpu(x), [2, 2], out=out)
    close(out, F.avg_pool2d(x, 2))
    with pytest.raises(RuntimeError):
        F.max_pool2d(tpu(x), 2, padding=2)
    with pytest.raises(RuntimeError):
        F.avg_pool2d(tpu(make((1, 1, 2, 2))), 3)


def test_max_unpool():
    x = make((2, 3, 6, 8), seed=4)
    v, i = F.max_pool2d(x, 2, return_indices=True)
    close(F.max_unpool2d(tpu(v), tpu(i), 2), F.max_unpool2d(v, i, 2))
    x = make((1, 2, 4, 4, 6), seed=5)
    v, i = F.max_pool3d(x, 2, return_indices=True)
    close(F.max_unpool3d(tpu(v), tpu(i), 2), F.max_unpool3d(v, i, 2))


# ---- normalization ---------------------------------------------------------------------------


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 5), (2, 3, 4, 5)])
def test_batch_norm(training, shape):
    x, w, b = make(shape, seed=1), make((3,), seed=2), make((3,), seed=3)
    rm, rv = make((3,), seed=4), make((3,), seed=5).abs() + 0.5
    trm, trv = rm.to("tpu"), rv.to("tpu")
    check(
        lambda x, w, b: F.batch_norm(x, rm.clone().to(x.device), rv.clone().to(x.device), w, b, training, 0.2, 1e-3),
        x,
        w,
        b,
    )
    want = F.batch_norm(x, rm, rv, w, b, training, 0.2, 1e-3)
    got = F.batch_norm(tpu(x), trm, trv, tpu(w), tpu(b), training, 0.2, 1e-3)
    close(got, want)
    close(trm, rm)
    close(trv, rv)


def test_batch_norm_no_stats_and_bf16():
    check(lambda x: F.batch_norm(x, None, None, training=True), make((3, 4, 5), seed=1))
    x = make((2, 3, 4), torch.bfloat16, seed=2)
    rm, rv = torch.zeros(3), torch.ones(3)
    close(F.batch_norm(tpu(x), tpu(rm), tpu(rv), training=True), F.batch_norm(x, rm.clone(), rv.clone(), training=True))


@pytest.mark.parametrize("groups", [1, 2, 6])
def test_group_norm(groups):
    check(F.group_norm, make((2, 6, 3, 4), seed=1), groups, make((6,), seed=2), make((6,), seed=3))
    check(F.group_norm, make((2, 6, 5), seed=4).transpose(1, 2).contiguous().transpose(1, 2), groups)


def test_instance_and_layer_norm():
    check(
        lambda x, w, b: F.instance_norm(x, weight=w, bias=b),
        make((2, 3, 4, 5), seed=1),
        make((3,), seed=2),
        make((3,), seed=3),
    )
    check(F.layer_norm, make((1,), seed=4), (1,), make((1,), seed=5), make((1,), seed=6))
    check(F.layer_norm, make((3, 4, 5), seed=7), (4, 5), make((4, 5), seed=8), None)
    x = make((3, 4), torch.bfloat16, seed=9)
    for got, want in zip(
        torch.native_layer_norm(tpu(x), [4], None, None, 1e-5), torch.native_layer_norm(x, [4], None, None, 1e-5)
    ):
        close(got, want)
    with pytest.raises(RuntimeError):
        F.group_norm(tpu(make((2, 6, 3))), 4)


# ---- upsampling ------------------------------------------------------------------------------

UPS = [
    ((2, 3, 5), dict(size=8, mode="nearest")),
    ((2, 3, 5), dict(scale_factor=1.7, mode="nearest-exact")),
    ((2, 3, 4, 5), dict(size=(7, 3), mode="nearest")),
    ((1, 2, 3, 4, 5), dict(scale_factor=2, mode="nearest")),
    ((2, 3, 5), dict(size=9, mode="linear", align_corners=True)),
    ((2, 3, 4, 5), dict(size=(7, 3), mode="bilinear")),
    ((2, 3, 4, 5), dict(scale_factor=1.5, mode="bilinear", align_corners=True)),
    ((2, 3, 4, 5), dict(size=(7, 9), mode="bicubic")),
    ((2, 3, 4, 5), dict(scale_factor=0.6, mode="bicubic", align_corners=True)),
    ((1, 2, 3, 4, 5), dict(size=(4, 3, 7), mode="trilinear")),
    ((2, 3, 8, 9), dict(size=(3, 4), mode="bilinear", antialias=True)),
    ((2, 3, 8, 9), dict(size=(5, 4), mode="area")),
]


@pytest.mark.parametrize("case", range(len(UPS)))
def test_interpolate(case):
    shape, kw = UPS[case]
    check(lambda x: F.interpolate(x, **kw), make(shape, seed=case))


def test_interpolate_dtypes_and_errors():
    x = make((2, 3, 4, 5), torch.int64)
    close(F.interpolate(tpu(x.to(torch.uint8)), scale_factor=2), F.interpolate(x.to(torch.uint8), scale_factor=2))
    xb = make((2, 3, 4, 5), torch.bfloat16)
    close(F.interpolate(tpu(xb), size=(6, 7), mode="bilinear"), F.interpolate(xb, size=(6, 7), mode="bilinear"))
    xn = make((2, 5, 3, 4), seed=3).transpose(1, 2)
    check(lambda x: F.interpolate(x, size=(5, 6), mode="bicubic"), xn)
    with pytest.raises(RuntimeError):
        torch._C._nn.upsample_bilinear2d(tpu(make((2, 3, 4))), [4, 4], False)


# ---- unfold / fold, channel_shuffle ----------------------------------------------------------


def test_unfold_fold():
    x = make((2, 3, 6, 7), seed=1)
    check(lambda x: F.unfold(x, (2, 3), dilation=(1, 2), padding=1, stride=(2, 1)), x)
    check(lambda x: F.unfold(x, 3), make((3, 5, 5), seed=2))
    cols = make((2, 3 * 2 * 3, 6), seed=3)
    check(lambda c: F.fold(c, (5, 6), (2, 3), padding=(1, 0), stride=(2, 2)), cols)
    xi = make((1, 2, 4, 4)) > 0
    close(F.unfold(tpu(xi), 2), F.unfold(xi, 2))
    with pytest.raises(RuntimeError):
        F.unfold(tpu(make((1, 1, 2, 2))), 3)


def test_channel_shuffle():
    x = make((2, 6, 3, 2), seed=4)
    close(F.channel_shuffle(tpu(x), 3), F.channel_shuffle(x, 3))
    close(F.channel_shuffle(tpu(x[:, :, 1:]), 2), F.channel_shuffle(x[:, :, 1:], 2))
    with pytest.raises(RuntimeError):
        F.channel_shuffle(tpu(x), 4)


# ---- grid sampling ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "mode,padding,align",
    [
        ("bilinear", "zeros", False),
        ("nearest", "border", True),
        ("bicubic", "reflection", False),
        ("bilinear", "reflection", True),
    ],
)
def test_grid_sample_2d(mode, padding, align):
    x, g = make((2, 3, 5, 6), seed=1), make((2, 4, 3, 2), seed=2) * 0.7
    f = lambda x, g: F.grid_sample(x, g, mode=mode, padding_mode=padding, align_corners=align)  # noqa: E731
    cpu = [x.clone().requires_grad_(), g.clone().requires_grad_()]
    dev = [x.to("tpu").requires_grad_(), g.to("tpu").requires_grad_()]
    want, got = f(*cpu), f(*dev)
    close(got, want)
    go = make(want.shape, seed=3)
    want.backward(go)
    got.backward(go.to("tpu"))
    close(dev[0].grad, cpu[0].grad)
    torch.testing.assert_close(dev[1].grad.cpu(), cpu[1].grad, rtol=1e-4, atol=1e-3)


def test_grid_sample_3d_and_errors():
    x, g = make((1, 2, 3, 4, 5), seed=4), make((1, 2, 3, 2, 3), seed=5)
    check(lambda x, g: F.grid_sample(x, g, padding_mode="border", align_corners=False), x, g)
    check(lambda x, g: F.grid_sample(x, g, mode="nearest", align_corners=True), x, g)
    with pytest.raises(RuntimeError):
        F.grid_sample(tpu(x), tpu(g.double()), align_corners=False)


@pytest.mark.parametrize(
    "nsp,shape,k,osz",
    [
        (2, (2, 3, 11, 9), (2, 3), (5, 4)),
        (2, (3, 10, 10), 2, (4, 7)),
        (2, (1, 2, 7, 7), 3, (1, 5)),
        (3, (2, 2, 7, 8, 9), (2, 3, 2), (3, 4, 5)),
        (3, (2, 6, 6, 6), 2, (1, 2, 4)),
    ],
)
def test_fractional_max_pool(nsp, shape, k, osz):
    g = torch.Generator().manual_seed(0)
    f = F.fractional_max_pool2d if nsp == 2 else F.fractional_max_pool3d
    x = torch.randn(shape, generator=g)
    x[..., 1:3, :] = 1.0  # ties: the first of equal values
    x[..., 0, 0] = float("nan")
    n = shape[0] if len(shape) == nsp + 2 else 1
    rs = torch.rand(n + 1, shape[-nsp - 1], nsp, generator=g)  # extra batch rows are not used
    a, ai = f(x, k, output_size=osz, return_indices=True, _random_samples=rs)
    b, bi = f(x.to("tpu"), k, output_size=osz, return_indices=True, _random_samples=rs.to("tpu"))
    torch.testing.assert_close(b.cpu(), a, equal_nan=True)
    assert bi.dtype == torch.int64 and torch.equal(bi.cpu(), ai)
    # bfloat16: the same windows (alpha in bfloat16 as on the CPU)
    xb, rb = x.bfloat16(), rs.bfloat16()
    a, ai = f(xb, k, output_size=osz, return_indices=True, _random_samples=rb)
    b, bi = f(xb.to("tpu"), k, output_size=osz, return_indices=True, _random_samples=rb.to("tpu"))
    torch.testing.assert_close(b.cpu(), a, equal_nan=True)
    assert torch.equal(bi.cpu(), ai)
    # gradient
    xc = torch.randn(shape, generator=g).requires_grad_()
    xt = xc.detach().to("tpu").requires_grad_()
    go = torch.randn(a.shape, generator=g)
    f(xc, k, output_size=osz, _random_samples=rs).backward(go)
    f(xt, k, output_size=osz, _random_samples=rs.to("tpu")).backward(go.to("tpu"))
    torch.testing.assert_close(xt.grad.cpu(), xc.grad)
    # samples drawn on the device: shapes and a valid max
    y, yi = f(x.to("tpu").nan_to_num(), k, output_size=osz, return_indices=True)
    assert y.shape == a.shape and yi.shape == a.shape
    flat = x.nan_to_num().flatten(-nsp)
    torch.testing.assert_close(y.cpu(), flat.gather(-1, yi.cpu().flatten(-nsp)).view(a.shape))


def test_fractional_max_pool_errors():
    x = torch.randn(1, 2, 6, 6)
    for args, kw in [
        ((x, 2), dict(output_size=(6, 5), _random_samples=torch.rand(1, 2, 2))),
        ((x, 2), dict(output_size=(3, 3), _random_samples=torch.rand(1, 3, 2))),
        ((x, 2), dict(output_size=(3, 3), _random_samples=torch.rand(1, 2, 3))),
        ((x, 2), dict(output_size=(3, 3), _random_samples=torch.rand(1, 2, 2).double())),
        ((x[0, 0], 2), dict(output_size=(3, 3), _random_samples=torch.rand(1, 1, 2))),
    ]:
        with pytest.raises(RuntimeError) as want:
            F.fractional_max_pool2d(*args, **kw)
        with pytest.raises(RuntimeError) as got:
            F.fractional_max_pool2d(*[tpu(a) for a in args], **{k: tpu(v) for k, v in kw.items()})
        assert str(got.value).split("\n")[0] == str(want.value).split("\n")[0]
    x3 = torch.randn(1, 6, 6, 6)
    with pytest.raises(RuntimeError, match="pool time 2 too large relative to input time 6"):
        F.fractional_max_pool3d(
            x3.to("tpu"), 2, output_size=(5, 4, 4), _random_samples=torch.rand(1, 1, 3, device="tpu")
        )


@pytest.mark.parametrize(
    "name",
    ["conv2d", "conv2d_groups_stride_dilation", "conv1d", "conv3d", "conv_transpose2d", "conv_transpose1d", "empty"],
)
def test_int64_convolutions_are_exact_and_wrap_as_cpu(name):
    # 64-bit integer convolutions are built as sums of products (TPU's compiler
    # has no 64-bit integer convolution): exact, wrapping on overflow as CPU's
    g = torch.Generator().manual_seed(3)

    def ints(*s, big=False):
        lim = 2**62 if big else 50
        return torch.randint(-lim, lim, s, generator=g)

    fn, args = {
        "conv2d": (lambda x, w: F.conv2d(x, w, padding=1), (ints(2, 3, 6, 6, big=True), ints(4, 3, 3, 3, big=True))),
        "conv2d_groups_stride_dilation": (
            lambda x, w: F.conv2d(x, w, stride=2, dilation=2, groups=2, padding=2),
            (ints(2, 4, 9, 8), ints(6, 2, 3, 2)),
        ),
        "conv1d": (lambda x, w: F.conv1d(x, w, stride=3), (ints(1, 2, 10), ints(3, 2, 4))),
        "conv3d": (lambda x, w: F.conv3d(x, w, padding=(1, 0, 1)), (ints(1, 2, 4, 3, 5), ints(2, 2, 2, 2, 3))),
        "conv_transpose2d": (
            lambda x, w: F.conv_transpose2d(x, w, stride=2, padding=1, output_padding=1),
            (ints(2, 3, 4, 5), ints(3, 2, 3, 3)),
        ),
        "conv_transpose1d": (
            lambda x, w: F.conv_transpose1d(x, w, stride=2, groups=3, dilation=2),
            (ints(1, 3, 5), ints(3, 2, 3)),
        ),
        "empty": (lambda x, w: F.conv2d(x, w), (ints(0, 3, 6, 6), ints(4, 3, 3, 3))),
    }[name]
    want, got = fn(*args), fn(*[tpu(a) for a in args]).cpu()
    assert got.dtype == want.dtype == torch.int64 and got.shape == want.shape
    assert torch.equal(got, want)


def test_int64_matmuls_are_exact_and_wrap_as_cpu():
    g = torch.Generator().manual_seed(4)
    a, b = torch.randint(-(2**62), 2**62, (5, 7), generator=g), torch.randint(-(2**62), 2**62, (7, 3), generator=g)
    assert torch.equal(torch.mm(tpu(a), tpu(b)).cpu(), a @ b)
    x, y = torch.randint(-9, 9, (2, 3, 4), generator=g), torch.randint(-9, 9, (2, 4, 5), generator=g)
    assert torch.equal(torch.einsum("bij,bjk->bik", tpu(x), tpu(y)).cpu(), torch.einsum("bij,bjk->bik", x, y))
    assert torch.equal(torch.matmul(tpu(x[0, 0]), tpu(y[0])).cpu(), x[0, 0] @ y[0])
    # products over 2^22 elements: summed by a loop over blocks of the contracting dim (257 = 5 * 49 + 12)
    a, b = (
        torch.randint(-(2**62), 2**62, (300, 257), generator=g),
        torch.randint(-(2**62), 2**62, (257, 280), generator=g),
    )
    assert torch.equal(torch.mm(tpu(a), tpu(b)).cpu(), a @ b)


UPSAMPLES = [
    ("linear", 1, dict(scale_factor=2)),
    ("linear", 1, dict(size=7, align_corners=True)),
    ("bilinear", 2, dict(scale_factor=2)),
    ("bilinear", 2, dict(size=(3, 3), antialias=True)),
    ("bicubic", 2, dict(scale_factor=2)),
    ("bicubic", 2, dict(size=(9, 5), align_corners=True)),
    ("trilinear", 3, dict(scale_factor=2)),
]


@pytest.mark.parametrize("case", range(len(UPSAMPLES)))
def test_upsampling_keeps_nan_and_inf_to_the_outputs_that_read_them(case):
    """Each output is the sum of its taps' terms: a nan it reads (whatever the weight), an
    infinity read with a zero weight or with weights of both signs (the border's clamped
    taps read one element several times) make it nan, an infinity otherwise makes it that
    infinity times its weight's sign; every other output keeps its value. So for the
    gradients of a non-finite output gradient."""
    mode, nd, kw = UPSAMPLES[case]
    nan, inf = float("nan"), float("inf")
    for at in (0, 3, 5):
        gen = torch.Generator().manual_seed(at)
        x = torch.randn((1, 2) + (6,) * nd, generator=gen)
        x.view(-1)[at], x.view(-1)[at + 6], x.view(-1)[at + 1] = nan, inf, -inf
        want = F.interpolate(x, mode=mode, **kw)
        torch.testing.assert_close(F.interpolate(tpu(x), mode=mode, **kw).cpu(), want, equal_nan=True)
        xc = torch.randn(x.shape, generator=gen).requires_grad_()
        xt = tpu(xc.detach()).requires_grad_()
        yc, yt = F.interpolate(xc, mode=mode, **kw), F.interpolate(xt, mode=mode, **kw)
        g = torch.randn(yc.shape, generator=gen)
        g.view(-1)[at], g.view(-1)[at + 5], g.view(-1)[at + 2] = nan, inf, -inf
        yc.backward(g)
        yt.backward(tpu(g))
        torch.testing.assert_close(xt.grad.cpu(), xc.grad, equal_nan=True, atol=1e-4, rtol=1e-4)


def test_fold_keeps_nan_and_inf_to_the_positions_they_sum_into():
    """fold (col2im, and unfold's backward) sums blocks into positions: a nan, or +inf with
    -inf, makes its position nan, one infinity makes it that infinity; other positions keep
    their sums, as on the CPU."""
    nan, inf = float("nan"), float("inf")
    for k, s, p, dil in [(2, 2, 0, 1), (3, 1, 1, 1), (2, 1, 0, 2)]:
        n = ((6 + 2 * p - dil * (k - 1) - 1) // s + 1) ** 2
        cols = torch.randn(1, 2 * k * k, n, generator=torch.Generator().manual_seed(k))
        cols.view(-1)[3], cols.view(-1)[10], cols.view(-1)[11], cols.view(-1)[20] = nan, inf, -inf, inf
        want = F.fold(cols, (6, 6), k, dilation=dil, padding=p, stride=s)
        got = F.fold(tpu(cols), (6, 6), k, dilation=dil, padding=p, stride=s).cpu()
        torch.testing.assert_close(got, want, equal_nan=True)
        xc = torch.randn(1, 2, 6, 6).requires_grad_()
        xt = tpu(xc.detach()).requires_grad_()
        yc, yt = F.unfold(xc, k, dil, p, s), F.unfold(xt, k, dil, p, s)
        g = torch.randn(yc.shape)
        g.view(-1)[2], g.view(-1)[7] = nan, inf
        yc.backward(g)
        yt.backward(tpu(g))
        torch.testing.assert_close(xt.grad.cpu(), xc.grad, equal_nan=True)
