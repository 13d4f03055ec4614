"""A fast fixed subset of the OpInfo coverage run (the full run is
`make coverage`): each entry must pass forward on every listed dtype and its
float32 gradient check, through the same harness that writes
docs/op_coverage.md."""
import pytest
import torch

import torchtpu  # noqa: F401
from torchtpu.tools import op_coverage as cov

# One or more entries per op family; all four dtypes where the op has them.
SUBSET = [
    "add", "mul", "sub", "div.no_rounding_mode", "rsub", "__rmod__", "where",
    "exp", "sin", "sigmoid", "clamp", "sum", "mean", "amax", "argmax", "softmax",
    "matmul", "mm", "bmm", "transpose", "permute", "narrow", "as_strided.partial_views",
    "repeat", "tile", "tensor_split", "view_as_complex", "complex", "cfloat", "to",
    "resize_", "contiguous",
]

_ENTRIES = None


def entries():
    global _ENTRIES
    if _ENTRIES is None:
        from torch.testing._internal.common_methods_invocations import op_db
        _ENTRIES = {cov.entry_name(o): o for o in op_db}
    return _ENTRIES


@pytest.mark.parametrize("name", SUBSET)
def test_opinfo_entry(name):
    op = entries()[name]
    ran = 0
    for d in cov.DTYPES:
        if getattr(torch, d) not in op.supported_dtypes("cpu"):
            continue
        r = cov.run_entry(op, d)
        assert r["status"] == "pass", (name, d, r)
        assert r["grad"] in (None, "pass", "no_samples"), (name, d, r)
        ran += 1
    assert ran > 0


def test_harness_classifies_missing_lowering():
    """An op with no lowering is reported as not_lowered, naming the overload."""
    exc = NotImplementedError("torchtpu: aten::foo.bar is not lowered for the tpu device yet. ...")
    assert cov._classify(exc) == ("not_lowered", "aten::foo.bar")
    assert cov._classify(cov._Mismatch("output: x"))[0] == "wrong"
    assert cov._classify(RuntimeError("boom"))[0] == "error"


def test_harness_detects_wrong_results():
    """The comparison cannot pass a wrong value, dtype or shape."""
    a = torch.ones(3)
    with pytest.raises(cov._Mismatch):
        cov._compare(a, (a + 1e-2).to("tpu"), "float32")
    with pytest.raises(cov._Mismatch):
        cov._compare(a, a.double().to("tpu"), "float32")
    with pytest.raises(cov._Mismatch):
        cov._compare(a, torch.ones(4).to("tpu"), "float32")
    cov._compare(a, a.to("tpu"), "float32")


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
