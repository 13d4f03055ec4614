"""linalg.eig and linalg.eigvals against CPU PyTorch.

Eigenvalues are a multiset: the tpu QR iteration need not produce LAPACK's
order, so they are matched to the CPU's (nearest pairs first) before being
compared. Eigenvectors are defined up to a phase: every tpu eigenpair must
satisfy A v = w v, have unit norm and its largest component real and positive,
and equal the CPU's vector times a phase where the eigenvalue is simple."""

import pytest
import torch

import torchtpu  # noqa: F401

DTYPES = [torch.float32, torch.float64, torch.complex64, torch.complex128]
TOL = {torch.complex64: 1e-4, torch.complex128: 1e-10}


def cdt(dt):
    return {torch.float32: torch.complex64, torch.float64: torch.complex128}.get(dt, dt)


def rand(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_complex:
        return torch.randn(shape, dtype=dtype, generator=g)
    return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)


def match(want, got):
    """got [..., n] permuted to want's order: the globally nearest pairs first."""
    n = want.shape[-1]
    w2, g2 = want.reshape(-1, n), got.reshape(-1, n).to(want.dtype)
    out = torch.empty_like(w2)
    for b in range(w2.shape[0]):
        d = (w2[b, :, None] - g2[b, None, :]).abs()
        for _ in range(n):
            i, j = divmod(int(torch.argmin(d)), n)
            out[b, i] = g2[b, j]
            d[i, :] = float("inf")
            d[:, j] = float("inf")
    return out.reshape(want.shape)


def check_pairs(a, w, v, tol):
    """A v = w v, unit norms, a largest component of each vector real and positive."""
    ac = a.to(v.dtype)
    scale = 1 + a.abs().amax().item() if a.numel() else 1
    res = (ac @ v - v * w.unsqueeze(-2)).abs()
    assert res.numel() == 0 or res.amax().item() <= tol * scale * a.shape[-1], res.amax()
    norms = v.abs().pow(2).sum(-2)
    torch.testing.assert_close(norms, torch.ones_like(norms), rtol=0, atol=10 * tol)
    if v.numel():  # one of the largest components (equal up to rounding) is real and positive
        big = v.abs() >= v.abs().amax(-2, keepdim=True) * (1 - 1e-4)
        ok = big & (v.imag == 0) & (v.real > 0)
        assert ok.any(-2).all()


def check_eig(a, tol=None, vectors_vs_cpu=True):
    """Run eig and eigvals on tpu and compare with the CPU's; returns (w, v) from tpu."""
    ct = cdt(a.dtype)
    tol = tol or TOL[ct]
    w, v = torch.linalg.eig(a.to("tpu"))
    wv = torch.linalg.eigvals(a.to("tpu"))
    assert w.device.type == "tpu" and v.device.type == "tpu"
    w, v, wv = w.cpu(), v.cpu(), wv.cpu()
    assert w.dtype == ct and v.dtype == ct and wv.dtype == ct
    assert w.shape == a.shape[:-1] and v.shape == a.shape and wv.shape == a.shape[:-1]
    cw, cv = torch.linalg.eig(a)
    scale = 1 + (a.abs().amax().item() if a.numel() else 0)
    torch.testing.assert_close(match(cw, w), cw, rtol=tol, atol=tol * scale)
    torch.testing.assert_close(match(cw, wv), cw, rtol=tol, atol=tol * scale)
    check_pairs(a, w, v, tol)
    if vectors_vs_cpu and a.numel():
        # the CPU's vectors up to a phase, for simple eigenvalues
        order = [
            [int(torch.argmin((w2 - x).abs())) for x in c2]
            for w2, c2 in zip(w.reshape(-1, a.shape[-1]), cw.reshape(-1, a.shape[-1]))
        ]
        vv = v.reshape(-1, *a.shape[-2:])
        cvv = cv.reshape(-1, *a.shape[-2:])
        cww = cw.reshape(-1, a.shape[-1])
        for b in range(vv.shape[0]):
            for i, j in enumerate(order[b]):
                gap = (cww[b] - cww[b, i]).abs()
                gap[i] = float("inf")
                if gap.min() < 1e-2 * scale:
                    continue
                p = (cvv[b, :, i].conj() * vv[b, :, j]).sum()
                torch.testing.assert_close(
                    vv[b, :, j] * (p.conj() / p.abs()), cvv[b, :, i], rtol=tol * 10, atol=tol * 10
                )
    return w, v


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (3, 3), (6, 6), (2, 3, 4, 4)])
def test_eig_random(dtype, shape):
    check_eig(rand(shape, dtype, seed=shape[-1]))


def test_eig_larger_batch():
    check_eig(rand((8, 12, 12), torch.float64, seed=3))


@pytest.mark.parametrize("dtype", [torch.float32, torch.complex128])
def test_eig_empty(dtype):
    for shape in [(0, 3, 3), (2, 0, 0), (0, 0)]:
        w, v = torch.linalg.eig(torch.zeros(shape, dtype=dtype, device="tpu"))
        cw, cv = torch.linalg.eig(torch.zeros(shape, dtype=dtype))
        assert w.shape == cw.shape and v.shape == cv.shape and w.dtype == cw.dtype and v.dtype == cv.dtype
        assert torch.linalg.eigvals(torch.zeros(shape, dtype=dtype, device="tpu")).shape == cw.shape


def test_eig_complex_eigenvalues():
    # a rotation: +-i; a real matrix with two conjugate pairs
    w, _ = check_eig(torch.tensor([[0.0, -1.0], [1.0, 0.0]]))
    torch.testing.assert_close(match(torch.tensor([1j, -1j]), w), torch.tensor([1j, -1j]), atol=1e-6, rtol=0)
    a = torch.tensor([[1.0, 2.0, 0, 0], [-2.0, 1.0, 0, 0], [0, 0, 3.0, -1.0], [0, 0, 5.0, 3.0]], dtype=torch.float64)
    s = rand((4, 4), torch.float64, seed=9)
    w, _ = check_eig(s @ a @ torch.linalg.inv(s))  # eigenvalues 1 +- 2i, 3 +- i sqrt(5)
    want = torch.tensor([1 + 2j, 1 - 2j, 3 + 5**0.5 * 1j, 3 - 5**0.5 * 1j], dtype=torch.complex128)
    torch.testing.assert_close(match(want, w), want, rtol=1e-10, atol=1e-10)


def test_eig_cyclic_permutation():
    # unitary, eigenvalues the 6th roots of unity: plain Wilkinson shifts stall here
    for n in (3, 6):
        check_eig(torch.roll(torch.eye(n, dtype=torch.float64), 1, 0))


def test_eig_diagonal_and_repeated():
    d = torch.tensor([3.0, 1.0, 2.0, 1.0])
    w, v = check_eig(torch.diag(d), vectors_vs_cpu=False)
    torch.testing.assert_close(w, d.to(torch.complex64))  # a diagonal matrix is its own Schur form
    torch.testing.assert_close(v, torch.eye(4, dtype=torch.complex64))
    w, v = check_eig(3 * torch.eye(5, dtype=torch.float64), vectors_vs_cpu=False)
    assert (w == 3).all()
    check_eig(torch.zeros(4, 4), vectors_vs_cpu=False)
    check_eig(torch.ones(5, 5), vectors_vs_cpu=False)  # rank one: 5 and a fourfold 0


def test_eig_defective():
    # a Jordan block: one eigenvector, returned (as by LAPACK) for both eigenvalues up to rounding
    w, v = check_eig(
        torch.eye(4, dtype=torch.float64) + torch.diag(torch.ones(3, dtype=torch.float64), 1),
        tol=1e-7,
        vectors_vs_cpu=False,
    )
    assert (w == 1).all()
    torch.testing.assert_close(v.abs()[0], torch.ones(4, dtype=torch.float64), atol=1e-6, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.complex128])
def test_eig_triangular(dtype):
    a = rand((5, 5), dtype, seed=7)
    for t in (a.triu(), a.tril()):
        w, _ = check_eig(t)
        torch.testing.assert_close(
            match(t.diagonal().to(w.dtype), w), t.diagonal().to(w.dtype), rtol=TOL[cdt(dtype)], atol=TOL[cdt(dtype)]
        )


def test_eig_symmetric_real_spectrum():
    a = rand((6, 6), torch.float64, seed=2)
    w, _ = check_eig(a + a.mT)
    assert w.imag.abs().max() < 1e-12


@pytest.mark.parametrize("scale", [1e20, 1e-20])
def test_eig_scaled(scale):
    check_eig(rand((5, 5), torch.float32, seed=1) * scale, vectors_vs_cpu=False)


def test_eig_non_contiguous():
    a = rand((5, 5), torch.float64, seed=4)
    w, v = torch.linalg.eig(a.to("tpu").mT)
    check_pairs(a.mT, w.cpu(), v.cpu(), 1e-10)


def test_eig_out():
    a = rand((2, 4, 4), torch.float32, seed=5)
    w = torch.empty(0, dtype=torch.complex64, device="tpu")
    v = torch.empty(0, dtype=torch.complex64, device="tpu")
    r = torch.linalg.eig(a.to("tpu"), out=(w, v))
    assert r[0] is w and r[1] is v and w.shape == (2, 4) and v.shape == (2, 4, 4)
    check_pairs(a, w.cpu(), v.cpu(), 1e-4)
    # a wider complex out= is allowed, as on the CPU
    w2 = torch.empty(0, dtype=torch.complex128, device="tpu")
    torch.linalg.eigvals(a.to("tpu"), out=w2)
    torch.testing.assert_close(
        match(torch.linalg.eigvals(a).to(torch.complex128), w2.cpu()),
        torch.linalg.eigvals(a).to(torch.complex128),
        rtol=1e-4,
        atol=1e-4,
    )


def same_error(fn, a, *, out=None):
    kw = {} if out is None else {"out": out(torch.device("cpu"))}
    with pytest.raises(Exception) as cpu:
        fn(a, **kw)
    kw = {} if out is None else {"out": out(torch.device("tpu"))}
    with pytest.raises(type(cpu.value)) as dev:
        r = fn(a.to("tpu"), **kw)
        (r[0] if isinstance(r, tuple) else r).cpu()
    assert type(dev.value) is type(cpu.value), (dev.value, cpu.value)
    return str(cpu.value), str(dev.value)


@pytest.mark.parametrize("fn", [torch.linalg.eig, torch.linalg.eigvals])
def test_eig_errors(fn):
    same_error(fn, torch.randn(3, 4))  # not square
    same_error(fn, torch.randn(3))  # not a matrix
    same_error(fn, torch.ones(3, 3, dtype=torch.int64))  # integer
    same_error(fn, torch.ones(3, 3, dtype=torch.float16))  # no half kernel
    same_error(fn, torch.ones(3, 3, dtype=torch.bfloat16))
    real_out = (
        (lambda d: (torch.empty(3, device=d), torch.empty(3, 3, dtype=torch.complex64, device=d)))
        if fn is torch.linalg.eig
        else (lambda d: torch.empty(3, device=d))
    )
    same_error(fn, torch.randn(3, 3), out=real_out)  # out= of a real dtype


def test_eig_refuses_nonfinite():
    a = torch.eye(3)
    a[0, 1] = float("nan")
    cpu, dev = same_error(torch.linalg.eig, a)
    assert "infs or NaNs" in dev
    # eigvals does not check (the CPU's LAPACK may even crash on a NaN): NaN eigenvalues, no error
    b = torch.randn(4, 4)
    b[1, 2] = float("nan")
    assert torch.linalg.eigvals(b.to("tpu")).cpu().isnan().any()


def loss_vals(w, v):
    return (w * torch.linspace(0.5, 1.5, w.shape[-1], dtype=w.real.dtype)).abs().sum()


def loss_absvec(w, v):
    return (v.abs() * torch.linspace(0.5, 1.5, v.shape[-1], dtype=w.real.dtype)).sum() + w.real.sum()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.complex128])
def test_eig_backward(dtype):
    """Phase-invariant losses (eigenvalues; |eigenvectors|), each in the CPU's order."""
    a = rand((2, 4, 4), dtype, seed=6)
    tol = 1e-3 if dtype == torch.float32 else 1e-8
    for loss in (loss_vals, loss_absvec):
        ac = a.clone().requires_grad_()
        cw, cv = torch.linalg.eig(ac)
        loss(cw, cv).backward()
        at = a.to("tpu").requires_grad_()
        w, v = torch.linalg.eig(at)
        # put the tpu eigenpairs in the CPU's order (a differentiable gather)
        perm = torch.tensor(
            [[int(torch.argmin((w2 - x).abs())) for x in c2] for w2, c2 in zip(w.detach().cpu(), cw.detach())]
        )
        w = torch.gather(w, -1, perm.to("tpu"))
        v = torch.gather(v, -1, perm.to("tpu").unsqueeze(-2).expand(v.shape))
        loss(w.cpu(), v.cpu()).backward()
        torch.testing.assert_close(at.grad.cpu(), ac.grad, rtol=tol, atol=tol)


def test_eigvals_backward():
    a = rand((3, 3), torch.float64, seed=8)
    ac, at = a.clone().requires_grad_(), a.to("tpu").requires_grad_()
    torch.linalg.eigvals(ac).abs().sum().backward()
    torch.linalg.eigvals(at).abs().sum().backward()
    torch.testing.assert_close(at.grad.cpu(), ac.grad, rtol=1e-8, atol=1e-8)
