"""Fused eager mode: recorded ops run as one program at a sync point, with
the semantics of eager PyTorch (views, in-place writes, aliasing), the same
losses as the other modes, one cached program per training step, and no
leaked device memory."""

import gc
import os
import re
import subprocess
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torchtpu

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
import char_gpt  # noqa: E402
import mlp_mnist  # noqa: E402


@pytest.fixture
def fused():
    with torchtpu.eager_mode("fused"):
        yield


def _m():
    return torchtpu.metrics()


def test_views_and_in_place_writes_match_cpu(fused):
    torch.manual_seed(0)
    base = torch.randn(6, 8)
    t = base.to("tpu")
    before = _m()["fused_programs_run"]
    outs = []
    for dev, x in (("cpu", base.clone()), ("tpu", t)):
        y = x * 2 + 1
        v = y[1:4, ::2]  # a strided view
        v.mul_(3)  # written through to y
        w = y.t()[2]  # another view of the same storage
        w.add_(v.sum())  # reads the first write
        z = torch.relu(y - 4)
        z[0, :6].copy_(w)
        x.add_(1)  # the input itself, after it was read
        outs.append([a.cpu() for a in (x, y, z, v, w)])
    for a, b in zip(*outs):
        torch.testing.assert_close(b, a)
    assert _m()["fused_programs_run"] > before


def test_dead_values_are_not_computed(fused):
    x = torch.ones(100000, device="tpu")
    torch.tpu.synchronize()
    torch.tpu.reset_peak_memory_stats()
    base = torch.tpu.memory_allocated()
    a = x + 1
    b = a * 2
    del a
    assert b[:3].cpu().tolist() == [4.0, 4.0, 4.0]
    # only b was computed: a died before the flush, so it never took memory
    assert torch.tpu.max_memory_allocated() < base + 2 * 400000


def test_flush_reasons(fused):
    m0 = _m()
    x = torch.ones(4, device="tpu")
    y = x + 1
    y.cpu()
    m1 = _m()
    assert m1["flushes_download"] == m0["flushes_download"] + 1
    z = x * 3
    x.copy_(torch.full((4,), 7.0))  # an upload into a tensor the recorded op reads
    m2 = _m()
    assert m2["flushes_upload"] == m1["flushes_upload"] + 1
    assert z.cpu().tolist() == [3.0] * 4 and x.cpu().tolist() == [7.0] * 4
    w = x - 1
    torch.tpu.synchronize()
    assert _m()["flushes_sync"] >= m2["flushes_sync"] + 1
    with torchtpu.eager_mode("strict"):
        pass
    assert w.cpu().tolist() == [6.0] * 4


def test_data_dependent_shapes_and_printing(fused):
    x = torch.tensor([0.0, 2.0, 0.0, 3.0], device="tpu") * 1
    assert x.nonzero().cpu().flatten().tolist() == [1, 3]
    assert x[x > 1].cpu().tolist() == [2.0, 3.0]
    assert "3." in str(x + 0)


def test_errors_are_raised_when_the_op_is_called(fused):
    a, b = torch.ones(2, 3, device="tpu"), torch.ones(4, 5, device="tpu")
    with pytest.raises(RuntimeError):
        a @ b
    assert (a + 1).sum().item() == 12


def _losses(mod, mode, steps):
    with torchtpu.eager_mode(mode):
        if mod is char_gpt:
            return char_gpt.train("tpu", steps)
        return mlp_mnist.train("tpu", steps)


@pytest.mark.parametrize("example", [mlp_mnist, char_gpt], ids=["mlp", "gpt"])
def test_examples_give_the_same_losses_in_all_modes(example):
    debug = _losses(example, "debug", 6)
    strict = _losses(example, "strict", 6)
    fused_ = _losses(example, "fused", 6)
    for a, b, c in zip(debug, strict, fused_):
        assert b == a
        assert abs(c - a) <= 1e-5 * abs(a)


def test_training_step_is_one_cached_program():
    tok, data = char_gpt.load_corpus()
    model = char_gpt.make_model(tok.vocab_size, seed=0, device="tpu")
    opt = char_gpt.make_optimizer(model)
    g = torch.Generator().manual_seed(0)
    with torchtpu.eager_mode("fused"):
        seen = []
        for _ in range(6):
            x, y = char_gpt.get_batch(data, 8, 32, g)
            char_gpt.train_step(model, opt, x.to("tpu"), y.to("tpu"))
            m = _m()
            seen.append((m["programs_compiled"], m["fused_programs_run"]))
    # steady state from the second step on: nothing compiles, one program runs per step. The
    # program the second step launches holds the first optimizer step, which makes AdamW's
    # state: zeros uploaded, not recorded, so that program is the steady one (one compile less)
    for (c0, r0), (c1, r1) in zip(seen[1:], seen[2:]):
        assert c1 == c0 and r1 == r0 + 1


def _gpt_loop_without_reads(mode, steps):
    """The GPT example's step without loss.item(): the loop reads nothing
    back until the end."""
    tok, data = char_gpt.load_corpus()
    model = char_gpt.make_model(tok.vocab_size, seed=0, device="tpu")
    opt = char_gpt.make_optimizer(model)
    g = torch.Generator().manual_seed(0)
    seen, losses = [], []
    with torchtpu.eager_mode(mode):
        for _ in range(steps):
            x, y = char_gpt.get_batch(data, 8, 32, g)
            opt.zero_grad(set_to_none=True)
            _, loss = model(x.to("tpu"), y.to("tpu"))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            losses.append(loss)
            m = _m()
            seen.append(
                (
                    m["programs_compiled"],
                    m["fused_programs_run"],
                    m["flushes_backward"],
                    m["flushes_size_cap"],
                    m["flushes_optimizer_step"],
                )
            )
        return [float(v) for v in losses], [p.detach().cpu() for p in model.parameters()], seen


def test_backward_pass_launches_the_fused_step():
    """The first op of each backward pass launches what was recorded before it
    (the rest of the last step, then this forward pass) as one program,
    without waiting: a loop that never reads a value back runs one program
    per step and compiles nothing in steady state, instead of growing one
    recording up to the size cap; the optimizer step then launches nothing
    more."""
    fl, fp, seen = _gpt_loop_without_reads("fused", 6)
    sl, sp, _ = _gpt_loop_without_reads("strict", 6)
    for (c0, r0, b0, k0, o0), (c1, r1, b1, k1, o1) in zip(seen, seen[1:]):
        assert r1 == r0 + 1 and b1 == b0 + 1 and k1 == k0 and o1 == o0
    for (c0, *_), (c1, *_) in zip(seen[2:], seen[3:]):
        assert c1 == c0
    for a, b in zip(fl, sl):
        assert abs(a - b) <= 1e-5 * abs(b)
    for a, b in zip(fp, sp):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)  # Adam divides by tiny moments


def test_accumulation_and_two_optimizers(fused):
    """Gradients accumulated over two micro-batches, two optimizers stepped
    one after the other: each backward pass launches one program, the
    optimizer steps none (their ops run in the next backward pass's)."""
    torch.manual_seed(0)
    net_cpu = nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 2))
    net = nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 2)).to("tpu")
    net.load_state_dict(net_cpu.state_dict())
    opts = [torch.optim.SGD(net[0].parameters(), lr=0.1, momentum=0.9), torch.optim.Adam(net[2].parameters(), lr=0.01)]
    opts_cpu = [
        torch.optim.SGD(net_cpu[0].parameters(), lr=0.1, momentum=0.9),
        torch.optim.Adam(net_cpu[2].parameters(), lr=0.01),
    ]
    data = [torch.randn(4, 6) for _ in range(8)]
    runs = []
    for i in range(4):
        m0 = _m()
        for mod, os_, dev in ((net, opts, "tpu"), (net_cpu, opts_cpu, "cpu")):
            for o in os_:
                o.zero_grad()
            for x in data[2 * i : 2 * i + 2]:
                F.mse_loss(mod(x.to(dev)), torch.ones(4, 2, device=dev)).backward()
            for o in os_:
                o.step()
        m1 = _m()
        runs.append(
            (
                m1["fused_programs_run"] - m0["fused_programs_run"],
                m1["flushes_backward"] - m0["flushes_backward"],
                m1["flushes_optimizer_step"] - m0["flushes_optimizer_step"],
            )
        )
    assert runs[1:] == [(2, 2, 0)] * 3
    for a, b in zip(net.parameters(), net_cpu.parameters()):
        torch.testing.assert_close(a.detach().cpu(), b.detach(), rtol=1e-4, atol=1e-5)


def test_optimizer_steps_without_backward_each_end_a_program(fused):
    """Gradients set by hand (no backward pass): each optimizer step launches
    the recorded step itself, one program per step (from the second: the
    first compares with backward passes since any optimizer's last step)."""
    p = torch.nn.Parameter(torch.ones(3, device="tpu"))
    opt = torch.optim.SGD([p], lr=0.5, momentum=0.9)
    runs = []
    for _ in range(5):
        m0 = _m()
        p.grad = p.detach() * 2
        opt.step()
        m1 = _m()
        runs.append(
            (
                m1["fused_programs_run"] - m0["fused_programs_run"],
                m1["flushes_optimizer_step"] - m0["flushes_optimizer_step"],
            )
        )
    assert runs[1:] == [(1, 1)] * 4
    q = torch.nn.Parameter(torch.ones(3))
    opt_cpu = torch.optim.SGD([q], lr=0.5, momentum=0.9)
    for _ in range(5):
        q.grad = q.detach() * 2
        opt_cpu.step()
    torch.testing.assert_close(p.detach().cpu(), q.detach())


def test_loss_read_after_the_step_leaves_the_step_recorded(fused):
    """The loss read after the optimizer step was computed by the program the
    backward pass launched: reading it waits for that program and leaves the
    backward pass and the optimizer step recorded (no flush), so the step's
    ops still run as one program, launched by the next backward pass. A read
    of a value the recorded ops touch still runs them first."""
    torch.manual_seed(0)
    net_cpu = nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 2))
    net = nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 2)).to("tpu")
    net.load_state_dict(net_cpu.state_dict())
    opt = torch.optim.AdamW(net.parameters(), lr=0.01)
    opt_cpu = torch.optim.AdamW(net_cpu.parameters(), lr=0.01)
    data = [torch.randn(4, 6) for _ in range(6)]
    for i, x in enumerate(data):
        losses = []
        for mod, o, dev in ((net, opt, "tpu"), (net_cpu, opt_cpu, "cpu")):
            o.zero_grad()
            loss = F.mse_loss(mod(x.to(dev)), torch.ones(4, 2, device=dev))
            loss.backward()
            o.step()
            m0 = _m()
            losses.append(loss.item())
            if dev == "tpu":
                m1 = _m()
                assert m1["flushes_download"] == m0["flushes_download"]
                assert m1["fused_programs_run"] == m0["fused_programs_run"]
        assert abs(losses[0] - losses[1]) <= 1e-5 * abs(losses[1])
    m0 = _m()
    w = net[0].weight.detach().cpu()  # written by the recorded optimizer step
    assert _m()["flushes_download"] == m0["flushes_download"] + 1
    torch.testing.assert_close(w, net_cpu[0].weight.detach(), rtol=1e-4, atol=1e-5)


def test_optimizer_step_outside_fused_mode_runs_nothing_more():
    p = torch.nn.Parameter(torch.ones(3, device="tpu"))
    opt = torch.optim.SGD([p], lr=0.5)
    p.grad = torch.full((3,), 2.0, device="tpu")
    torch.tpu.synchronize()
    m0 = _m()
    with torchtpu.eager_mode("strict"):
        opt.step()
    m1 = _m()
    assert m1["flushes_optimizer_step"] == m0["flushes_optimizer_step"]
    assert p.detach().cpu().tolist() == [0.0] * 3


def test_size_cap_splits_long_recordings():
    code = (
        "import torch, torchtpu; torchtpu.eager_mode('fused'); x = torch.zeros(3, device='tpu')\n"
        "for i in range(50): x = x + 1\n"
        "print(x.cpu().tolist(), torchtpu.metrics()['flushes_size_cap'])"
    )
    p = subprocess.run(
        [sys.executable, "-c", code],
        env=dict(os.environ, TORCHTPU_FUSED_MAX_OPS="8"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    values, caps = p.stdout.strip().rsplit(" ", 1)
    assert values == "[50.0, 50.0, 50.0]" and int(caps) >= 5


FOREACH = """
import re, sys, torch, torchtpu
torchtpu.eager_mode("fused")
shapes = [(3,), (2, 5), (4, 1, 2), (7,), (1,), (6, 3)]
cpu = [torch.randn(s, generator=torch.Generator().manual_seed(i)) for i, s in enumerate(shapes)]
tpu = [t.to("tpu") for t in cpu]
for scales in ([0.5] * 6, [0.5, 0.25, 0.5, 2.0, 0.5, 0.5], [0.75] * 6):
    for ts in (cpu, tpu):
        torch._foreach_mul_(ts, 1.5)
        torch._foreach_add_(ts, ts, alpha=0.5)
        torch._foreach_mul_(ts, scales)
    print("max diff", max((a.cpu() - b).abs().max().item() for a, b in zip(tpu, cpu)), file=sys.stderr)
"""


def test_a_foreach_calls_number_is_one_program_input():
    # torch._foreach_mul_(tensors, 1.5) records one op per tensor; their 1.5
    # is one input of the fused program, not six (an optimizer passes its
    # learning rate and betas this way, to every parameter); the items of a
    # scalar list share an input where their values are equal
    p = subprocess.run(
        [sys.executable, "-c", FOREACH],
        env=dict(os.environ, TORCHTPU_DUMP_HLO="1"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    diffs = [float(x) for x in re.findall(r"max diff (\S+)", p.stderr)]
    assert len(diffs) == 3 and max(diffs) < 1e-5, diffs
    programs = re.findall(r"-- fused program of (\d+) ops\n.*?func\.func public @main\((.*?)\)\s*->", p.stderr, re.S)
    numbers = [len(re.findall(r"tensor<f64>", sig)) for _, sig in programs]
    # 18 recorded ops each time; numbers: 1.5, alpha and the scale list (one
    # value: one input; 0.5, 0.25 and 2.0: three). The third list's items are
    # equal again: the first program is found, none is compiled.
    assert [int(n) for n, _ in programs] == [18, 18] and numbers == [3, 5], (programs, numbers)


def test_no_device_buffer_outlives_the_model():
    gc.collect()
    base = _m()["live_records"]
    with torchtpu.eager_mode("fused"):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).to("tpu")
        opt = torch.optim.AdamW(model.parameters(), lr=0.01)
        for _ in range(20):
            x, y = torch.randn(8, 16).to("tpu"), torch.randint(0, 4, (8,)).to("tpu")
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            loss.item()
        del model, opt, x, y, loss
        gc.collect()
    assert _m()["live_records"] == base


DONATE = """
import torch, torchtpu
def hwm_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
torchtpu.eager_mode("fused")
p = torch.zeros(25_000_000, device="tpu")  # 100 MB
torch.tpu.synchronize()
open("/proc/self/clear_refs", "w").write("5")  # the peak starts again from here
base = hwm_mb()
for _ in range(3):
    p.add_(1)
    p.mul_(2)
    torch.tpu.synchronize()
print(hwm_mb() - base, p[:2].cpu().tolist())
"""


def test_rewritten_buffers_are_donated_to_the_program():
    """p.add_(1); p.mul_(2) rewrites p: the program takes p's buffer for the
    new value instead of holding two copies (TORCHTPU_DONATE=0 turns it off)."""
    grows = {}
    for donate in ("1", "0"):
        p = subprocess.run(
            [sys.executable, "-c", DONATE],
            env=dict(os.environ, TORCHTPU_DONATE=donate),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert p.returncode == 0, p.stderr[-2000:]
        grow, values = p.stdout.strip().split(" ", 1)
        assert values == "[14.0, 14.0]"
        grows[donate] = float(grow)
    # without donation the old and the new 100 MB live at once
    assert grows["1"] < 70 and grows["0"] > grows["1"] + 50, grows


STRIDED_VIEW = """
import torch, torchtpu
x = torch.randn(4, 16, 6, 16)
v = x.to("tpu")[:, :, 2:4].transpose(1, 2)  # a head of a qkv projection, as attention reads it
assert torch.equal((v * 2).cpu(), x[:, :, 2:4].transpose(1, 2) * 2)
"""


def test_a_strided_views_offset_is_split_in_32_bits():
    # a strided view's offset (an input, so views at other offsets share the
    # program) is split into coordinates in 32 bits: TPUs emulate 64-bit
    # integers, and these divisions in 64 bits took libtpu seconds to compile
    p = subprocess.run(
        [sys.executable, "-c", STRIDED_VIEW],
        env=dict(os.environ, TORCHTPU_DUMP_HLO="1", TORCHTPU_EAGER="strict"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    ops = re.findall(r'"stablehlo\.(divide|remainder)".*?-> tensor<(\w+)>', p.stderr)
    assert ops and {t for _, t in ops} == {"i32"}, ops


def test_step_boundary_at_the_optimizer():
    """TORCHTPU_STEP_BOUNDARY=optimizer (the default once a tensor is on a
    mesh): the backward pass launches nothing, and the first op after the
    optimizer steps launches the whole step (forward, backward, clipping,
    optimizer) as one program, with the losses and parameters of strict
    mode (a bad value: tests/test_settings.py)."""
    code = f"""
import sys
sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
import torch, test_fused
fl, fp, seen = test_fused._gpt_loop_without_reads("fused", 6)
sl, sp, _ = test_fused._gpt_loop_without_reads("strict", 6)
runs = [b[1] - a[1] for a, b in zip(seen, seen[1:])]
assert runs == [1] * 5, runs  # each step's first op launches the last step
assert all(s[2] == 0 for s in seen), seen  # no backward pass launched anything
assert seen[3][0] == seen[-1][0], seen  # steady: nothing compiles
for a, b in zip(fl, sl):
    assert abs(a - b) <= 1e-5 * abs(b), (a, b)
for a, b in zip(fp, sp):
    torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)
print("OK")
"""
    env = dict(os.environ, TORCHTPU_STEP_BOUNDARY="optimizer")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "OK" in r.stdout, r.stdout[-2000:] + r.stderr[-3000:]
