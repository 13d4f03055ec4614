"""Linalg family against CPU PyTorch: products (baddbmm, addbmm, addmv,
vdot, cross, eye), Cholesky and triangular solves, LU (factor, unpack,
solve, inverse, solve, det, slogdet): values, dtypes, shapes, pivots,
float32 gradients, non-contiguous inputs, out= variants and errors."""

import pytest
import torch
from _helpers import close, make

import torchtpu  # noqa: F401


def spd(n, batch=(), seed=0):
    a = make(batch + (n, n), seed=seed)
    return a @ a.mT + n * torch.eye(n)


def check(fn, *args, grad=True, tol=1e-4, **kw):
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
    wants = tuple(want) if isinstance(want, (tuple, list)) else (want,)
    gots = tuple(got) if isinstance(got, (tuple, list)) else (got,)
    for w, g in zip(wants, gots):
        close(g, w, tol)
    if not grad:
        return
    outs = [(w, g) for w, g in zip(wants, gots) if w.requires_grad]
    if not outs:
        return
    sw = sum((w * torch.linspace(0.5, 1.5, w.numel()).reshape(w.shape)).sum() for w, _ in outs)
    sg = sum((g * torch.linspace(0.5, 1.5, g.numel()).reshape(g.shape).to("tpu")).sum() for _, g in outs)
    sw.backward()
    sg.backward()
    for c, d in zip(cpu, dev):
        if isinstance(c, torch.Tensor) and c.requires_grad:
            close(d.grad, c.grad, tol * 10)


# ---- products ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_baddbmm_addbmm_addmv(dtype):
    s, a, b = make((3, 4, 5), dtype), make((3, 4, 6), dtype, 1), make((3, 6, 5), dtype, 2)
    g = dtype == torch.float32
    check(torch.baddbmm, s, a, b, grad=g)
    check(lambda s, a, b: torch.baddbmm(s, a, b, beta=2, alpha=3), s, a, b, grad=g)
    check(torch.addbmm, s[0], a, b, grad=g)
    check(torch.addmv, make((4,), dtype), a[0], make((6,), dtype, 3), grad=g)
    check(
        lambda s, m, v: torch.addmv(s, m, v, beta=0.5 if g else 2, alpha=2),
        make((4,), dtype),
        a[0],
        make((6,), dtype, 3),
        grad=g,
    )


def test_beta_zero_ignores_nan():
    s = torch.full((4, 5), float("nan"))
    a, b = make((3, 4, 6)), make((3, 6, 5), seed=1)
    close(torch.addbmm(s.to("tpu"), a.to("tpu"), b.to("tpu"), beta=0), torch.addbmm(s, a, b, beta=0))


def test_out_and_inplace():
    a, b = make((4, 6)), make((6, 5), seed=1)
    out = torch.empty(4, 5, device="tpu")
    torch.mm(a.to("tpu"), b.to("tpu"), out=out)
    close(out, a @ b)
    s = make((4, 5), seed=2)
    t = s.to("tpu")
    t.addmm_(a.to("tpu"), b.to("tpu"), alpha=2)
    close(t, s.addmm(a, b, alpha=2))
    ba, bb = make((2, 4, 6)), make((2, 6, 5), seed=1)
    out = torch.empty(0, device="tpu")
    torch.bmm(ba.to("tpu"), bb.to("tpu"), out=out)
    close(out, torch.bmm(ba, bb))


def test_noncontiguous_products():
    a = make((6, 4)).t()
    v = make((12,))[::2]
    check(torch.mv, a, v)
    check(torch.addmv, make((4,)), a, v)
    check(torch.vdot, v, make((6,), seed=3))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_cross(dtype):
    a, b = make((4, 3, 2), dtype), make((1, 3, 2), dtype, 1)
    check(torch.linalg.cross, a, b, dim=1, grad=dtype == torch.float32)
    check(torch.cross, make((5, 3), dtype), make((5, 3), dtype, 2), grad=dtype == torch.float32)
    with pytest.raises(RuntimeError, match="length 3"):
        torch.linalg.cross(a.to("tpu"), b.to("tpu"), dim=2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_eye(dtype):
    close(torch.eye(3, 5, dtype=dtype, device="tpu"), torch.eye(3, 5, dtype=dtype))
    close(torch.eye(4, dtype=dtype, device="tpu"), torch.eye(4, dtype=dtype))
    check(lambda a: torch.linalg.matrix_power(a, 0), make((3, 3)), grad=False)


def test_vdot_errors():
    with pytest.raises(RuntimeError, match="1D tensors expected"):
        torch.vdot(make((2, 2)).to("tpu"), make((4,)).to("tpu"))


# ---- Cholesky and triangular solves ------------------------------------------------------------


def test_cholesky():
    a = spd(4, (2,))
    check(torch.linalg.cholesky, a)
    check(lambda x: torch.linalg.cholesky(x, upper=True), a)
    check(torch.cholesky, a[0])
    L, info = torch.linalg.cholesky_ex(a.to("tpu"))
    assert info.cpu().tolist() == [0, 0] and info.dtype == torch.int32
    f = torch.linalg.cholesky(a)
    b = make((2, 4, 3))
    check(torch.cholesky_solve, b, f)
    check(lambda b, f: torch.cholesky_solve(b, f.mT, upper=True), b, f)
    check(torch.cholesky_inverse, f[0])
    check(lambda f: torch.cholesky_inverse(f, upper=True), f[1].mT)


def test_cholesky_not_pd():
    a = torch.tensor([[1.0, 2.0], [2.0, 1.0]])
    _, info = torch.linalg.cholesky_ex(a.to("tpu"))
    assert info.item() != 0


def test_triangular_solves():
    a = make((2, 4, 4)) + 4 * torch.eye(4)
    b = make((2, 4, 3), seed=1)
    for upper in (True, False):
        check(lambda a, b: torch.linalg.solve_triangular(a, b, upper=upper), a, b)
        check(lambda a, b: torch.linalg.solve_triangular(a, b.mT, upper=upper, left=False), a, b)
        check(lambda b, a: torch.triangular_solve(b, a, upper=upper, transpose=True), b, a)
    check(lambda a, b: torch.linalg.solve_triangular(a, b, upper=True, unitriangular=True), a, b[0])
    with pytest.raises(RuntimeError):
        torch.linalg.solve_triangular(a.to("tpu"), make((2, 5, 3)).to("tpu"), upper=True)


# ---- LU -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(4, 4), (2, 5, 5), (3, 5), (5, 3)])
def test_lu_factor_matches_lapack(shape):
    a = make(shape)
    lu, piv = torch.linalg.lu_factor(a.to("tpu"))
    wlu, wpiv = torch.linalg.lu_factor(a)
    close(lu, wlu)
    assert torch.equal(piv.cpu(), wpiv)
    check(torch.linalg.lu, a)
    check(lambda x: torch.lu_unpack(*torch.linalg.lu_factor(x)), a)


def test_lu_ties_and_singular():
    a = torch.tensor([[1.0, 2.0, 3.0], [-1.0, 0.0, 1.0], [1.0, 5.0, 2.0]])  # tie in column 0: first row wins
    lu, piv, info = torch.linalg.lu_factor_ex(a.to("tpu"))
    wlu, wpiv, winfo = torch.linalg.lu_factor_ex(a)
    close(lu, wlu)
    assert torch.equal(piv.cpu(), wpiv)
    s = torch.zeros(3, 3)
    s[0, 1] = 1
    _, piv, info = torch.linalg.lu_factor_ex(s.to("tpu"))
    assert info.item() == torch.linalg.lu_factor_ex(s)[2].item()


def test_solves_inverse_det():
    a = make((3, 4, 4)) + 2 * torch.eye(4)
    b = make((3, 4, 2), seed=1)
    check(torch.linalg.inv, a)
    check(torch.linalg.solve, a, b)
    check(torch.linalg.solve, a, make((3, 4), seed=2))
    check(lambda a, b: torch.linalg.solve(a, b, left=False), a, b.mT)
    check(torch.linalg.det, a)
    check(torch.linalg.det, a.mT)  # not contiguous: factors A itself
    check(lambda x: torch.linalg.slogdet(x), a)
    check(torch.logdet, spd(3))
    lu, piv = torch.linalg.lu_factor(a)
    for left in (True, False):
        for adjoint in (True, False):
            bb = b if left else b.mT
            check(lambda l, p, x: torch.linalg.lu_solve(l, p, x, left=left, adjoint=adjoint), lu, piv, bb, grad=False)


def test_inverse_out_and_errors():
    a = make((4, 4)) + 2 * torch.eye(4)
    out = torch.empty(4, 4, device="tpu")
    torch.linalg.inv(a.to("tpu"), out=out)
    close(out, torch.linalg.inv(a))
    with pytest.raises(RuntimeError, match="square"):
        torch.linalg.inv(make((3, 4)).to("tpu"))
    with pytest.raises(RuntimeError):
        torch.linalg.det(make((4, 4), torch.int64).to("tpu"))


# ---- SVD, eigh, QR, distances ---------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(5, 5), (2, 6, 4), (3, 5)])
def test_svd_values_and_reconstruction(shape):
    a = make(shape)
    u, s, vh = torch.linalg.svd(a.to("tpu"), full_matrices=False)
    close(s, torch.linalg.svdvals(a))
    close(u.cpu() @ torch.diag_embed(s.cpu()) @ vh.cpu(), a)
    check(torch.linalg.svdvals, a)
    check(torch.linalg.pinv, a)


def test_eigh_values_and_reconstruction():
    a = make((2, 5, 5))
    a = a + a.mT
    w, v = torch.linalg.eigh(a.to("tpu"))
    close(w, torch.linalg.eigvalsh(a))
    close(v.cpu() @ torch.diag_embed(w.cpu()) @ v.cpu().mT, a)
    check(torch.linalg.eigvalsh, a)
    check(lambda x: torch.linalg.eigvalsh(x, UPLO="U"), make((4, 4), seed=3))


@pytest.mark.parametrize("mode", ["reduced", "complete", "r"])
def test_qr_matches_lapack(mode):
    for shape in [(5, 5), (2, 6, 4), (3, 5)]:
        check(lambda x: torch.linalg.qr(x, mode=mode), make(shape), grad=mode == "reduced")
    check(torch.geqrf, make((5, 3)), grad=False)
    a, tau = torch.geqrf(make((5, 3)))
    check(torch.linalg.householder_product, a, tau)
    check(lambda a, t, c: torch.ormqr(a, t, c, left=False, transpose=True), a, tau, make((2, 5), seed=4))


@pytest.mark.parametrize("p", [0.0, 1.0, 2.0, 1.5, float("inf")])
def test_cdist_pdist(p):
    check(lambda a, b: torch.cdist(a, b, p=p), make((2, 4, 3)), make((5, 3), seed=1))
    check(lambda a: torch.pdist(a, p=p), make((5, 3), seed=2))


@pytest.mark.parametrize("driver", ["gels", "gelsy", "gelsd"])
def test_lstsq(driver):
    check(lambda a, b: torch.linalg.lstsq(a, b, driver=driver), make((5, 3)), make((5, 2), seed=1))
    check(lambda a, b: torch.linalg.lstsq(a, b, driver=driver).solution, make((2, 3)), make((2, 2), seed=1))


def test_matmuls_of_lazily_conjugated_tensors():
    """PyTorch lets conjugate views through to mm/addmm/bmm/baddbmm/dot/vdot
    (its other ops get them resolved); the backward of a complex matmul
    passes a.mH this way."""
    g = torch.Generator().manual_seed(0)

    def c(*s):
        return torch.complex(torch.randn(*s, generator=g), torch.randn(*s, generator=g))

    a, b, m, v = c(3, 4), c(4, 5), c(2, 3, 4), c(4)
    cases = [
        lambda a, b, m, v: a.conj() @ b,
        lambda a, b, m, v: a @ b.conj(),
        lambda a, b, m, v: torch.addmm(b[:3].conj(), a, b),
        lambda a, b, m, v: torch.bmm(m.conj(), m.mH),
        lambda a, b, m, v: torch.baddbmm(m[:, :, :3].conj(), m, m.mT),
        lambda a, b, m, v: torch.dot(v.conj(), v),
    ]
    for f in cases:
        want = f(a, b, m, v)
        got = f(a.to("tpu"), b.to("tpu"), m.to("tpu"), v.to("tpu")).cpu()
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    xs = [torch.randn(4, 5, generator=g) for _ in range(4)]
    grads = []
    for dev in ("cpu", "tpu"):
        leaves = [x.detach().to(dev).requires_grad_() for x in xs]
        p, q, r, s = leaves
        out = torch.view_as_real(torch.complex(p, q) @ torch.complex(r, s).mT)
        out.pow(2).sum().backward()
        grads.append([x.grad.cpu() for x in leaves])
    for gc, gt in zip(*grads):
        torch.testing.assert_close(gt, gc, rtol=1e-4, atol=1e-4)


def _sym(g, *shape):
    a = torch.randn(*shape, generator=g)
    return a + a.mT


@pytest.mark.parametrize("n", [1, 2, 3, 5, 7])
def test_ldl_factor_and_solve(n):
    """Bunch-Kaufman as LAPACK's sytrf: the same pivots (1x1 and 2x2 blocks,
    1-based, negative for 2x2), LD (upper triangle zero) and info; ldl_solve
    as sytrs, with broadcast batches."""
    g = torch.Generator().manual_seed(n)
    for trial in range(8):
        A = _sym(g, 3, n, n)
        if trial == 1:
            A[..., 0, 0] = 0  # forces a 2x2 pivot or an interchange
        if trial == 2:
            A[1] = 0  # singular: info = 1
        LD, piv, info = torch.linalg.ldl_factor_ex(A)
        LD2, piv2, info2 = torch.linalg.ldl_factor_ex(A.to("tpu"))
        assert piv2.dtype == torch.int32 and info2.dtype == torch.int32
        assert torch.equal(piv2.cpu(), piv) and torch.equal(info2.cpu(), info)
        close(LD2, LD, tol=1e-4)
        if trial == 2:
            continue
        for bshape in [(3, n, 2), (n, 4)]:
            b = torch.randn(bshape, generator=g)
            want = torch.linalg.ldl_solve(LD, piv, b)
            got = torch.linalg.ldl_solve(LD.to("tpu"), piv.to("tpu"), b.to("tpu"))
            close(got, want, tol=1e-3)
    # the upper triangle, and hermitian=True for a real matrix (the same factorization)
    A = _sym(g, n, n)
    LD, piv = torch.linalg.ldl_factor(A, hermitian=True)
    LD2, piv2 = torch.linalg.ldl_factor(A.to("tpu"), hermitian=True)
    close(LD2, LD)
    assert torch.equal(piv2.cpu(), piv)
    # only the lower triangle is read
    close(torch.linalg.ldl_factor(A.tril().to("tpu"))[0], LD)


def test_ldl_empty_and_errors():
    for shape in [(0, 0), (0, 2, 2), (2, 0, 0)]:
        a = torch.zeros(shape)
        LD, piv, info = torch.linalg.ldl_factor_ex(a)
        LD2, piv2, info2 = torch.linalg.ldl_factor_ex(a.to("tpu"))
        assert LD2.shape == LD.shape and piv2.shape == piv.shape and info2.shape == info.shape
    LD, piv = torch.linalg.ldl_factor(_sym(torch.Generator().manual_seed(0), 3, 3))
    assert torch.linalg.ldl_solve(LD.to("tpu"), piv.to("tpu"), torch.zeros(3, 0, device="tpu")).shape == (3, 0)
    for fn, args in [
        (torch.linalg.ldl_factor, (torch.ones(3, 2),)),
        (torch.linalg.ldl_factor, (torch.ones(3),)),
        (torch.linalg.ldl_solve, (LD, piv, torch.ones(3))),
        (torch.linalg.ldl_solve, (LD, piv, torch.ones(3, 2, dtype=torch.float64))),
    ]:
        with pytest.raises(Exception) as want:
            fn(*args)
        with pytest.raises(want.type):
            fn(*[a.to("tpu") for a in args])


# ---- matrix_exp -------------------------------------------------------------------------------------


@pytest.mark.parametrize("scale", [0.01, 1.0, 10.0, 30.0])
def test_matrix_exp_float32_accuracy(scale):
    """Scaling and squaring with a degree-22 Taylor polynomial: within float32
    rounding of CPU torch in float64, at least as close as CPU's own float32
    kernel (whose error, not ours, fails the OpInfo sample: 3.5e-4 on a 0.148
    element)."""
    a = make((6, 5, 5), seed=1) * (scale / 5**0.5)
    ref = torch.linalg.matrix_exp(a.double())
    got = torch.linalg.matrix_exp(a.to("tpu")).cpu()
    assert got.dtype == torch.float32 and got.shape == a.shape

    def rel(x):
        return ((x.double() - ref).flatten(1).abs().amax(1) / ref.flatten(1).abs().amax(1)).max().item()

    assert rel(got) <= max(rel(torch.linalg.matrix_exp(a)), 1e-6)
    close(got, torch.linalg.matrix_exp(a), tol=1e-4 * max(1.0, scale))


def test_matrix_exp_opinfo_samples_within_float32_rounding():
    """The OpInfo samples against CPU torch in float64, normwise: their
    entries span 0.1 to 9e4, so an entrywise tolerance would ask a small
    entry for more than float32 products of the large ones hold (CPU's own
    float32 kernel fails it, and ours did on some hosts); the error relative
    to each matrix's largest entry stays within a few float32 roundings."""
    from torch.testing._internal.common_methods_invocations import op_db

    op = next(o for o in op_db if o.name == "matrix_exp")
    for s in op.sample_inputs("cpu", torch.float32):
        ref = torch.linalg.matrix_exp(s.input.double())
        got = torch.linalg.matrix_exp(s.input.to("tpu")).cpu()
        assert got.dtype == torch.float32 and got.shape == ref.shape
        r = ref.reshape(-1, *ref.shape[-2:])
        err = (got.double().reshape(r.shape) - r).flatten(1).abs().amax(1) / r.flatten(1).abs().amax(1)
        assert err.max().item() <= 2e-6, (tuple(s.input.shape), err.max().item())


def test_matrix_exp_gradient_and_forms():
    a = make((2, 4, 4), seed=2) * 0.5
    check(torch.linalg.matrix_exp, a)
    check(torch.matrix_exp, a[0])
    close(torch.linalg.matrix_exp(torch.zeros(0, 3, 3, device="tpu")), torch.zeros(0, 3, 3))


@pytest.mark.parametrize("dt", [torch.bfloat16, torch.float16])
def test_matrix_exp_half_types(dt):
    """torch's CPU kernel takes half types (and returns garbage there: exp(I)
    is -1.3e30 in bfloat16): the same dtype, computed in float32 and rounded
    once, so within one rounding of the float64 result."""
    a = (make((3, 4, 4), seed=3) * 0.5).to(dt)
    got = torch.linalg.matrix_exp(a.to("tpu")).cpu()
    assert got.dtype == dt and got.shape == a.shape
    ref = torch.linalg.matrix_exp(a.double())
    torch.testing.assert_close(got.double(), ref, rtol=1e-2, atol=1e-2)
    assert (
        torch.linalg.matrix_exp(torch.eye(3, dtype=dt, device="tpu")).cpu().float().diagonal().sub(2.718).abs().max()
        < 0.02
    )


def test_matrix_exp_errors():
    for dt in (torch.int64, torch.bool):
        with pytest.raises(
            RuntimeError, match=r"Expected a floating point or complex tensor as input. Got (Long|Bool)"
        ):
            torch.linalg.matrix_exp(torch.ones(2, 2, dtype=dt, device="tpu"))
    with pytest.raises(RuntimeError, match="square"):
        torch.linalg.matrix_exp(torch.ones(2, 3, device="tpu"))


# ---- matmul family: dtypes and empty inputs as torch's CPU kernels -----------------------------

_MM_CASES = [
    (
        "bmm",
        torch.bmm,
        [
            ((2, 3, 4), (2, 4, 5)),
            ((2, 0, 3), (2, 3, 4)),
            ((2, 3, 0), (2, 0, 4)),
            ((0, 3, 4), (0, 4, 5)),
            ((2, 3, 4), (2, 4, 0)),
            ((2, 3, 4), (2, 5, 6)),
            ((3, 4), (2, 4, 5)),
            ((2, 3, 4), (4, 5)),
        ],
    ),
    ("mm", torch.mm, [((3, 4), (4, 5)), ((0, 3), (3, 4)), ((3, 0), (0, 4))]),
    ("dot", torch.dot, [((3,), (3,)), ((0,), (0,))]),
    ("mv", torch.mv, [((3, 4), (4,)), ((0, 4), (4,)), ((3, 0), (0,))]),
    (
        "matmul",
        torch.matmul,
        [((2, 1, 3, 4), (4, 4, 2)), ((2, 1, 3, 0), (4, 0, 2)), ((2, 0, 3), (3, 2)), ((3,), (3, 0))],
    ),
    (
        "addmm",
        lambda a, b: torch.addmm(torch.zeros((), dtype=b.dtype, device=b.device), a, b),
        [((3, 4), (4, 5)), ((3, 0), (0, 5))],
    ),
]
_MM_DTYPES = [
    (torch.int64, torch.float32),
    (torch.float32, torch.int64),
    (torch.float32, torch.float64),
    (torch.bfloat16, torch.float32),
    (torch.bool, torch.bool),
    (torch.bool, torch.float32),
    (torch.float32, torch.bool),
    (torch.int32, torch.int32),
]


@pytest.mark.parametrize("name,fn,shapes", _MM_CASES, ids=[c[0] for c in _MM_CASES])
def test_matmul_family_dtypes_and_empties(name, fn, shapes):
    """Mixed dtypes and bool: where the CPU computes (bmm of an empty result or
    an empty sum takes any two dtypes and gives mat2's; mm/mv/addmm take bool
    when nothing is summed), the same result; where it refuses, the same
    exception type and message."""
    for sa, sb in shapes:
        for da, db in _MM_DTYPES:
            if name == "addmm" and torch.bool in (da, db) and 0 in sa:
                continue  # the CPU fails casting its int beta * self to bool: not matched
            a, b = torch.ones(sa, dtype=da), torch.ones(sb, dtype=db)
            try:
                want = fn(a, b)
            except Exception as e:  # noqa: BLE001 - the CPU's exception is the reference
                with pytest.raises(type(e)) as got:
                    fn(a.to("tpu"), b.to("tpu")).cpu()
                assert str(got.value).splitlines()[0] == str(e).splitlines()[0], (name, sa, sb, da, db)
                continue
            got = fn(a.to("tpu"), b.to("tpu")).cpu()
            assert got.dtype == want.dtype and got.shape == want.shape, (name, sa, sb, da, db)
            assert torch.equal(got, want), (name, sa, sb, da, db)
