"""Tensors laid over a mesh of local devices and programs over the whole mesh
(torchtpu.spmd), with TORCHTPU_NUM_DEVICES=4 on the CPU plugin. The test
process has one device: the cases run in one child process that reports each
case (a start costs seconds); every case is a test here."""

import os
import textwrap

import pytest
from _child import ChildCases

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = textwrap.dedent(r"""
    import sys
    import torchtpu
    from torchtpu import spmd
    from torchtpu.spmd import Mesh, Replicate, Shard

    sys.path.insert(0, EXAMPLES)
    import spmd_gpt

    def raises(exc, text, fn):
        try:
            fn()
        except exc as e:
            assert text in str(e), (text, str(e))
            return
        raise AssertionError(f"no {exc.__name__} ({text})")

    mesh4 = Mesh((4,), ("x",))
    mesh22 = Mesh((2, 2), ("dp", "tp"))

    @case
    def layouts_round_trip():
        g = torch.Generator().manual_seed(0)
        for dt in (torch.float32, torch.bfloat16, torch.int64, torch.bool):
            for shape in ((8,), (4, 6), (2, 4, 8), ()):
                x = (torch.randn(shape, generator=g) * 10).to(dt)
                layouts = [(mesh4, [Replicate()]), (mesh22, [Replicate(), Replicate()])]
                for d in range(len(shape)):
                    if shape[d] % 4 == 0:
                        layouts.append((mesh4, [Shard(d)]))
                    if shape[d] % 2 == 0:
                        layouts.append((mesh22, [Shard(d), Replicate()]))
                        layouts.append((mesh22, [Replicate(), Shard(d)]))
                if len(shape) >= 2 and shape[0] % 2 == 0 and shape[1] % 2 == 0:
                    layouts.append((mesh22, [Shard(1), Shard(0)]))
                for mesh, pl in layouts:
                    t = spmd.shard(x, mesh, pl)
                    assert t.device == torch.device("tpu", 0) and t.shape == x.shape and t.dtype == dt
                    assert torch.equal(t.cpu(), x), (dt, shape, pl)
                    assert spmd.sharding(t)[0] == mesh.shape
        assert spmd.sharding(torch.ones(2, device="tpu")) is None

    @case
    def layout_errors():
        raises(ValueError, "not divisible", lambda: spmd.shard(torch.ones(6, 4), mesh4, [Shard(0)]))
        raises(ValueError, "placements", lambda: spmd.shard(torch.ones(8), mesh22, [Shard(0)]))
        raises(ValueError, "two mesh axes", lambda: spmd.shard(torch.ones(8), mesh22, [Shard(0), Shard(0)]))
        raises(IndexError, "Shard(2)", lambda: spmd.shard(torch.ones(8), mesh4, [Shard(2)]))
        raises(TypeError, "placement", lambda: spmd.shard(torch.ones(8), mesh4, ["x"]))
        raises(ValueError, "this process has 4", lambda: Mesh((8,)))
        raises(ValueError, "partitioner", lambda: spmd.set_partitioner("magic"))

    @case
    def eager_ops_over_the_mesh():
        g = torch.Generator().manual_seed(1)
        x = torch.randn(8, 6, generator=g)
        w = torch.randn(6, 4, generator=g)
        xs = spmd.shard(x, mesh22, [Shard(0), Replicate()])
        ws = spmd.shard(w, mesh22, [Replicate(), Shard(1)])
        for name, got, want in [
            ("elementwise", (xs * 2).sin() + 1, (x * 2).sin() + 1),
            ("matmul", xs @ ws, x @ w),
            ("sum", xs.sum(), x.sum()),
            ("sum dim", xs.sum(1), x.sum(1)),
            ("softmax", torch.softmax(xs, -1), torch.softmax(x, -1)),
            ("mixed with one device", xs + torch.ones(6, device="tpu:0"), x + 1),
            ("transpose", xs.t().contiguous(), x.t()),
        ]:
            assert torch.allclose(got.cpu(), want, atol=1e-5), name
        assert spmd.sharding(xs * 2) == ((2, 2), (0, -1))  # the layout of the input of its shape
        assert abs((xs * xs).sum().item() - (x * x).sum().item()) < 1e-3
        before = torchtpu.metrics()["spmd_programs_run"]
        (xs + 1).cpu()
        assert torchtpu.metrics()["spmd_programs_run"] == before + 1

    @case
    def writes_into_a_mesh_tensor():
        x = torch.arange(16.0).reshape(4, 4)
        xs = spmd.shard(x, mesh4, [Shard(1)])
        xs.add_(1)
        assert spmd.sharding(xs) == ((4,), (-1, 0))
        xs.copy_(torch.full((4, 4), 7.0))  # host data written as the shards
        assert torch.equal(xs.cpu(), torch.full((4, 4), 7.0))
        xs.zero_()
        assert torch.equal(xs.cpu(), torch.zeros(4, 4))
        assert torch.equal(xs.to("tpu:2").cpu(), torch.zeros(4, 4))

    @case
    def constraint_inside_a_program():
        x0 = torch.arange(32.0).reshape(8, 4)
        x = spmd.shard(x0, mesh4, [Shard(0)])
        y = spmd.constrain(x * 2, mesh4, [Shard(1)])
        assert spmd.sharding(y) == ((4,), (-1, 0)) and torch.equal(y.cpu(), x0 * 2)
        with torchtpu.eager_mode("fused"):
            torch.tpu.synchronize()
            before = torchtpu.metrics()["spmd_programs_run"]
            z = spmd.constrain(x + 1, mesh4, [Replicate()])
            w = (z * z).sum(0)
            assert torch.equal(w.cpu(), ((x0 + 1) ** 2).sum(0))
            assert torchtpu.metrics()["spmd_programs_run"] == before + 1
        assert spmd.sharding(z) == ((4,), (-1, -1))
        # fused mode: refused when the program is built (the value is read)
        one = torch.ones(4, device="tpu")
        raises(RuntimeError, "not on a mesh", lambda: spmd.constrain(one, mesh4, [Shard(0)]).cpu())
        p = spmd.shard(torch.ones(8, 4), mesh4, [Shard(0)]).requires_grad_()
        spmd.constrain(p * 3, mesh4, [Replicate()]).sum().backward()
        assert torch.equal(p.grad.cpu(), torch.full((8, 4), 3.0)) and spmd.sharding(p.grad) is not None
        z = torch.zeros_like(p)  # laid out as p (a sharded parameter's optimizer state)
        assert spmd.sharding(z) == ((4,), (0, -1)) and torch.equal(z.cpu(), torch.zeros(8, 4))

    @case
    def sharded_parameters_take_a_quarter():
        base = [torch.tpu.memory_allocated(i) for i in range(4)]
        w = torch.randn(1024, 64)
        rep = spmd.shard(w, mesh4, [Replicate()])
        mid = [torch.tpu.memory_allocated(i) - b for i, b in zip(range(4), base)]
        shd = spmd.shard(w, mesh4, [Shard(0)])
        end = [torch.tpu.memory_allocated(i) - b - m for i, b, m in zip(range(4), base, mid)]
        assert mid == [1024 * 64 * 4] * 4, mid
        assert end == [1024 * 64 * 4 // 4] * 4, end
        del rep, shd

    @case
    def views_over_the_mesh():
        # a view's offset is a constant of a program over the mesh (the
        # partitioner slices a split tensor only at known places): programs
        # alike but for their views' offsets are not confused, and writes
        # through views land where they belong
        x0 = torch.arange(64.0).reshape(8, 8)
        x = spmd.shard(x0, mesh22, [Shard(0), Shard(1)])
        with torchtpu.eager_mode("fused"):
            for off in (0, 2, 5):
                assert torch.equal((x[:, off : off + 3] * 2).cpu(), x0[:, off : off + 3] * 2), off
                assert torch.equal((x[off : off + 2].t() + 1).cpu(), x0[off : off + 2].t() + 1), off
                assert torch.equal(x.view(8, 2, 4)[:, 1, off % 4].cpu(), x0.view(8, 2, 4)[:, 1, off % 4]), off
                q, k, v = (x * 1).split([2, 2, 4], dim=1)
                want = x0[:, :2] @ x0[:, 2:4].t() + x0[:, 4:].sum(1, keepdim=True)
                assert torch.equal((q @ k.t() + v.sum(1, keepdim=True)).cpu(), want)
            y0, y = x0.clone(), spmd.shard(x0, mesh22, [Shard(0), Shard(1)])
            for off in (1, 3):
                y[:, off : off + 2].mul_(3)
                y0[:, off : off + 2].mul_(3)
                y[off].add_(1)
                y0[off].add_(1)
            assert torch.equal(y.cpu(), y0) and spmd.sharding(y) == ((2, 2), (0, 1))

    @case
    def host_batch_goes_to_each_device():
        # a host batch: each device is sent its own block, nothing through tpu:0
        for dt in (torch.float32, torch.bfloat16, torch.int64, torch.bool):
            x = (torch.randn(8, 6) * 10).to(dt)
            for mesh, pl, copies in [
                (mesh4, [Shard(0)], 1),
                (mesh22, [Shard(0), Replicate()], 2),
                (mesh22, [Shard(1), Shard(0)], 1),
                (mesh4, [Replicate()], 4),
            ]:
                m0 = torchtpu.metrics()
                t = spmd.shard(x, mesh, pl)
                m1 = torchtpu.metrics()
                assert m1["h2d_bytes"] - m0["h2d_bytes"] == copies * x.numel() * x.element_size(), (dt, pl)
                assert m1["d2h_bytes"] == m0["d2h_bytes"] and m1["d2d_bytes"] == m0["d2d_bytes"], (dt, pl)
                assert torch.equal(t.cpu(), x), (dt, pl)
        x = torch.randn(8, 6)
        xt = x.t()  # not contiguous: laid out from its contiguous copy
        assert torch.equal(spmd.shard(xt, mesh4, [Shard(1)]).cpu(), xt)
        p = torch.nn.Parameter(torch.randn(8, 4))  # a host parameter cannot change device in place
        raises(ValueError, "move it (or the module) to tpu first", lambda: spmd.shard_(p, mesh4, [Shard(0)]))
        assert p.device.type == "cpu"
        # a tpu tensor (from tpu:0 through the host) and a tensor already on a mesh
        y = spmd.shard(x.to("tpu"), mesh4, [Shard(0)])
        z = spmd.shard(y, mesh22, [Replicate(), Shard(1)])
        assert torch.equal(z.cpu(), x) and spmd.sharding(z) == ((2, 2), (-1, 1))
        raises(ValueError, "not divisible", lambda: spmd.shard(torch.ones(6, 4), mesh4, [Shard(0)]))

    @case
    def layouts_from_the_partitioner():
        # square projections of two layouts (column- then row-parallel): each
        # gradient takes its own parameter's layout, the saved activation is
        # split over both axes, all as XLA's partitioner chose them
        torch.manual_seed(0)
        q, o = torch.nn.Linear(8, 8, bias=False), torch.nn.Linear(8, 8, bias=False)
        qt, ot = torch.nn.Linear(8, 8, bias=False).to("tpu"), torch.nn.Linear(8, 8, bias=False).to("tpu")
        qt.load_state_dict(q.state_dict())
        ot.load_state_dict(o.state_dict())
        spmd.shard_(qt.weight, mesh22, [Replicate(), Shard(0)])
        spmd.shard_(ot.weight, mesh22, [Replicate(), Shard(1)])
        x = torch.randn(4, 8)
        with torchtpu.eager_mode("fused"):
            torch.tpu.synchronize()
            m0 = torchtpu.metrics()
            h = torch.relu(qt(spmd.shard(x, mesh22, [Shard(0), Replicate()])))
            loss = ot(h).square().sum()
            loss.backward()
            torch.tpu.synchronize()
            m1 = torchtpu.metrics()
        torch.relu(q(x)).matmul(o.weight.t()).square().sum().backward()
        assert spmd.sharding(h) == ((2, 2), (0, 1)), spmd.sharding(h)  # batch over dp, features over tp
        assert spmd.sharding(qt.weight.grad) == spmd.sharding(qt.weight) == ((2, 2), (1, -1))
        assert spmd.sharding(ot.weight.grad) == spmd.sharding(ot.weight) == ((2, 2), (-1, 1))
        assert torch.allclose(qt.weight.grad.cpu(), q.weight.grad, atol=1e-5)
        assert torch.allclose(ot.weight.grad.cpu(), o.weight.grad, atol=1e-5)
        assert m1["spmd_layouts_chosen"] - m0["spmd_layouts_chosen"] >= 3
        assert m1["spmd_layout_fallbacks"] == m0["spmd_layout_fallbacks"]
        # a layout a mesh sharding cannot say (GSPMD lays a reversed split in
        # reversed device order): the program is compiled again with the
        # rule's layouts declared, and the value is right
        spmd.set_partitioner("gspmd")
        try:
            x0 = torch.arange(16.0)
            y = torch.flip(spmd.shard(x0, mesh4, [Shard(0)]), [0]) * 2
            before = torchtpu.metrics()["spmd_layout_fallbacks"]
            assert torch.equal(y.cpu(), torch.flip(x0, [0]) * 2)
            assert torchtpu.metrics()["spmd_layout_fallbacks"] == before + 1
            assert spmd.sharding(y) == ((4,), (0,))
        finally:
            spmd.set_partitioner("shardy")

    @case
    def one_program_per_step_over_a_mesh():
        # once a tensor is on a mesh the optimizer steps end a step's program
        # (TORCHTPU_STEP_BOUNDARY=auto): forward, backward and the optimizer
        # step are one program, saved activations never leave it
        small = dict(n_layer=1, n_embd=32, n_head=2, block_size=16)
        m0 = torchtpu.metrics()
        got, _, programs, _ = spmd_gpt.run("2x2", 4, "fused", batch_size=8, **small)
        m1 = torchtpu.metrics()
        assert programs == 4, programs
        assert m1["flushes_backward"] == m0["flushes_backward"]
        assert m1["backward_passes"] - m0["backward_passes"] == 4
        # two optimizers stepped one after the other, nothing read back: the
        # first op after them launches the step, one program per step
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4)).to("tpu")
        ref = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4))
        ref.load_state_dict({k: v.cpu() for k, v in net.state_dict().items()})
        spmd.shard_(net[0].weight, mesh22, [Replicate(), Shard(0)])
        opts = [torch.optim.SGD(net[0].parameters(), lr=0.1), torch.optim.Adam(net[2].parameters(), lr=0.01)]
        ropts = [torch.optim.SGD(ref[0].parameters(), lr=0.1), torch.optim.Adam(ref[2].parameters(), lr=0.01)]
        data = [torch.randn(8, 8) for _ in range(5)]
        runs, losses = [], []
        with torchtpu.eager_mode("fused"):
            for x in data:
                m0 = torchtpu.metrics()["spmd_programs_run"]
                for mod, os_, xx in ((net, opts, spmd.shard(x, mesh22, [Shard(0), Replicate()])), (ref, ropts, x)):
                    for o in os_:
                        o.zero_grad()
                    loss = mod(xx).square().mean()
                    loss.backward()
                    for o in os_:
                        o.step()
                    losses.append(loss)
                runs.append(torchtpu.metrics()["spmd_programs_run"] - m0)
        assert runs[1:] == [1] * 4, runs  # the first iteration only records
        for a, b in zip(losses[0::2], losses[1::2]):
            assert abs(a.item() - b.item()) <= 1e-5, (a, b)
        for a, b in zip(net.parameters(), ref.parameters()):
            torch.testing.assert_close(a.detach().cpu(), b.detach(), rtol=1e-4, atol=1e-5)

    @case
    def fused_recording_is_one_program():
        x = spmd.shard(torch.randn(8, 4), mesh4, [Shard(0)])
        with torchtpu.eager_mode("fused"):
            torch.tpu.synchronize()
            before = torchtpu.metrics()["spmd_programs_run"]
            y = ((x * 3).relu() @ torch.ones(4, 4, device="tpu")).sum(0)
            y.cpu()
            assert torchtpu.metrics()["spmd_programs_run"] == before + 1

    def check_training(mesh_kind, mode, partitioner, steps=10):
        spmd.set_partitioner(partitioner)
        try:
            small = dict(n_layer=1, n_embd=32, n_head=2, block_size=16)
            got, params, programs, _ = spmd_gpt.run(mesh_kind, steps, mode, batch_size=8, **small)
            ref, ref_params, _, _ = spmd_gpt.run("one", steps, mode, batch_size=8, **small)
        finally:
            spmd.set_partitioner("shardy")
        dl = max(abs(a - b) for a, b in zip(got, ref))
        dp = max((a - b).abs().max().item() for a, b in zip(params, ref_params))
        assert dl <= 1e-6, (mesh_kind, mode, partitioner, dl)
        assert dp <= 1e-4, (mesh_kind, mode, partitioner, dp)
        return programs / steps

    @case
    def data_parallel_step_fused():
        per_step = check_training("dp", "fused", "shardy")
        assert per_step <= 1.5, per_step  # the first step runs two

    @case
    def tensor_parallel_step_fused():
        assert check_training("2x2", "fused", "shardy") <= 1.5

    @case
    def tensor_parallel_step_gspmd():
        assert check_training("2x2", "fused", "gspmd") <= 1.5

    @case
    def data_parallel_step_compiled():
        small = dict(n_layer=1, n_embd=32, n_head=2, block_size=16)
        got, params, programs, _ = spmd_gpt.run("dp", 6, "fused", batch_size=8, compiled=True, **small)
        ref, ref_params, ref_programs, _ = spmd_gpt.run("one", 6, "fused", batch_size=8, compiled=True, **small)
        dl = max(abs(a - b) for a, b in zip(got, ref))
        dp = max((a - b).abs().max().item() for a, b in zip(params, ref_params))
        assert dl <= 1e-6 and dp <= 1e-4, (dl, dp)
        # the compiled forward and backward, and the optimizer's step: as many programs as on one device
        assert programs == ref_programs, (programs, ref_programs)

    @case
    def data_parallel_step_strict():
        check_training("dp", "strict", "shardy", steps=3)

    @case
    def data_parallel_step_graph():
        small = dict(n_layer=1, n_embd=32, n_head=2, block_size=16)
        got, params, programs, replays = spmd_gpt.run_graph("dp", 10, batch_size=8, **small)
        ref, ref_params, _, _ = spmd_gpt.run("one", 10, "fused", batch_size=8, **small)
        dl = max(abs(a - b) for a, b in zip(got, ref))
        dp = max((a - b).abs().max().item() for a, b in zip(params, ref_params))
        assert dl <= 1e-6 and dp <= 1e-4, (dl, dp)
        assert replays == 8 and programs == replays, (programs, replays)

""")

_cases = ChildCases(
    f"EXAMPLES = {os.path.join(ROOT, 'examples')!r}\n" + CHILD, {"TORCHTPU_NUM_DEVICES": "4"}, timeout=900
)


CASES = [
    "layouts_round_trip",
    "layout_errors",
    "eager_ops_over_the_mesh",
    "writes_into_a_mesh_tensor",
    "constraint_inside_a_program",
    "sharded_parameters_take_a_quarter",
    "views_over_the_mesh",
    "host_batch_goes_to_each_device",
    "layouts_from_the_partitioner",
    "fused_recording_is_one_program",
    "one_program_per_step_over_a_mesh",
    "data_parallel_step_fused",
    "tensor_parallel_step_fused",
    "tensor_parallel_step_gspmd",
    "data_parallel_step_compiled",
    "data_parallel_step_strict",
    "data_parallel_step_graph",
]


@pytest.mark.parametrize("name", CASES)
def test_spmd(name):
    _cases.check(name)


def test_every_case_is_listed():
    _cases.check_listed(CASES)
