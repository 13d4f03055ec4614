"""Autograd and torch's device guard over several local devices
(TORCHTPU_NUM_DEVICES=4 on the CPU plugin): backward on tpu:1 and above runs
on the autograd engine's worker thread for that device, which torchtpu's
device guard (torchtpu._device_guard) makes exist. The cases run in one child
process (a start costs seconds) that reports each case; every case is a test
here, as in test_local_devices.py."""

import textwrap

import pytest
from _child import ChildCases

CHILD = textwrap.dedent(r"""
    import threading
    import torchtpu
    from torchtpu import _native

    def after_case():
        torch.tpu.set_device(0)

    def grads(dev):
        torch.manual_seed(0)
        x, w = torch.randn(5, 4), torch.randn(4, 3)
        xd = x.to(dev).requires_grad_()
        wd = w.to(dev).requires_grad_()
        (torch.tanh(xd @ wd) * xd.sum(1, keepdim=True)).sum().backward()
        xc, wc = x.clone().requires_grad_(), w.clone().requires_grad_()
        (torch.tanh(xc @ wc) * xc.sum(1, keepdim=True)).sum().backward()
        return xd.grad, wd.grad, xc.grad, wc.grad

    @case
    def guard_is_torchtpus():
        assert _native.DEVICE_GUARD == "torchtpu", _native.DEVICE_GUARD
        assert torch.accelerator.device_count() == 4

    @case
    def backward_on_tpu1():
        gx, gw, cx, cw = grads("tpu:1")
        assert gx.device == torch.device("tpu", 1) and gw.device == torch.device("tpu", 1)
        same(gx, cx, 1e-5)
        same(gw, cw, 1e-5)

    @case
    def backward_on_tpu3():
        gx, gw, cx, cw = grads("tpu:3")
        assert gx.device == torch.device("tpu", 3)
        same(gx, cx, 1e-5)
        same(gw, cw, 1e-5)

    @case
    def backward_keeps_the_callers_device():
        # autograd's worker threads set their own device; the caller's stays
        torch.tpu.set_device(1)
        x = torch.randn(3, device="tpu:3", requires_grad=True)
        (x * 2).sum().backward()
        assert torch.tpu.current_device() == 1
        assert torch.accelerator.current_device_index() == 1
        assert torch.empty(1, device="tpu").device == torch.device("tpu", 1)

    @case
    def backward_across_devices():
        x = torch.randn(4, 3)
        a = x.to("tpu:1").requires_grad_()
        b = (a * a).to("tpu:2")
        (b.sin()).sum().backward()
        assert a.grad.device == torch.device("tpu", 1)
        same(a.grad, 2 * x * torch.cos(x * x), 1e-5)

    @case
    def mlp_sgd_on_tpu2():
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
        md = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
        md.load_state_dict(m.state_dict())
        md = md.to("tpu:2")
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        optd = torch.optim.SGD(md.parameters(), lr=0.1)
        for _ in range(3):
            x, y = torch.randn(8, 6), torch.randint(0, 3, (8,))
            for mod, o, xx, yy in ((m, opt, x, y), (md, optd, x.to("tpu:2"), y.to("tpu:2"))):
                o.zero_grad()
                torch.nn.functional.cross_entropy(mod(xx), yy).backward()
                o.step()
        for p, pd in zip(m.parameters(), md.parameters()):
            assert pd.device == torch.device("tpu", 2)
            same(pd.detach(), p.detach(), 1e-5)

    @case
    def compiled_backward_on_tpu1():
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 2))
        x = torch.randn(3, 4)
        m(x).sum().backward()
        want = [p.grad.clone() for p in m.parameters()]
        m.zero_grad()
        f = torch.compile(m.to("tpu:1"), backend="tpu")
        out = f(x.to("tpu:1"))
        assert out.device == torch.device("tpu", 1)
        out.sum().backward()
        for p, g in zip(m.parameters(), want):
            assert p.grad.device == torch.device("tpu", 1)
            same(p.grad, g, 1e-5)

    @case
    def fused_backward_on_tpu2():
        with torchtpu.eager_mode("fused"):
            gx, gw, cx, cw = grads("tpu:2")
            assert gx.device == torch.device("tpu", 2)
            same(gx, cx, 1e-5)
            same(gw, cw, 1e-5)

    @case
    def set_device_is_torchs_current_device():
        torch.tpu.set_device(2)
        assert torch.tpu.current_device() == 2 and torch.accelerator.current_device_index() == 2
        torch.accelerator.set_device_index(3)
        assert torch.tpu.current_device() == 3
        with torch.tpu.device(1):
            assert torch.accelerator.current_device_index() == 1
            assert torch.empty(2, device="tpu").device == torch.device("tpu", 1)
        assert torch.tpu.current_device() == 3
        with torch.accelerator.device_index(2):
            assert torch.tpu.current_device() == 2
        assert torch.tpu.current_device() == 3

    @case
    def current_device_is_per_thread():
        # as CUDA's: a new thread starts on device 0 and moves only its own
        torch.tpu.set_device(2)
        seen = []

        def run():
            seen.append(torch.tpu.current_device())
            torch.tpu.set_device(3)
            seen.append(torch.empty(1, device="tpu").device.index)

        t = threading.Thread(target=run)
        t.start()
        t.join()
        assert seen == [0, 3], seen
        assert torch.tpu.current_device() == 2

""")

_cases = ChildCases(CHILD, {"TORCHTPU_NUM_DEVICES": "4"}, timeout=600)


CASES = [
    "guard_is_torchtpus",
    "backward_on_tpu1",
    "backward_on_tpu3",
    "backward_keeps_the_callers_device",
    "backward_across_devices",
    "mlp_sgd_on_tpu2",
    "compiled_backward_on_tpu1",
    "fused_backward_on_tpu2",
    "set_device_is_torchs_current_device",
    "current_device_is_per_thread",
]


@pytest.mark.parametrize("name", CASES)
def test_local_devices_autograd(name):
    _cases.check(name)


def test_every_case_is_listed():
    _cases.check_listed(CASES)
