"""A storage's device buffer has the shape of the tensor it was made for, and
every program takes and gives it in that shape (on a TPU a flat array and a
matrix are laid out differently in memory, and each change between them is a
copy: issue 40). Checked on the programs' text (TORCHTPU_DUMP_HLO), with
values against CPU, and where a buffer of another shape meets a program made
for the first (compiled graphs, replica collectives)."""

import os
import re
import subprocess
import sys

import pytest
import torch

import torchtpu  # noqa: F401  (registers the device)
from torchtpu import _C


def _run(code, **env):
    p = subprocess.run(
        [sys.executable, "-c", code],
        env=dict(os.environ, TORCHTPU_DUMP_HLO="1", **env),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return p.stderr


def _signatures(text, name):
    """(parameters, results) of each dumped program whose label starts with name."""
    out = []
    for m in re.finditer(r"-- (.*?)\n.*?func\.func public @main\((.*?)\)\s*->\s*(.*?)\{", text, re.S):
        if m.group(1).startswith(name):
            out.append((re.findall(r"tensor<([^>]*)>", m.group(2)), re.findall(r"tensor<([^>]*)>", m.group(3))))
    return out


def test_storage_shapes():
    a = torch.empty(4, 6, device="tpu")
    assert _C.storage_shape(a) == (4, 6)
    assert _C.storage_shape(a.view(24)) == (4, 6)
    assert _C.storage_shape(torch.empty(24, device="tpu")) == (24,)
    assert _C.storage_shape(torch.empty((), device="tpu")) == (1,)
    assert _C.storage_shape(torch.empty(0, 3, device="tpu")) == (0,)
    # a permuted layout in storage order (below), any other flat
    assert _C.storage_shape(torch.empty_strided((2, 3), (1, 2), device="tpu")) == (3, 2)
    assert _C.storage_shape(torch.empty_strided((2, 3), (4, 1), device="tpu")) == (7,)
    assert _C.storage_shape(torch.empty_strided((2, 3), (3, 1), device="tpu")) == (2, 3)
    assert _C.storage_shape(torch.randn(3, 5).to("tpu")) == (3, 5)
    assert _C.storage_shape(torch.randn(3, 5, device="tpu") + 1) == (3, 5)
    assert _C.buffer_shape((3, 5)) == (3, 5) and _C.buffer_shape((7,)) == (7,) and _C.buffer_shape(()) == (1,)
    with pytest.raises(RuntimeError, match="not a tpu storage"):
        _C.storage_shape(torch.ones(2))


STRICT = """
import torch, torchtpu
x = torch.arange(24.0).reshape(4, 6)
a = x.to("tpu")
assert torch.equal((a * 2).cpu(), x * 2)
assert torch.equal((a.view(24) + 1).cpu(), x.view(24) + 1)
a.view(24)[3:7] = -1.0
x.view(24)[3:7] = -1.0
assert torch.equal(a.cpu(), x)
a.t()[1:3].mul_(3)
x.t()[1:3].mul_(3)
assert torch.equal(a.cpu(), x)
"""


def test_strict_programs_take_and_give_records_in_their_shape():
    text = _run(STRICT, TORCHTPU_EAGER="strict")
    mul = _signatures(text, "mul.Tensor")
    assert mul and mul[0][0][0] == "4x6xf32" and mul[0][1] == ["4x6xf32"], mul
    # a 1-D view of the matrix: read in the matrix's shape, a new 1-D tensor given flat
    add = _signatures(text, "add.Tensor")
    assert add and add[0][0][0] == "4x6xf32" and add[0][1] == ["24xf32"], add
    # writes through views give the whole record back in its shape
    for name in ("tpu::copy", "mul_"):
        sigs = _signatures(text, name)
        assert sigs and all(r == ["4x6xf32"] for _, r in sigs), (name, sigs)


FUSED = """
import torch, torchtpu
torch.manual_seed(0)
cpu = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
dev = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
dev.load_state_dict(cpu.state_dict())
dev.to("tpu")
oc = torch.optim.AdamW(cpu.parameters(), lr=1e-2)
od = torch.optim.AdamW(dev.parameters(), lr=1e-2)
x = torch.randn(5, 8)
xd = x.to("tpu")
for _ in range(4):
    for m, o, inp in ((cpu, oc, x), (dev, od, xd)):
        o.zero_grad()
        m(inp).square().mean().backward()
        o.step()
for p, q in zip(cpu.parameters(), dev.parameters()):
    torch.testing.assert_close(q.cpu(), p, rtol=1e-5, atol=1e-6)
"""


def test_a_fused_step_takes_and_gives_weights_in_their_shape():
    text = _run(FUSED, TORCHTPU_STEP_BOUNDARY="optimizer")
    steps = _signatures(text, "fused program")
    assert steps, text[-2000:]
    params, results = steps[-1]
    # the weights, their gradients and Adam's moments: matrices, never flat
    assert params.count("16x8xf32") >= 3 and params.count("4x16xf32") >= 3, params
    assert "128xf32" not in params and "64xf32" not in params, params
    assert results.count("16x8xf32") >= 3 and "128xf32" not in results, results


GRAPH = """
import torch, torchtpu
f = torch.compile(lambda x: x * 2 + 1, backend="tpu")
x = torch.arange(24.0)
flat = x.to("tpu")
matrix = x.reshape(4, 6).to("tpu").view(24)  # the same view of a buffer of another shape
for t in (flat, matrix, flat, matrix):
    assert torch.equal(f(t).cpu(), x * 2 + 1)
"""


def test_a_compiled_graph_is_not_replayed_on_a_buffer_of_another_shape():
    _run(GRAPH)


def _permuted_writes():
    """(cpu, tpu) pairs after writes through views that permute a contiguous block."""
    g = torch.Generator().manual_seed(0)
    out = []
    for make in (lambda d: torch.zeros(4, 6, device=d), lambda d: torch.zeros(3, 4, 5, device=d)):
        a, b = make("cpu"), make("tpu")
        s = torch.randn(a.shape[::-1], generator=g)
        for x, src in ((a, s), (b, s.to("tpu"))):
            x.permute(*reversed(range(x.dim()))).copy_(src)  # the whole record, transposed
        out.append((a, b))
    a, b = torch.arange(60.0).reshape(3, 4, 5), torch.arange(60.0).reshape(3, 4, 5).to("tpu")
    for x in (a, b):
        x[1].t().mul_(-2)  # a block in the middle of the record
        x.permute(2, 0, 1).add_(1)
        x[2].t()[1:3].fill_(7)  # not a whole block: the index path
    out.append((a, b))
    a, b = torch.zeros(4, 1, 6), torch.zeros(4, 1, 6, device="tpu")
    s = torch.randn(6, 1, 4, generator=g)
    for x, src in ((a, s), (b, s.to("tpu"))):
        x.permute(2, 1, 0).copy_(src)  # with a dim of size 1
    out.append((a, b))
    return out


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_writes_through_permuted_views_match_cpu(mode):
    prev = torchtpu.get_eager_mode()
    torchtpu.eager_mode(mode)
    try:
        for a, b in _permuted_writes():
            assert torch.equal(b.cpu(), a), (mode, a, b.cpu())
    finally:
        torchtpu.eager_mode(prev)


def test_a_permuted_destination_is_made_in_storage_order():
    # torch's _to_copy of a transposed weight (autocast's casts) makes its
    # destination with the source's strides: its buffer is the storage's
    # array, and the copy writes it transposed, not through index vectors
    d = torch.empty_strided((128, 256), (1, 128), device="tpu")
    assert _C.storage_shape(d) == (256, 128)
    assert _C.storage_shape(torch.empty_strided((3, 4, 5), (1, 15, 3), device="tpu")) == (4, 5, 3)
    text = _run(
        "import torch, torchtpu\n"
        "w = torch.randn(256, 128)\n"
        "d = torch.empty_strided((128, 256), (1, 128), device='tpu', dtype=torch.bfloat16)\n"
        "d.copy_(w.to('tpu').t())\n"
        "assert torch.equal(d.cpu(), w.t().bfloat16())\n",
        TORCHTPU_EAGER="strict",
    )
    copy = re.findall(r"-- tpu::copy\n(.*?)\n\}", text, re.S)
    assert copy and "scatter" not in copy[-1] and "iota" not in copy[-1], copy
