"""A fast fixed subset of the OpInfo coverage run (the full run is
`make coverage`): each entry must pass forward on every listed dtype and its
float32 gradient check, through the same harness that writes
docs/op_coverage.md."""

import pytest
import torch
from sweeps import op_coverage as cov
from sweeps import op_samples as samples

import torchtpu  # noqa: F401

# One or more entries per op family; all four dtypes where the op has them.
SUBSET = [
    # core: broadcasting, views, storage, dtypes
    "add",
    "mul",
    "sub",
    "div.no_rounding_mode",
    "div.floor_rounding",
    "rsub",
    "__rmod__",
    "where",
    "masked_fill",
    "transpose",
    "permute",
    "narrow",
    "as_strided.partial_views",
    "tile",
    "unfold",
    "tensor_split",
    "view_as_complex",
    "complex",
    "cfloat",
    "to",
    "resize_",
    "contiguous",
    # elementwise and activations
    "abs",
    "exp",
    "sin",
    "acos",
    "erfinv",
    "lgamma",
    "sigmoid",
    "clamp",
    "fmod",
    "lerp",
    "nn.functional.elu",
    "nn.functional.hardswish",
    "nn.functional.softplus",
    "nn.functional.glu",
    "special.i0e",
    "polygamma.polygamma_n_1",
    # reductions, scans, sorting
    "sum",
    "mean",
    "amax",
    "argmax",
    "var",
    "cumsum",
    "cummax",
    "sort",
    "topk",
    "median",
    "softmax",
    # linear algebra
    "matmul",
    "mm",
    "bmm",
    "baddbmm",
    "linalg.cholesky",
    "linalg.solve",
    "linalg.det",
    "linalg.eig",
    "linalg.eigh",
    # convolution, pooling, normalisation, upsampling
    "nn.functional.conv2d",
    "nn.functional.avg_pool2d",
    "nn.functional.batch_norm",
    "nn.functional.layer_norm",
    "nn.functional.group_norm",
    "nn.functional.interpolate.bilinear",
    # indexing and data-dependent shapes
    "gather",
    "scatter_add",
    "index_put",
    "__getitem__",
    "index_select",
    "flip",
    "roll",
    "nonzero",
    "masked_select",
    "nn.functional.embedding",
    "nn.functional.pad.reflect",
    # losses, FFT
    "nn.functional.cross_entropy",
    "nn.functional.mse_loss",
    "nn.functional.binary_cross_entropy",
    "fft.rfft",
    "fft.ifft",
]

_ENTRIES = None


def entries():
    global _ENTRIES
    if _ENTRIES is None:
        from torch.testing._internal.common_methods_invocations import op_db

        _ENTRIES = {samples.entry_name(o): o for o in op_db}
    return _ENTRIES


@pytest.mark.parametrize("name", SUBSET)
def test_opinfo_entry(name):
    op = entries()[name]
    ran = 0
    for d in cov.DTYPES:
        if getattr(torch, d) not in op.supported_dtypes("cpu"):
            continue
        r = samples.run_entry(op, d)
        assert r["status"] == "pass", (name, d, r)
        assert r["grad"] in (None, "pass", "no_samples"), (name, d, r)
        ran += 1
    assert ran > 0


def test_harness_classifies_missing_lowering():
    """An op with no lowering is reported as not_lowered, naming the overload."""
    exc = NotImplementedError("torchtpu: aten::foo.bar is not lowered for the tpu device yet. ...")
    assert samples._classify(exc) == ("not_lowered", "aten::foo.bar")
    assert samples._classify(samples._Mismatch("output: x"))[0] == "wrong"
    assert samples._classify(RuntimeError("boom"))[0] == "error"


def test_harness_detects_wrong_results():
    """The comparison cannot pass a wrong value, dtype or shape."""
    a = torch.ones(3)
    with pytest.raises(samples._Mismatch):
        samples._compare(a, (a + 1e-2).to("tpu"), "float32")
    with pytest.raises(samples._Mismatch):
        samples._compare(a, a.double().to("tpu"), "float32")
    with pytest.raises(samples._Mismatch):
        samples._compare(a, torch.ones(4).to("tpu"), "float32")
    samples._compare(a, a.to("tpu"), "float32")


def test_harness_eig_invariants():
    """Eigendecompositions: any eigenvalue order and eigenvector phase pass, a
    wrong eigenvalue or a vector that is not an eigenvector does not."""
    from torch.testing._internal.opinfo.core import SampleInput

    a = torch.tensor([[2.0, 1.0, 0.0], [0.0, 3.0, 1.0], [1.0, 0.0, -1.0]])
    s = SampleInput(a)
    w, v = torch.linalg.eig(a)
    p = torch.tensor([2, 0, 1])
    ph = torch.exp(1j * torch.tensor([0.3, -2.0, 1.0]))
    samples._check_eig("linalg.eig", s, (w, v), (w[p].to("tpu"), (v[:, p] * ph).to("tpu")), "float32")
    samples._check_eig("linalg.eigvals", s, w, w[p].to("tpu"), "float32")
    with pytest.raises(samples._Mismatch):
        samples._check_eig("linalg.eigvals", s, w, (w + 1e-2).to("tpu"), "float32")
    with pytest.raises(samples._Mismatch):
        samples._check_eig("linalg.eig", s, (w, v), (w.to("tpu"), v[:, [1, 0, 2]].to("tpu")), "float32")
    with pytest.raises(samples._Mismatch):
        samples._check_eig("linalg.eig", s, (w, v), (w.to("tpu"), (2 * v).to("tpu")), "float32")
    h = a + a.mT
    e, u = torch.linalg.eigh(h)
    samples._check_eig(
        "linalg.eigh", SampleInput(h), (e, u), (e.to("tpu"), (u * torch.tensor([1.0, -1.0, -1.0])).to("tpu")), "float32"
    )
    with pytest.raises(samples._Mismatch):
        samples._check_eig("linalg.eigh", SampleInput(h), (e, u), (e.to("tpu"), u[:, [1, 0, 2]].to("tpu")), "float32")


def test_harness_runs_isolated_workers(tmp_path):
    """The driver runs entries in worker processes and writes both reports."""
    res = cov.run([("add", "float32"), ("abs", "int64")], nworkers=1)
    assert res[("add", "float32")]["status"] == "pass"
    assert res[("abs", "int64")]["status"] == "pass"
    out = str(tmp_path / "cov")
    cov.write_report(res, out, ["float32", "int64"], {"seconds": 1.0, "unsupported": []})
    text = open(out + ".md").read()
    assert "| add | pass | - | pass |" in text or "| add |" in text
    assert "## Totals" in text


# Entries whose OpInfo error inputs must all be refused on tpu with the CPU's
# exception type (the full pass is part of `make coverage`). Not listed: the
# refusals that read tensor values (multinomial's probabilities, gather and
# scatter index bounds, masked_fill of a complex value tensor), see docs/op_coverage.md.
ERROR_SUBSET = [
    "amax",
    "amin",
    "aminmax",
    "kthvalue",
    "take",
    "index_select",
    "masked_scatter",
    "masked_select",
    "native_layer_norm",
    "nn.functional.gelu",
    "roll",
    "cat",
    "arange",
    "nn.functional.poisson_nll_loss",
    "nn.functional.triplet_margin_loss",
    "uniform",
    "cauchy",
    "narrow_copy",
    "nn.functional.max_pool3d",
]


@pytest.mark.parametrize("name", ERROR_SUBSET)
def test_opinfo_error_inputs(name):
    r = samples.run_error_entry(entries()[name])
    assert r["status"] == "errors", r
    assert r["other"] == 0 and r["none"] == 0, r["details"]
    assert r["same"] > 0


def test_error_pass_keeps_aliasing():
    """An out= that is an input on the CPU is the same tpu storage too."""
    conv = samples._aliasing_to_tpu()
    x = torch.arange(6.0)
    a, b = conv(x), conv(x[2:])
    assert a.device.type == "tpu" and b.untyped_storage().data_ptr() == a.untyped_storage().data_ptr()
    assert b.storage_offset() == 2
