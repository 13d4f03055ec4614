"""No 64-bit values where a TPU needs none (a TPU emulates them in pairs of
32-bit words, and no fusion crosses that emulation: issue 40). Python numbers
a use wants as f32 enter the program as f32 inputs, rounded on the host as the
program's convert would round them; views' offsets enter as s32; the norms'
1/sqrt is an f32 rsqrt instead of an f64 division. The programs are
compiled for v5e (TORCHTPU_AOT_TOPOLOGY) and run on the CPU plugin, in each
eager mode and in a captured step: values match CPU torch's, and no program
takes or makes a 64-bit value. Without a TPU target, nothing changes."""

import json
import os
import re
import subprocess
import sys

import pytest
from _libtpu import needs_libtpu

CODE = r"""
import json, sys, torch, torchtpu
torch.manual_seed(0)
x = torch.randn(4, 8)
out = {}
def ops(t):
    return [t * 0.1, t + 3, t / 7.5, t * 1e39, t + (2**40 + 1), t - 1e-46, torch.clamp(t, -0.3, 0.7),
            torch.where(t > 0, t, 0.25), t.pow(2.0), torch.full_like(t, 0.1) + t]
want, got = ops(x), ops(x.to("tpu"))
out["ops"] = [torch.equal(g.cpu(), w) for g, w in zip(got, want)]
def step(dev):
    torch.manual_seed(1)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).to(dev)
    capturable = dev == "tpu" and sys.argv[1] == "graph"
    opt = torch.optim.AdamW(m.parameters(), lr=3e-3, weight_decay=0.1, capturable=capturable)
    data = torch.randn(6, 8).to(dev)
    def one():
        opt.zero_grad()
        (m(data) ** 2).mean().backward()
        opt.step()
    if dev == "tpu" and sys.argv[1] == "graph":
        one()
        g = torch.tpu.TPUGraph()
        with torch.tpu.graph(g):
            one()
        for _ in range(3):  # the capture runs nothing
            g.replay()
    else:
        for _ in range(4):
            one()
    return [p.detach().cpu() for p in m.parameters()]
err = max((a - b).abs().max().item() for a, b in zip(step("cpu"), step("tpu")))
out["adamw_err"] = err
print("RESULT " + json.dumps(out))
"""


def _child(mode, topology):
    env = dict(os.environ, TORCHTPU_CACHE_DIR="", TORCHTPU_DUMP_HLO="1")
    env["TORCHTPU_EAGER"] = "fused" if mode == "graph" else mode
    if topology:
        env["TORCHTPU_AOT_TOPOLOGY"] = topology
    else:
        env.pop("TORCHTPU_AOT_TOPOLOGY", None)
    p = subprocess.run([sys.executable, "-c", CODE, mode], env=env, capture_output=True, text=True, timeout=600)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    assert p.returncode == 0 and lines, p.stdout[-2000:] + p.stderr[-3000:]
    params = re.findall(r"func\.func public @main\((.*?)\)\s*->", p.stderr, re.S)
    assert params, p.stderr[-2000:]
    scalars = [ty for ps in params for ty in re.findall(r"tensor<([a-z0-9]+)>", ps)]
    return json.loads(lines[-1][len("RESULT ") :]), scalars


@needs_libtpu
@pytest.mark.parametrize("mode", ["strict", "fused", "graph"])
def test_numbers_enter_a_tpu_program_as_f32(mode):
    out, scalars = _child(mode, "v5e:1x1")
    assert all(out["ops"]), out["ops"]
    assert out["adamw_err"] <= 1e-6, out
    assert "f32" in scalars and "f64" not in scalars and "i64" not in scalars, sorted(set(scalars))


def test_without_a_tpu_numbers_stay_64_bit():
    out, scalars = _child("fused", None)
    assert all(out["ops"]) and out["adamw_err"] <= 1e-6, out
    assert "f64" in scalars and "i64" in scalars, sorted(set(scalars))


NORMS = r"""
import json, torch, torch.nn.functional as F, torchtpu
torch.manual_seed(0)
x, w, b = torch.randn(4, 6, 32) * 3 + 1, torch.randn(32), torch.randn(32)
xi, wi = torch.randn(4, 6, 5, 5), torch.randn(6)
errs = []
for dev in ("cpu", "tpu"):
    xs, ws, bs = (t.detach().to(dev).requires_grad_() for t in (x, w, b))
    xn, wn = (t.detach().to(dev).requires_grad_() for t in (xi, wi))
    y = F.layer_norm(xs, (32,), ws, bs, 1e-5)
    z = F.group_norm(xn, 3, wn) + F.batch_norm(xn, None, None, wn, None, training=True)
    (y.square().sum() + z.square().sum()).backward()
    errs.append([t.detach().cpu() for t in (y, z, xs.grad, ws.grad, bs.grad, xn.grad, wn.grad)])
print("RESULT " + json.dumps([((g - c).abs().max() / c.abs().max()).item() for c, g in zip(*errs)]))
"""


@needs_libtpu
def test_norms_on_a_tpu_use_rsqrt_not_f64():
    env = dict(os.environ, TORCHTPU_CACHE_DIR="", TORCHTPU_DUMP_HLO="1", TORCHTPU_AOT_TOPOLOGY="v5e:1x1")
    p = subprocess.run([sys.executable, "-c", NORMS], env=env, capture_output=True, text=True, timeout=600)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    assert p.returncode == 0 and lines, p.stdout[-2000:] + p.stderr[-3000:]
    assert max(json.loads(lines[-1][len("RESULT ") :])) < 2e-6, lines[-1]
    # (the CPU plugin that runs them here writes rsqrt as an f32 sqrt and division)
    assert "fused program" in p.stderr and "f64>" not in p.stderr
