"""SVD against CPU PyTorch (csrc/lower/emit_svd.c): singular values, shapes,
thin and full U and V (orthonormal, the CPU's vectors up to sign where a
singular value is apart from the others), rank-deficient inputs, gradients
of sign-free functions, torch.svd; and the coverage harness's comparison."""

import pytest
import torch
from _helpers import close, make
from sweeps import op_samples as samples

import torchtpu  # noqa: F401


def svd_both(a, full):
    want = torch.linalg.svd(a, full_matrices=full)
    got = [t.cpu() for t in torch.linalg.svd(a.to("tpu"), full_matrices=full)]
    return want, got


def orthonormal(x, tol=1e-5):
    eye = torch.eye(x.shape[-1]).expand(x.mT.shape[:-1] + (x.shape[-1],))
    torch.testing.assert_close(x.mT @ x, eye, atol=tol, rtol=0)


@pytest.mark.parametrize("shape", [(5, 3), (3, 5), (2, 6, 4), (2, 4, 6), (4, 4), (1, 5), (5, 1), (3, 2, 7)])
@pytest.mark.parametrize("full", [True, False])
def test_svd_shapes_values_and_vectors(shape, full):
    a = make(shape, seed=sum(shape))
    (cu, cs, cvh), (u, s, vh) = svd_both(a, full)
    for g, w in ((u, cu), (s, cs), (vh, cvh)):
        assert g.dtype == w.dtype and g.shape == w.shape
    close(s, cs)
    orthonormal(u)
    orthonormal(vh.mT)
    k = s.shape[-1]
    close(u[..., :k] @ torch.diag_embed(s) @ vh[..., :k, :], a)
    # the CPU's vectors up to the sign of each pair (random matrices: distinct values)
    sg = torch.where((u[..., :k] * cu[..., :k]).sum(-2) < 0, -1.0, 1.0).unsqueeze(-2)
    close(u[..., :k] * sg, cu[..., :k])
    close(vh[..., :k, :] * sg.mT, cvh[..., :k, :])


@pytest.mark.parametrize("shape", [(0, 3), (3, 0), (2, 0, 3), (0, 0)])
def test_svd_empty_full_matrices(shape):
    """An empty side has no values; full_matrices gives the identity of the other (as LAPACK)."""
    a = torch.zeros(shape)
    (cu, cs, cvh), (u, s, vh) = svd_both(a, True)
    for g, w in ((u, cu), (s, cs), (vh, cvh)):
        close(g, w)


def test_svd_rank_deficient_vectors_orthonormal():
    """Zero singular values: U and V are still orthonormal (not zero columns), as on CPU."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(6, 2, generator=g) @ torch.randn(2, 4, generator=g)
    for x in (a, a.mT.contiguous(), torch.zeros(4, 3), torch.zeros(3, 4)):
        for full in (False, True):
            (cu, cs, cvh), (u, s, vh) = svd_both(x, full)
            assert u.shape == cu.shape and vh.shape == cvh.shape
            close(s, cs)
            orthonormal(u)
            orthonormal(vh.mT)
            k = s.shape[-1]
            close(u[..., :k] @ torch.diag_embed(s) @ vh[..., :k, :], x)


def test_torch_svd_some_false():
    a = make((2, 5, 3), seed=4)
    cu, cs, cv = torch.svd(a, some=False)
    u, s, v = (t.cpu() for t in torch.svd(a.to("tpu"), some=False))
    assert u.shape == cu.shape == (2, 5, 5) and v.shape == cv.shape == (2, 3, 3)
    close(s, cs)
    orthonormal(u)
    orthonormal(v)
    _, s0, _ = torch.svd(a.to("tpu"), compute_uv=False)
    close(s0, cs)


@pytest.mark.parametrize("full", [True, False])
@pytest.mark.parametrize("shape", [(4, 3), (3, 4)])
def test_svd_gradients_of_sign_free_functions(full, shape):
    """Through |U|, S, |Vh| and U Vh (PyTorch's OpInfo functions): gradients as on CPU."""
    a = make(shape, seed=5)
    k = min(shape)
    w = torch.linspace(0.5, 1.5, 20)
    fns = (
        lambda u, s, vh: (u[..., :k].abs() * w[: shape[0] * k].reshape(shape[0], k).to(u.device)).sum(),
        lambda u, s, vh: (s * w[:k].to(s.device)).sum(),
        lambda u, s, vh: (vh[..., :k, :].abs() * w[: k * shape[1]].reshape(k, shape[1]).to(u.device)).sum(),
        lambda u, s, vh: ((u[..., :k] @ vh[..., :k, :]) * w[: a.numel()].reshape(shape).to(u.device)).sum(),
    )
    for f in fns:
        grads = []
        for dev in ("cpu", "tpu"):
            x = a.to(dev).requires_grad_()
            (g,) = torch.autograd.grad(f(*torch.linalg.svd(x, full_matrices=full)), x)
            grads.append(g.cpu())
        close(grads[1], grads[0], tol=1e-4)


def test_harness_compares_svd_up_to_signs():
    a = make((5, 3), seed=6)
    want = torch.linalg.svd(a, full_matrices=True)
    u, s, vh = want
    flip = torch.tensor([1.0, -1.0, -1.0])
    # the same decomposition with two pairs turned and another completion of U
    q = torch.linalg.qr(u[:, 3:] @ torch.tensor([[0.6, -0.8], [0.8, 0.6]]))[0]
    other = (torch.cat([u[:, :3] * flip, q], 1).to("tpu"), s.to("tpu"), (vh * flip[:, None]).to("tpu"))
    samples._check_svd("linalg.svd", want, other, "float32")
    with pytest.raises(samples._Mismatch):  # a wrong value
        samples._check_svd("linalg.svd", want, (other[0], (s * 1.01).to("tpu"), other[2]), "float32")
    with pytest.raises(samples._Mismatch):  # vectors that are not the CPU's
        samples._check_svd("linalg.svd", want, (other[0].roll(1, 1), other[1], other[2]), "float32")
    with pytest.raises(samples._Mismatch):  # a completion that is not orthonormal
        bad = other[0].cpu().clone()
        bad[:, 4] = bad[:, 3]
        samples._check_svd("linalg.svd", want, (bad.to("tpu"), other[1], other[2]), "float32")


def test_svd_lowrank_matches_cpu_given_the_same_random_projection(monkeypatch):
    """svd_lowrank projects on torch.randn(..., device=A.device): tpu's random
    stream is not the CPU's, and for a matrix of higher rank than q the result
    depends on the projection (the OpInfo entry's 5e-5 difference). With the
    CPU's random numbers the tpu result is the CPU's; for rank <= q it is
    the same whatever the projection."""
    g = torch.Generator().manual_seed(3)
    a = torch.randn(2, 6, 2, generator=g) @ torch.randn(2, 2, 5, generator=g)
    m = torch.randn(2, 6, 5, generator=g)
    torch.manual_seed(0)
    cu, cs, cv = torch.svd_lowrank(a, q=2)
    u, s, v = (t.cpu() for t in torch.svd_lowrank(a.to("tpu"), q=2))
    close(s, cs)
    close(u @ torch.diag_embed(s) @ v.mT, cu @ torch.diag_embed(cs) @ cv.mT)
    real = torch.randn
    monkeypatch.setattr(torch, "randn", lambda *size, device=None, **kw: real(*size, **kw).to(device))
    torch.manual_seed(0)
    want = torch.svd_lowrank(a, q=2, M=m)
    torch.manual_seed(0)
    got = torch.svd_lowrank(a.to("tpu"), q=2, M=m.to("tpu"))
    for g_, w in zip(got, want):
        close(g_, w)
