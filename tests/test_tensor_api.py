"""Tensor arguments are read from torch's C++ tensors (torchtpu._device_guard's
tensor_api) instead of through Python attributes: every kind of argument
(views with offsets and strides, CPU 0-d tensors, each dtype, zero-size
tensors) gives the same results and the same errors both ways."""

import os
import subprocess
import sys

import torch

import torchtpu  # noqa: F401
from torchtpu import _registry

CASES = r"""
import torch, torchtpu
out = []
def run(name, fn):
    try:
        r = fn()
        out.append((name, "ok", r.cpu().tolist() if isinstance(r, torch.Tensor) else r))
    except Exception as e:
        out.append((name, type(e).__name__, str(e).splitlines()[0]))
base = torch.arange(24.0).reshape(4, 6)
x = base.to("tpu")
run("offset_view", lambda: x[1:, 2:5] * 2)
run("strided_view", lambda: x.t()[::2] + x.t()[1::2])
run("expanded", lambda: x[0].expand(3, 6) - 1)
run("cpu_scalar", lambda: x * torch.tensor(3.0))
run("cpu_scalar_int_view", lambda: x + torch.tensor([5, 7])[1])
run("cpu_vector", lambda: x + torch.ones(6))
run("zero_size", lambda: x[:0] + 1)
run("zero_size_cat", lambda: torch.cat([x[:0], x[:1]]))
for dt in (torch.bfloat16, torch.float16, torch.int32, torch.int64, torch.bool, torch.uint8, torch.complex64):
    run(str(dt), lambda: (x.to(dt)[1:3] * 2 if dt != torch.bool else ~x.to(dt)[1:3]))
run("view_as_real", lambda: torch.view_as_real(torch.complex(x, x)[1:]) + 0)
run("nine_dims", lambda: torch.ones([1] * 9, device="tpu") + 1)
run("float64", lambda: x.double()[2:] / 3)
run("parameter", lambda: torch.nn.Parameter(x.clone()) * 2)
print("CASES", repr(out))
"""


def _run(api):
    env = dict(os.environ, TORCHTPU_TENSOR_API=api)
    r = subprocess.run([sys.executable, "-c", CASES], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    line = [x for x in r.stdout.splitlines() if x.startswith("CASES ")][-1]
    return eval(line[6:])


def test_tensor_api_is_used_when_built():
    if _registry.DEVICE_GUARD == "torchtpu":  # the extension is built
        assert _registry.TENSOR_API


def test_both_paths_give_the_same_results_and_errors():
    fast, slow = _run("1"), _run("0")
    assert fast == slow
    kinds = {name: kind for name, kind, _ in fast}
    assert kinds["offset_view"] == "ok" and kinds["cpu_scalar"] == "ok" and kinds["zero_size"] == "ok"
    assert kinds["cpu_vector"] == "RuntimeError" and kinds["nine_dims"] == "RuntimeError"
    want = (base := torch.arange(24.0).reshape(4, 6))[1:, 2:5] * 2
    assert dict((n, v) for n, _, v in fast)["offset_view"] == want.tolist()
    assert base is not None


def test_parameter_and_subclass_arguments():
    p = torch.nn.Parameter(torch.ones(3, device="tpu"))
    assert (p * 2).cpu().tolist() == [2.0, 2.0, 2.0]
    assert torch.equal((torch.ones(2, 3, device="tpu")[:, 1:] + torch.tensor(1.0)).cpu(), torch.full((2, 2), 2.0))
