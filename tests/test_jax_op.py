"""torchtpu.jax_op and torchtpu.stablehlo_op: JAX functions, Pallas kernels
and StableHLO text as torch ops on tpu tensors, inlined into torchtpu's
programs: equal to their torch versions forward and backward in every eager
mode, in a graph capture and under torch.compile; a tiny model using one
trains like the torch model; bad inputs and bad text are clear errors; a
Pallas kernel runs on the CPU plugin through interpret mode and its TPU
(Mosaic) form is in the program text for the TPU, which libtpu compiles for
v5e; `import torchtpu` does not import jax."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

import torchtpu

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

MODES = ["strict", "fused", "debug"]


@torchtpu.jax_op
def rms_norm(x, w, eps=1e-6):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * w


@torchtpu.jax_op
def swiglu(x, w_gate, w_up):
    return jax.nn.silu(x @ w_gate) * (x @ w_up)


def rms_norm_torch(x, w, eps=1e-6):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w


def swiglu_torch(x, w_gate, w_up):
    return torch.nn.functional.silu(x @ w_gate) * (x @ w_up)


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(4, 8, generator=g), torch.randn(8, generator=g), torch.randn(8, 16, generator=g)


def _grads(fn, *xs, device):
    ts = [x.detach().clone().to(device).requires_grad_() for x in xs]
    out = fn(*ts)
    out.backward(torch.ones_like(out) * 0.5)
    return out.detach().cpu(), [t.grad.cpu() for t in ts]


@pytest.mark.parametrize("mode", MODES)
def test_forward_and_backward_in_each_eager_mode(mode):
    x, w, wg = _inputs()
    wu = wg.flip(0)
    with torchtpu.eager_mode(mode):
        out, grads = _grads(rms_norm, x, w, device="tpu")
        ref, rgrads = _grads(rms_norm_torch, x, w, device="cpu")
        torch.testing.assert_close(out, ref)
        for g, r in zip(grads, rgrads):
            torch.testing.assert_close(g, r)
        out, grads = _grads(swiglu, x, wg, wu, device="tpu")
        ref, rgrads = _grads(swiglu_torch, x, wg, wu, device="cpu")
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
        for g, r in zip(grads, rgrads):
            torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-5)


def test_fused_program_holds_the_function_with_other_ops():
    x, w, _ = _inputs()
    with torchtpu.eager_mode("fused"):
        y = (rms_norm(x.to("tpu") * 2, w.to("tpu")) + 1).relu()
        torch.testing.assert_close(y.cpu(), (rms_norm_torch(x * 2, w) + 1).relu())


def test_cached_per_signature_and_tree_outputs_and_static_args():
    x, w, _ = _inputs()
    op = rms_norm._torchtpu_jax_op
    n = len(op.cache)
    rms_norm(x.to("tpu"), w.to("tpu"))
    rms_norm(x.to("tpu"), w.to("tpu"))
    assert len(op.cache) == max(n, 1)
    rms_norm(x.to("tpu"), w.to("tpu"), eps=0.5)  # a static argument: another signature
    torch.testing.assert_close(rms_norm(x.to("tpu"), w.to("tpu"), eps=0.5).cpu(), rms_norm_torch(x, w, 0.5))

    @torchtpu.jax_op
    def stats(x):
        return {"mean": x.mean(0), "max": x.max(), "argmax": jnp.argmax(x, axis=1)}

    s = stats(x.to("tpu"))
    assert set(s) == {"mean", "max", "argmax"}
    torch.testing.assert_close(s["mean"].cpu(), x.mean(0))
    assert s["argmax"].dtype == torch.int32 and torch.equal(s["argmax"].cpu().long(), x.argmax(1))

    @torchtpu.jax_op
    def scale64(x, k):
        return x * 2, k + 1

    a, b = scale64(x.double().to("tpu"), torch.arange(3).to("tpu"))
    assert a.dtype == torch.float64 and b.dtype == torch.int64
    torch.testing.assert_close(a.cpu(), x.double() * 2)


def test_integer_arguments_and_results_unused_arguments_and_double_backward():
    @torchtpu.jax_op
    def rows(x, idx, unused):
        return x[idx] * 2, jnp.argmax(x, axis=1)

    x, idx = torch.randn(5, 3), torch.tensor([0, 2, 2])
    xt = x.to("tpu").requires_grad_()
    a, b = rows(xt, idx.to("tpu"), torch.ones(2, device="tpu"))
    assert torch.equal(b.cpu().long(), x.argmax(1))
    a.sum().backward()
    torch.testing.assert_close(xt.grad.cpu(), torch.zeros(5, 3).index_add_(0, idx, torch.full((3, 3), 2.0)))

    @torchtpu.jax_op
    def cube(x):
        return x**3

    x = torch.randn(4, device="tpu", requires_grad=True)
    (g,) = torch.autograd.grad(cube(x).sum(), x, create_graph=True)
    (g2,) = torch.autograd.grad(g.sum(), x)
    torch.testing.assert_close(g2.cpu(), 6 * x.detach().cpu())
    with pytest.raises(RuntimeError, match="argument 0 is on cpu, expected a tpu tensor"):
        cube(torch.randn(4))
    with pytest.raises(TypeError, match="must be hashable"):
        rms_norm(x, x, eps=[1])


def test_graph_capture_replays_the_function():
    x, w, _ = _inputs()
    xs, ws = x.to("tpu"), w.to("tpu")
    with torchtpu.eager_mode("fused"):
        rms_norm(xs, ws).cpu()  # warm up
        g = torch.tpu.TPUGraph()
        with torch.tpu.graph(g):
            out = rms_norm(xs, ws) * 3
        for k in range(2):
            x2 = torch.randn(4, 8)
            xs.copy_(x2.to("tpu"))
            g.replay()
            torch.testing.assert_close(out.cpu(), rms_norm_torch(x2, w) * 3)


def test_graph_capture_of_a_training_step():
    def run(device, capture):
        torch.manual_seed(0)
        w = torch.nn.Parameter(torch.randn(8).to(device))
        opt = torch.optim.SGD([w], lr=0.1)
        x = torch.randn(4, 8).to(device)
        norm = rms_norm if device == "tpu" else rms_norm_torch

        def step():
            opt.zero_grad(set_to_none=False)
            loss = norm(x, w).square().sum()
            loss.backward()
            opt.step()
            return loss

        losses = [step().item() for _ in range(2)]
        if not capture:
            return losses + [step().item() for _ in range(3)]
        g = torch.tpu.TPUGraph()
        with torch.tpu.graph(g):
            loss = step()
        for _ in range(3):
            g.replay()
            losses.append(loss.item())
        return losses

    with torchtpu.eager_mode("fused"):
        ours = run("tpu", True)
    assert ours == pytest.approx(run("cpu", False), rel=1e-4)


def test_torch_compile_forward_and_backward():
    x, w, wg = _inputs()
    wu = wg * 0.5

    def f(x, w, wg, wu):
        return swiglu(rms_norm(x, w), wg, wu).sum(-1)

    cf = torch.compile(f, backend="tpu")
    out, grads = _grads(cf, x, w, wg, wu, device="tpu")
    ref, rgrads = _grads(lambda *a: swiglu_torch(rms_norm_torch(*a[:2]), *a[2:]).sum(-1), x, w, wg, wu, device="cpu")
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    for g, r in zip(grads, rgrads):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-5)


class _Block(torch.nn.Module):
    def __init__(self, norm, act):
        super().__init__()
        torch.manual_seed(0)
        self.w = torch.nn.Parameter(torch.ones(8))
        self.gate = torch.nn.Linear(8, 16, bias=False)
        self.up = torch.nn.Linear(8, 16, bias=False)
        self.out = torch.nn.Linear(16, 1)
        self.norm, self.act = norm, act

    def forward(self, x):
        h = self.norm(x, self.w)
        return self.out(self.act(h, self.gate.weight.t(), self.up.weight.t()))


def _train(model, device, steps=4):
    model = model.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(3)
    losses = []
    for _ in range(steps):
        x, y = torch.randn(4, 8, generator=g), torch.randn(4, 1, generator=g)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x.to(device)), y.to(device))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_tiny_model_trains_like_torch():
    ours = _train(_Block(rms_norm, swiglu), "tpu")
    ref = _train(_Block(rms_norm_torch, swiglu_torch), "cpu")
    assert ours == pytest.approx(ref, rel=1e-4, abs=1e-5)
    assert ours[-1] < ours[0]


# ---- stablehlo_op -------------------------------------------------------------------

ADD_MUL = """
// a hand-written function: a + b and a * b
module @hand attributes {mhlo.num_partitions = 1 : i32} {
  func.func public @main(%a: tensor<2x3xf32> loc("a"), %b: tensor<2x3xf32>) -> (tensor<2x3xf32>, tensor<2x3xf32>) {
    %0 = call @add(%a, %b) : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x3xf32>
    %1 = "stablehlo.multiply"(%a, %b) : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x3xf32>
    return %0, %1 : tensor<2x3xf32>, tensor<2x3xf32>
  }
  func.func private @add(%a: tensor<2x3xf32>, %b: tensor<2x3xf32>) -> tensor<2x3xf32> {
    %0 = stablehlo.add %a, %b : tensor<2x3xf32>
    return %0 : tensor<2x3xf32>
  }
}
"""


@pytest.mark.parametrize("mode", MODES)
def test_stablehlo_op_hand_written(mode):
    op = torchtpu.stablehlo_op(ADD_MUL, backward=lambda a, b, gs, gp: (gs + gp * b, gs + gp * a))
    a, b = torch.randn(2, 3), torch.randn(2, 3)
    with torchtpu.eager_mode(mode):
        at, bt = a.to("tpu").requires_grad_(), b.to("tpu").requires_grad_()
        s, p = op(at, bt)
        torch.testing.assert_close(s.cpu(), a + b)
        torch.testing.assert_close(p.cpu(), a * b)
        (s + p).sum().backward()
        torch.testing.assert_close(at.grad.cpu(), 1 + b)
        torch.testing.assert_close(bt.grad.cpu(), 1 + a)


def test_stablehlo_op_bad_inputs_are_clear_errors():
    op = torchtpu.stablehlo_op(ADD_MUL)
    a = torch.randn(2, 3, device="tpu")
    with pytest.raises(TypeError, match=r"takes 2 tensors .* got 1"):
        op(a)
    with pytest.raises(RuntimeError, match=r"argument 1 has dtype torch.float64, the function takes torch.float32"):
        op(a, a.double())
    with pytest.raises(RuntimeError, match=r"argument 0 has shape \[3, 2\], the function takes \[2, 3\]"):
        op(a.t(), a)
    with pytest.raises(RuntimeError, match=r"argument 1 is on cpu"):
        op(a, torch.randn(2, 3))
    with pytest.raises(TypeError, match=r"argument 1 is int"):
        op(a, 3)
    with pytest.raises(RuntimeError, match="no backward"):
        op(a.requires_grad_(), a)[0].sum().backward()
    # the core's own checks, reached without the Python ones
    from torchtpu import _jax

    with pytest.raises(RuntimeError, match=r"argument 0 has shape \[3, 2\]"):
        _jax._call(op.fn, [a.detach().t(), a.detach()])
    with pytest.raises(TypeError, match=r"takes 2 tensors"):
        _jax._call(op.fn, [a.detach()])
    with pytest.raises(ValueError, match="no function was registered"):
        _jax._KERNEL([a.detach()], 10**6)


@pytest.mark.parametrize(
    "text, match",
    [
        ("", "empty"),
        ("module {\n}\n", "no function @main"),
        ("func.func @main(%a: tensor<?xf32>) -> tensor<f32> {\n}\n", r"tensor<\?xf32> is not supported"),
        ("func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> {\n return %a\n", "balanced braces"),
        ('func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> {\n %0 = "x\n}\n', "unterminated string"),
        ("module {\n sdy.mesh @m = <[\"x\"=2]>\n}\n", "only func.func definitions"),
    ],
)
def test_stablehlo_op_bad_text_is_a_value_error(text, match):
    with pytest.raises(ValueError, match=match):
        torchtpu.stablehlo_op(text)
    with pytest.raises(TypeError, match="expected the text"):
        torchtpu.stablehlo_op(b"bytes")


def test_text_the_compiler_refuses_is_a_runtime_error():
    bad = (
        "func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> {\n"
        "  %0 = stablehlo.no_such_op %a : tensor<2xf32>\n  return %0 : tensor<2xf32>\n}\n"
    )
    op = torchtpu.stablehlo_op(bad)
    with pytest.raises(RuntimeError):
        op(torch.ones(2, device="tpu")).cpu()
    assert torch.equal((torch.ones(2, device="tpu") + 1).cpu(), torch.full((2,), 2.0))  # still usable


# ---- Pallas ----------------------------------------------------------------------------


def _pallas_swish_mul():
    from jax.experimental import pallas as pl

    def kernel(x_ref, y_ref, o_ref):
        x = x_ref[...]
        o_ref[...] = x * jax.nn.sigmoid(x) * y_ref[...]

    @torchtpu.jax_op
    def swish_mul(x, y):
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x, y)

    return swish_mul


def test_pallas_kernel_runs_through_interpret_mode_and_has_a_tpu_form():
    op = _pallas_swish_mul()
    x, y = torch.randn(8, 128), torch.randn(8, 128)
    for mode in MODES:
        with torchtpu.eager_mode(mode):
            out = op(x.to("tpu"), y.to("tpu"))
            torch.testing.assert_close(out.cpu(), torch.nn.functional.silu(x) * y)
    # jax differentiates no pallas_call without a custom_vjp: a clear error
    with pytest.raises(RuntimeError, match="could not differentiate.*custom_vjp"):
        op(x.to("tpu").requires_grad_(), y.to("tpu")).sum().backward()
    here = op.lower_text(x, y)
    tpu = op.lower_text(x, y, target="tpu")
    assert "tpu_custom_call" not in here and "stablehlo.while" in here
    assert "@tpu_custom_call(" in tpu and "stablehlo.while" not in tpu
    # a whole program of torchtpu's with the kernel, retargeted
    assert "@tpu_custom_call(" in torchtpu._C.stablehlo_retarget(here, "tpu")


# A training step with a Pallas kernel (a custom_vjp: its backward in plain
# JAX), run on the CPU plugin (interpret mode) while TORCHTPU_AOT_TOPOLOGY
# compiles every program for v5e with the kernel's Mosaic form; and a
# function whose TPU form is broken, which the TPU compile refuses (what it
# compiles is the TPU form, not the one run here).
_AOT_STEP = """
import json, jax, torch, torchtpu
from jax.experimental import pallas as pl

def kernel(x_ref, y_ref, o_ref):
    x = x_ref[...]
    o_ref[...] = x * jax.nn.sigmoid(x) * y_ref[...]

@jax.custom_vjp
def swish_mul(x, y):
    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x, y)

def fwd(x, y):
    return swish_mul(x, y), (x, y)

def bwd(res, g):
    x, y = res
    s = jax.nn.sigmoid(x)
    return g * y * (s + x * s * (1 - s)), g * x * s

swish_mul.defvjp(fwd, bwd)
op = torchtpu.jax_op(swish_mul)
torch.manual_seed(0)
lin = torch.nn.Linear(128, 128)
x, y = torch.randn(8, 128), torch.randn(8, 128)
ref = torch.nn.Linear(128, 128)
ref.load_state_dict(lin.state_dict())
lin = lin.to("tpu")
opt = torch.optim.SGD(lin.parameters(), lr=0.1)
ropt = torch.optim.SGD(ref.parameters(), lr=0.1)
losses = []
for _ in range(2):
    opt.zero_grad()
    loss = op(lin(x.to("tpu")), y.to("tpu")).pow(2).mean()
    loss.backward()
    opt.step()
    ropt.zero_grad()
    rloss = (torch.nn.functional.silu(ref(x)) * y).pow(2).mean()
    rloss.backward()
    ropt.step()
    losses.append((loss.item(), rloss.item()))
text = op.lower_text(x, y)
good = [p.as_dict() for p in torchtpu.aot_report()]
broken = torchtpu.stablehlo_op(text, tpu_text=text.replace("stablehlo.multiply", "stablehlo.bogus_op", 1))
try:
    broken(x.to("tpu"), y.to("tpu")).cpu()
    refused = ""
except RuntimeError as e:
    refused = str(e)
print("RESULT", json.dumps(dict(losses=losses, programs=good, refused=refused)))
"""


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason="libtpu is not installed")
def test_a_training_step_with_a_pallas_kernel_compiles_for_v5e():
    env = dict(os.environ, TORCHTPU_AOT_TOPOLOGY="v5e:2x2", TORCHTPU_EAGER="fused", TORCHTPU_CACHE_DIR="")
    env.pop("JAX_PLATFORMS", None)
    r = subprocess.run([sys.executable, "-c", _AOT_STEP], capture_output=True, text=True, timeout=400, env=env)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    assert r.returncode == 0 and lines, r.stdout[-2000:] + r.stderr[-3000:]
    res = json.loads(lines[-1][len("RESULT ") :])
    for got, want in res["losses"]:
        assert abs(got - want) <= 1e-5 * max(1.0, abs(want)), res["losses"]
    progs = res["programs"]
    assert progs and all(p["ok"] for p in progs), [p for p in progs if not p["ok"]]
    assert all(0 < p["peak_bytes"] <= p["hbm_limit_bytes"] for p in progs)
    assert "TORCHTPU_AOT_TOPOLOGY" in res["refused"] and "does not compile for TPU v5e:2x2" in res["refused"]


_IMPORT = """
import sys, torch, torchtpu
assert "jax" not in sys.modules, "import torchtpu imported jax"
import jax
f = torchtpu.jax_op(lambda x: x + 1)
assert f(torch.zeros(2, device="tpu")).cpu().tolist() == [1.0, 1.0]
from jax._src import xla_bridge
assert sorted(xla_bridge._backends) == ["cpu"], xla_bridge._backends  # jax never opened libtpu
print("ok")
"""


def test_import_torchtpu_does_not_import_jax_and_jax_stays_on_its_cpu_backend():
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    r = subprocess.run([sys.executable, "-c", _IMPORT], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-2000:]
    assert "TPU" not in r.stderr, r.stderr[-2000:]
