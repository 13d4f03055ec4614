"""Errors that match PyTorch: each case runs on the CPU and on tpu, and both
must raise the same exception type (and, where the message is ours, name the
problem in PyTorch's words) -- or both must succeed with equal results."""

import math
import os
import re
import warnings

import pytest
import torch

import torchtpu  # noqa: F401

B, I64, I32, BF16 = torch.bool, torch.int64, torch.int32, torch.bfloat16


def _run(fn, dev):
    try:
        r = fn(dev)
        if isinstance(r, torch.Tensor):
            r = r.cpu()
        elif isinstance(r, (tuple, list)):
            r = [x.cpu() if isinstance(x, torch.Tensor) else x for x in r]
        return r, None
    except Exception as e:  # noqa: BLE001 - the type is what is compared
        return None, e


def same_as_cpu(fn, match=None):
    """fn(device) raises the same type on tpu as on the CPU (match: a
    substring both messages contain), or both succeed with equal results."""
    cr, ce = _run(fn, "cpu")
    tr, te = _run(fn, "tpu")
    if ce is None:
        assert te is None, f"tpu raised {type(te).__name__}: {te}; the CPU succeeds"
        torch.testing.assert_close(tr, cr, equal_nan=True)
        return
    assert te is not None, f"tpu raised nothing; the CPU raises {type(ce).__name__}: {ce}"
    assert type(te) is type(ce), f"tpu {type(te).__name__}: {te} / CPU {type(ce).__name__}: {ce}"
    if match:
        assert match in str(ce), str(ce)
        assert match in str(te), str(te)
    assert "stablehlo" not in str(te) and "PJRT" not in str(te), str(te)


def t(*shape, dtype=torch.float32, dev):
    return torch.ones(*shape, dtype=dtype, device=dev)


# ---- broadcasting: RuntimeError with torch's words -------------------------------------------

CASES_BROADCAST = {
    "mul": (lambda d: t(1, 2, dev=d) * t(3, dev=d), "must match the size of tensor b"),
    "masked_fill": (lambda d: t(1, 2, dev=d).masked_fill(t(3, dtype=B, dev=d), 1.0), "must match"),
    "masked_fill_": (lambda d: t(1, 2, dev=d).masked_fill_(t(3, dtype=B, dev=d), 1.0), "must match"),
    "where": (lambda d: torch.where(t(3, dtype=B, dev=d), t(1, 2, dev=d), 0.0), "must match"),
    "copy_": (
        lambda d: t(1, 1, dev=d).copy_(t(1, 1, 1, dev=d)),
        "output with shape [1, 1] doesn't match the broadcast shape [1, 1, 1]",
    ),
    "add_": (lambda d: t(1, 1, dev=d).add_(t(1, 1, 1, dev=d)), "doesn't match the broadcast shape"),
    "copy_ into empty narrow": (
        lambda d: t(4, dtype=I64, dev=d).narrow(0, 4, 0).copy_(t(2, dtype=I64, dev=d)),
        "The size of tensor a (0) must match the size of tensor b (2)",
    ),
    "copy_ into empty": (
        lambda d: t(0, dtype=I64, dev=d).unsqueeze(-1).copy_(t(3, 0, 1, dtype=I64, dev=d)),
        "output with shape [0, 1] doesn't match the broadcast shape [3, 0, 1]",
    ),
    "poisson_nll_loss": (lambda d: torch.nn.functional.poisson_nll_loss(t(5, 4, dev=d), t(5, dev=d)), "must match"),
}


@pytest.mark.parametrize("name", sorted(CASES_BROADCAST))
def test_broadcast_errors(name):
    fn, match = CASES_BROADCAST[name]
    same_as_cpu(fn, match)


# ---- dtype checks -------------------------------------------------------------------------------

CASES_DTYPE = {
    "f32 - bool": (lambda d: t(2, dev=d) - t(2, dtype=B, dev=d), "with a bool tensor is not supported"),
    "bool.sub_(2)": (lambda d: t(2, dtype=B, dev=d).sub_(2), "with a bool tensor is not supported"),
    "bool.sub_(bf16)": (lambda d: t(2, dtype=B, dev=d).sub_(t(1, dtype=BF16, dev=d)), "Subtraction"),
    "rsub bool bool": (lambda d: torch.rsub(t(2, dtype=B, dev=d), t(2, dtype=B, dev=d)), "two bool tensors"),
    "argmax bool": (lambda d: t(2, dtype=B, dev=d).argmax(), "argmax(): does not support bool input"),
    "argmin bool": (lambda d: t(2, dtype=B, dev=d).argmin(0), "argmin(): does not support bool input"),
    "clamp bool tensors": (
        lambda d: torch.clamp(t(2, dtype=B, dev=d), t(2, dtype=B, dev=d), t(2, dtype=B, dev=d)),
        "not implemented for 'Bool'",
    ),
    "clamp bool scalar": (lambda d: torch.clamp(t(2, dtype=B, dev=d), 0, 1), None),
    "bitwise_not f32": (lambda d: torch.bitwise_not(t(2, dev=d)), "not implemented for 'Float'"),
    "bitwise_or bf16": (
        lambda d: torch.bitwise_or(t(2, dtype=BF16, dev=d), t(2, dtype=BF16, dev=d)),
        "\"bitwise_or_cpu\" not implemented for 'BFloat16'",
    ),
    "bitwise_and bf16": (lambda d: torch.bitwise_and(t(2, dtype=BF16, dev=d), t(2, dtype=BF16, dev=d)), None),
    "bitwise_xor f32": (lambda d: torch.bitwise_xor(t(2, dev=d), t(2, dev=d)), None),
    "frac bool": (lambda d: torch.frac(t(2, dtype=B, dev=d)), "not implemented for 'Bool'"),
    "trunc bool": (lambda d: torch.trunc(t(2, dtype=B, dev=d)), "not implemented for 'Bool'"),
    "floor_divide bool": (
        lambda d: torch.floor_divide(t(2, dtype=B, dev=d), t(2, dtype=B, dev=d)),
        "\"div_floor_cpu\" not implemented for 'Bool'",
    ),
    "pow bool False": (lambda d: torch.pow(torch.tensor([True, False], device=d), False), None),
    "pow bool bool": (
        lambda d: torch.pow(
            torch.tensor([True, False, True, False], device=d), torch.tensor([True, True, False, False], device=d)
        ),
        "\"pow\" not implemented for 'Bool'",
    ),
    "pow_ bool True": (lambda d: torch.tensor([True, False], device=d).pow_(True), None),
    # |z| is real: in place on a complex tensor torch refuses; out= and abs() may
    "abs_ complex": (lambda d: torch.tensor([3 + 4j], device=d).abs_(), "In-place abs is not supported"),
    "abs out complex": (lambda d: (lambda z: torch.abs(z, out=z))(torch.tensor([3 + 4j], device=d)), None),
    "abs complex": (lambda d: torch.tensor([3 + 4j, -1j], device=d).abs(), None),
    "abs_ f32": (lambda d: torch.tensor([-1.5, 2.0], device=d).abs_(), None),
    # a RuntimeError, as the CPU's (not a ValueError)
    "clamp no bounds": (lambda d: torch.clamp(t(2, dev=d)), "At least one of 'min' or 'max'"),
    "clamp_ no bounds": (lambda d: t(2, dev=d).clamp_(), "At least one of 'min' or 'max'"),
    "clamp out no bounds": (lambda d: torch.clamp(t(2, dev=d), out=t(2, dev=d)), "At least one of 'min' or 'max'"),
}


@pytest.mark.parametrize("name", sorted(CASES_DTYPE))
def test_dtype_errors(name):
    fn, match = CASES_DTYPE[name]
    same_as_cpu(fn, match)


# ---- reductions over nothing, k out of range -----------------------------------------------------

CASES_REDUCE = {
    "argmax size-0 dim": (lambda d: t(2, 0, dev=d).argmax(1), "Expected reduction dim 1 to have non-zero size"),
    "argmin size-0 dim": (lambda d: t(2, 0, dev=d).argmin(1), "Expected reduction dim 1 to have non-zero size"),
    "argmax empty": (lambda d: t(0, dev=d).argmax(), "Expected reduction dim to be specified"),
    "amin empty": (lambda d: torch.amin(t(0, dev=d)), "Expected reduction dim to be specified"),
    "amax empty 3d": (lambda d: torch.amax(t(5, 0, 5, dev=d)), "Expected reduction dim to be specified"),
    "amax size-0 dim": (lambda d: torch.amax(t(5, 0, 5, dev=d), 1), "Expected reduction dim 1 to have non-zero size"),
    "kthvalue k": (lambda d: torch.kthvalue(t(2, 2, dev=d), 3), "selected number k out of range"),
    "kthvalue 0-d": (lambda d: torch.kthvalue(torch.tensor(2, device=d), 3), "selected number k out of range"),
}


@pytest.mark.parametrize("name", sorted(CASES_REDUCE))
def test_reduce_errors(name):
    fn, match = CASES_REDUCE[name]
    same_as_cpu(fn, match)


# ---- indexing, out= aliasing -----------------------------------------------------------------------


def test_gather_index_larger_than_self():
    same_as_cpu(
        lambda d: torch.gather(t(1, 1, dev=d), 1, torch.zeros(2, 2, dtype=I64, device=d)),
        "Size does not match at dimension 0 expected index [2, 2] to be no larger than self [1, 1]",
    )
    same_as_cpu(
        lambda d: torch.gather(t(2, 3, dev=d), 1, torch.zeros(2, dtype=I64, device=d)),
        "Index tensor must have the same number of dimensions as input tensor",
    )


def test_resized_out_that_aliases_an_input():
    """An out= tensor that is resized to take the result may not overlap an
    input (kthvalue's values into self, take into its source, index_select
    into an expanded tensor)."""

    def kth(d):
        x = torch.arange(10.0, device=d)
        return torch.kthvalue(x, 5, out=(x, torch.empty((), dtype=I64, device=d)))

    def take(d):
        x = torch.arange(6.0, device=d)
        return torch.take(x, torch.tensor([0, 1, 2], device=d), out=x)

    def index_select(d):
        out = torch.ones(1, 6, device=d).expand(2, 6)
        return torch.index_select(t(3, 6, dev=d), 1, torch.tensor([0, 1], device=d), out=out)

    for fn in (kth, take, index_select):
        same_as_cpu(fn, "unsupported operation")


@pytest.mark.filterwarnings("ignore:An output with one or more elements was resized")
def test_resized_out_that_is_an_input_is_allowed_where_torch_allows_it():
    """torch lets sum(x, 0, out=x) and mm(x, x.t(), out=x) resize x (what
    the CPU then computes reads the resized x: only the refusal is compared)."""

    def summed(d):
        x = torch.arange(12.0, device=d).reshape(3, 4)
        torch.sum(x, 0, out=x)
        return x

    def mm(d):
        x = torch.arange(12.0, device=d).reshape(3, 4)
        torch.mm(x, x.t(), out=x)
        return x

    for fn in (summed, mm):
        assert _run(fn, "cpu")[1] is None
        r, e = _run(fn, "tpu")
        assert e is None, e
        assert r.shape == _run(fn, "cpu")[0].shape


def test_builder_errors_are_runtime_errors_naming_the_op():
    """An input an emitter does not check reaches the StableHLO builder: the
    user sees a RuntimeError naming the aten op, not a TypeError of the builder."""
    x = torch.ones(3, 0, device="tpu")
    with pytest.raises((RuntimeError, IndexError)) as e:
        x[:, torch.zeros(2, dtype=I64, device="tpu")].cpu()
    assert not str(e.value).startswith("stablehlo")


# ---- values: sign of NaN ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fn", [torch.sign, torch.sgn])
def test_sign_of_nan_is_zero_as_on_cpu(fn, dtype):
    same_as_cpu(lambda d: fn(torch.tensor([math.nan, -1.0, 0.0, 2.0, -math.inf], dtype=dtype, device=d)))


# ---- values that do not fit the destination's dtype (checked on every call) --------------------

CASES_FILL = {
    "int32.fill_(inf)": (
        lambda d: t(2, dtype=I32, dev=d).fill_(math.inf),
        "value cannot be converted to type int without",
    ),
    "int64.fill_(nan)": (lambda d: t(2, dtype=I64, dev=d).fill_(math.nan), "to type int64_t without overflow"),
    "int8.fill_(300)": (lambda d: t(2, dtype=torch.int8, dev=d).fill_(300), "to type int8_t without overflow"),
    "uint8.fill_(-1)": (lambda d: t(2, dtype=torch.uint8, dev=d).fill_(-1), None),
    "f32.fill_(1e40)": (lambda d: t(2, dev=d).fill_(1e40), "to type float without overflow"),
    "bf16.fill_(inf)": (lambda d: t(2, dtype=BF16, dev=d).fill_(math.inf), None),
    "bool.fill_(inf)": (lambda d: t(2, dtype=B, dev=d).fill_(math.inf), None),
    "int64.masked_fill_(inf)": (
        lambda d: t(2, dtype=I64, dev=d).masked_fill_(t(2, dtype=B, dev=d), math.inf),
        "to type int64_t without overflow",
    ),
    "f32.masked_fill(1j)": (
        lambda d: t(2, 2, dev=d).masked_fill(torch.tensor(True, device=d), 1j),
        "to type float without overflow",
    ),
    "int64.fill_(7) after inf": (lambda d: t(2, dtype=I64, dev=d).fill_(7), None),
}


@pytest.mark.parametrize("name", sorted(CASES_FILL))
def test_fill_value_overflow(name):
    fn, match = CASES_FILL[name]
    same_as_cpu(fn, match)


def test_fill_check_runs_on_every_call():
    """The value is a program input, not part of the compiled program: a
    cached fill_ still checks each new value."""
    x = torch.zeros(3, dtype=I32, device="tpu")
    x.fill_(5)
    with pytest.raises(RuntimeError, match="without overflow"):
        x.fill_(math.inf)
    x.fill_(6)
    assert x.cpu().tolist() == [6, 6, 6]


def test_random_fill_arguments_checked_on_every_call():
    x = torch.empty(10, device="tpu")
    x.uniform_(0, 1)
    same_as_cpu(lambda d: torch.empty(10, device=d).uniform_(3, -1), "uniform_ expects to return a [from, to) range")
    same_as_cpu(lambda d: torch.empty(10, device=d).cauchy_(0, 0), "cauchy_ expects sigma > 0.0")


# ---- argument checks of single ops -------------------------------------------------------------

CASES_ARGS = {
    "masked_fill 1-d value": (
        lambda d: t(2, 2, dev=d).masked_fill(torch.tensor(True, device=d), t(1, dev=d)),
        "masked_fill_ only supports a 0-dimensional value tensor",
    ),
    "masked_scatter float mask": (
        lambda d: t(1, 3, dev=d).masked_scatter(t(1, 3, dev=d), t(3, 4, dev=d)),
        "masked_scatter_ only supports boolean masks, but got mask with dtype Float",
    ),
    "roll 0-d": (lambda d: torch.roll(torch.tensor(1.0, device=d), 0, 0), "Dimension specified as 0"),
    "gelu approximate": (
        lambda d: torch.nn.functional.gelu(t(2, dev=d), approximate="asdf"),
        "approximate argument must be either none or tanh",
    ),
    "layer_norm empty shape": (
        lambda d: torch.native_layer_norm(t(1, 2, 3, dev=d), (), None, None, 1e-5),
        "Expected normalized_shape to be at least 1-dimensional",
    ),
    "max_pool3d empty non-batch dim": (
        lambda d: torch.nn.functional.max_pool3d(t(0, 1, 2, 10, dev=d), 1),
        "non-batch dimension",  # torch 2.15 words it otherwise
    ),
    "aminmax out dtype": (
        lambda d: torch.aminmax(t(4, 4, dev=d), dim=0, out=(t(4, dev=d), t(4, dtype=torch.float64, dev=d))),
        None,
    ),
    "nll_loss weight of 4 for 5 classes": (
        lambda d: torch.nn.functional.nll_loss(t(3, 5, dev=d), torch.tensor([1, 2, 3], device=d), weight=t(4, dev=d)),
        "weight tensor should be defined either for all 5 classes or no classes but got weight tensor of shape: [4]",
    ),
    "nll_loss weight 2-d": (
        lambda d: torch.nn.functional.nll_loss(
            t(3, 5, dev=d), torch.tensor([1, 2, 3], device=d), weight=t(5, 1, dev=d)
        ),
        "got weight tensor of shape: [5, 1]",
    ),
    "cross_entropy weight of 6 for 5 classes": (
        lambda d: torch.nn.functional.cross_entropy(
            t(3, 5, dev=d), torch.tensor([1, 2, 3], device=d), weight=t(6, dev=d)
        ),
        "for all 5 classes or no classes",
    ),
    "nll_loss2d weight of 4 for 5 classes": (
        lambda d: torch.nn.functional.nll_loss(
            t(2, 5, 3, 3, dev=d), torch.zeros(2, 3, 3, dtype=torch.long, device=d), weight=t(2, 2, dev=d)
        ),
        "weight tensor should be defined either for all or no classes",
    ),
    "nll_loss2d weight 5x1 as the CPU takes it": (
        lambda d: torch.nn.functional.nll_loss(
            t(2, 5, 3, 3, dev=d), torch.zeros(2, 3, 3, dtype=torch.long, device=d), weight=t(5, 1, dev=d)
        ),
        None,
    ),
    "amax rank 65": (
        lambda d: torch.amax(torch.ones([1] * 65, device=d), dim=-1),
        "only tensors with up to 64 dims are supported",
    ),
}


@pytest.mark.parametrize("name", sorted(CASES_ARGS))
def test_argument_errors(name):
    fn, match = CASES_ARGS[name]
    same_as_cpu(fn, match)


def test_rank_above_the_limit_is_a_runtime_error():
    """tpu keeps tensors of up to 64 dims (TPU_MAX_RANK, tests/test_high_rank.py);
    more is refused with a RuntimeError naming the limit."""
    with pytest.raises(RuntimeError, match="up to 64 dims are supported on tpu"):
        torch.ones([1] * 65, device="tpu")
    with pytest.raises(RuntimeError, match="up to 64 dims are supported on tpu"):
        torch.ones([1] * 65).to("tpu")


# ---- indexing over empty dims, index_put dtypes, arange into an integer out= ----------------------

CASES_INDEX = {
    "index empty on empty": (
        lambda d: torch.ones(0, 4, 0, dtype=BF16, device=d)[torch.zeros(0, dtype=I64, device=d)],
        None,
    ),
    "index a size-0 dim": (
        lambda d: t(3, 0, dev=d)[:, torch.zeros(2, dtype=I64, device=d)],
        "index is out of bounds for dimension with size 0",
    ),
    "index_put_ dtypes": (
        lambda d: t(3, dev=d).index_put_(
            (torch.zeros(0, dtype=I64, device=d),), torch.zeros(0, dtype=I64, device=d), accumulate=True
        ),
        "Index put requires the source and destination dtypes match, got Float for the destination "
        "and Long for the source.",
    ),
    "setitem dtypes": (
        lambda d: t(3, dev=d).__setitem__(torch.tensor([0], device=d), torch.tensor([5], device=d)),
        "Index put requires the source and destination dtypes match",
    ),
    "index_put_ empty values": (
        lambda d: t(3, dev=d).index_put_(
            (torch.zeros(0, dtype=I64, device=d),), torch.zeros(0, device=d), accumulate=True
        ),
        None,
    ),
    "arange int out step 0.5": (
        lambda d: torch.arange(0, 64, 0.5, out=torch.empty(0, dtype=I64, device=d)),
        "step must be nonzero",
    ),
    # an integer arange of float bounds: the truncated bounds (torch 2.13), or the count from the
    # float ones (2.14 and later); tpu did neither ([0, 2, 3] for the first)
    "arange int64 of float bounds": (lambda d: torch.arange(0.5, 5, 1.5, dtype=I64, device=d), None),
    "arange int64 of float bounds down": (lambda d: torch.arange(5.5, 0.2, -1.5, dtype=I64, device=d), None),
    "arange int64 step 0.7": (lambda d: torch.arange(0, 3, 0.7, dtype=I64, device=d), None),
    "arange int32 of float bounds": (lambda d: torch.arange(0.2, 4.9, 1.0, dtype=torch.int32, device=d), None),
    "arange int32 step 0.5": (lambda d: torch.arange(0, 6, 0.5, dtype=torch.int32, device=d), None),
    "arange int32 out of float bounds": (
        lambda d: torch.arange(0.5, 5, 1.5, out=torch.empty(0, dtype=torch.int32, device=d)),
        None,
    ),
    "cat out aliases input": (lambda d: (lambda x: torch.cat((x, x), out=x))(t(4, 6, dev=d)), "unsupported operation"),
    "cat out": (lambda d: torch.cat((t(2, 3, dev=d), t(1, 3, dev=d)), out=torch.empty(3, 3, device=d)), None),
}


@pytest.mark.parametrize("name", sorted(CASES_INDEX))
def test_index_errors(name):
    fn, match = CASES_INDEX[name]
    same_as_cpu(fn, match)


# masked_fill with a 0-d value tensor: the CPU reads the value and converts it
# checked (c10's "value cannot be converted to type ... without overflow");
# on tpu a value check makes the same refusal at the sync point.
MASKED_FILL_VALUES = [
    (torch.int64, 1 + 2j, torch.complex64),
    (torch.int64, 2 + 0j, torch.complex64),
    (torch.int8, 300, torch.int64),
    (torch.uint8, -1, torch.int64),
    (torch.int32, 2**40, torch.int64),
    (torch.float32, 1e300, torch.float64),
    (torch.float16, 1e6, torch.float32),
    (torch.bool, 5, torch.int64),
    (torch.float32, math.inf, torch.float64),
    (torch.int64, math.nan, torch.float32),
    (torch.int16, 40000.0, torch.float32),
    (torch.float32, 1 + 1j, torch.complex64),
    (torch.complex64, 1e300 + 0j, torch.complex128),
]


@pytest.mark.parametrize("case", range(len(MASKED_FILL_VALUES)))
def test_masked_fill_value_tensor_must_fit(case):
    dt, v, vdt = MASKED_FILL_VALUES[case]
    out = []
    for dev in ("cpu", "tpu"):
        x = torch.zeros(3, dtype=dt, device=dev)
        mask = torch.tensor([True, False, True], device=dev)
        try:
            out.append(x.masked_fill(mask, torch.tensor(v, dtype=vdt, device=dev)).cpu())
        except RuntimeError as e:
            out.append(str(e))
    if isinstance(out[0], str):
        assert isinstance(out[1], str) and out[0] in out[1], out
    else:
        assert not isinstance(out[1], str), out
        assert out[1].dtype == out[0].dtype and torch.equal(out[1], out[0])


@pytest.mark.parametrize("write", [False, True])
def test_uint8_mask_index_warns_as_on_cpu(write):
    """Indexing with a uint8 mask works and carries the CPU's deprecation warning; a bool mask does not warn."""
    import warnings

    def run(dev):
        x = torch.arange(4.0, device=dev)
        m = torch.tensor([1, 0, 1, 0], dtype=torch.uint8, device=dev)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            r = x.index_put_((m,), torch.tensor([7.0, 8.0], device=dev)) if write else x[m]
            quiet = x[m.bool()]
        msgs = [str(i.message) for i in w if issubclass(i.category, UserWarning)]
        return r.cpu(), quiet.cpu(), msgs

    (cr, cq, cm), (tr, tq, tm) = run("cpu"), run("tpu")
    torch.testing.assert_close(tr, cr)
    torch.testing.assert_close(tq, cq)
    assert len(tm) == len(cm) == 1 and "indexing with dtype torch.uint8 is now deprecated" in tm[0], (tm, cm)


def test_sparse_layouts_are_refused_in_one_line():
    """A sparse tensor moved to tpu, made there, or a sparse embedding's gradient: one
    NotImplementedError line naming the layout and what to do (not torch's list of backends);
    a compressed (CSR) tensor's ops say the same."""
    i, v = torch.tensor([[0, 1], [1, 0]]), torch.tensor([1.0, 2.0])
    coo = torch.sparse_coo_tensor(i, v, (2, 2), check_invariants=True)
    emb = torch.nn.Embedding(10, 3, sparse=True).to("tpu")
    for make in (
        lambda: coo.to("tpu"),
        lambda: torch.sparse_coo_tensor(i.to("tpu"), v.to("tpu"), (2, 2)),
        lambda: emb(torch.tensor([1, 2], device="tpu")).sum().backward(),
    ):
        with pytest.raises(
            NotImplementedError, match=r"sparse tensors \(torch.sparse_coo\) are not supported on tpu"
        ) as e:
            make()
        assert "\n" not in str(e.value) and "to_dense" in str(e.value)
    # made from a dense tpu tensor (to_sparse and its compressed forms), with the CPU fallback on too
    d = torch.tensor([[1.0, 0.0], [0.0, 2.0]], device="tpu")
    for make, layout in (
        (lambda: d.to_sparse(), "torch.sparse_coo"),
        (lambda: d.to_sparse_csr(), "a compressed sparse layout"),
        (lambda: d.to_sparse_bsr((1, 1)), "a compressed sparse layout"),
    ):
        for fallback in ("0", "1"):
            os.environ["TORCHTPU_CPU_FALLBACK"] = fallback
            try:
                with pytest.raises(NotImplementedError, match=rf"sparse tensors \({layout}\)") as e:
                    make()
            finally:
                os.environ.pop("TORCHTPU_CPU_FALLBACK")
            assert "\n" not in str(e.value)
    csr = torch.tensor([[0.0, 1.0], [2.0, 0.0]]).to_sparse_csr().to("tpu")
    with pytest.raises(NotImplementedError, match=r"sparse tensors \(a compressed sparse layout\)") as e:
        csr.to_dense()
    assert "\n" not in str(e.value)
    # dense work on tpu goes on as before
    assert torch.equal((torch.ones(2, device="tpu") + 1).cpu(), torch.full((2,), 2.0))


def test_quantized_tensors_are_refused_in_one_line(monkeypatch):
    """A quantized tensor moved to tpu, made there, or quantized there (with the CPU
    fallback on too): one NotImplementedError line naming the layout and what to do."""
    x = torch.randn(4)
    monkeypatch.setenv("TORCHTPU_CPU_FALLBACK", "1")
    for make in (
        lambda: torch.quantize_per_tensor(x, 0.1, 0, torch.qint8).to("tpu"),
        lambda: torch._empty_affine_quantized([2, 3], scale=0.5, zero_point=1, dtype=torch.quint8, device="tpu"),
        lambda: torch.quantize_per_tensor(x.to("tpu"), 0.1, 0, torch.qint8),
        lambda: torch.quantize_per_channel(
            x.to("tpu"), torch.ones(4), torch.zeros(4, dtype=torch.long), 0, torch.quint8
        ),
    ):
        with pytest.raises(NotImplementedError, match=r"quantized tensors \(torch.quint8") as e:
            make()
        assert "\n" not in str(e.value) and "dequantize" in str(e.value)
    assert torch.equal((x.to("tpu") * 2).cpu(), x * 2)


@pytest.mark.parametrize("mask_dtype", [torch.uint8, torch.int64, torch.float32])
def test_masked_fill_takes_only_boolean_masks(mask_dtype):
    """masked_fill(_) with a mask that is not bool: the CPU's RuntimeError, word for word; nothing written."""
    for dev in ("cpu", "tpu"):
        x = torch.arange(4.0, device=dev)
        m = torch.tensor([1, 0, 1, 0], device=dev).to(mask_dtype)
        msgs = []
        for fill in (
            lambda: x.masked_fill(m, 5.0),
            lambda: x.masked_fill_(m, 5.0),
            lambda: x.masked_fill_(m, torch.tensor(5.0)),
        ):
            with pytest.raises(RuntimeError, match="masked_fill_ only supports boolean masks") as e:
                fill().cpu()
            msgs.append(str(e.value))
        assert torch.equal(x.cpu(), torch.arange(4.0))
        if dev == "cpu":
            want = msgs
        else:
            assert msgs == want, (msgs, want)


_ACCEPTED_SILENTLY = {
    # name: (call on a device, text the tpu error holds)
    "where_float_condition": (
        lambda d: torch.where(torch.tensor([1.0, 0.0], device=d), torch.ones(2, device=d), torch.zeros(2, device=d)),
        "where expected condition to be a boolean tensor, but got a tensor with dtype Float",
    ),
    "scatter_reduce_index_out_of_range": (
        lambda d: torch.zeros(3, device=d).scatter_reduce(
            0, torch.tensor([5], device=d), torch.ones(1, device=d), "sum"
        ),
        "scatter_reduce's indices must be in [0, size)",
    ),
    "embedding_bag_index_out_of_range": (
        lambda d: torch.nn.functional.embedding_bag(torch.tensor([[7]], device=d), torch.ones(3, 2, device=d)),
        "not in [0, num_embeddings)",
    ),
    "repeat_interleave_negative": (
        lambda d: torch.repeat_interleave(torch.tensor([5, 6], device=d), torch.tensor([1, -1], device=d)),
        "repeats can not be negative",
    ),
    "repeat_interleave_negative_sized": (
        lambda d: torch.repeat_interleave(torch.tensor([2, -1], device=d), output_size=1),
        "repeats can not be negative",
    ),
    "masked_scatter_short_source": (
        lambda d: torch.zeros(4, device=d).masked_scatter_(
            torch.ones(4, dtype=torch.bool, device=d), torch.ones(2, device=d)
        ),
        "Number of elements of source < number of ones in mask",
    ),
}


@pytest.mark.parametrize("name", sorted(_ACCEPTED_SILENTLY))
def test_what_the_cpu_refuses_tpu_refuses(name):
    """Calls the CPU refuses, which tpu took silently (a result from invalid input): the CPU's
    exception type on tpu too, at the call or at the next sync point; valid calls still work."""
    call, says = _ACCEPTED_SILENTLY[name]
    with pytest.raises(RuntimeError):
        call("cpu")
    with pytest.raises(RuntimeError, match=re.escape(says)):
        r = call("tpu")
        r.cpu()
    torch.tpu.synchronize()
    assert torch.equal((torch.ones(2, device="tpu") * 3).cpu(), torch.full((2,), 3.0))


def test_valid_neighbours_of_those_calls_match_cpu():
    for d in ("cpu", "tpu"):
        results = [
            torch.where(
                torch.tensor([1, 0], dtype=torch.uint8, device=d), torch.ones(2, device=d), torch.zeros(2, device=d)
            ),
            torch.zeros(3, device=d).scatter_reduce(0, torch.tensor([2, 2], device=d), torch.ones(2, device=d), "amax"),
            torch.nn.functional.embedding_bag(torch.tensor([[2, 1]], device=d), torch.arange(6.0).reshape(3, 2).to(d)),
            torch.zeros(4, device=d).masked_scatter_(
                torch.tensor([True, False, True, False], device=d), torch.arange(2.0).to(d)
            ),
        ]
        if d == "cpu":
            want = results
        else:
            for got, w in zip(results, want):
                torch.testing.assert_close(got.cpu(), w)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bool, torch.int64])
def test_nonzero_and_masked_select_write_out_tensors_as_cpu(dtype):
    """nonzero(out=) and masked_select(out=): the values, the out tensor itself returned, the
    resize (with torch's deprecation warning when it held elements), and the CPU's errors for
    a wrong dtype and an out tensor that overlaps the input."""
    x = torch.tensor([[1, 0, 2], [0, 3, 0]]).to(dtype)
    for start in ((0,), (4, 3), (3, 2)):
        got = {}
        for dev in ("cpu", "tpu"):
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                o = torch.empty(start, dtype=torch.long, device=dev)
                r = torch.nonzero(x.to(dev), out=o)
                m = torch.empty(start, dtype=dtype, device=dev)
                s = torch.masked_select(x.to(dev), x.to(dev) != 0, out=m)
            assert r is o and s is m
            got[dev] = (o.cpu(), m.cpu(), sum("resized" in str(x.message) for x in w))
        assert torch.equal(got["cpu"][0], got["tpu"][0]) and torch.equal(got["cpu"][1], got["tpu"][1]), got
        assert got["cpu"][2] == got["tpu"][2], (start, got)
    for dev in ("cpu", "tpu"):
        with pytest.raises(RuntimeError, match="Expected out tensor to have scalar type Long but got scalar typeInt"):
            torch.nonzero(x.to(dev), out=torch.empty(0, dtype=torch.int32, device=dev))
        xl = x.to(dev).long()
        with pytest.raises(RuntimeError, match="unsupported operation"):
            torch.nonzero(xl, out=xl)
    # an out tensor on the CPU for a tpu input: torch's device error, the out tensor untouched
    xt = x.to("tpu")
    for call, out in (
        (lambda o: torch.nonzero(xt, out=o), torch.full((2,), 7, dtype=torch.long)),
        (lambda o: torch.masked_select(xt, xt != 0, out=o), torch.full((2,), 7, dtype=dtype)),
    ):
        before = out.clone()
        with pytest.raises(RuntimeError, match="on the same device"):
            call(out)
        assert torch.equal(out, before)


def test_unfold_backward_checks_its_step_and_size_as_cpu():
    """A step of 0 or less is the CPU's ValueError, a negative size its RuntimeError (the step first)."""
    for dev in ("cpu", "tpu"):
        g = torch.randn(2, 3, device=dev)
        with pytest.raises(ValueError, match="step is 0 but must be > 0"):
            torch.ops.aten.unfold_backward(g, [6], 0, 3, 0)
        with pytest.raises(ValueError, match="step is 0 but must be > 0"):
            torch.ops.aten.unfold_backward(g, [6], 0, -1, 0)
        with pytest.raises(RuntimeError, match="size is -1 but must be >= 0"):
            torch.ops.aten.unfold_backward(g, [6], 0, -1, 1)
    g = torch.randn(2, 3)
    want = torch.ops.aten.unfold_backward(g, [6], 0, 3, 2)
    assert torch.equal(torch.ops.aten.unfold_backward(g.to("tpu"), [6], 0, 3, 2).cpu(), want)


@pytest.mark.parametrize("inplace", [True, False])
def test_index_fill_refuses_a_complex_value_for_a_real_tensor(inplace):
    """index_fill(_) of a real tensor with a complex number or 0-d complex tensor: the CPU's
    RuntimeError, nothing written (tpu wrote the real part); a complex tensor takes it."""
    for dev in ("cpu", "tpu"):
        x = torch.tensor([[1.0, 2.0], [4.0, 5.0]], device=dev)
        idx = torch.tensor([0], device=dev)
        for value in (1 + 1j, torch.tensor(1 + 1j, device=dev)):
            with pytest.raises(RuntimeError, match="Converting complex Scalar to non-complex type is not supported"):
                x.index_fill_(1, idx, value) if inplace else x.index_fill(1, idx, value)
        assert torch.equal(x.cpu(), torch.tensor([[1.0, 2.0], [4.0, 5.0]]))
    z = torch.zeros(2, 2, dtype=torch.cfloat)
    want = z.index_fill(1, torch.tensor([0]), 1 + 1j)
    got = z.to("tpu").index_fill(1, torch.tensor([0], device="tpu"), 1 + 1j)
    assert torch.equal(got.cpu(), want)
