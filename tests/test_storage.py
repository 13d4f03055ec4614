"""Storage-level behaviour on tpu against CPU PyTorch: resize_, set_, out=
tensors of the wrong shape, views that reinterpret storage (view_as_real,
view_as_complex, view(dtype)), and .to() with non_blocking."""

import warnings

import pytest
import torch

import torchtpu  # noqa: F401


def test_resize_grows_and_keeps_elements():
    for dev in ("cpu", "tpu"):
        t = torch.arange(4.0, device=dev)
        t.resize_(2, 3)
        assert t.shape == (2, 3) and t.stride() == (3, 1)
        assert t.reshape(-1)[:4].cpu().tolist() == [0.0, 1.0, 2.0, 3.0]
    t = torch.arange(6.0, device="tpu").resize_(2, 2)
    assert t.cpu().tolist() == [[0.0, 1.0], [2.0, 3.0]]  # shrinking keeps the storage


def test_resize_channels_last_and_errors():
    c = torch.empty(0).resize_(2, 3, 4, 5, memory_format=torch.channels_last)
    t = torch.empty(0, device="tpu").resize_(2, 3, 4, 5, memory_format=torch.channels_last)
    assert t.stride() == c.stride()
    with pytest.raises(RuntimeError):
        torch.empty(0, device="tpu").resize_(-1)


def test_storage_geometry_helpers():
    """The C helpers of the Python kernels (_C.dense, contiguous_strides,
    stride_order, check_out_overlap) against torch's own answers."""
    from torch._prims_common import is_non_overlapping_and_dense_or_false as is_non_overlapping_and_dense

    from torchtpu import _C

    base = torch.arange(120.0).view(2, 3, 4, 5)
    for view in (
        lambda b: b,
        lambda b: b.permute(0, 2, 3, 1),
        lambda b: b[:, :, ::2],
        lambda b: b[:, :1],
        lambda b: b.transpose(1, 3),
        lambda b: b[0, 0, 0].expand(3, 5),
        lambda b: b[0, 0, 0, 0],
    ):
        t, d = view(base), view(base.to("tpu"))
        assert _C.dense(d) == _C.dense(t) == is_non_overlapping_and_dense(t), (t.shape, t.stride())
        want = sorted(range(t.dim()), key=lambda k: -t.stride()[k])
        assert _C.stride_order(d) == _C.stride_order(t) == ([] if want == list(range(t.dim())) else want)
    for size in ([2, 3, 4, 5], [2, 0, 4, 5], [2, 3, 4, 5, 6], [7], []):
        for mf, cl in ((torch.contiguous_format, 0), (torch.channels_last, 4), (torch.channels_last_3d, 5)):
            if cl and 0 in size:
                continue  # torch gives such a channels_last tensor strides of 0; resize_ keeps the plain rule
            if cl and cl != len(size):
                assert _C.contiguous_strides(size, cl) == _C.contiguous_strides(size, 0)
                continue
            assert tuple(_C.contiguous_strides(size, cl)) == torch.empty(size, memory_format=mf).stride()
    a = torch.arange(8.0, device="tpu")
    _C.check_out_overlap(a[:4], a[4:], torch.ones(4))  # apart, or on another device
    for out, inputs in ((a[:4], (a[3:7],)), (a[:4].expand(2, 4), ()), (a[::2], (a[1::2],))):
        with pytest.raises(RuntimeError, match="unsupported operation"):
            _C.check_out_overlap(out, *inputs)


def test_set_shares_storage():
    a = torch.arange(6.0).to("tpu")
    b = torch.empty(0, device="tpu")
    b.set_(a.untyped_storage(), 2, (2, 2), (2, 1))
    assert b.cpu().tolist() == [[2.0, 3.0], [4.0, 5.0]]
    b.add_(10)
    assert a.cpu().tolist() == [0.0, 1.0, 12.0, 13.0, 14.0, 15.0]
    c = torch.empty(0, device="tpu").set_(a)
    assert c.shape == a.shape and c.data_ptr() == a.data_ptr()


def test_out_of_wrong_shape_is_resized():
    x = torch.randn(3, 4)
    out = torch.empty(0, device="tpu")
    r = torch.add(x.to("tpu"), 1, out=out)
    assert r is out and out.shape == (3, 4)
    torch.testing.assert_close(out.cpu(), x + 1)
    out = torch.empty(5, device="tpu")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        torch.mul(x.to("tpu"), 2, out=out)
    assert any("resized" in str(m.message) for m in w)
    torch.testing.assert_close(out.cpu(), x * 2)
    out64 = torch.empty(0, device="tpu", dtype=torch.float64)
    torch.add(x.to("tpu"), 1, out=out64)
    assert out64.dtype == torch.float64
    torch.testing.assert_close(out64.cpu(), (x + 1).double())


def test_view_as_real_reads_and_writes_through():
    z = torch.randn(3, 2, dtype=torch.complex64)
    t = z.to("tpu")
    r = torch.view_as_real(t)
    torch.testing.assert_close(r.cpu(), torch.view_as_real(z))
    r[1, 0, 1] = 7.0
    z2 = z.clone()
    torch.view_as_real(z2)[1, 0, 1] = 7.0
    torch.testing.assert_close(t.cpu(), z2)
    torch.testing.assert_close(t.real.cpu(), z2.real)
    torch.testing.assert_close(t.imag.cpu(), z2.imag)


# Writes through lazily conjugated or negated views: each case mutates a
# fresh destination through such a view; the destination must hold what the
# CPU's holds (the write was once dropped: torch's fallbacks handed the copy
# kernel a resolved clone of the destination).
_SRC = [1 + 2j, 3 - 1j, -1j, 0.5 + 0.25j]
_BIT_WRITES = {
    "conj_copy": lambda d, s: d.conj().copy_(s),
    "neg_copy": lambda d, s: d.real._neg_view().copy_(s.real),
    "conj_neg_copy": lambda d, s: d.conj()._neg_view().copy_(s),
    "conj_copy_of_conj": lambda d, s: d.conj().copy_(s.conj()),
    "conj_copy_from_cpu": lambda d, s: d.conj().copy_(s.cpu()),
    "conj_copy_real_source": lambda d, s: d.conj().copy_(s.real),
    "conj_add_": lambda d, s: d.conj().add_(s),
    "conj_mul_slice": lambda d, s: d.conj()[1:3].mul_(2j),
    "conj_out": lambda d, s: torch.add(s, s, out=d.conj()),
    "neg_out": lambda d, s: torch.mul(s.real, 3, out=d.real._neg_view()),
    "conj_index_put": lambda d, s: d.conj().index_put_((torch.tensor([0, 2], device=d.device),), s[:2]),
    "conj_fill": lambda d, s: d.conj().fill_(2 - 3j),
    "neg_int_copy": lambda d, s: d._neg_view().copy_(torch.arange(4, device=d.device)),
}


@pytest.mark.parametrize("mode", ["debug", "strict", "fused"])
@pytest.mark.parametrize("case", sorted(_BIT_WRITES))
def test_writes_through_conj_and_neg_views(case, mode):
    write = _BIT_WRITES[case]
    dtype = torch.int64 if case.startswith("neg_int") else torch.complex64

    def run(device):
        d = (torch.arange(4) + 1).to(dtype).to(device)
        s = torch.tensor(_SRC, dtype=torch.complex64, device=device)
        write(d, s)
        return d

    want = run("cpu")
    with torchtpu.eager_mode(mode):
        got = run("tpu")
        torch.testing.assert_close(got.cpu(), want)
    assert not got.is_conj() and not got.is_neg()


def test_write_into_a_cpu_conj_view_from_tpu():
    s = torch.tensor(_SRC, dtype=torch.complex64)
    want, got = torch.zeros(4, dtype=torch.complex64), torch.zeros(4, dtype=torch.complex64)
    want.conj().copy_(s)
    got.conj().copy_(s.to("tpu"))
    torch.testing.assert_close(got, want)


def test_view_as_complex_and_grad():
    x = torch.randn(4, 2, requires_grad=True)
    xt = x.detach().to("tpu").requires_grad_()
    c, ct = torch.view_as_complex(x), torch.view_as_complex(xt)
    torch.testing.assert_close(ct.cpu(), c.detach())
    (g,) = torch.autograd.grad((c.real * 2 + c.imag * 3).sum(), x)
    (gt,) = torch.autograd.grad((ct.real * 2 + ct.imag * 3).sum(), xt)
    torch.testing.assert_close(gt.cpu(), g)


@pytest.mark.parametrize(
    "src,dst",
    [
        (torch.float32, torch.int32),
        (torch.float32, torch.uint8),
        (torch.uint8, torch.int32),
        (torch.bfloat16, torch.float32),
        (torch.int64, torch.float64),
        (torch.bool, torch.uint8),
    ],
)
def test_view_dtype(src, dst):
    x = (torch.arange(8) * 3 + 1).to(src) if src != torch.bool else torch.arange(8) % 3 == 0
    t = x.to("tpu").view(dst)
    assert t.dtype == dst
    assert torch.equal(t.cpu(), x.view(dst))
    # a write through the reinterpreted view lands in the original storage
    if dst.is_floating_point:
        return
    base = x.to("tpu")
    v = base.view(dst)
    v[0] = 0
    x2 = x.clone()
    x2.view(dst)[0] = 0
    assert torch.equal(base.cpu(), x2)


def test_to_non_blocking_and_formats():
    x = torch.randn(2, 3, 4, 5)
    t = x.to("tpu")
    y = t.to("cpu", non_blocking=True)
    torch.testing.assert_close(y, x)
    y = t.to(torch.float64)
    assert y.device.type == "tpu" and y.dtype == torch.float64
    y = t.to("cpu", memory_format=torch.channels_last)
    assert y.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(y, x)
    tt = t.transpose(0, 3).to("cpu")  # preserve_format keeps dense strides
    assert tt.stride() == x.transpose(0, 3).stride()


def test_complex_and_polar():
    a, b = torch.randn(3), torch.randn(3)
    torch.testing.assert_close(torch.complex(a.to("tpu"), b.to("tpu")).cpu(), torch.complex(a, b))
    torch.testing.assert_close(torch.polar(a.abs().to("tpu"), b.to("tpu")).cpu(), torch.polar(a.abs(), b))
    with pytest.raises(RuntimeError):
        torch.complex(a.to("tpu"), b.to("tpu").double())


_VIEWS = [
    lambda x: x[:, :, 4:8],  # a contiguous range
    lambda x: x.transpose(0, 2),  # a permutation of the whole record
    lambda x: x[:, ::2],  # rows skipped
    lambda x: x[:, :, ::3],  # columns skipped
    lambda x: x.split(4, 2)[1].transpose(1, 2),  # k of a q/k/v split, transposed
    lambda x: x.view(4, 6, 3, 4)[:, :, 2].transpose(1, 2),  # the last head block
    lambda x: x[1:3, 1:5, 2:9:2],
    lambda x: x.transpose(0, 2)[::2, 1:],
    lambda x: x.view(4, 6, 3, 4).permute(2, 0, 3, 1)[1],
    lambda x: x.view(-1)[3:].as_strided((20, 3), (12, 1), 10),  # offsets that carry across rows
    lambda x: x.as_strided((3, 4), (7, 2), 3),  # rows that overlap columns: a gather
    lambda x: x[3, 5, :1],
]


@pytest.mark.parametrize("mode", ["strict", "fused"])
@pytest.mark.parametrize("k", range(len(_VIEWS)))
def test_strided_views_read_like_cpu(mode, k):
    base = torch.randn(4, 6, 12)
    with torchtpu.eager_mode(mode):
        t = base.to("tpu")
        got = (_VIEWS[k](t) * 2 + 1).cpu()
        got_sum = _VIEWS[k](t).sum(-1).cpu()
    assert torch.equal(got, _VIEWS[k](base) * 2 + 1)
    torch.testing.assert_close(got_sum, _VIEWS[k](base).sum(-1))


# ---- the memory behind a storage: freed and allocated again (what FSDP2's
# free_storage and alloc_storage do on tpu)


def test_freed_storage_is_refused_until_allocated_again():
    from torchtpu import _C

    a = torch.arange(1024.0).to("tpu")
    v = a[10:20]
    before = torch.tpu.memory_allocated()
    _C.storage_free(v)  # a view frees its whole storage
    assert _C.storage_freed(a) and torch.tpu.memory_allocated() == before - 4096
    assert a.untyped_storage().nbytes() == 4096  # torch's storage keeps its size
    for use in (lambda: v + 1, lambda: a.cpu(), lambda: a.copy_(torch.ones(1024)), lambda: a.zero_()):
        with pytest.raises(RuntimeError, match="freed"):
            use()
    _C.storage_free(a)  # freeing again changes nothing
    _C.storage_alloc(a)
    assert not _C.storage_freed(v)
    v.copy_(torch.ones(10))
    assert a.cpu()[8:12].tolist() == [0.0, 0.0, 1.0, 1.0]  # unwritten memory reads as zeros
    _C.storage_alloc(a)  # allocating a storage that has memory changes nothing
    assert v.cpu().tolist() == [1.0] * 10
    with pytest.raises(RuntimeError, match="not a tpu storage"):
        _C.storage_free(torch.ones(3))


def test_free_runs_the_recorded_ops_that_use_the_storage_first():
    from torchtpu import _C

    with torchtpu.eager_mode("fused"):
        b = torch.ones(8, device="tpu")
        c = b * 3
        b.add_(1)
        flushes = torchtpu.metrics()["flushes_storage_free"]
        _C.storage_free(b)
        assert torchtpu.metrics()["flushes_storage_free"] == flushes + 1
        assert c.cpu().tolist() == [3.0] * 8
        with pytest.raises(RuntimeError, match="freed"):
            b.mul_(2)


def test_free_inside_a_graph_capture_is_refused():
    from torchtpu import _C

    x = torch.ones(4, device="tpu")
    with pytest.raises(RuntimeError, match="graph capture"):
        with torch.tpu.graph(torch.tpu.TPUGraph()):
            _C.storage_free(x)
    assert not _C.storage_freed(x) and x.cpu().tolist() == [1.0] * 4


def test_a_captured_graph_refuses_to_replay_on_a_freed_storage():
    from torchtpu import _C

    x = torch.ones(4, device="tpu")
    g = torch.tpu.TPUGraph()
    with torch.tpu.graph(g):
        x.mul_(2)
    _C.storage_free(x)
    with pytest.raises(RuntimeError, match="freed"):
        g.replay()
    _C.storage_alloc(x)
    g.replay()
    assert x.cpu().tolist() == [0.0] * 4


_UNINITIALIZED = {
    "empty f32": lambda d: torch.empty(3, device=d),
    "empty i32": lambda d: torch.empty(2, dtype=torch.int32, device=d),
    "empty u8": lambda d: torch.empty(2, dtype=torch.uint8, device=d),
    "empty bool": lambda d: torch.empty(2, dtype=torch.bool, device=d),
    "empty c64": lambda d: torch.empty(2, dtype=torch.complex64, device=d),
    "empty bf16": lambda d: torch.empty(2, 2, dtype=torch.bfloat16, device=d),
    "empty_strided gaps": lambda d: torch.empty_strided((2,), (2,), device=d),
    "empty_strided expanded": lambda d: torch.empty_strided((3,), (0,), device=d),
    "empty_like i8": lambda d: torch.empty_like(torch.ones(2, dtype=torch.int8, device=d)),
    "new_empty": lambda d: torch.ones(1, device=d).new_empty((2, 3)),
    "resize_ grows": lambda d: torch.ones(2, device=d).resize_(5),
    "resize_ within storage": lambda d: torch.ones(4, device=d).resize_(2).resize_(4),
    "resize_ i64": lambda d: torch.arange(3, device=d).resize_(2, 3),
}


@pytest.mark.parametrize("case", sorted(_UNINITIALIZED))
def test_deterministic_mode_fills_uninitialized_memory(case):
    """torch.use_deterministic_algorithms(True): new memory reads as NaN or the
    dtype's largest value, as on the CPU; with it off nothing is filled."""
    make = _UNINITIALIZED[case]
    torch.use_deterministic_algorithms(True)
    try:
        want, got = make("cpu"), make("tpu").cpu()
    finally:
        torch.use_deterministic_algorithms(False)
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, equal_nan=True, rtol=0, atol=0)


def test_uninitialized_memory_is_left_alone_without_the_switch():
    """Only the deterministic switch with fill_uninitialized_memory fills: a
    never-written tpu record reads as zeros otherwise (no program runs)."""
    assert not torch.empty(3, device="tpu").cpu().isnan().any()
    torch.use_deterministic_algorithms(True)
    torch.utils.deterministic.fill_uninitialized_memory = False
    try:
        assert not torch.empty(3, device="tpu").cpu().isnan().any()
        assert not torch.ones(2, device="tpu").resize_(5).cpu().isnan().any()
    finally:
        torch.utils.deterministic.fill_uninitialized_memory = True
        torch.use_deterministic_algorithms(False)
