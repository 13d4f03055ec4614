"""Several local devices in one process (TORCHTPU_NUM_DEVICES=4 on the CPU
plugin): tpu:0 .. tpu:3 are real. The test process has one device, so the
cases run in one child process (a start costs seconds) that reports each
case; every case is a test here."""

import textwrap

import pytest
from _child import ChildCases

CHILD = textwrap.dedent(r"""
    import torchtpu

    @case
    def count_and_current():
        assert torch.tpu.device_count() == 4
        assert torch.tpu.current_device() == 0
        assert torch.accelerator.device_count() == 4

    @case
    def tensors_live_where_asked():
        for i in range(4):
            for t in (torch.ones(3, device=f"tpu:{i}"), torch.arange(5, device=f"tpu:{i}"),
                      torch.randn(2, 2).to(f"tpu:{i}"), torch.empty(4, device=torch.device("tpu", i)),
                      torch.zeros(2, 3, device=f"tpu:{i}").t()):
                assert t.device == torch.device("tpu", i), (i, t.device)

    @case
    def ops_run_on_their_device():
        x = torch.randn(8, 5)
        w = torch.randn(5, 3)
        for i in range(4):
            a, b = x.to(f"tpu:{i}"), w.to(f"tpu:{i}")
            y = torch.relu(a @ b) + 1
            assert y.device == torch.device("tpu", i)
            same(y, torch.relu(x @ w) + 1, 1e-5)
            s = y.sum(0)
            assert s.device == a.device and s[1].item() == s.cpu()[1].item()

    @case
    def copies_between_devices():
        src = torch.arange(12.0).reshape(3, 4)
        a = src.to("tpu:1")
        b = a.to("tpu:3")
        assert b.device == torch.device("tpu", 3)
        same(b, src)
        view = a[:, 1:3]
        c = view.to("tpu:2")
        same(c, src[:, 1:3])
        d = torch.zeros(3, 4, device="tpu:0")
        d[1].copy_(a[2])
        same(d, torch.stack([torch.zeros(4), src[2], torch.zeros(4)]))
        before = torchtpu.metrics()["d2d_bytes"]
        a.to("tpu:0")
        assert torchtpu.metrics()["d2d_bytes"] >= before + 48

    @case
    def mixed_devices_are_refused():
        a, b = torch.ones(2, device="tpu:1"), torch.ones(2, device="tpu:2")
        try:
            a + b
        except RuntimeError as e:
            assert "Expected all tensors to be on the same device" in str(e) and "tpu:1" in str(e), e
        else:
            raise AssertionError("no error")

    @case
    def invalid_ordinal():
        for bad in ("tpu:4", "tpu:9"):
            try:
                torch.ones(2, device=bad)
            except RuntimeError as e:
                assert "invalid device ordinal" in str(e), e
            else:
                raise AssertionError(bad)
        try:
            torch.tpu.set_device(4)
        except RuntimeError as e:
            assert "tpu:4: invalid device ordinal" in str(e), e
        else:
            raise AssertionError("set_device(4)")

    @case
    def current_device_selects():
        torch.tpu.set_device(2)
        try:
            assert torch.ones(1, device="tpu").device == torch.device("tpu", 2)
            assert torch.tpu.current_device() == 2
            with torch.tpu.device(3):
                assert torch.tpu.current_device() == 3
                assert torch.zeros(2, device="tpu").device == torch.device("tpu", 3)
            assert torch.tpu.current_device() == 2
        finally:
            torch.tpu.set_device(0)

    @case
    def memory_per_device():
        base = [torch.tpu.memory_allocated(i) for i in range(4)]
        t = torch.ones(1 << 18, device="tpu:2")  # 1 MiB
        t.add_(1)
        now = [torch.tpu.memory_allocated(i) for i in range(4)]
        # the tensor's bytes, give or take the engine's cached scalar inputs (8 bytes each)
        assert abs(now[2] - base[2] - (1 << 20)) <= 64, (base, now)
        assert all(abs(now[i] - base[i]) <= 64 for i in (0, 1, 3)), (base, now)
        assert torch.tpu.memory_allocated("tpu:2") == now[2]
        del t
        assert abs(torch.tpu.memory_allocated(2) - base[2]) <= 64

    @case
    def fused_mode_per_device():
        with torchtpu.eager_mode("fused"):
            x = torch.randn(16)
            a, b = x.to("tpu:1"), x.to("tpu:2")
            before = torchtpu.metrics()["flushes_device"]
            y = (a * 2).sin()
            z = (b * 3).cos()
            w = y + 1
            same(w, (x * 2).sin() + 1, 1e-6)
            same(z, (x * 3).cos(), 1e-6)
            assert torchtpu.metrics()["flushes_device"] > before
            assert w.device == torch.device("tpu", 1) and z.device == torch.device("tpu", 2)

    @case
    def debug_mode_per_device():
        with torchtpu.eager_mode("debug"):
            x = torch.randn(4, 4)
            same(torch.tanh(x.to("tpu:3")) * 2, torch.tanh(x) * 2, 1e-6)

    @case
    def graph_on_another_device():
        x = torch.randn(6, device="tpu:1")
        graph = torch.tpu.TPUGraph()
        with torch.tpu.graph(graph):
            out = x * 2 + 1
        x.copy_(torch.arange(6.0).to("tpu:1"))
        graph.replay()
        assert out.device == torch.device("tpu", 1)
        same(out, torch.arange(6.0) * 2 + 1)

    @case
    def compiled_forward_on_another_device():
        m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 2))
        x = torch.randn(3, 4)
        want = m(x)
        m2 = m.to("tpu:2")
        f = torch.compile(m2, backend="tpu")
        with torch.no_grad():
            got = f(x.to("tpu:2"))
        assert got.device == torch.device("tpu", 2)
        same(got, want.detach(), 1e-5)

    @case
    def random_ops_on_another_device():
        torch.manual_seed(0)
        a = torch.rand(1000, device="tpu:3")
        assert a.device == torch.device("tpu", 3)
        v = a.cpu()
        assert 0 <= v.min().item() and v.max().item() < 1 and abs(v.mean().item() - 0.5) < 0.05

    @case
    def backward_on_device_0_with_others_present():
        x = torch.randn(4, 4, device="tpu:0", requires_grad=True)
        (x * x).sum().backward()
        same(x.grad, 2 * x.detach().cpu(), 1e-6)

""")

_cases = ChildCases(CHILD, {"TORCHTPU_NUM_DEVICES": "4"}, timeout=600)


CASES = [
    "count_and_current",
    "tensors_live_where_asked",
    "ops_run_on_their_device",
    "copies_between_devices",
    "mixed_devices_are_refused",
    "invalid_ordinal",
    "current_device_selects",
    "memory_per_device",
    "fused_mode_per_device",
    "debug_mode_per_device",
    "graph_on_another_device",
    "compiled_forward_on_another_device",
    "random_ops_on_another_device",
    "backward_on_device_0_with_others_present",
]


@pytest.mark.parametrize("name", CASES)
def test_local_devices(name):
    _cases.check(name)


def test_every_case_is_listed():
    _cases.check_listed(CASES)
