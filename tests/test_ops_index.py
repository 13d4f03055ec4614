"""Index family against CPU PyTorch: scatter_reduce, index_reduce, take/put,
isin, unfold's gradient, reflection/replication padding, unique,
repeat_interleave, embedding_bag and embedding_renorm_: values, dtypes,
shapes, float32 gradients, non-contiguous inputs, out=/in-place variants and
errors."""

import math

import pytest
import torch
import torch.nn.functional as F
from _helpers import close, make

import torchtpu  # noqa: F401


def check(fn, *args, grad=True):
    """fn on CPU and tpu: outputs, and float32 gradients of every float input."""
    cpu = [
        a.detach().clone().requires_grad_(grad and a.dtype == torch.float32) if isinstance(a, torch.Tensor) else a
        for a in args
    ]
    dev = [
        a.detach().to("tpu").requires_grad_(grad and a.dtype == torch.float32) if isinstance(a, torch.Tensor) else a
        for a in args
    ]
    want, got = fn(*cpu), fn(*dev)
    wants = want if isinstance(want, tuple) else (want,)
    gots = got if isinstance(got, tuple) else (got,)
    for w, g in zip(wants, gots):
        close(g, w)
    ins = [(c, d) for c, d in zip(cpu, dev) if isinstance(c, torch.Tensor) and c.requires_grad]
    outs = [(w, g) for w, g in zip(wants, gots) if w.requires_grad]
    if ins and outs:
        gouts = [make(w.shape, w.dtype, seed=7) for w, _ in outs]
        gw = torch.autograd.grad([w for w, _ in outs], [c for c, _ in ins], gouts, allow_unused=True)
        gg = torch.autograd.grad(
            [g for _, g in outs], [d for _, d in ins], [x.to("tpu") for x in gouts], allow_unused=True
        )
        for a, b in zip(gg, gw):
            if b is not None:
                close(a, b)


CASES = [(torch.float32, r, i) for r in ["sum", "prod", "mean", "amax", "amin"] for i in (True, False)] + [
    (torch.int64, "mean", True),
    (torch.int64, "amin", False),
    (torch.bfloat16, "sum", True),
    (torch.bfloat16, "amax", False),
]


@pytest.mark.parametrize("dtype,reduce,include_self", CASES)
def test_scatter_reduce(dtype, reduce, include_self):
    x, src = make((4, 5), dtype), make((3, 5), dtype, seed=1)
    idx = torch.randint(0, 4, (3, 5), generator=torch.Generator().manual_seed(2))
    check(
        lambda a, s: a.scatter_reduce(0, idx.to(a.device), s, reduce, include_self=include_self),
        x,
        src,
        grad=reduce in ("sum", "mean"),
    )
    if dtype == torch.float32:  # non-contiguous source
        check(
            lambda a, s: a.scatter_reduce(
                1, idx.T.contiguous().to(a.device)[:4], s.T[:4], reduce, include_self=include_self
            ),
            x,
            src,
            grad=False,
        )


def test_scatter_reduce_out_and_errors():
    x, src, idx = make((4, 5)), make((3, 5), seed=1), torch.tensor([[0, 1, 2, 3, 0]] * 3)
    out = torch.empty(4, 5, device="tpu")
    torch.scatter_reduce(x.to("tpu"), 0, idx.to("tpu"), src.to("tpu"), "sum", out=out)
    close(out, torch.scatter_reduce(x, 0, idx, src, "sum"))
    with pytest.raises(RuntimeError):
        x.to("tpu").scatter_reduce(0, idx.to("tpu"), src.to("tpu"), "median")


@pytest.mark.parametrize(
    "dtype,reduce,include_self",
    [(torch.float32, r, i) for r in ["prod", "mean", "amax", "amin"] for i in (True, False)]
    + [(torch.int64, "mean", False)],
)
def test_index_reduce(dtype, reduce, include_self):
    x, src = make((4, 5), dtype), make((4, 3), dtype, seed=1)
    idx = torch.tensor([0, 4, 4])
    check(lambda a, s: a.index_reduce(1, idx.to(a.device), s, reduce, include_self=include_self), x, src, grad=False)
    a = x.to("tpu")
    a.index_reduce_(1, idx.to("tpu"), src.to("tpu"), reduce, include_self=include_self)
    close(a, x.clone().index_reduce_(1, idx, src, reduce, include_self=include_self))


def test_take_put():
    x = make((3, 4))
    idx = torch.tensor([[0, -1], [7, 11]])
    check(lambda a: torch.take(a, idx.to(a.device)), x)
    check(lambda a: torch.take(a.T, idx.to(a.device)), x)  # non-contiguous
    src = make((3,), seed=3)
    for acc in (False, True):
        check(lambda a, s: a.put(torch.tensor([0, 5, 5]).to(a.device), s, accumulate=acc), x, src)
    a = x.to("tpu")
    a.put_(torch.tensor([1, -2]).to("tpu"), torch.tensor([9.0, 8.0]).to("tpu"))
    close(a, x.clone().put_(torch.tensor([1, -2]), torch.tensor([9.0, 8.0])))
    with pytest.raises(RuntimeError):
        x.to("tpu").put_(torch.tensor([1]).to("tpu"), torch.tensor([1.0, 2.0]).to("tpu"))


def test_isin():
    e, t = torch.arange(-4, 8).reshape(3, 4), torch.tensor([3, 5, 12, -4])
    for inv in (False, True):
        close(torch.isin(e.to("tpu"), t.to("tpu"), invert=inv), torch.isin(e, t, invert=inv))
    close(torch.isin(e.to("tpu"), 3), torch.isin(e, 3))
    close(torch.isin(3.0, t.to("tpu")), torch.isin(3.0, t))
    close(torch.isin(e.float().to("tpu"), t.to("tpu")), torch.isin(e.float(), t))


def test_unfold_grad():
    check(lambda a: a.unfold(1, 3, 2), make((2, 8, 3)))
    check(lambda a: a.unfold(-1, 2, 1), make((4, 3)))


@pytest.mark.parametrize("mode", ["reflect", "replicate"])
@pytest.mark.parametrize(
    "shape,pad",
    [((2, 3, 5), (2, 1)), ((2, 3, 5, 6), (1, 2, 3, 0)), ((1, 2, 4, 5, 6), (1, 1, 2, 0, 3, 2)), ((3, 5), (0, 2))],
)
def test_pad(mode, shape, pad):
    check(lambda a: F.pad(a, pad, mode=mode), make(shape))
    check(lambda a: F.pad(a.transpose(-1, -2), pad, mode=mode), make(shape))


def test_pad_negative_and_errors():
    check(lambda a: F.pad(a, (-1, 2, 1, -2), mode="replicate"), make((2, 4, 5)))
    check(lambda a: F.pad(a, (1, 2), mode="reflect"), make((2, 3, 5), torch.bfloat16), grad=False)
    with pytest.raises(RuntimeError):
        F.pad(make((2, 3, 3)).to("tpu"), (3, 1), mode="reflect")


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_unique(dtype):
    x = make((4, 5), dtype)
    for s in (True, False):
        for ri, rc in ((False, False), (True, True)):
            check(lambda a: torch.unique(a, sorted=s, return_inverse=ri, return_counts=rc), x, grad=False)
            check(lambda a: torch.unique_consecutive(a, return_inverse=ri, return_counts=rc), x, grad=False)
    check(lambda a: torch.unique(a.T), x, grad=False)
    check(lambda a: torch.unique(a), torch.empty(0, dtype=dtype), grad=False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_unique_count_row(dtype):
    """tpu::unique_count (the size unique's kernels read back): a 0-d long on
    the device, the number of distinct values (of runs when consecutive) as
    CPU torch finds them, each NaN counting once."""
    from torchtpu import _kernels

    spec = [("self", "T", _kernels._REQUIRED), ("consecutive", "b", _kernels._REQUIRED)]
    row = _kernels._row("tpu::unique_count", spec)
    x = make((4, 5), dtype)
    cases = [x, x.T, x[:1, :1], torch.empty(0, dtype=dtype), torch.zeros(3, dtype=dtype)]
    if dtype.is_floating_point:
        cases.append(torch.tensor([1.0, float("nan"), 1.0, float("nan"), -0.0, 0.0]))
    for t in cases:
        for consecutive in (False, True):
            got = row(t.to("tpu"), consecutive)
            assert got.device.type == "tpu" and got.dtype == torch.int64 and got.dim() == 0
            want = torch.unique_consecutive(t) if consecutive else torch.unique(t)
            assert int(got.item()) == want.numel(), (t, consecutive)


def test_repeat_interleave():
    r = torch.tensor([2, 0, 3, 1])
    close(torch.repeat_interleave(r.to("tpu")), torch.repeat_interleave(r))
    close(torch.repeat_interleave(r.int().to("tpu")), torch.repeat_interleave(r.int()))
    check(lambda a: a.repeat_interleave(r.to(a.device), dim=0), make((4, 3)))
    check(lambda a: a.repeat_interleave(2, dim=1), make((4, 3)))
    close(torch.repeat_interleave(r.to("tpu"), output_size=6), torch.repeat_interleave(r, output_size=6))


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag(mode):
    w = make((10, 3))
    i, o = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9]), torch.tensor([0, 4, 4, 6])
    check(lambda a: F.embedding_bag(i.to(a.device), a, o.to(a.device), mode=mode), w)
    check(lambda a: F.embedding_bag(i.to(a.device), a, o.to(a.device), mode=mode, padding_idx=4), w)
    check(lambda a: F.embedding_bag(i.reshape(2, 4).to(a.device), a, mode=mode), w)
    if mode == "sum":
        check(
            lambda a, p: F.embedding_bag(i.to(a.device), a, o.to(a.device), mode="sum", per_sample_weights=p),
            w,
            make((8,), seed=4),
        )
    check(
        lambda a: F.embedding_bag(i.to(a.device), a, o.to(a.device), mode=mode, include_last_offset=True),
        w,
        grad=mode != "sum",
    )


def test_embedding_max_norm():
    w = make((10, 3)) * 3
    idx = torch.tensor([[1, 2], [2, 7]])
    a, b = w.clone(), w.to("tpu")
    ya, yb = F.embedding(idx, a, max_norm=1.0), F.embedding(idx.to("tpu"), b, max_norm=1.0)
    close(yb, ya)
    close(b, a)  # renormalised in place
    a, b = w.clone(), w.to("tpu")
    torch.embedding_renorm_(a, idx, 1.5, 1.0)
    torch.embedding_renorm_(b, idx.to("tpu"), 1.5, 1.0)
    close(b, a)


def test_unique_dim():
    x = torch.tensor([[3, 1, 2, 1], [1, 5, 3, 5], [3, 1, 2, 1]])
    for dim in (0, 1):
        check(lambda a: torch.unique(a, dim=dim, return_inverse=True, return_counts=True), x, grad=False)
        check(lambda a: torch.unique_consecutive(a, dim=dim, return_counts=True), x.float(), grad=False)
    check(lambda a: torch.unique(a, dim=2), torch.randint(0, 2, (6, 2, 3)), grad=False)


@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min", "prod"])
def test_segment_reduce(reduce):
    x = make((5, 5, 3))
    x[1, 2, 0] = 0
    lengths = torch.tensor([[2, 0, 3, 0], [0, 1, 2, 2], [3, 0, 2, 0], [1, 1, 1, 2], [0, 1, 2, 2]])
    check(lambda a: torch.segment_reduce(a, reduce, lengths=lengths.to(a.device), axis=1, initial=2), x)
    offsets = torch.tensor([0, 1, 3, 3, 5])
    check(lambda a: torch.segment_reduce(a, reduce, offsets=offsets.to(a.device), axis=0), x)
    with pytest.raises(RuntimeError):
        torch.segment_reduce(x.to("tpu"), reduce)


@pytest.mark.parametrize(
    "shape,reps",
    [
        ((2, 3), (2, 2)),
        ((3,), (2, 1, 3)),
        ((), (3, 2)),
        ((1, 2, 3, 4, 5), (2, 1, 1, 1, 1)),  # torch's own kernel needs a 10-dim view here
        ((2, 1, 2, 1, 2, 1, 2, 1), (1, 2, 1, 2, 1, 1, 1, 3)),  # 8 dims: copies by concatenation
        ((2, 3), (0, 2)),
        ((0, 3), (2, 2)),
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_repeat_and_tile_match_cpu(shape, reps, dtype):
    n = math.prod(shape)
    x = (torch.arange(n) % 3).to(dtype).reshape(shape)
    got = x.to("tpu").repeat(*reps)
    want = x.repeat(*reps)
    assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got.cpu(), want)
    assert torch.equal(torch.tile(x.to("tpu"), reps).cpu(), torch.tile(x, reps))


def test_repeat_gradient_and_errors_match_cpu():
    x = torch.randn(2, 3, generator=torch.Generator().manual_seed(0))
    w = torch.arange(24.0).reshape(2, 2, 6)
    xc, xt = x.clone().requires_grad_(), x.to("tpu").requires_grad_()
    (xc.repeat(2, 1, 2) * w).sum().backward()
    (xt.repeat(2, 1, 2) * w.to("tpu")).sum().backward()
    assert torch.allclose(xt.grad.cpu(), xc.grad)
    for reps in ((2,), (2, -1)):
        with pytest.raises(RuntimeError) as cpu:
            torch.ones(2, 3).repeat(*reps)
        with pytest.raises(RuntimeError) as tpu:
            torch.ones(2, 3, device="tpu").repeat(*reps)
        assert str(cpu.value) in str(tpu.value)
