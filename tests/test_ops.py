"""The everyday ops (elementwise, activations, matmuls, reductions, softmax and
norms, factories, random, foreach) against CPU PyTorch: values, dtypes and shapes
across dtypes, non-contiguous inputs, and gradients (float32). Other families
have their own test_ops_<family>.py."""

import math

import pytest
import torch
import torch.nn.functional as F

import torchtpu  # noqa: F401

DTYPES = [torch.float32, torch.bfloat16, torch.int64, torch.bool]


def make(shape, dtype, seed=0, low=-3, high=3):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_floating_point:
        return (torch.rand(shape, generator=g) * (high - low) + low).to(dtype)
    return torch.randint(low, high + 1, shape, generator=g).to(dtype)


def tpu(x):
    return x.to("tpu") if isinstance(x, torch.Tensor) else x


def check(fn, *args, dtype=None, **kw):
    """Run fn on CPU and on tpu copies; compare values, dtypes and shapes (or
    that both raise)."""
    try:
        want = fn(*args, **kw)
    except Exception as e:  # the tpu must fail the same way
        with pytest.raises(type(e)):
            fn(*[tpu(a) for a in args], **{k: tpu(v) for k, v in kw.items()})
        return
    got = fn(*[tpu(a) for a in args], **{k: tpu(v) for k, v in kw.items()})
    wants = want if isinstance(want, tuple) else (want,)
    gots = got if isinstance(got, tuple) else (got,)
    for w, g in zip(wants, gots):
        assert g.device.type == "tpu"
        g = g.cpu()
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, w.dtype, g.shape, w.shape)
        if w.dtype == torch.bfloat16 or w.dtype == torch.float16:
            torch.testing.assert_close(g.float(), w.float(), rtol=2e-2, atol=2e-2)
        else:
            torch.testing.assert_close(g, w, equal_nan=True)


BINARY = {
    "add": torch.add,
    "sub": torch.sub,
    "mul": torch.mul,
    "div": torch.div,
    "maximum": torch.maximum,
    "minimum": torch.minimum,
    "eq": torch.eq,
    "ne": torch.ne,
    "lt": torch.lt,
    "le": torch.le,
    "gt": torch.gt,
    "ge": torch.ge,
    "logical_and": torch.logical_and,
    "logical_or": torch.logical_or,
    "logical_xor": torch.logical_xor,
}


@pytest.mark.parametrize("name", sorted(BINARY))
@pytest.mark.parametrize("dtype", DTYPES)
def test_binary(name, dtype):
    f = BINARY[name]
    a, b = make((3, 4), dtype, 1), make((3, 4), dtype, 2)
    check(f, a, b)
    check(f, a, make((4,), dtype, 3))  # broadcasting
    check(lambda x, y: f(x.t(), y.t()), a, b)  # non-contiguous
    if dtype != torch.bool:
        check(lambda x: f(x, 2), a)  # Python scalar
        check(lambda x: f(x, 1.5), a)  # float scalar promotes ints


def test_type_promotion_mixed():
    check(torch.add, make((3,), torch.int64), make((3,), torch.float32))
    check(torch.add, make((3,), torch.bfloat16), make((3,), torch.float32))
    check(torch.mul, make((3,), torch.bool), make((3,), torch.int64))
    check(lambda x: x + torch.tensor(2.5), make((3,), torch.int64))  # 0-d CPU tensor
    check(lambda x, y: x * y, make((3,), torch.float32), make((), torch.float64))


def test_alpha_rounding_remainder_pow():
    a, b = make((5,), torch.float32, 1), make((5,), torch.float32, 2)
    check(lambda x, y: torch.add(x, y, alpha=2.5), a, b)
    check(lambda x, y: torch.sub(x, y, alpha=3), a, b)
    check(lambda x: torch.rsub(x, 2.0), a)
    ia, ib = torch.tensor([7, -7, 7, -7, 5]), torch.tensor([2, 2, -2, -2, 5])
    for mode in ("trunc", "floor"):
        check(lambda x, y: torch.div(x, y, rounding_mode=mode), ia, ib)
        check(lambda x, y: torch.div(x, y, rounding_mode=mode), ia.float(), ib.float())
    check(torch.remainder, ia, ib)
    check(torch.remainder, ia.float(), ib.float())
    check(lambda x: torch.pow(x, 2), a)
    check(lambda x: torch.pow(2, x), a)
    check(torch.pow, a.abs(), b)
    check(torch.atan2, a, b)
    check(torch.hypot, a, b)


UNARY = [
    "neg",
    "abs",
    "exp",
    "expm1",
    "log",
    "log1p",
    "sqrt",
    "rsqrt",
    "sin",
    "cos",
    "tanh",
    "sigmoid",
    "floor",
    "ceil",
    "round",
    "sign",
    "reciprocal",
    "erf",
    "relu",
    "logical_not",
]


@pytest.mark.parametrize("name", UNARY)
@pytest.mark.parametrize("dtype", DTYPES)
def test_unary(name, dtype):
    f = getattr(torch, name)
    x = make((4, 3), dtype, 4, low=0 if name in ("log", "sqrt", "rsqrt", "log1p") else -3)
    if name in ("log", "sqrt", "rsqrt", "reciprocal") and dtype.is_floating_point:
        x = x + 0.5
    check(f, x)
    check(lambda t: f(t.t()[1:]), x)


def test_activations_and_backwards():
    x = make((4, 6), torch.float32, 5)
    for f in (
        F.relu,
        F.gelu,
        lambda t: F.gelu(t, approximate="tanh"),
        torch.tanh,
        torch.sigmoid,
        F.silu,
        torch.erf,
        lambda t: t.clamp(-1, 1),
    ):
        check(f, x)
        xc = x.clone().requires_grad_()
        xt = x.to("tpu").requires_grad_()
        (g,) = torch.autograd.grad(f(xc).sum(), xc)
        (gt,) = torch.autograd.grad(f(xt).sum(), xt)
        torch.testing.assert_close(gt.cpu(), g, rtol=1e-5, atol=1e-5)


def test_where_masked_fill_clamp():
    x, y = make((3, 4), torch.float32, 1), make((3, 4), torch.float32, 2)
    m = make((3, 4), torch.bool, 3)
    check(torch.where, m, x, y)
    check(lambda c, a: torch.where(c, a, 0.0), m, x)
    check(lambda a, c: a.masked_fill(c, -1.5), x, m)
    check(lambda a, c: a.masked_fill(c, float("-inf")), x, m[0])
    check(lambda a: a.clamp(min=-1), x)
    check(lambda a: a.clamp(max=1), x)
    check(lambda a, lo: a.clamp(min=lo), x, y)
    check(lambda a: a.clamp_min(0.5), x)
    check(lambda a: a.clamp(-1, 1), make((3, 4), torch.int64))


@pytest.mark.parametrize("dtype", DTYPES)
def test_reductions(dtype):
    x = make((3, 4, 5), dtype, 6)
    check(torch.sum, x)
    check(lambda t: t.sum(1), x)
    check(lambda t: t.sum((0, 2), keepdim=True), x)
    check(lambda t: t.sum(-1, dtype=torch.float64), x)
    check(lambda t: t.amax(1), x)
    check(lambda t: t.amin((0, 1), keepdim=True), x)
    check(torch.max, x)
    check(torch.min, x)
    check(lambda t: torch.max(t, 2), x)
    check(lambda t: torch.min(t, 0, keepdim=True), x)
    check(torch.any, x)
    check(lambda t: t.all(1), x)
    if dtype != torch.bool:
        check(torch.argmax, x)
        check(lambda t: t.argmax(1), x)
        check(lambda t: t.argmin(2, keepdim=True), x)
    check(torch.mean, x)  # ints raise the same error as on CPU
    check(lambda t: t.mean((1, 2)), x)
    check(lambda t: t.t() if t.dim() == 2 else t.transpose(0, 2).sum(0), x)


def test_argmax_ties_and_nan():
    check(lambda t: t.argmax(1), torch.tensor([[1.0, 3.0, 3.0], [2.0, float("nan"), 5.0]]))
    check(lambda t: t.max(0), torch.tensor([[1.0, 3.0], [1.0, float("nan")]]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matmuls(dtype):
    a, b = make((4, 5), dtype, 1), make((5, 3), dtype, 2)
    check(torch.mm, a, b)
    check(lambda x, y: torch.mm(y.t(), x.t()), a, b)
    check(torch.addmm, make((3,), dtype, 3), a, b)
    check(lambda c, x, y: torch.addmm(c, x, y, beta=0.5, alpha=2), make((4, 3), dtype, 3), a, b)
    check(torch.bmm, make((2, 4, 5), dtype, 4), make((2, 5, 3), dtype, 5))
    check(torch.matmul, make((2, 3, 4, 5), dtype, 6), make((5, 2), dtype, 7))
    check(torch.matmul, make((5,), dtype, 6), make((5, 2), dtype, 7))
    check(torch.dot, make((5,), dtype, 8), make((5,), dtype, 9))
    check(torch.mv, a, make((5,), dtype, 9))
    check(torch.mm, a, make((4, 3), dtype))  # shape error like CPU


def test_matmul_grads():
    a = make((4, 5), torch.float32, 1).requires_grad_()
    b = make((5, 3), torch.float32, 2).requires_grad_()
    at, bt = a.detach().to("tpu").requires_grad_(), b.detach().to("tpu").requires_grad_()
    ga = torch.autograd.grad((a @ b).square().sum(), (a, b))
    gt = torch.autograd.grad((at @ bt).square().sum(), (at, bt))
    for x, y in zip(gt, ga):
        torch.testing.assert_close(x.cpu(), y, rtol=1e-5, atol=1e-5)


def test_cat_stack_tril():
    a, b = make((2, 3), torch.float32, 1), make((4, 3), torch.float32, 2)
    check(lambda x, y: torch.cat([x, y]), a, b)
    check(lambda x, y: torch.cat([x.t(), y.t()], 1), a, b)
    check(lambda x, y: torch.cat([x, y.to(torch.int64)]), a, b)
    check(lambda x: torch.stack([x, x, x], 1), a)
    check(lambda x: torch.tril(x), b)
    check(lambda x: torch.triu(x, 1), b)
    check(lambda x: torch.tril(x, -1), make((2, 4, 4), torch.int64))


def test_cat_and_stack_of_long_lists():
    """Lists longer than one call takes (64): torch.stack of a model's norms
    (clip_grad_norm_), cat of per-batch results."""
    xs = [make((2, 3), torch.float32, i) for i in range(150)]
    check(lambda *t: torch.cat(t), *xs)
    check(lambda *t: torch.stack(t, 1), *xs)
    mixed = [make((3,), torch.int64 if i % 3 else torch.float32, i) for i in range(130)]
    mixed[70] = torch.zeros(0)  # legacy: an empty 1-d tensor is skipped
    check(lambda *t: torch.cat(t), *mixed)
    ones = [torch.full((1,), float(i)) for i in range(1000)]
    got = torch.cat([t.to("tpu") for t in ones])
    assert torch.equal(got.cpu(), torch.cat(ones))
    with torchtpu.eager_mode("fused"):
        m0 = torchtpu.metrics()["fused_programs_run"]
        got = torch.stack([t.to("tpu") * 2 for t in ones]).sum()
        assert got.item() == 2 * sum(range(1000))
        assert torchtpu.metrics()["fused_programs_run"] == m0 + 1


def test_clip_grad_norm_of_many_parameters():
    ps = [make((4,), torch.float32, i) for i in range(100)]
    cpu = [torch.nn.Parameter(p.clone()) for p in ps]
    tpu = [torch.nn.Parameter(p.to("tpu")) for p in ps]
    for a, b, i in zip(cpu, tpu, range(100)):
        a.grad = make((4,), torch.float32, 1000 + i)
        b.grad = a.grad.to("tpu")
    na, nb = torch.nn.utils.clip_grad_norm_(cpu, 1.0), torch.nn.utils.clip_grad_norm_(tpu, 1.0)
    torch.testing.assert_close(nb.cpu(), na)
    for a, b in zip(cpu, tpu):
        torch.testing.assert_close(b.grad.cpu(), a.grad)


def _foreach_program(dev):
    """The foreach calls of torch's optimizers and more, on lists of mixed
    shapes and dtypes (every overload kind: List, Scalar, ScalarList, Tensor;
    in place, functional and out= element ops)."""

    def lst(seed, dtype=torch.float32, pos=False):
        xs = [make((3 + i, 4) if i % 2 else (5,), dtype, seed + i) for i in range(5)]
        return [(x.abs() + 0.5 if pos else x).to(dev) for x in xs]

    a, b, c = lst(0), lst(10, pos=True), lst(20)
    ints = lst(30, torch.int64)
    torch._foreach_add_(a, b, alpha=0.3)
    torch._foreach_mul_(a, 1.5)
    torch._foreach_div_(a, [1.0, 2.0, 3.0, 4.0, 5.0])
    torch._foreach_sub_(a, c)
    torch._foreach_lerp_(a, c, 0.25)
    torch._foreach_lerp_(a, b, [0.1, 0.2, 0.3, 0.6, 0.9])
    torch._foreach_lerp_(a, b, c)
    torch._foreach_addcmul_(a, b, c, value=0.5)
    torch._foreach_addcdiv_(a, c, b, [0.1, 0.2, 0.3, 0.4, 0.5])
    torch._foreach_addcdiv_(a, c, b, 2)
    torch._foreach_mul_(c, torch.tensor(3.0, device=dev))
    torch._foreach_add_(c, torch.tensor(2.0, device=dev), alpha=2)
    torch._foreach_clamp_min_(c, 0.1)
    torch._foreach_maximum_(c, a)
    torch._foreach_add_(ints, 3)
    out = [
        t
        for r in (
            torch._foreach_sqrt(b),
            torch._foreach_add(a, b),
            torch._foreach_pow(b, 2.0),
            torch._foreach_mul(ints, 2),
            torch._foreach_div(ints, 2),
            torch._foreach_exp(c),
            torch._foreach_max(c),
            torch._foreach_norm(c),
            torch._foreach_neg(ints),
        )
        for t in r
    ]
    torch._foreach_sqrt_(b)
    torch._foreach_zero_(ints)
    return [x.cpu() for x in a + b + c + ints + out]


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_foreach_ops(mode):
    want = _foreach_program("cpu")
    m0 = torchtpu.metrics()["ops_dispatched"]
    with torchtpu.eager_mode(mode):
        got = _foreach_program("tpu")
    assert torchtpu.metrics()["ops_dispatched"] > m0
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)
    t = [torch.ones(2, device="tpu")]
    with pytest.raises(RuntimeError, match="same number of tensors"):
        torch._foreach_add_(t, t * 2)
    with pytest.raises(RuntimeError, match="at least one tensor"):
        torch._foreach_mul_([], 2.0)
    with pytest.raises(RuntimeError, match="same device|devices"):
        torch._foreach_add_(t, [torch.ones(2)])


def test_foreach_ops_reach_the_element_kernels():
    """torch's optimizers' foreach calls are served by torchtpu's own foreach
    kernels (one call per list, not torch's loop that dispatches each item)."""
    for name in (
        "_foreach_add_.List",
        "_foreach_add_.Scalar",
        "_foreach_mul_.Tensor",
        "_foreach_lerp_.Scalar",
        "_foreach_addcmul_.Scalar",
        "_foreach_addcdiv_.ScalarList",
        "_foreach_sqrt",
        "_foreach_div_.ScalarList",
    ):
        table = torch._C._dispatch_dump_table("aten::" + name)
        line = next(x for x in table.splitlines() if x.startswith("PrivateUse1:"))
        assert "torchtpu" in line, line


def _close_norm(g, w, tol=1e-5):
    g = g.cpu()
    assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, w.dtype, g.shape, w.shape)
    tol = 2e-2 if w.dtype == torch.bfloat16 else tol
    torch.testing.assert_close(g, w, rtol=tol, atol=tol)


def test_foreach_norm():
    """torch._foreach_norm (clip_grad_norm_'s) is one op per 64 tensors: each
    order, dtype=, half and 0-d tensors, empty tensors, as on CPU; torch's
    errors for an order without an identity on an empty tensor."""
    ts = [
        make((3, 4), torch.float32, 1),
        make((5,), torch.float32, 2),
        make((), torch.float32, 3),
        make((2, 3), torch.bfloat16, 4),
        torch.zeros(0, 3),
    ]
    for o in (2, 1, 0, 3.5, float("inf"), float("-inf")):
        items = ts if o in (2, 1, 0, 3.5) else ts[:-1]
        want = torch._foreach_norm(items, o)
        got = torch._foreach_norm([t.to("tpu") for t in items], o)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            _close_norm(g, w, 1e-5)
    _close_norm(
        torch._foreach_norm([ts[0].to("tpu")], 2, dtype=torch.float64)[0],
        torch._foreach_norm([ts[0]], 2, dtype=torch.float64)[0],
    )
    many = [make((3,), torch.float32, k) for k in range(70)]
    on_tpu = [t.to("tpu") for t in many]
    m0 = torchtpu.metrics()["ops_dispatched"]
    got = torch._foreach_norm(on_tpu)
    assert torchtpu.metrics()["ops_dispatched"] - m0 == 2  # one op per 64 tensors
    for g, w in zip(got, torch._foreach_norm(many)):
        _close_norm(g, w, 1e-5)
    with pytest.raises(RuntimeError, match="infinity norm on an empty tensor"):
        torch._foreach_norm([torch.zeros(0, device="tpu")], float("inf"))
    with pytest.raises(RuntimeError, match="-1 norm on an empty tensor"):
        torch._foreach_norm([torch.zeros(0, device="tpu")], -1)


@pytest.mark.parametrize("fn", [torch.softmax, torch.log_softmax])
def test_softmax_of_rows_with_infinities_and_nan_matches_cpu(fn):
    """A row holding +inf or NaN is NaN throughout, a row of -inf too, as on the CPU; -inf beside
    finite values is a 0 probability."""
    inf, nan = float("inf"), float("nan")
    x = torch.tensor([[-inf, -inf], [inf, 1.0], [inf, inf], [nan, 1.0], [-inf, 1.0], [1.0, 2.0]])
    for dim in (1, 0):
        got = fn(x.to("tpu"), dim).cpu()
        torch.testing.assert_close(got, fn(x, dim), equal_nan=True)


def test_softmax_family_and_grads():
    x = make((3, 7), torch.float32, 3)
    for f in (lambda t: F.softmax(t, -1), lambda t: F.log_softmax(t, 0), lambda t: F.softmax(t, 1)):
        check(f, x)
        xc, xt = x.clone().requires_grad_(), x.to("tpu").requires_grad_()
        w = make((3, 7), torch.float32, 4)
        (g,) = torch.autograd.grad((f(xc) * w).sum(), xc)
        (gt,) = torch.autograd.grad((f(xt) * w.to("tpu")).sum(), xt)
        torch.testing.assert_close(gt.cpu(), g, rtol=1e-5, atol=1e-6)
    check(lambda t: F.softmax(t, -1), x.to(torch.bfloat16))
    check(lambda t: F.softmax(t.masked_fill(torch.ones_like(t, dtype=torch.bool), float("-inf")), -1), x)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_nll(reduction):
    x = make((6, 5), torch.float32, 1)
    y = torch.tensor([0, 4, 2, 2, 1, 3])
    w = make((5,), torch.float32, 2, low=0.1, high=2)
    for kw in ({}, {"weight": w}, {"ignore_index": 2}, {"weight": w, "ignore_index": 4}):
        check(lambda a, b, **k: F.cross_entropy(a, b, reduction=reduction, **k), x, y, **kw)
        xc, xt = x.clone().requires_grad_(), x.to("tpu").requires_grad_()
        ktpu = {k: tpu(v) for k, v in kw.items()}
        (g,) = torch.autograd.grad(F.cross_entropy(xc, y, reduction=reduction, **kw).sum(), xc)
        (gt,) = torch.autograd.grad(F.cross_entropy(xt, y.to("tpu"), reduction=reduction, **ktpu).sum(), xt)
        torch.testing.assert_close(gt.cpu(), g, rtol=1e-5, atol=1e-6)
    check(lambda a, b: F.nll_loss(a, b, reduction=reduction), F.log_softmax(x[0], 0), y[0])


def test_layer_norm_and_grads():
    x = make((2, 3, 8), torch.float32, 1)
    w, b = make((8,), torch.float32, 2), make((8,), torch.float32, 3)
    check(lambda t: F.layer_norm(t, (8,)), x)
    check(lambda t, ww, bb: F.layer_norm(t, (8,), ww, bb, eps=1e-3), x, w, b)
    check(lambda t: F.layer_norm(t, (3, 8)), x)
    check(lambda t: F.layer_norm(t, (8,)), x.to(torch.bfloat16))
    params = [x.clone().requires_grad_(), w.clone().requires_grad_(), b.clone().requires_grad_()]
    tparams = [p.detach().to("tpu").requires_grad_() for p in params]
    up = make((2, 3, 8), torch.float32, 4)
    g = torch.autograd.grad((F.layer_norm(params[0], (8,), params[1], params[2]) * up).sum(), params)
    gt = torch.autograd.grad((F.layer_norm(tparams[0], (8,), tparams[1], tparams[2]) * up.to("tpu")).sum(), tparams)
    for a, e in zip(gt, g):
        torch.testing.assert_close(a.cpu(), e, rtol=1e-4, atol=1e-5)


def test_embedding_and_grad():
    w = make((10, 4), torch.float32, 1)
    idx = torch.tensor([[1, 3, 3], [0, 9, 1]])
    check(F.embedding, idx, w)
    for pad in (None, 3):
        wc, wt = w.clone().requires_grad_(), w.to("tpu").requires_grad_()
        up = make((2, 3, 4), torch.float32, 2)
        (g,) = torch.autograd.grad((F.embedding(idx, wc, padding_idx=pad) * up).sum(), wc)
        (gt,) = torch.autograd.grad((F.embedding(idx.to("tpu"), wt, padding_idx=pad) * up.to("tpu")).sum(), wt)
        torch.testing.assert_close(gt.cpu(), g)


@pytest.mark.parametrize("dtype", DTYPES)
def test_factories_fill_clone_convert(dtype):
    assert torch.equal(torch.zeros(2, 3, dtype=dtype, device="tpu").cpu(), torch.zeros(2, 3, dtype=dtype))
    assert torch.equal(torch.ones(2, 3, dtype=dtype, device="tpu").cpu(), torch.ones(2, 3, dtype=dtype))
    assert torch.equal(torch.full((2, 2), 1, dtype=dtype, device="tpu").cpu(), torch.full((2, 2), 1, dtype=dtype))
    x = make((3, 4), dtype, 1)
    check(lambda t: t.clone(), x)
    check(lambda t: t.t().contiguous(), x)
    for other in DTYPES:
        check(lambda t: t.to(other), x)
    t = torch.empty(3, 4, dtype=dtype, device="tpu")
    t.fill_(1)
    assert torch.equal(t.cpu(), torch.ones(3, 4, dtype=dtype))
    t.zero_()
    assert torch.equal(t.cpu(), torch.zeros(3, 4, dtype=dtype))


def test_arange():
    for args, kw in [
        ((5,), {}),
        ((2, 9), {}),
        ((1, 10, 3), {}),
        ((0.0, 1.0, 0.25), {}),
        ((10, 0, -3), {}),
        ((5,), {"dtype": torch.float32}),
        ((0, 2.5, 0.5), {"dtype": torch.float64}),
    ]:
        want = torch.arange(*args, **kw)
        got = torch.arange(*args, device="tpu", **kw).cpu()
        assert got.dtype == want.dtype and torch.equal(got, want), (args, got, want)


def test_random_statistics():
    n = 100_000
    torch.manual_seed(0)
    x = torch.empty(n, device="tpu").normal_(2.0, 3.0).cpu()
    assert abs(x.mean().item() - 2.0) < 5 * 3.0 / n**0.5
    assert abs(x.std().item() - 3.0) < 0.05
    u = torch.empty(n, device="tpu").uniform_(-1, 3).cpu()
    assert u.min().item() >= -1 and u.max().item() < 3
    assert abs(u.mean().item() - 1.0) < 5 * (16 / 12) ** 0.5 / n**0.5
    b = torch.empty(n, device="tpu").bernoulli_(0.3).cpu()
    assert set(b.unique().tolist()) <= {0.0, 1.0}
    assert abs(b.mean().item() - 0.3) < 5 * (0.21 / n) ** 0.5
    r = torch.randn(n, device="tpu").cpu()
    assert abs(r.mean().item()) < 5 / n**0.5


@pytest.mark.parametrize("mode", ["strict", "fused"])
@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_random_complex(dtype, mode):
    """torch samples a complex tensor as view_as_real(self): each part is an
    independent draw; a normal's parts have the same mean and std / sqrt(2)."""
    n = 100_000
    with torchtpu.eager_mode(mode):
        torch.manual_seed(3)
        z = torch.randn(n, dtype=dtype, device="tpu")
        torch.manual_seed(3)
        again = torch.randn(n, dtype=dtype, device="tpu")
        m = torch.empty(n, dtype=dtype, device="tpu").normal_(1.0, 2.0)
        u = torch.rand(n, dtype=dtype, device="tpu")
        v = torch.empty(n, dtype=dtype, device="tpu").uniform_(-1, 3)
        like = torch.randn_like(z)
        z, again, m, u, v, like = (a.cpu() for a in (z, again, m, u, v, like))
    assert all(a.dtype == dtype and a.shape == (n,) for a in (z, m, u, v, like))
    assert torch.equal(z, again)  # reproducible for a seed
    tol = 5 / n**0.5
    for part in (z.real, z.imag, like.real, like.imag):
        assert abs(part.mean().item()) < tol and abs(part.var().item() - 0.5) < 0.02
    assert abs(z.abs().pow(2).mean().item() - 1.0) < 0.03  # E|z|^2 = 1, as randn's
    for part in (m.real, m.imag):
        assert abs(part.mean().item() - 1.0) < 2 * tol * 2 and abs(part.std().item() - 2 / 2**0.5) < 0.03
    for part, lo, hi in ((u.real, 0, 1), (u.imag, 0, 1), (v.real, -1, 3), (v.imag, -1, 3)):
        assert part.min().item() >= lo and part.max().item() < hi
        assert abs(part.mean().item() - (lo + hi) / 2) < 5 * (hi - lo) / 12**0.5 / n**0.5
    assert abs(torch.corrcoef(torch.stack([z.real, z.imag]))[0, 1].item()) < tol  # independent parts
    assert not torch.equal(u.real, u.imag)


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_normal_of_a_complex_mean(dtype):
    """torch.normal(mean, std) with a complex mean, as the CPU: mean plus noise whose parts have
    std / sqrt(2) each (std a number or a real tensor); a complex std is refused as on the CPU."""
    n = 100_000
    real = torch.float32 if dtype == torch.complex64 else torch.float64
    mean = torch.full((n,), 1 + 2j, dtype=dtype)
    stds = (2.0, torch.full((n,), 2.0, dtype=real))
    for std in stds:
        got = torch.normal(mean.to("tpu"), std.to("tpu") if torch.is_tensor(std) else std).cpu()
        assert got.dtype == dtype and got.shape == (n,)
        for part, mu in ((got.real, 1.0), (got.imag, 2.0)):
            assert abs(part.mean().item() - mu) < 0.03 and abs(part.std().item() - 2 / 2**0.5) < 0.03
    bad = torch.full((4,), 2.0, dtype=dtype)
    with pytest.raises(RuntimeError, match="standard deviation to be non-complex"):
        torch.normal(torch.zeros(4, dtype=dtype), bad)  # the CPU's own error
    with pytest.raises(RuntimeError, match="standard deviation to be non-complex"):
        torch.normal(torch.zeros(4, dtype=dtype, device="tpu"), bad.to("tpu")).cpu()


_COMPLEX_TRUTH = {
    "all": lambda z: z.all(),
    "all_dim": lambda z: z.all(1),
    "any_dim": lambda z: z.any(0),
    "all_keepdim": lambda z: torch.all(z, dim=0, keepdim=True),
    "bool": lambda z: z.bool(),
    "logical_not": lambda z: z.logical_not(),
    "logical_and": lambda z: torch.logical_and(z, z.conj()),
    "copy_into_bool": lambda z: torch.empty(2, 2, dtype=torch.bool, device=z.device).copy_(z),
    "where": lambda z: torch.where(z.bool(), 1, 0),
    "nonzero": lambda z: z.nonzero(),
    "count_nonzero": lambda z: torch.count_nonzero(z),
    "scalar_fill": lambda z: torch.full((2,), 1j, device=z.device).bool(),
}


@pytest.mark.parametrize("mode", ["strict", "fused"])
@pytest.mark.parametrize("case", sorted(_COMPLEX_TRUTH))
def test_complex_truth_is_either_part_nonzero(case, mode):
    """A complex number is true when its real or imaginary part is nonzero
    (1j is True; the real part alone once decided, and all/any failed)."""
    f = _COMPLEX_TRUTH[case]
    z = torch.tensor([[1 + 1j, 0j], [1j, float("nan")]], dtype=torch.complex64)
    with torchtpu.eager_mode(mode):
        got = f(z.to("tpu")).cpu()
    want = f(z)
    assert got.dtype == want.dtype and torch.equal(got, want), (got, want)


def test_dropout():
    n = 100_000
    x = torch.ones(n, device="tpu")
    torch.manual_seed(1)
    y = F.dropout(x, 0.25, training=True).cpu()
    kept = (y != 0).float().mean().item()
    assert abs(kept - 0.75) < 5 * (0.75 * 0.25 / n) ** 0.5
    assert torch.allclose(y[y != 0], torch.tensor(1 / 0.75))
    torch.manual_seed(1)
    assert torch.equal(F.dropout(x, 0.25, training=True).cpu(), y)  # reproducible for a seed
    assert torch.equal(F.dropout(x, 0.25, training=False).cpu(), x.cpu())
    xt = torch.ones(1000, device="tpu", requires_grad=True)
    out = F.dropout(xt, 0.5, training=True)
    (g,) = torch.autograd.grad(out.sum(), xt)
    torch.testing.assert_close(g.cpu(), (out.detach().cpu() != 0).float() * 2.0)


def test_inplace_ops_on_views():
    x = make((4, 5), torch.float32, 1)
    t = x.to("tpu")
    for f in (
        lambda a: a[:, 1].mul_(2),
        lambda a: a.t().add_(1),
        lambda a: a[1:3, ::2].sub_(0.5),
        lambda a: a.diagonal().div_(4),
        lambda a: a[2].relu_(),
        lambda a: a[:, :2].clamp_(-0.5, 0.5),
        lambda a: a.view(-1)[3:7].neg_(),
        lambda a: a[::2].masked_fill_(a[::2] > 0, 9.0),
    ):
        f(x)
        f(t)
        torch.testing.assert_close(t.cpu(), x)


def test_out_variants():
    a, b = make((3, 4), torch.float32, 1), make((3, 4), torch.float32, 2)
    out = torch.empty(3, 4, device="tpu")
    torch.add(a.to("tpu"), b.to("tpu"), out=out)
    torch.testing.assert_close(out.cpu(), a + b)
    torch.mul(a.to("tpu"), 3, out=out)
    torch.testing.assert_close(out.cpu(), a * 3)


def _floor_div_steps(a, b):
    """torch's floor division (mod = fmod(a, b), (a - mod) / b, adjusted and
    floored) computed in float64 with every step rounded to a's type: what
    CPU torch computes for half types, independent of the host."""
    dt, d = a.dtype, torch.float64

    def r(t):
        return t.to(dt).to(d)

    a, b = a.to(d), b.to(d)
    mod = torch.fmod(a, b)
    div = r((r(a - mod)) / b)
    div = torch.where((mod != 0) & ((b < 0) != (mod < 0)), r(div - 1), div)
    fl = torch.floor(div)
    fl = torch.where(r(div - fl) > 0.5, r(fl + 1), fl)
    fl = torch.where(div == 0, torch.copysign(torch.zeros_like(a), r(a / b)), fl)
    return torch.where(b == 0, a / b, fl).to(dt)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_floor_division_is_exactly_torchs(dtype):
    # torch floors from the remainder, step by step in the tensor's own type;
    # flooring the f32 quotient of half types differs in about 1% of elements
    g = torch.Generator().manual_seed(0)
    a = (torch.randn(5000, generator=g) * 50).to(dtype)
    b = (torch.randn(5000, generator=g) * 3).to(dtype)
    b[::7] = 0
    a[::11] = 0
    if dtype in (torch.float16, torch.bfloat16):
        # CPU torch's half kernels may compute natively on some hosts, so the
        # reference is torch's algorithm with each step rounded to the type
        want_half = _floor_div_steps(a, b)
    for fn in (lambda x, y: torch.div(x, y, rounding_mode="floor"), torch.floor_divide):
        got = fn(a.to("tpu"), b.to("tpu")).cpu()
        want = want_half if dtype in (torch.float16, torch.bfloat16) else fn(a, b)
        assert got.dtype == want.dtype
        assert torch.equal(got.isnan(), want.isnan())
        real = ~want.isnan()
        assert torch.equal(got[real], want[real])
        assert torch.equal(torch.signbit(got[real]), torch.signbit(want[real]))


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_division_is_correctly_rounded(mode):
    """XLA's CPU compiler turns a division by a broadcast or a constant into a
    product with the reciprocal (1 ulp off in about a quarter of the elements,
    0 for 0 / 0 of booleans); the quotients must be torch's, bit for bit."""
    g = torch.Generator().manual_seed(0)
    a, row, s = torch.randn(256, 64, generator=g), torch.randn(64, generator=g), torch.randn((), generator=g)
    cases = [
        lambda x, r, t: x / r,
        lambda x, r, t: x / t,
        lambda x, r, t: x / 3.7,
        lambda x, r, t: x / (r.abs() + 1),
        lambda x, r, t: (x > 0) / (r > 5),  # booleans, divisor all False: nan and inf as CPU
        lambda x, r, t: (x * 2) / 7 - r / 7,  # inside one fused program too
    ]
    with torchtpu.eager_mode(mode):
        for i, f in enumerate(cases):
            want = f(a, row, s)
            got = f(a.to("tpu"), row.to("tpu"), s.to("tpu")).cpu()
            assert got.dtype == want.dtype and got.shape == want.shape
            assert torch.equal(got.nan_to_num(7.0), want.nan_to_num(7.0)), (i, (got != want).sum())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rsqrt_is_one_over_sqrt_as_torch(dtype):
    """XLA's CPU rsqrt is approximate (up to 2 ulp); torch's kernel computes
    1 / sqrt(x): the same bits are expected."""
    x = torch.rand(4096, generator=torch.Generator().manual_seed(1), dtype=dtype) * 100
    x[:4] = torch.tensor([0.0, -1.0, float("inf"), float("nan")], dtype=dtype)
    got, want = x.to("tpu").rsqrt().cpu(), x.rsqrt()
    assert got.dtype == want.dtype and torch.equal(got.nan_to_num(7.0), want.nan_to_num(7.0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_atan_on_large_arrays(dtype):
    """The newer XLA CPU plugin's atan is wrong from 64 elements on (and XLA
    rewrites atan2(x, 1) into it): atan, and atan2 by a constant 1 inside a
    compiled graph, must match CPU on arrays of every size."""
    x = torch.randn(20, 20, generator=torch.Generator().manual_seed(0), dtype=dtype) * 9
    for n in (7, 64, 400):
        v = x.flatten()[:n]
        torch.testing.assert_close(torch.atan(v.to("tpu")).cpu(), torch.atan(v))
    f = torch.compile(lambda t: torch.atan2(t, torch.ones_like(t)), backend="tpu")
    torch.testing.assert_close(f(x.to("tpu")).cpu(), torch.atan2(x, torch.ones_like(x)))


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float64, torch.int64, torch.int32, torch.float16, torch.bfloat16]
)
def test_linspace_logspace_match_cpu(dtype):
    """float32, float64 and integers bit for bit with CPU torch's kernel (its
    fused multiply-adds, truncated integer ends). Half types within two units
    in the last place of the largest end of an exact (float64) linspace
    rounded to the type: CPU torch's own half results depend on the host's
    vector unit (native float16 arithmetic on AVX512-FP16 hosts rounds
    differently), so they are not a reference to match bit for bit."""
    half = dtype in (torch.float16, torch.bfloat16)
    g = torch.Generator().manual_seed(0)
    for _ in range(40):
        a, b = (torch.rand(2, generator=g) * 200 - 100).tolist()
        n = int(torch.randint(0, 60, (1,), generator=g))
        got = torch.linspace(a, b, n, dtype=dtype, device="tpu")
        assert got.dtype == dtype and got.shape == (n,)
        if half:
            exact = torch.linspace(a, b, n, dtype=torch.float64)
            ulp = torch.finfo(dtype).eps * 2 ** math.floor(math.log2(max(abs(a), abs(b), 1.0)))
            err = (got.cpu().double() - exact).abs().max().item() if n else 0.0
            assert err <= 2 * ulp, (a, b, n, err, ulp)
        else:
            assert torch.equal(got.cpu(), torch.linspace(a, b, n, dtype=dtype)), (a, b, n)
        if dtype.is_floating_point:
            lw = torch.logspace(a / 50, b / 50, n, base=3.0, dtype=dtype)
            lg = torch.logspace(a / 50, b / 50, n, base=3.0, dtype=dtype, device="tpu").cpu()
            tol = 3e-2 if dtype in (torch.float16, torch.bfloat16) else 1e-5
            torch.testing.assert_close(lg, lw, rtol=tol, atol=0)
    assert torch.linspace(2, 2, 1, device="tpu").cpu().tolist() == [2.0]
    with pytest.raises(RuntimeError):
        torch.linspace(0, 1, -1, device="tpu")


def test_shift_operators():
    x = torch.arange(-6, 7)
    for f in (
        lambda t: t << 3,
        lambda t: t >> 1,
        lambda t: t << t.abs(),
        lambda t: t >> (t.abs() % 5),
        lambda t: t.to(torch.int8) << 5,
        lambda t: t.to(torch.uint8) >> 2,
    ):
        check(f, x)
    y = x.to("tpu")
    y <<= 2
    y >>= 1
    assert torch.equal(y.cpu(), (x << 2) >> 1)
    with pytest.raises(RuntimeError):
        torch.ones(2, device="tpu") << 1


def test_torch_func_transforms():
    """jacrev/hessian make zero tensors (aten::_efficientzerotensor)."""
    from torch.func import grad, hessian, jacrev, vmap

    x = make((4, 3), torch.float32, 5)
    f = lambda v: (v.sin() * v).sum()  # noqa: E731
    for fn in (lambda t: vmap(grad(f))(t), lambda t: jacrev(torch.exp)(t[0]), lambda t: hessian(f)(t[0])):
        torch.testing.assert_close(fn(x.to("tpu")).cpu(), fn(x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool, torch.complex64])
def test_angle(dtype):
    if dtype == torch.complex64:
        x = torch.tensor([1 + 1j, -2j, -3 + 0j, 0j, complex(float("nan"), 1.0)], dtype=dtype)
    elif dtype.is_floating_point:
        x = torch.tensor(
            [-1.0, 0.0, -0.0, 2.0, -float("inf"), float("inf")] + ([float("nan")] if dtype == torch.float32 else []),
            dtype=dtype,
        )
    else:
        x = make((3, 5), dtype)
    check(torch.angle, x)
    check(lambda t: torch.angle(t, out=torch.empty(0, dtype=torch.angle(t).dtype, device=t.device)), x)
    if dtype == torch.float32:
        a, b = x.clone().requires_grad_(), x.clone().to("tpu").requires_grad_()
        torch.angle(a).sum().backward()
        torch.angle(b).sum().backward()
        torch.testing.assert_close(b.grad.cpu(), a.grad, equal_nan=True)
