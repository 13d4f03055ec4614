"""Reduce family against CPU PyTorch: sums/products/means, var/std, norms,
scans, sorting, selection (topk/kthvalue/median/mode), searching, histc,
renorm: values, dtypes, shapes, float32 gradients, non-contiguous inputs,
out= variants and errors."""

import pytest
import torch
from _helpers import close, make

import torchtpu  # noqa: F401


def check(fn, *args, grad=True, **kw):
    """fn on CPU and tpu: outputs, and float32 gradients of every float input."""
    cpu = [
        a.detach().clone().requires_grad_(grad and a.dtype == torch.float32) if isinstance(a, torch.Tensor) else a
        for a in args
    ]
    dev = [
        a.detach().to("tpu").requires_grad_(grad and a.dtype == torch.float32) if isinstance(a, torch.Tensor) else a
        for a in args
    ]
    want, got = fn(*cpu, **kw), fn(*dev, **kw)
    wants = want if isinstance(want, tuple) else (want,)
    gots = got if isinstance(got, tuple) else (got,)
    for w, g in zip(wants, gots):
        close(g, w)
    w, g = wants[0], gots[0]
    if grad and w.requires_grad:
        gw = make(w.shape, seed=7)
        w.backward(gw)
        g.backward(gw.to("tpu"))
        for a, b in zip(cpu, dev):
            if isinstance(a, torch.Tensor) and a.requires_grad:
                close(b.grad, a.grad)


DT = [torch.float32, torch.bfloat16, torch.int64]


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_sum_prod_out(dtype):
    x = make((3, 4, 5), dtype)
    check(lambda a: torch.sum(a, (0, 2), keepdim=True), x)
    check(lambda a: torch.prod(a, 1), x)
    check(torch.prod, x if dtype != torch.bfloat16 else x * 0.5)
    out = torch.empty(0, dtype=torch.int64 if dtype in (torch.int64, torch.bool) else dtype)
    want = torch.sum(x, 1, out=out.clone())
    close(torch.sum(x.to("tpu"), 1, out=out.to("tpu")), want)


def test_nansum_nanmean_noncontiguous():
    x = make((4, 6))
    x[1, 2] = float("nan")
    check(lambda a: torch.nansum(a.t(), 0), x)
    check(lambda a: torch.nanmean(a, 1), x)
    check(lambda a: torch.mean(a[:, ::2], 0), x)


@pytest.mark.parametrize("fn", [torch.var, torch.std, torch.var_mean, torch.std_mean])
def test_moments(fn):
    x = make((4, 5, 3))
    check(lambda a: fn(a, 1, correction=0, keepdim=True), x)
    check(lambda a: fn(a), x)
    check(lambda a: fn(a, (0, 2), correction=2), x)


@pytest.mark.parametrize("ord", [2, 0, 3.5, -float("inf")])
def test_vector_norm(ord):
    x = make((4, 5))
    check(lambda a: torch.linalg.vector_norm(a, ord, dim=1), x, grad=ord != 0)
    check(lambda a: torch.linalg.vector_norm(a, ord), x.bfloat16(), grad=False)


def test_norm_dist_renorm():
    x, y = make((3, 4)), make((3, 4), seed=1)
    check(lambda a: torch.norm(a, p="fro"), x)
    check(torch.dist, x, y)
    check(lambda a: torch.renorm(a, 2, 0, 1.0), make((3, 4, 2)))
    check(lambda a: torch.renorm(a, 1, 1, 0.5), make((3, 4)))
    with pytest.raises(RuntimeError):
        torch.renorm(make((3,)).to("tpu"), 2, 0, 1.0)


def test_linalg_vector_norm_int_error():
    with pytest.raises(RuntimeError, match="floating point"):
        torch.linalg.vector_norm(make((3,), torch.int64).to("tpu"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bool])
def test_small_reductions(dtype):
    x = make((3, 5), dtype)
    check(lambda a: torch.count_nonzero(a, 1), x, grad=False)
    check(lambda a: torch.aminmax(a, dim=0), x, grad=False)
    check(lambda a: torch.any(a), x)
    check(lambda a: torch.all(a, 1), x)
    if dtype != torch.bool:
        check(torch.trace, x)


def test_max_min_nan():
    x = make((3, 4))
    x[1, 1] = float("nan")
    check(torch.amax, x, grad=False)
    check(lambda a: torch.amin(a, 1), x, grad=False)
    check(lambda a: torch.max(a, 1)[0], x, grad=False)
    check(lambda a: torch.max(a, 1), make((3, 4)))
    check(torch.min, make((3, 4)))


@pytest.mark.parametrize("dtype", DT)
def test_scans(dtype):
    x = make((4, 5), dtype)
    check(lambda a: torch.cumsum(a, 1), x)
    check(lambda a: torch.cumprod(a, 0), x)
    check(lambda a: torch.cummax(a, 1), x)
    check(lambda a: torch.cummin(a, 0), x)
    if dtype.is_floating_point:
        check(lambda a: torch.logcumsumexp(a, 1), x)
    out = torch.empty(4, 5, dtype=dtype).to("tpu")
    torch.cumsum(x.to("tpu"), 0, out=out)
    close(out, torch.cumsum(x, 0))


@pytest.mark.parametrize("dtype", DT)
def test_sort_family(dtype):
    x = make((4, 7), dtype)
    if dtype.is_floating_point:
        x[0, 3] = float("nan")
    check(lambda a: torch.sort(a, dim=1, stable=True), x, grad=False)
    check(lambda a: torch.sort(a, dim=0, descending=True, stable=True), x, grad=False)
    check(lambda a: torch.argsort(a, dim=1, stable=True), x, grad=False)
    check(torch.msort, x, grad=False)
    if dtype != torch.bool:
        y = make((4, 7), dtype, seed=3)
        check(lambda a: torch.sort(a, dim=1, stable=True)[0], y)


def test_selection():
    x = make((5, 6))
    check(lambda a: torch.topk(a, 3, 1), x)
    check(lambda a: torch.topk(a, 2, 0, largest=False), x)
    check(lambda a: torch.kthvalue(a, 2, 1, keepdim=True), x)
    check(lambda a: torch.median(a, 0), x)
    check(torch.median, x)
    xn = x.clone()
    xn[2, 1] = float("nan")
    check(torch.nanmedian, xn, grad=False)
    check(lambda a: torch.nanmedian(a, 1)[0], xn, grad=False)
    with pytest.raises(RuntimeError):
        torch.topk(x.to("tpu"), 9, 1)


def test_mode():
    x = torch.randint(0, 3, (4, 7, 5))
    for d in range(3):
        want, got = torch.mode(x, d), torch.mode(x.to("tpu"), d)
        close(got.values, want.values)
        assert torch.equal(x.gather(d, got.indices.cpu().unsqueeze(d)).squeeze(d), want.values)
    check(lambda a: torch.mode(a, 1)[0], x.float())
    close(torch.mode(x.to("tpu"), 2, keepdim=True).values, torch.mode(x, 2, keepdim=True).values)


def test_quantile():
    x = make((4, 6))
    q = torch.tensor([0.1, 0.5, 0.9])
    check(lambda a, qq: torch.quantile(a, qq, dim=1), x, q)
    check(lambda a: torch.quantile(a, 0.3, interpolation="lower"), x)
    x[1, 2] = float("nan")
    check(lambda a: torch.nanquantile(a, 0.5, dim=0), x, grad=False)


@pytest.mark.parametrize("right", [False, True])
def test_search(right):
    seq = torch.sort(make((3, 6)), 1)[0]
    v = make((3, 4), seed=2)
    check(lambda s, a: torch.searchsorted(s, a, right=right), seq, v, grad=False)
    b = torch.tensor([-1.0, 0.0, 0.5, 1.0])
    check(lambda a, bb: torch.bucketize(a, bb, right=right, out_int32=True), v, b, grad=False)


def test_histc_equal():
    x = make((20,))
    for args in [(10, 0, 0), (7, -1, 1), (3, 2, 5)]:
        close(torch.histc(x.to("tpu"), *args), torch.histc(x, *args))
    close(torch.histc(torch.full((3,), 2.0).to("tpu"), 4), torch.histc(torch.full((3,), 2.0), 4))
    w = make((20,), seed=4).abs()
    for kw in [dict(bins=5), dict(bins=7, range=(-1.0, 1.0)), dict(bins=4, weight=w, density=True)]:
        want = torch.histogram(x, **kw)
        got = torch.histogram(
            x.to("tpu"), **{k: v.to("tpu") if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
        )
        close(got.hist, want.hist)
        close(got.bin_edges, want.bin_edges)
    # no elements: zeros, or 0/0 (NaN) with density, as the CPU
    e = torch.empty(5, 0, 5)
    for kw in [
        dict(bins=torch.tensor([0.0, 1.0, 2.0])),
        dict(bins=torch.tensor([0.0, 1.0]), density=True),
        dict(bins=3, density=True),
    ]:
        want = torch.histogram(e, **kw)
        got = torch.histogram(
            e.to("tpu"), **{k: v.to("tpu") if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
        )
        torch.testing.assert_close(got.hist.cpu(), want.hist, equal_nan=True)
    assert torch.equal(x.to("tpu"), x.clone().to("tpu"))
    assert not torch.equal(x.to("tpu"), (x + 1).to("tpu"))
    with pytest.raises(RuntimeError):
        torch.histc(x.to("tpu"), 4, 2, 1)


def test_logsumexp_isclose():
    x = make((3, 5))
    check(lambda a: torch.logsumexp(a, 1), x)
    y = x + 1e-7
    close(torch.isclose(x.to("tpu"), y.to("tpu")), torch.isclose(x, y))
    assert torch.allclose(x.to("tpu"), y.to("tpu"))


def test_hash_tensor():
    """xor of the 64-bit patterns (floats widened to double, signed integers
    sign-extended, bool and unsigned zero-extended); the CPU's errors."""
    g = torch.Generator().manual_seed(0)
    cases = [
        (torch.tensor([-1, 2, 3]), {}),
        (torch.tensor([True, False, True]), {}),
        (torch.tensor([255, 3], dtype=torch.uint8), {}),
        (torch.tensor([-1, 5], dtype=torch.int8), {}),
        (torch.tensor([-1.5, 2.25], dtype=torch.bfloat16), {}),
        (torch.randn(4, 5, generator=g), {}),
        (torch.randn(4, 5, generator=g), dict(dim=1)),
        (torch.randn(4, 5, 3, generator=g), dict(dim=(0, 2), keepdim=True)),
        (torch.empty(0, 3), dict(dim=1)),
        (torch.tensor(3.0), {}),
        (torch.tensor([float("nan"), -0.0, float("inf")]), {}),
        (torch.randn(3, 4, generator=g).double(), dict(dim=0)),
    ]
    for x, kw in cases:
        a, b = torch.hash_tensor(x, **kw), torch.hash_tensor(x.to("tpu"), **kw).cpu()
        assert a.dtype == b.dtype == torch.uint64 and a.shape == b.shape and torch.equal(a, b), (x, kw, a, b)
    for x, kw in [
        (torch.empty(0), {}),
        (torch.empty(2, 0), dict(dim=1)),
        (torch.tensor([1j]), {}),
        (torch.ones(3), dict(mode=1)),
    ]:
        with pytest.raises(Exception) as want:
            torch.hash_tensor(x, **kw)
        with pytest.raises(want.type) as got:
            torch.hash_tensor(x.to("tpu"), **kw)
        assert str(got.value).split("\n")[0] == str(want.value).split("\n")[0]


@pytest.mark.parametrize("shape", [(7, 2), (4, 3, 3), (0, 2)])
def test_histogramdd(shape):
    """Edges from the data or a range (as torch.linspace), bins found as the
    CPU's binary search (edges that are not sorted too), weights, density."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=g) * 3
    D = shape[-1]
    w = torch.rand(shape[:-1], generator=g)
    unsorted = [torch.tensor([-2.0, 1.5, -0.5, 3.0]), torch.tensor([2.0, -1.0, 0.5])] + [
        torch.tensor([-3.0, 0.0, 3.0])
    ] * (D - 2)
    for bins, kw in [
        ([3] * D, {}),
        ([2, 4] + [1] * (D - 2), dict(density=True)),
        ([3] * D, dict(weight=w)),
        ([2] * D, dict(range=[-1.0, 1.0] * D, density=True, weight=w)),
        ([torch.linspace(-4, 4, 5)] * D, {}),
        (unsorted, dict(weight=w, density=True)),
    ]:
        want = torch.histogramdd(x, bins, **kw)
        got = torch.histogramdd(
            x.to("tpu"),
            [b.to("tpu") if isinstance(b, torch.Tensor) else b for b in bins],
            **{k: v.to("tpu") if isinstance(v, torch.Tensor) else v for k, v in kw.items()},
        )
        torch.testing.assert_close(got.hist.cpu(), want.hist, equal_nan=True)
        assert len(got.bin_edges) == len(want.bin_edges)
        for e2, e in zip(got.bin_edges, want.bin_edges):
            torch.testing.assert_close(e2.cpu(), e)
    # a single value per dim widens by half a unit each way
    one = torch.ones(3, D)
    torch.testing.assert_close(
        torch.histogramdd(one.to("tpu"), [2] * D).hist.cpu(), torch.histogramdd(one, [2] * D).hist
    )


def test_histogramdd_errors():
    x = torch.randn(5, 2)
    for args, kw in [
        ((torch.randn(5), [2]), {}),
        ((x, [2]), {}),
        ((x, [2, 0]), {}),
        ((x, [2, 2]), dict(range=[0.0, 1.0])),
        ((x, [torch.tensor([0.0, 1.0])]), {}),
    ]:
        with pytest.raises(RuntimeError):
            torch.histogramdd(*args, **kw)
        with pytest.raises(RuntimeError):
            torch.histogramdd(
                args[0].to("tpu"), [b.to("tpu") if isinstance(b, torch.Tensor) else b for b in args[1]], **kw
            )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_histogramdd_bin_edges(dtype):
    """_histogramdd_bin_edges computed on the device (tpu::histogramdd_edges):
    the data's or the given range, a single point widened by half a unit, [0, 1]
    with no data; the edges' dtype is the input's."""
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(9, 3, generator=g) * 4).to(dtype)
    point = torch.tensor([[2.5, -1.0, 7.0]] * 4, dtype=dtype)
    for t, bins, kw in [
        (x, [3, 1, 5], {}),
        (x, [2, 2, 2], dict(range=[-1.0, 1.0, 0.0, 0.0, 1e-3, 3.25])),
        (point, [4, 2, 1], {}),
        (x[:0], [3, 2, 2], {}),
        (x.view(3, 3, 3), [1, 2, 3], {}),
    ]:
        want = torch.ops.aten._histogramdd_bin_edges(t, bins, **kw)
        got = torch.ops.aten._histogramdd_bin_edges(t.to("tpu"), bins, **kw)
        assert isinstance(got, list) and len(got) == len(want)
        for e2, e in zip(got, want):
            assert e2.device.type == "tpu" and e2.dtype == e.dtype
            torch.testing.assert_close(e2.cpu(), e)
    one = torch.ops.aten._histogramdd_bin_edges(x[:, :1].to("tpu"), [4])
    assert len(one) == 1 and one[0].shape == (5,)


def test_histogramdd_bin_edges_errors():
    """The CPU's refusals: a bad bins count, range length or order, bins <= 0,
    a non-finite range (the data's is a value check, raised at the sync),
    an integer input."""
    x = torch.randn(5, 2)
    for bins in ([2, 0], [-1, 2]):  # the CPU refuses these in histogramdd's counting
        with pytest.raises(RuntimeError):
            torch.histogramdd(x, bins)
        with pytest.raises(RuntimeError):
            torch.histogramdd(x.to("tpu"), bins)
    for t, bins, kw in [
        (x, [2, 2], dict(range=[0.0, 1.0, 3.0])),
        (x, [2, 2], dict(range=[0.0, 1.0, 3.0, 2.0])),
        (x, [2, 2], dict(range=[0.0, float("inf"), 0.0, 1.0])),
        (x, [2, 2], dict(range=[0.0, 1.0, float("nan"), 1.0])),
        (x.long(), [2, 2], {}),
    ]:
        with pytest.raises(RuntimeError):
            torch.ops.aten._histogramdd_bin_edges(t, bins, **kw)
        with pytest.raises(RuntimeError):
            torch.ops.aten._histogramdd_bin_edges(t.to("tpu"), bins, **kw)
    for bad in (float("inf"), float("nan")):
        y = x.clone()
        y[3, 1] = bad
        with pytest.raises(RuntimeError, match="not finite"):
            torch.ops.aten._histogramdd_bin_edges(y, [2, 2])
        with pytest.raises(RuntimeError, match="not finite"):
            [e.cpu() for e in torch.ops.aten._histogramdd_bin_edges(y.to("tpu"), [2, 2])]


def test_logcumsumexp_keeps_nan_and_infinities_as_the_cpu():
    """A nan makes every later running value nan (the combiner's max and min need not keep
    it); equal infinities combine to themselves."""
    nan, inf = float("nan"), float("inf")
    x = torch.tensor([[1.0, 2.0, nan, 3.0, 0.5], [1.0, -inf, inf, 2.0, -inf], [-inf, -inf, 1.0, inf, nan]])
    for dim in (0, 1):
        for dt in (torch.float32, torch.bfloat16):
            want = torch.logcumsumexp(x.to(dt), dim)
            got = torch.logcumsumexp(x.to(dt).to("tpu"), dim).cpu()
            torch.testing.assert_close(got, want, equal_nan=True)


def test_searchsorted_and_bucketize_place_nan_after_every_boundary():
    """The CPU's binary search steps right while !(b >= v) (right=True: !(b > v)), so a nan
    value lands after every boundary; infinities land at either end."""
    nan, inf = float("nan"), float("inf")
    v = torch.tensor([nan, -inf, inf, 0.0, 0.5, 1.0, 2.0])
    b = torch.tensor([0.0, 1.0])
    for right in (False, True):
        for dt in (torch.float32, torch.bfloat16):
            vd, bd = v.to(dt), b.to(dt)
            want = torch.bucketize(vd, bd, right=right)
            assert torch.equal(torch.bucketize(vd.to("tpu"), bd.to("tpu"), right=right).cpu(), want)
            want = torch.searchsorted(bd, vd, right=right, out_int32=True)
            got = torch.searchsorted(bd.to("tpu"), vd.to("tpu"), right=right, out_int32=True).cpu()
            assert torch.equal(got, want)
