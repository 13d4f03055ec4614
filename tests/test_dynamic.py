"""torch.compile with symbolic sizes (dynamic=True, mark_dynamic): graphs run
padded to power-of-two buckets, masked so that results are those of CPU
PyTorch exactly, and a new size in a known bucket compiles nothing."""

import os
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torchtpu

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))


@pytest.fixture(autouse=True)
def _nan_padding(monkeypatch):
    # Padded positions hold NaN: a mask missing anywhere shows in the results.
    from torchtpu import _bucket

    monkeypatch.setattr(_bucket, "FLOAT_PAD", float("nan"))


def _compiled():
    return torchtpu.metrics()["programs_compiled"]


def _tpu(x):
    return x.to("tpu") if isinstance(x, torch.Tensor) else x


def _sweep(f, make, sizes, grads=False, rtol=1e-5, atol=1e-5):
    """Runs f compiled and on the CPU for each size; returns programs compiled
    for each size."""
    torch._dynamo.reset()
    cf = torch.compile(f, backend="tpu", dynamic=True)
    counts = []
    for n in sizes:
        args = make(n)
        targs = [_tpu(a).detach().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a for a in args]
        before = _compiled()
        got = cf(*targs)
        want = f(*args)
        if grads:
            got.sum().backward() if got.dim() else got.backward()
            want.sum().backward() if want.dim() else want.backward()
        counts.append(_compiled() - before)
        torch.testing.assert_close(got.cpu(), want.detach(), rtol=rtol, atol=atol)
        assert got.shape == want.shape and got.dtype == want.dtype
        for a, t in zip(args, targs):
            if isinstance(a, torch.Tensor) and a.requires_grad:
                torch.testing.assert_close(t.grad.cpu(), a.grad, rtol=rtol, atol=atol)
    return counts


def _x(n, c=8, grad=False):
    g = torch.Generator().manual_seed(n)
    return torch.randn(n, c, generator=g).requires_grad_(grad)


@pytest.mark.parametrize(
    "name,f",
    [
        ("sum", lambda x: x.sum(0)),
        ("mean", lambda x: x.mean(0)),
        ("mean_all", lambda x: x.mean()),
        ("amax", lambda x: x.amax(0)),
        ("amin", lambda x: x.amin(0)),
        ("max_values", lambda x: x.max(0).values),
        ("any", lambda x: (x > 1.5).any(0)),
        ("all", lambda x: (x > -1.5).all(0)),
        ("softmax", lambda x: torch.softmax(x, 0)),
        ("log_softmax", lambda x: torch.log_softmax(x, 0)),
        ("contraction", lambda x: x.t() @ x),
        ("cumsum", lambda x: x.cumsum(0)),
        ("layer_norm", lambda x: F.layer_norm(x, (8,)).sum(0)),
        ("rows", lambda x: (x * 2 + 1)[:, :3]),
        ("var", lambda x: x.var(0)),
        ("std_all", lambda x: x.std()),
        ("var_mean", lambda x: torch.stack(torch.var_mean(x, 0, correction=0, keepdim=True))),
    ],
)
def test_padding_is_masked(name, f):
    # sizes 5, 6, 7 share the bucket 8; 9 and 13 the bucket 16
    counts = _sweep(f, lambda n: (_x(n),), [5, 6, 7, 9, 13])
    assert counts[1] == counts[2] == counts[4] == 0, counts


@pytest.mark.parametrize(
    "name,f",
    [
        ("mean", lambda x: x.mean(0).sum()),
        ("softmax", lambda x: (torch.softmax(x, 0) * torch.arange(8.0, device=x.device)).sum()),
        ("contraction", lambda x: (x.t() @ x).sum()),
        ("var", lambda x: (x.var(0) * torch.arange(8.0, device=x.device)).sum()),
        ("layer_norm", lambda x: (F.layer_norm(x, (8,)) * torch.linspace(0, 1, 8, device=x.device)).sum()),
    ],
)
def test_gradients_through_padding(name, f):
    counts = _sweep(f, lambda n: (_x(n, grad=True),), [5, 7, 11], grads=True)
    assert counts[1] == 0, counts


def test_cross_entropy_and_embedding_gradients():
    torch.manual_seed(0)
    emb_c = nn.Embedding(20, 8)
    emb_t = nn.Embedding(20, 8).to("tpu")
    emb_t.load_state_dict(emb_c.state_dict())

    def f(emb, idx, tgt):
        h = emb(idx)
        return F.cross_entropy(h.view(-1, 8), tgt.view(-1) % 8)

    cf = torch.compile(f, backend="tpu", dynamic=True)
    for n in (5, 7, 6):
        g = torch.Generator().manual_seed(n)
        idx = torch.randint(0, 20, (2, n), generator=g)
        tgt = torch.randint(0, 20, (2, n), generator=g)
        before = _compiled()
        lt = cf(emb_t, idx.to("tpu"), tgt.to("tpu"))
        lt.backward()
        lc = f(emb_c, idx, tgt)
        lc.backward()
        if n == 6:
            assert _compiled() == before
        torch.testing.assert_close(lt.cpu(), lc.detach(), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(emb_t.weight.grad.cpu(), emb_c.weight.grad, rtol=1e-5, atol=1e-6)
        emb_t.zero_grad()
        emb_c.zero_grad()


def test_mark_dynamic_buckets_too():
    def f(x):
        return torch.softmax(x, 0).sum(1)

    torch._dynamo.reset()
    cf = torch.compile(f, backend="tpu")
    for n, compiles in ((20, None), (25, 0), (30, 0)):
        x = _x(n)
        xt = x.to("tpu")
        torch._dynamo.mark_dynamic(xt, 0)
        before = _compiled()
        torch.testing.assert_close(cf(xt).cpu(), f(x), rtol=1e-5, atol=1e-6)
        if compiles is not None:
            assert _compiled() - before == compiles


def test_an_op_without_a_rule_compiles_per_size_and_stays_correct():
    # flip along the symbolic size has no masking rule: not bucketed, still right
    counts = _sweep(lambda x: torch.flip(x, [0]) * 2, lambda n: (_x(n),), [5, 6])
    assert counts[1] > 0


def test_gpt_forward_sweep_compiles_at_most_ten_programs():
    from char_gpt import GPT, GPTConfig

    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=65, block_size=512, n_layer=1, n_embd=32, n_head=2)
    m = GPT(cfg).eval()
    mt = GPT(cfg).to("tpu").eval()
    mt.load_state_dict(m.state_dict())
    torch._dynamo.reset()
    cm = torch.compile(mt, backend="tpu", dynamic=True)
    before = _compiled()
    for T in (1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 100, 144, 233, 300, 377, 512):
        idx = torch.randint(0, 65, (2, T), generator=torch.Generator().manual_seed(T))
        with torch.no_grad():
            got, _ = cm(idx.to("tpu"))
            want, _ = m(idx)
        assert got.shape == want.shape
        torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-5)
    assert _compiled() - before <= 10


def test_gpt_training_step_sweep_is_exact_and_compiles_per_bucket():
    from char_gpt import GPT, GPTConfig

    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=65, block_size=64, n_layer=1, n_embd=32, n_head=2)
    m = GPT(cfg)
    mt = GPT(cfg).to("tpu")
    mt.load_state_dict(m.state_dict())
    torch._dynamo.reset()
    cm = torch.compile(mt, backend="tpu", dynamic=True)
    counts = []
    for T in (3, 5, 7, 6, 12, 9):
        g = torch.Generator().manual_seed(T)
        x, y = torch.randint(0, 65, (2, T), generator=g), torch.randint(0, 65, (2, T), generator=g)
        before = _compiled()
        _, lt = cm(x.to("tpu"), y.to("tpu"))
        lt.backward()
        counts.append(_compiled() - before)
        _, lc = m(x, y)
        lc.backward()
        torch.testing.assert_close(lt.cpu(), lc.detach(), rtol=1e-5, atol=1e-6)
        for p, q in zip(mt.parameters(), m.parameters()):
            torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-4, atol=1e-6)
        mt.zero_grad()
        m.zero_grad()
    # 5, 7 and 6 share the bucket of 8, 12 and 9 the bucket of 16
    assert counts[2] == counts[3] == counts[5] == 0, counts


def test_convolutions_over_a_dynamic_batch():
    """Convolution, batch norm (training statistics over the real rows, and
    eval), max / average / adaptive pooling along a padded batch: values,
    gradients and running statistics as CPU, one program set per bucket."""
    import copy

    torch._dynamo.reset()
    torch.manual_seed(0)
    m = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 8, 3, padding=1, bias=False),
        nn.BatchNorm2d(8),
        nn.AvgPool2d(2),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 4),
    )
    mt = copy.deepcopy(m).to("tpu")

    def f(model, x):
        out = model(x)
        return out, (out * torch.arange(4.0, device=x.device)).sum()

    cf = torch.compile(f, backend="tpu")
    counts = []
    for train, sizes in ((True, [5, 6, 7, 9]), (False, [5, 7])):
        m.train(train)
        mt.train(train)
        for n in sizes:
            x = torch.randn(n, 3, 8, 8, generator=torch.Generator().manual_seed(n))
            xt = x.to("tpu")
            torch._dynamo.mark_dynamic(xt, 0)
            before = _compiled()
            (got, gl), (want, wl) = cf(mt, xt), f(m, x)
            if train:
                gl.backward()
                wl.backward()
            counts.append(_compiled() - before)
            torch.testing.assert_close(got.detach().cpu(), want.detach(), rtol=1e-5, atol=1e-5)
            for p, q in zip(mt.parameters(), m.parameters()):
                if train:
                    torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-4, atol=1e-4)
                p.grad = q.grad = None
            for p, q in zip(mt.buffers(), m.buffers()):
                torch.testing.assert_close(p.cpu(), q, rtol=1e-5, atol=1e-6)
    assert counts[1] == counts[2] == counts[5] == 0, counts


def test_resnet_training_step_over_a_dynamic_batch_is_exact_in_f64():
    """The ResNet example's loss and gradients for batches of 32, 20 and 30
    (one bucket): as CPU's to f64 rounding (in f32 the two differ where a
    ReLU input lies within rounding of 0), and no compile after the first."""
    import copy

    import resnet_cifar

    torch._dynamo.reset()
    torch.manual_seed(0)
    m = resnet_cifar.ResNet().double()
    mt = copy.deepcopy(m).to("tpu")

    def f(model, x, y):
        return F.cross_entropy(model(x), y)

    cf = torch.compile(f, backend="tpu")
    counts = []
    for n in (32, 20, 30):
        g = torch.Generator().manual_seed(n)
        x, y = torch.randn(n, 3, 32, 32, generator=g, dtype=torch.float64), torch.randint(0, 10, (n,), generator=g)
        xt, yt = x.to("tpu"), y.to("tpu")
        torch._dynamo.mark_dynamic(xt, 0)
        torch._dynamo.mark_dynamic(yt, 0)
        before = _compiled()
        got, want = cf(mt, xt, yt), f(m, x, y)
        got.backward()
        want.backward()
        counts.append(_compiled() - before)
        torch.testing.assert_close(got.detach().cpu(), want.detach(), rtol=1e-12, atol=1e-12)
        for p, q in zip(mt.parameters(), m.parameters()):
            torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-10, atol=1e-12)
            p.grad = q.grad = None
    assert counts[1:] == [0, 0], counts


@pytest.mark.parametrize(
    "name,f",
    [
        ("sort", lambda x: torch.sort(x, 0)),
        ("sort_descending", lambda x: torch.sort(x, 0, descending=True)),
        ("sort_stable", lambda x: torch.sort(x, dim=0, stable=True)),
        ("topk", lambda x: torch.topk(x, 3, 0)),
        ("topk_smallest", lambda x: torch.topk(x, 2, 0, largest=False)),
        ("sort_rows", lambda x: torch.sort(x, 1)),
        ("topk_rows", lambda x: torch.topk(x, 2, 1)),
    ],
)
def test_sorting_along_padding(name, f):
    """Sorts and topk along a padded dim (the padding sorts after every real
    value, NaN and infinities included) and along another dim: values and
    indices as CPU, no compile within a bucket."""

    def make(n):
        x = _x(n)
        x[0, 0], x[-1, 1], x[n // 2, 2] = float("nan"), float("inf"), float("-inf")
        return (x,)

    torch._dynamo.reset()
    cf = torch.compile(lambda x: tuple(f(x)), backend="tpu", dynamic=True)
    counts = []
    for n in (5, 6, 7, 11):
        (x,) = make(n)
        before = _compiled()
        got, want = cf(x.to("tpu")), tuple(f(x))
        counts.append(_compiled() - before)
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.dtype == w.dtype
            assert torch.equal(g.cpu().nan_to_num(9.0), w.nan_to_num(9.0)), (n, g.cpu(), w)
    assert counts[1] == counts[2] == 0, counts
