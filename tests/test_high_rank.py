"""Tensors of more than 8 dims (issue 41): tpu keeps up to 64, as many as the
CPU's reductions take, and more is a RuntimeError naming the limit.

Each case runs on CPU and on tpu and compares values, dtype, shape and the
gradients of every floating input. Shapes are mostly 1s with a few 2s and 3s,
so the programs stay small while every dim is a real dim of the program."""

import pytest
import torch
from _helpers import close, make

S12 = [2, 1, 3, 1, 2, 1, 1, 2, 1, 2, 1, 2]
S25 = [1, 2, 1, 1, 2, 1, 1, 1, 2, 1, 1, 1, 1, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 1]
S64 = [1] * 60 + [2, 3, 1, 2]


def _on(x, dev, grad):
    x = x.to(dev)
    return x.requires_grad_() if grad and x.is_floating_point() else x


def check(fn, *xs, grad=True):
    """fn on CPU and tpu: the result, and with grad the gradient of every
    floating input of sum(result)."""
    cpu = [_on(x.clone(), "cpu", grad) for x in xs]
    tpu = [_on(x, "tpu", grad) for x in xs]
    want, got = fn(*cpu), fn(*tpu)
    close(got, want, tol=1e-5)
    if grad and want.is_floating_point():
        want.sum().backward()
        got.sum().backward()
        for c, t in zip(cpu, tpu):
            if c.grad is not None:
                close(t.grad, c.grad, tol=1e-5)


def _idx(dev):
    return torch.tensor([1, 0, 1], device=dev)


CASES = {
    "add": (lambda a, b: a + b, [S12, S12]),
    "mul broadcast": (lambda a, b: a * b[:, :1], [S12, S12]),
    "exp 25 dims": (torch.exp, [S25]),
    "sum over dims, 25": (lambda a: a.sum((1, 4, 8, 23)), [S25]),
    "sum over dims, 64": (lambda a: a.sum((60, 61, 63)), [S64]),
    "sum of all, 64": (lambda a: a.sum(), [S64]),
    "amax, 64": (lambda a: a.amax(dim=61), [S64]),
    "mean": (lambda a: a.mean(), [S12]),
    "std": (lambda a: a.std(2), [S12]),
    "softmax": (lambda a: a.softmax(2), [S12]),
    "log_softmax, 64": (lambda a: a.log_softmax(-3), [S64]),
    "permute reversed": (lambda a: a.permute(list(range(11, -1, -1))).contiguous(), [S12]),
    "transpose, 25": (lambda a: a.transpose(1, 23).contiguous(), [S25]),
    "reshape": (lambda a: a.reshape(6, -1), [S12]),
    "squeeze, 64": (lambda a: a.squeeze() * 2, [S64]),
    "unsqueeze to 64": (lambda a: a.reshape([1] * 62 + [6, 16]) + 1, [S12]),
    "slices": (lambda a: a[:, :, 1:, :, :, :, :, 1:] * 2, [S12]),
    "select": (lambda a: a[1], [S12]),
    "index with a tensor": (lambda a: a[_idx(a.device)], [S12]),
    "cat": (lambda a, b: torch.cat([a, b], 5), [S12, S12]),
    "stack": (lambda a, b: torch.stack([a, b], 3), [S12, S12]),
    "where": (lambda a, b: torch.where(a > 0, a, b), [S12, S12]),
    "expand": (lambda a: a.expand(2, 4, 3, 1, 2, 1, 1, 2, 1, 2, 1, 2).contiguous(), [[2, 1] + S12[2:]]),
    "cumsum": (lambda a: a.cumsum(2), [S12]),
    "sort": (lambda a: a.sort(2).values, [S12]),
    "flip": (lambda a: a.flip(0, 2, 11), [S12]),
    "roll": (lambda a: a.roll(1, 2), [S12]),
    "matmul": (lambda a, b: a @ b.transpose(-1, -2), [S12, S12]),
    "strided clone": (lambda a: a.transpose(0, 2)[::2].clone(), [S12]),
    "masked_fill": (lambda a: a.masked_fill(a > 0, 0.0), [S12]),
    "pad": (lambda a: torch.nn.functional.pad(a, (1, 1, 0, 2)), [S12]),
    "bfloat16 round trip": (lambda a: a.to(torch.bfloat16).float(), [S12]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_high_rank_op(name):
    fn, shapes = CASES[name]
    check(fn, *[make(s, seed=i) for i, s in enumerate(shapes)])


def test_high_rank_integer_and_bool_results():
    x = make(S12)
    check(lambda a: a.argmax(2), x, grad=False)
    check(lambda a: (a > 0).nonzero(), x, grad=False)
    check(lambda a: (a > 0).all(5), x, grad=False)
    check(lambda a: a.to(torch.int32) * 3, make(S25, seed=3), grad=False)


def test_high_rank_writes_through_views():
    """copy_ into a transposed view of a 12-dim tensor, and an in-place add
    into a slice: the base sees the writes."""
    for dev in ("cpu", "tpu"):
        base = torch.zeros(S12, device=dev)
        base.transpose(0, 2).copy_(torch.arange(96.0, device=dev).reshape(3, 1, 2, 1, 2, 1, 1, 2, 1, 2, 1, 2))
        base[:, :, 1:].add_(1)
        if dev == "cpu":
            want = base
        else:
            close(base, want)


def test_high_rank_from_and_to_the_host():
    x = make(S64)
    t = x.to("tpu")
    assert t.shape == x.shape and t.dim() == 64
    close(t, x)
    close(t.permute(list(range(63, -1, -1))).cpu(), x.permute(list(range(63, -1, -1))))


def test_more_than_64_dims_is_a_runtime_error():
    """65 dims: made on tpu, moved there, or read by an op from a 65-dim view,
    a RuntimeError in torch's words for its reductions' limit, naming tpu."""
    msg = "only tensors with up to 64 dims are supported on tpu"
    with pytest.raises(RuntimeError, match=msg):
        torch.ones([1] * 65, device="tpu")
    with pytest.raises(RuntimeError, match=msg):
        torch.ones([1] * 65).to("tpu")
    v = torch.ones([1] * 64, device="tpu").unsqueeze(0)  # a view: torch's metadata only
    with pytest.raises(RuntimeError, match=msg):
        (v + 1).cpu()
    a = torch.ones([1] * 64, device="tpu")
    with pytest.raises(RuntimeError, match="64 dims"):
        torch.stack([a, a]).cpu()
    close(a + 1, torch.ones([1] * 64) + 1)  # the device still works
