"""Bad input never ends the process or gives a silently wrong answer: each
case behaves as CPU torch does (the same exception type, or the same
values)."""

import pytest
import torch

import torchtpu  # noqa: F401

HUGE = 2**62


def _same_error(fn):
    """fn(device) raises on the CPU; on the tpu it raises the same type."""
    with pytest.raises(Exception) as want:
        fn("cpu")
    with pytest.raises(type(want.value)):
        fn("tpu")
    return want.value


@pytest.mark.parametrize(
    "make",
    [
        lambda d: torch.empty(HUGE, device=d),
        lambda d: torch.empty(2**61, device=d),
        lambda d: torch.zeros(HUGE, device=d),
        lambda d: torch.ones(HUGE, 2, device=d),
        lambda d: torch.full((HUGE,), 1.0, device=d),
        lambda d: torch.randn(HUGE, device=d),
        lambda d: torch.empty_strided((HUGE,), (1,), device=d),
        lambda d: torch.empty_strided((2, HUGE), (HUGE, 1), device=d),
        lambda d: torch.empty_strided((2,), (-1,), device=d),
        lambda d: torch.empty(0, HUGE, HUGE, device=d),
        lambda d: torch.ones(2, device=d).new_empty(HUGE),
        lambda d: torch.ones(2, device=d).resize_(HUGE),
        lambda d: torch.ones(2, device=d).repeat(HUGE),
        lambda d: torch.ones(2, device=d).repeat(2**31, 2**31),
    ],
    ids=lambda f: "",
)
def test_overflowing_sizes_raise_as_on_cpu(make):
    e = _same_error(make)
    assert isinstance(e, RuntimeError)
    assert torch.ones(2, device="tpu").add(1).cpu().tolist() == [2.0, 2.0]  # the process goes on


NAN = float("nan")


def _both(fn):
    """fn(device) on the CPU and on the tpu: the same values (NaN where NaN),
    dtype and shape, or the same exception type."""
    try:
        want = fn("cpu")
    except Exception as e:
        with pytest.raises(type(e)):
            fn("tpu")
        return e
    got = fn("tpu")
    wants, gots = (want, got) if isinstance(want, tuple) else ((want,), (got,))
    for w, g in zip(wants, gots):
        g = g.cpu()
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, w.dtype, g.shape, w.shape)
        torch.testing.assert_close(g, w, equal_nan=True, rtol=0, atol=0)
    return None


def _nan_operands(d):
    x = torch.tensor([1.0, NAN, -2.0, NAN, 0.5], device=d)
    y = torch.tensor([NAN, 3.0, NAN, NAN, -1.0], device=d)
    return x, y


@pytest.mark.parametrize(
    "fn",
    [
        lambda x, y: torch.maximum(x, y),
        lambda x, y: torch.maximum(y, x),
        lambda x, y: torch.minimum(x, y),
        lambda x, y: torch.minimum(y, x),
        lambda x, y: torch.fmax(x, y),
        lambda x, y: torch.fmin(y, x),
        lambda x, y: torch.clamp(x, y, None),
        lambda x, y: torch.clamp(x, None, y),
        lambda x, y: torch.clamp(x, y, y + 1),
        lambda x, y: torch.clamp(y, x, x + 1),
        lambda x, y: torch.clamp(x, min=NAN),
        lambda x, y: torch.clamp(x, max=NAN),
        lambda x, y: torch.clamp_min(x, y),
        lambda x, y: torch.clamp_max(y, x),
        lambda x, y: x.clamp(-1, 1),
        lambda x, y: torch.relu(x),
        lambda x, y: torch.nn.functional.hardtanh(y),
        lambda x, y: torch.stack([x, y]).amax(0),
        lambda x, y: torch.stack([y, x]).amin(0),
        lambda x, y: torch.stack([x, y]).max(0),
        lambda x, y: torch.stack([y, x]).min(0),
        lambda x, y: x.max(),
        lambda x, y: y.min(),
        lambda x, y: x.argmax(),
        lambda x, y: x.argmin(),
        lambda x, y: torch.sort(torch.cat([x, y])),
        lambda x, y: torch.sort(torch.cat([y, x]), descending=True),
        lambda x, y: torch.topk(torch.cat([x, y]), 3).values,
        lambda x, y: torch.topk(x, 2, largest=False).values,
        lambda x, y: torch.unique(torch.cat([x, y])),
    ],
    ids=lambda f: "",
)
def test_nan_in_every_operand_position_as_on_cpu(fn):
    _both(lambda d: fn(*_nan_operands(d)))


@pytest.mark.parametrize(
    "fn",
    [
        lambda d: torch.ones(2, dtype=torch.long, device=d).mul_(0.5),
        lambda d: torch.ones(2, dtype=torch.long, device=d).__iadd__(0.5),
        lambda d: torch.ones(2, dtype=torch.long, device=d).div_(2),
        lambda d: torch.ones(2, dtype=torch.long, device=d).sqrt_(),
        lambda d: torch.ones(2, dtype=torch.long, device=d).pow_(0.5),
        lambda d: torch.ones(2, dtype=torch.long, device=d).clamp_(0.5, 1.5),
        lambda d: torch.ones(2, dtype=torch.bool, device=d).add_(2),
        lambda d: torch.ones(2, device=d).add_(torch.ones(2, dtype=torch.complex64, device=d)),
        lambda d: torch.add(
            torch.ones(2, device=d), torch.ones(2, device=d), out=torch.empty(2, dtype=torch.long, device=d)
        ),
        lambda d: torch.mm(
            torch.ones(2, 2, device=d), torch.ones(2, 2, device=d), out=torch.empty(2, 2, dtype=torch.long, device=d)
        ),
        lambda d: torch.mm(
            torch.ones(2, 2, device=d), torch.ones(2, 2, device=d), out=torch.empty(2, 2, dtype=torch.float64, device=d)
        ),
        lambda d: torch.gather(
            torch.ones(2, 2, device=d),
            0,
            torch.zeros(2, 2, dtype=torch.long, device=d),
            out=torch.empty(2, 2, dtype=torch.long, device=d),
        ),
        lambda d: torch.complex(
            torch.ones(2, device=d), torch.ones(2, device=d), out=torch.empty(2, dtype=torch.complex128, device=d)
        ),
        lambda d: torch.multinomial(torch.ones(2, 4, device=d), 2, out=torch.empty(2, 2, dtype=torch.int32, device=d)),
        lambda d: torch.argmax(torch.ones(2, 2, device=d), 0, out=torch.empty(2, dtype=torch.int32, device=d)),
        lambda d: torch.sort(
            torch.ones(3, device=d),
            out=(torch.empty(3, dtype=torch.float64, device=d), torch.empty(3, dtype=torch.long, device=d)),
        ),
    ],
    ids=lambda f: "",
)
def test_results_that_cannot_be_cast_raise_as_on_cpu(fn):
    e = _both(fn)
    assert isinstance(e, RuntimeError)


@pytest.mark.parametrize(
    "fn",
    [
        lambda d: torch.ones(2, dtype=torch.long, device=d).mul_(2),
        lambda d: torch.ones(2, device=d).add_(torch.ones(2, dtype=torch.float64, device=d)),
        lambda d: torch.ones(2, dtype=torch.int32, device=d).add_(torch.ones(2, dtype=torch.long, device=d)),
        lambda d: torch.ones(2, dtype=torch.bool, device=d).mul_(True),
        lambda d: torch.ones(2, dtype=torch.long, device=d).relu_(),
        lambda d: torch.add(torch.ones(2, device=d), 1, out=torch.empty(2, dtype=torch.float64, device=d)),
        lambda d: torch.eq(torch.ones(2, device=d), 1, out=torch.empty(2, device=d)),
        lambda d: torch.sum(torch.ones(2, 3, device=d), 0, out=torch.empty(3, dtype=torch.float64, device=d)),
        lambda d: torch.mul(torch.ones(2, dtype=torch.long, device=d), 3, out=torch.empty(2, device=d)),
    ],
    ids=lambda f: "",
)
def test_castable_results_are_written_as_on_cpu(fn):
    assert _both(fn) is None


def test_int64_arange_beyond_2_pow_53_is_exact():
    for args in ((2**53 + 1, 2**53 + 4), (2**62, 2**62 + 7, 3), (-(2**60) - 3, -(2**60) + 9, 5)):
        _both(lambda d: torch.arange(*args, device=d))


@pytest.mark.parametrize(
    "fn",
    [
        lambda d: torch.zeros(3, device=d).expand(2, 3).add_(1),
        lambda d: torch.zeros(3, device=d).expand(2, 3).mul_(2),
        lambda d: torch.zeros(3, device=d).expand(2, 3).relu_(),
        lambda d: torch.zeros(3, device=d).expand(2, 3).copy_(torch.ones(2, 3, device=d)),
        lambda d: torch.zeros(3, device=d).expand(2, 3).copy_(torch.ones(2, 3)),
        lambda d: torch.zeros(3, device=d).expand(3, 3).addmm_(torch.ones(3, 3, device=d), torch.ones(3, 3, device=d)),
        lambda d: (lambda x: x[1:].copy_(x[:-1]))(torch.arange(4.0, device=d)),
        lambda d: (lambda x: x[1:].add_(x[:-1]))(torch.arange(4.0, device=d)),
        lambda d: (lambda x: x.add_(x.t()))(torch.ones(3, 3, device=d)),
        lambda d: (lambda x: torch.neg(x[:3], out=x[1:]))(torch.arange(4.0, device=d)),
        lambda d: (lambda x: torch.add(x[:3], 1, out=x[1:]))(torch.arange(4.0, device=d)),
        lambda d: (lambda x: torch.gather(x, 0, torch.tensor([1, 0, 2, 3], device=d), out=x))(
            torch.arange(4.0, device=d)
        ),
        lambda d: (lambda x: torch.index_select(x, 0, torch.tensor([1, 0, 2, 3], device=d), out=x))(
            torch.arange(4.0, device=d)
        ),
        lambda d: (lambda x: torch.take(x, torch.tensor([3, 2, 1, 0], device=d), out=x))(torch.arange(4.0, device=d)),
    ],
    ids=lambda f: "",
)
def test_writes_into_overlapping_memory_are_refused_as_on_cpu(fn):
    e = _both(fn)
    assert isinstance(e, RuntimeError) and "memory location" in str(e)


@pytest.mark.parametrize(
    "fn",
    [
        lambda d: (lambda x: x.mul_(x))(torch.arange(4.0, device=d)),
        lambda d: (lambda x: torch.add(x, x, out=x))(torch.arange(4.0, device=d)),
        lambda d: (lambda x: (x.t().add_(1), x)[1])(torch.ones(2, 3, device=d)),
        lambda d: (lambda x: (x[::2].add_(x[1::2]), x)[1])(torch.arange(6.0, device=d)),
        lambda d: (lambda z: (z.expand(2, 3).fill_(1), z)[1])(torch.zeros(3, device=d)),
        lambda d: (lambda z: (z.expand(2, 3).zero_(), z)[1])(torch.ones(3, device=d)),
        lambda d: (lambda z: (z.expand(2, 3).masked_fill_(torch.ones(2, 3, dtype=torch.bool, device=d), 2), z)[1])(
            torch.ones(3, device=d)
        ),
        lambda d: (lambda x: (x.copy_(x), x)[1])(torch.arange(4.0, device=d)),
    ],
    ids=lambda f: "",
)
def test_writes_that_cpu_allows_still_work(fn):
    assert _both(fn) is None


def test_mm_into_its_own_input_gives_the_product():
    # CPU torch allows torch.mm(x, x, out=x); what it writes depends on the
    # host's BLAS (MKL on an AVX2 AMD host clears the output before reading
    # its inputs and gives zeros; elsewhere the product): tpu gives the product
    a = torch.arange(4.0).reshape(2, 2) + 1
    x = a.to("tpu")
    assert torch.mm(x, x, out=x) is x
    assert torch.equal(x.cpu(), a @ a)


_DEAD_VALUES = r"""
import gc, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (6 * 2**30, 6 * 2**30))
import torch, torchtpu
torchtpu.eager_mode("fused")
k = [torch.empty(64 * 2**20, device="tpu") + 1 for i in range(100)]  # 25 GB if it ran
del k
gc.collect()
x = torch.ones(4, device="tpu") * 3
assert x.cpu().tolist() == [3.0] * 4
m = torchtpu.metrics()
assert m["fused_ops_pruned"] >= 100, m["fused_ops_pruned"]
kept = torch.arange(4.0, device="tpu")
y = kept * 2            # live: computed
dead = kept + 100       # dropped before the sync
del dead
assert y.cpu().tolist() == [0.0, 2.0, 4.0, 6.0]
try:
    z = torch.empty(2**36, device="tpu").add_(1)   # 256 GB: more than the limit
    z.sum().item()
except torch.OutOfMemoryError as e:
    assert isinstance(e, MemoryError) and ("aten::" in str(e) or "fused" in str(e)), str(e)
else:
    sys.exit("no out-of-memory error")
print("ok")
"""


def test_fused_mode_does_not_compute_or_allocate_dead_values():
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", _DEAD_VALUES], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout[-2000:] + r.stderr[-3000:]


@pytest.mark.parametrize("mode", ["debug", "strict", "fused"])
def test_half_type_chains_round_after_every_op(mode):
    """A chain of bfloat16/float16 ops rounds each result to its type, as CPU
    torch does: XLA's excess precision (float32 intermediates inside a fused
    program) is off. Checked without CPU torch's half kernels (whose rounding
    depends on the host): every intermediate read back in float32 is a value
    of the half type, and equals the chain computed in float64 with a rounding
    to the type after each op."""
    for dt in (torch.bfloat16, torch.float16):
        x = torch.tensor([0.1, 0.7, 1.3, -2.9, 5.3, 0.33], dtype=dt)

        def r(t):
            return t.to(dt).double()

        want = r(r(r(x.double() * 3) + 1) / 7)
        with torchtpu.eager_mode(mode):
            a = x.to("tpu")
            b = (a * 3 + 1) / 7
            got = b.float().cpu().double()  # in fused mode the float() joins the same program
        assert torch.equal(got, r(got)), (dt, got)
        assert torch.equal(got, want), (dt, got, want)


_BAD_VALUES = {
    "gather": lambda d: torch.gather(
        torch.arange(6.0, device=d).view(2, 3), 1, torch.tensor([[0, 5], [1, 2]], device=d)
    ),
    "gather_negative": lambda d: torch.gather(
        torch.arange(6.0, device=d).view(2, 3), 1, torch.tensor([[0, -1], [1, 2]], device=d)
    ),
    "index_select": lambda d: torch.index_select(torch.arange(6.0, device=d), 0, torch.tensor([7], device=d)),
    "embedding": lambda d: torch.nn.functional.embedding(torch.tensor([3, 9], device=d), torch.ones(5, 2, device=d)),
    "index": lambda d: torch.arange(6.0, device=d)[torch.tensor([6], device=d)],
    "index_negative": lambda d: torch.arange(6.0, device=d)[torch.tensor([-7], device=d)],
    "index_put_": lambda d: torch.zeros(3, device=d).index_put_(
        (torch.tensor([3], device=d),), torch.tensor(1.0, device=d)
    ),
    "setitem": lambda d: (lambda x: x.__setitem__(torch.tensor([4], device=d), 2.0) or x)(torch.zeros(3, device=d)),
    "take": lambda d: torch.take(torch.arange(6.0, device=d), torch.tensor([6], device=d)),
    "scatter_": lambda d: torch.zeros(3, device=d).scatter_(0, torch.tensor([4], device=d), torch.ones(1, device=d)),
    "scatter_add": lambda d: torch.zeros(3, device=d).scatter_add(
        0, torch.tensor([-1], device=d), torch.ones(1, device=d)
    ),
    "cross_entropy": lambda d: torch.nn.functional.cross_entropy(
        torch.randn(3, 4, device=d), torch.tensor([0, 4, 1], device=d)
    ),
    "nll_loss_negative": lambda d: torch.nn.functional.nll_loss(
        torch.randn(3, 4, device=d), torch.tensor([0, -2, 1], device=d)
    ),
    "cross_entropy_2d": lambda d: torch.nn.functional.cross_entropy(
        torch.randn(2, 4, 3, 3, device=d), torch.full((2, 3, 3), 5, device=d)
    ),
    "floor_divide": lambda d: torch.tensor([5, 3], device=d) // torch.tensor([0, 2], device=d),
    "div_trunc": lambda d: torch.div(
        torch.tensor([5, 3], device=d), torch.tensor([0, 2], device=d), rounding_mode="trunc"
    ),
    "remainder": lambda d: torch.tensor([5, 3], device=d) % torch.tensor([0, 2], device=d),
    "remainder_scalar": lambda d: torch.remainder(torch.tensor([5, 3], device=d), 0),
    "fmod": lambda d: torch.fmod(torch.tensor([5, 3], device=d), torch.tensor([2, 0], device=d)),
    "index_add_": lambda d: torch.zeros(3, device=d).index_add_(
        0, torch.tensor([3], device=d), torch.ones(1, device=d)
    ),
    "index_copy_": lambda d: torch.zeros(3, device=d).index_copy_(
        0, torch.tensor([-1], device=d), torch.ones(1, device=d)
    ),
    "index_fill_": lambda d: torch.zeros(3, device=d).index_fill_(0, torch.tensor([3], device=d), 1.0),
    "put_": lambda d: torch.zeros(3, device=d).put_(torch.tensor([3], device=d), torch.ones(1, device=d)),
    "bernoulli": lambda d: torch.bernoulli(torch.tensor([0.5, 1.5], device=d)),
    "bernoulli_": lambda d: torch.empty(2, device=d).bernoulli_(torch.tensor([-0.1, 0.5], device=d)),
    "multinomial_negative": lambda d: torch.multinomial(torch.tensor([0.5, -1.0], device=d), 1),
    "multinomial_nan": lambda d: torch.multinomial(torch.tensor([[0.5, NAN]], device=d), 1),
    "multinomial_zero_sum": lambda d: torch.multinomial(torch.tensor([0.0, 0.0], device=d), 1),
    "binary_cross_entropy": lambda d: torch.nn.functional.binary_cross_entropy(
        torch.tensor([1.5], device=d), torch.tensor([1.0], device=d)
    ),
}

_GOOD_VALUES = {
    "index_negative": lambda d: torch.arange(6.0, device=d)[torch.tensor([-6, 5], device=d)],
    "take_negative": lambda d: torch.take(torch.arange(6.0, device=d), torch.tensor([-6, 5], device=d)),
    "ignore_index": lambda d: torch.nn.functional.cross_entropy(
        torch.ones(3, 4, device=d), torch.tensor([0, -100, 1], device=d)
    ),
    "index_fill_negative": lambda d: torch.zeros(3, device=d).index_fill_(0, torch.tensor([-1], device=d), 1.0),
    "put_negative": lambda d: torch.zeros(3, device=d).put_(torch.tensor([-3], device=d), torch.ones(1, device=d)),
    "float_division_by_zero": lambda d: torch.tensor([5.0, 3.0], device=d) // torch.tensor([0.0, 2.0], device=d),
    "embedding_last_row": lambda d: torch.nn.functional.embedding(
        torch.tensor([4], device=d), torch.arange(10.0, device=d).view(5, 2)
    ),
}


@pytest.mark.parametrize("mode", ["debug", "strict", "fused"])
@pytest.mark.parametrize("name", sorted(_BAD_VALUES))
def test_value_checks_raise_as_on_cpu(name, mode):
    """An index, a class target or an integer divisor that CPU torch rejects
    raises the same exception type: at once in debug mode, at the next sync
    point in strict and fused mode (the op itself returns), naming the Python
    lines that called the op, not the sync point's."""
    fn = _BAD_VALUES[name]
    with pytest.raises(Exception) as want:
        fn("cpu")
    with torchtpu.eager_mode(mode):
        with pytest.raises(type(want.value)) as got:
            fn("tpu").cpu()
        assert "aten::" in str(got.value)
        if mode != "debug":
            site = str(got.value).split("the op was called from, most recent call last:", 1)[1]
            assert f'{__file__}", line ' in site and "in <lambda>" in site, str(got.value)
            assert "in test_value_checks_raise_as_on_cpu" in site, str(got.value)
        assert torch.ones(2, device="tpu").add(1).cpu().tolist() == [2.0, 2.0]  # nothing pending stays


@pytest.mark.parametrize("mode", ["debug", "strict", "fused"])
@pytest.mark.parametrize("name", sorted(_GOOD_VALUES))
def test_value_checks_pass_valid_values(name, mode):
    with torchtpu.eager_mode(mode):
        assert _both(_GOOD_VALUES[name]) is None


@pytest.mark.parametrize("mode", ["debug", "strict", "fused"])
def test_a_failed_value_check_corrupts_nothing(mode):
    """The bad op leaves what it writes as it was; the error surfaces at the
    sync point in strict and fused mode."""
    with torchtpu.eager_mode(mode):
        x = torch.arange(4.0, device="tpu")
        bad = torch.tensor([1, 7], device="tpu")
        if mode == "debug":
            with pytest.raises(IndexError):
                x.index_put_((bad,), torch.tensor(9.0, device="tpu"))
        else:
            x.index_put_((bad,), torch.tensor(9.0, device="tpu"))  # returns: checked at the sync
            x.scatter_(0, torch.tensor([5], device="tpu"), torch.ones(1, device="tpu"))
            with pytest.raises(IndexError):
                torch.tpu.synchronize()
        assert x.cpu().tolist() == [0.0, 1.0, 2.0, 3.0]


def test_value_checks_can_be_turned_off():
    import subprocess
    import sys

    code = (
        "import torch, torchtpu\n"
        "x = torch.arange(4.0, device='tpu')[torch.tensor([1], device='tpu')]\n"
        "print(x.cpu().tolist())\n"
        "torch.arange(4.0, device='tpu')[torch.tensor([9], device='tpu')].cpu()\n"
        "print('unchecked')\n"
    )
    env = dict(__import__("os").environ, TORCHTPU_VALUE_CHECKS="0")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0 and "unchecked" in r.stdout, r.stderr[-2000:]
