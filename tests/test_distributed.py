"""torch.distributed on tpu (the "tpu" c10d backend): every collective and
dtype against gloo on CPU tensors in the same processes, sub-groups, async
work, functional collectives, fused mode, and failures that raise within
their timeout instead of hanging. World size 2, each run bounded in time
(tests/_dist.py)."""

import datetime
import os
import time

import pytest
import torch
import torch.distributed as dist
from _dist import run

R = dist.ReduceOp

# what gloo supports, and so what the host-staged transport supports
DTYPES = [
    torch.float32,
    torch.float64,
    torch.bfloat16,
    torch.float16,
    torch.int64,
    torch.int32,
    torch.int8,
    torch.uint8,
]


def _data(rank, dtype, n=6, salt=0):
    g = torch.Generator().manual_seed(100 * rank + salt)
    if dtype.is_floating_point:
        return torch.randn(n, generator=g).to(dtype)
    if dtype == torch.uint8:
        return torch.randint(0, 9, (n,), generator=g).to(dtype)
    return torch.randint(-9, 10, (n,), generator=g).to(dtype)


def _same(tpu, cpu, what):
    got = tpu.cpu()
    assert got.dtype == cpu.dtype and got.shape == cpu.shape, (what, got.dtype, cpu.dtype, got.shape, cpu.shape)
    assert torch.equal(got, cpu), (what, got, cpu)


def _ops_for(dtype):
    ops = [R.SUM, R.PRODUCT, R.MIN, R.MAX, R.AVG]
    if not dtype.is_floating_point:
        ops += [R.BAND, R.BOR, R.BXOR]
    else:
        ops.append("premul")
    return ops


def _op(op, factor=0.5):
    return dist._make_nccl_premul_sum(factor) if op == "premul" else op


def _gloo_allreduce(x, op, gloo, world):
    """What the tpu's all_reduce must give: gloo on CPU, with AVG and
    PREMUL_SUM spelled out (gloo lacks both)."""
    if op == R.AVG:
        dist.all_reduce(x, group=gloo)
        return x / world if x.is_floating_point() else torch.div(x, world, rounding_mode="trunc")
    if op == "premul":
        x.mul_(0.5)
        dist.all_reduce(x, group=gloo)
        return x
    dist.all_reduce(x, op=op, group=gloo)
    return x


def _collectives(rank, world):
    gloo = dist.new_group(backend="gloo")
    assert dist.get_backend_config() == "tpu:tpu", dist.get_backend_config()  # init_process_group() chose it
    checked = 0
    for dt in DTYPES:
        for op in _ops_for(dt):
            x = _data(rank, dt)
            t = x.to("tpu")
            dist.all_reduce(t, op=_op(op))
            _same(t, _gloo_allreduce(x.clone(), op, gloo, world), f"all_reduce {dt} {op}")
            checked += 1
        x = _data(rank, dt, salt=1)
        # all_gather (list) and all_gather_into_tensor
        outs = [torch.empty(6, dtype=dt, device="tpu") for _ in range(world)]
        dist.all_gather(outs, x.to("tpu"))
        want = [torch.empty(6, dtype=dt) for _ in range(world)]
        dist.all_gather(want, x, group=gloo)
        for o, w in zip(outs, want):
            _same(o, w, f"all_gather {dt}")
        big = torch.empty(6 * world, dtype=dt, device="tpu")
        dist.all_gather_into_tensor(big, x.to("tpu"))
        _same(big, torch.cat(want), f"all_gather_into_tensor {dt}")
        # reduce_scatter (list) and reduce_scatter_tensor, SUM and AVG
        for op in (R.SUM, R.AVG, R.MAX):
            xs = _data(rank, dt, n=4 * world, salt=2)
            out = torch.empty(4, dtype=dt, device="tpu")
            dist.reduce_scatter_tensor(out, xs.to("tpu"), op=op)
            full = _gloo_allreduce(xs.clone(), op, gloo, world)
            _same(out, full[4 * rank : 4 * rank + 4], f"reduce_scatter_tensor {dt} {op}")
            out = torch.empty(4, dtype=dt, device="tpu")
            dist.reduce_scatter(out, [c.to("tpu") for c in xs.chunk(world)], op=op)
            _same(out, full[4 * rank : 4 * rank + 4], f"reduce_scatter {dt} {op}")
        # broadcast, reduce
        for src in range(world):
            b = x.to("tpu")
            dist.broadcast(b, src)
            w = x.clone()
            dist.broadcast(w, src, group=gloo)
            _same(b, w, f"broadcast {dt} from {src}")
        r = x.to("tpu")
        dist.reduce(r, 0, op=R.SUM)
        w = x.clone()
        dist.reduce(w, 0, op=R.SUM, group=gloo)
        _same(r, w if rank == 0 else x, f"reduce {dt}")
        # all_to_all_single, equal and uneven splits; all_to_all (list)
        xa = _data(rank, dt, n=2 * world, salt=3)
        a = torch.empty(2 * world, dtype=dt, device="tpu")
        dist.all_to_all_single(a, xa.to("tpu"))
        w = torch.empty(2 * world, dtype=dt)
        dist.all_to_all_single(w, xa, group=gloo)
        _same(a, w, f"all_to_all_single {dt}")
        ins, outs_ = [1 + rank, 3 - rank], [1 + 0, 1 + 1] if rank == 0 else [3, 2]
        xu = _data(rank, dt, n=sum(ins), salt=4)
        a = torch.empty(sum(outs_), dtype=dt, device="tpu")
        dist.all_to_all_single(a, xu.to("tpu"), outs_, ins)
        w = torch.empty(sum(outs_), dtype=dt)
        dist.all_to_all_single(w, xu, outs_, ins, group=gloo)
        _same(a, w, f"all_to_all_single uneven {dt}")
        lo = [torch.empty(2, dtype=dt, device="tpu") for _ in range(world)]
        dist.all_to_all(lo, [c.to("tpu") for c in xa.chunk(world)])
        lw = [torch.empty(2, dtype=dt) for _ in range(world)]
        dist.all_to_all(lw, list(xa.chunk(world)), group=gloo)
        for o, w in zip(lo, lw):
            _same(o, w, f"all_to_all {dt}")
        # scatter, gather
        s = torch.empty(6, dtype=dt, device="tpu")
        parts = [_data(k, dt, salt=5) for k in range(world)]
        dist.scatter(s, [p.to("tpu") for p in parts] if rank == 0 else None, src=0)
        _same(s, parts[rank], f"scatter {dt}")
        gl = [torch.empty(6, dtype=dt, device="tpu") for _ in range(world)] if rank == 1 else None
        dist.gather(x.to("tpu"), gl, dst=1)
        if rank == 1:
            for o, w in zip(gl, want):
                _same(o, w, f"gather {dt}")
        checked += 12
    return checked


def test_every_collective_and_dtype_equals_gloo_on_cpu():
    checked = run(_collectives, timeout_s=300)
    assert checked[0] == checked[1] > 100


def _point_to_point_groups_async(rank, world):
    other = 1 - rank
    # send/recv, isend/irecv, batch_isend_irecv
    if rank == 0:
        dist.send(torch.arange(5.0, device="tpu"), 1)
    else:
        r = torch.zeros(5, device="tpu")
        dist.recv(r, 0)
        _same(r, torch.arange(5.0), "recv")
    out = torch.zeros(3, dtype=torch.bfloat16, device="tpu")
    reqs = [
        dist.isend(torch.full((3,), float(rank + 1), dtype=torch.bfloat16, device="tpu"), other),
        dist.irecv(out, other),
    ]
    for q in reqs:
        q.wait()
    _same(out, torch.full((3,), float(other + 1), dtype=torch.bfloat16), "isend/irecv")
    got = torch.zeros(4, device="tpu")
    ops = [
        dist.P2POp(dist.isend, torch.full((4,), 10.0 + rank, device="tpu"), other),
        dist.P2POp(dist.irecv, got, other),
    ]
    for q in dist.batch_isend_irecv(ops):
        q.wait()
    _same(got, torch.full((4,), 10.0 + other), "batch_isend_irecv")
    # async_op=True: the Work waits, its future carries the tensors
    t = torch.full((4,), float(rank + 1), device="tpu")
    w = dist.all_reduce(t, async_op=True)
    w.wait()
    assert w.is_completed()
    _same(t, torch.full((4,), 3.0), "async all_reduce")
    fut = dist.all_reduce(torch.ones(2, device="tpu"), async_op=True).get_future()
    _same(fut.wait()[0], torch.full((2,), 2.0), "future of all_reduce")
    # a view as the tensor (non-contiguous) and an empty tensor
    m = torch.arange(12.0, device="tpu").view(3, 4) * (rank + 1)
    col = m[:, 1]
    dist.all_reduce(col)
    want = torch.arange(12.0).view(3, 4) * (rank + 1)
    want[:, 1] = torch.arange(12.0).view(3, 4)[:, 1] * 3
    _same(m, want, "a column view")
    dist.all_reduce(torch.empty(0, device="tpu"))
    # coalesced: one flat collective per dtype
    ts = [torch.full((2,), 1.0 + rank, device="tpu"), torch.full((3,), 2 + rank, dtype=torch.int64, device="tpu")]
    with dist._coalescing_manager(async_ops=True) as cm:
        for x in ts:
            dist.all_reduce(x)
    cm.wait()
    _same(ts[0], torch.full((2,), 3.0), "coalesced f32")
    _same(ts[1], torch.full((3,), 5, dtype=torch.int64), "coalesced i64")
    ts = [torch.full((2,), 1.0 + rank, device="tpu"), torch.full((2, 2), 3.0 * rank, device="tpu")]
    dist.all_reduce_coalesced(ts)
    _same(ts[1], torch.full((2, 2), 3.0), "all_reduce_coalesced")
    # sub-groups: every rank alone, then both
    for k in range(world):
        g = dist.new_group([k])
        if rank == k:
            t = torch.full((2,), 4.0, device="tpu")
            dist.all_reduce(t, group=g)
            _same(t, torch.full((2,), 4.0), "single-rank group")
    g = dist.new_group([1, 0])
    t = torch.full((2,), float(rank), device="tpu")
    dist.all_reduce(t, group=g, op=R.MAX)
    _same(t, torch.full((2,), 1.0), "sub-group")
    # complex tensors (torch hands the backend their real view)
    gloo = dist.new_group(backend="gloo")
    z = torch.complex(torch.arange(3.0), torch.ones(3) * (rank + 1))
    zt = z.to("tpu")
    dist.all_reduce(zt)
    dist.all_reduce(z, group=gloo)
    _same(zt, z, "complex all_reduce")
    zl = [torch.empty(3, dtype=torch.complex64, device="tpu") for _ in range(world)]
    dist.all_gather(zl, zt)
    _same(torch.stack(zl), torch.stack([z, z]), "complex all_gather")
    # CPU tensors on the same group go to gloo directly
    c = torch.full((2,), rank + 1.0)
    dist.all_reduce(c, op=R.AVG)
    _same(c, torch.full((2,), 1.5), "cpu all_reduce AVG")
    # objects (torch moves their bytes through tpu tensors: the tpu is the
    # group's device)
    objs = [None] * world
    dist.all_gather_object(objs, {"rank": rank})
    assert objs == [{"rank": 0}, {"rank": 1}]
    lst = [rank * 7] if rank == 0 else [None]
    dist.broadcast_object_list(lst, src=0)
    assert lst == [0]
    dist.barrier()
    return True


def test_point_to_point_async_coalesced_and_groups():
    assert run(_point_to_point_groups_async) == [True, True]


def _functional_and_modes(rank, world):
    import torch.distributed._functional_collectives as fc

    import torchtpu

    x = torch.arange(4.0) + rank
    want_sum = torch.arange(4.0) * 2 + 1
    want_gather = torch.cat([torch.arange(4.0), torch.arange(4.0) + 1])
    for mode in ("debug", "strict", "fused"):
        with torchtpu.eager_mode(mode):
            t = x.to("tpu") * 2  # an op before the collective: it must run first
            r = fc.all_reduce(t, "sum", dist.group.WORLD)
            _same(r * 1, want_sum * 2, f"functional all_reduce ({mode})")
            _same(fc.all_gather_tensor(x.to("tpu"), 0, dist.group.WORLD), want_gather, f"all_gather_tensor ({mode})")
            rs = fc.reduce_scatter_tensor(x.to("tpu"), "avg", 0, dist.group.WORLD)
            _same(rs, (want_sum / 2)[2 * rank : 2 * rank + 2], f"reduce_scatter_tensor ({mode})")
            y = x.to("tpu") + 1
            dist.all_reduce(y)
            _same(y - 2, want_sum, f"all_reduce then an op ({mode})")

    def step(v):
        return fc.all_reduce(v * 3, "sum", dist.group.WORLD) + 1

    compiled = torch.compile(step, backend="tpu")
    _same(compiled(x.to("tpu")), want_sum * 3 + 1, "torch.compile with a functional collective")
    return True


def test_functional_collectives_in_every_mode_and_compiled():
    assert run(_functional_and_modes) == [True, True]


def _skips_a_collective(rank, world):
    t = torch.ones(4, device="tpu")
    if rank == 0:
        start = time.monotonic()
        try:
            dist.all_reduce(t)
        except RuntimeError as e:
            msg = str(e)
            assert "all_reduce" in msg and "rank 0 of 2" in msg, msg
            return time.monotonic() - start
        raise AssertionError("the all_reduce that rank 1 never joined returned")
    time.sleep(6)  # rank 1 calls nothing: rank 0's collective must time out
    return 0.0


def test_a_collective_one_rank_skips_raises_within_its_timeout():
    waited = run(_skips_a_collective, collective_timeout_s=2, timeout_s=120)[0]
    assert 1.5 <= waited < 30, waited


def _mismatched(rank, world):
    seen = []
    calls = [
        # (rank 0's call, rank 1's call): gloo would abort the process on the
        # first (sizes differ), wait out the timeout on the second, and give
        # wrong values silently on the third (reduce ops differ)
        (lambda: dist.all_reduce(torch.ones(4, device="tpu")), lambda: dist.all_reduce(torch.ones(8, device="tpu"))),
        (lambda: dist.all_reduce(torch.ones(4, device="tpu")), lambda: dist.broadcast(torch.ones(4, device="tpu"), 1)),
        (
            lambda: dist.all_reduce(torch.ones(4, device="tpu")),
            lambda: dist.all_reduce(torch.ones(4, device="tpu"), op=dist.ReduceOp.MAX),
        ),
        (
            lambda: dist.all_reduce(torch.ones(4, device="tpu")),
            lambda: dist.all_reduce(torch.ones(4, device="tpu").long()),
        ),
    ]
    for mine in calls:
        try:
            mine[rank]()
        except RuntimeError as e:
            assert "collective mismatch" in str(e), e
            seen.append(str(e).split("(rank 0: ")[1])
        else:
            raise AssertionError("a mismatched collective returned")
    t = torch.ones(2, device="tpu")
    dist.all_reduce(t)  # the group still works
    _same(t, torch.full((2,), 2.0), "all_reduce after mismatches")
    return seen


def test_mismatched_collectives_raise_on_every_rank_naming_both():
    got = run(_mismatched, collective_timeout_s=20)
    assert got[0] == got[1]
    assert got[0][0].startswith("all_reduce(float32, 4 elements, ReduceOp.SUM); rank 1: all_reduce(float32, 8 el"), got
    assert "rank 1: broadcast(float32, 4 elements, root 1)" in got[0][1], got
    assert "ReduceOp.MAX" in got[0][2] and "int64" in got[0][3], got


def _unchecked(rank, world):
    t = torch.ones(4, device="tpu")
    dist.all_reduce(t, op=dist.ReduceOp.SUM if rank == 0 else dist.ReduceOp.MAX)
    return t.cpu().tolist()


def test_collective_checks_can_be_turned_off(monkeypatch):
    # without the comparison, a reduce-op mismatch runs to the end with
    # neither SUM's nor MAX's result (gloo mixes the ranks' ops, chunk by
    # chunk): what the check catches
    monkeypatch.setenv("TORCHTPU_COLLECTIVE_CHECKS", "0")
    r0, r1 = run(_unchecked)
    assert r0 != r1 or r0 not in ([2.0] * 4, [1.0] * 4), (r0, r1)


def _dies(rank, world):
    if rank == 1:
        os._exit(3)
    t = torch.ones(4, device="tpu")
    try:
        dist.broadcast(t, 1)
    except RuntimeError as e:
        assert "broadcast" in str(e), e
        return True
    raise AssertionError("the broadcast from a dead rank returned")


def test_a_dead_rank_is_an_error_on_the_others():
    assert run(_dies, collective_timeout_s=6, timeout_s=120, may_exit={1}) == [True, None]


def _raised(call):
    try:
        call()
    except Exception as e:  # noqa: BLE001 (the type is what is compared)
        return type(e)
    return None


def _bad_arguments(rank, world):
    gloo = dist.new_group(backend="gloo")
    tpu = dist.new_group()  # both sub-groups: torch checks their ranks the same way
    cases = {
        "broadcast from no such rank": lambda d, g: dist.broadcast(torch.ones(4, device=d), 5, group=g),
        "all_gather_into_tensor, wrong output size": lambda d, g: dist.all_gather_into_tensor(
            torch.empty(3, device=d), torch.ones(4, device=d), group=g
        ),
        "reduce_scatter_tensor, wrong output size": lambda d, g: dist.reduce_scatter_tensor(
            torch.empty(3, device=d), torch.ones(4, device=d), group=g
        ),
        "all_to_all_single, splits that do not add up": lambda d, g: dist.all_to_all_single(
            torch.empty(4, device=d), torch.ones(4, device=d), [1, 1], [3, 3], group=g
        ),
    }
    for what, call in cases.items():
        want = _raised(lambda: call("cpu", gloo))
        assert want is not None, what
        got = _raised(lambda: call("tpu", tpu))
        assert got is not None and issubclass(got, want), (what, got, want)
    t = torch.ones(4, device="tpu")
    dist.all_reduce(t)  # the group still works
    _same(t, torch.full((4,), 2.0), "all_reduce after the errors")
    return True


def test_bad_arguments_raise_and_leave_the_group_usable():
    assert run(_bad_arguments) == [True, True]


def test_init_with_bad_arguments_raises():
    with pytest.raises(RuntimeError, match="rank 2 and world_size 2"):  # gloo's type, in words
        dist.init_process_group("tpu", rank=2, world_size=2, store=dist.HashStore())
    with pytest.raises((ValueError, RuntimeError)):
        dist.init_process_group("tpu:tpu:tpu", rank=0, world_size=1, store=dist.HashStore())
    assert not dist.is_initialized()


def test_a_collective_inside_a_graph_capture_is_refused():
    store = dist.HashStore()
    dist.init_process_group("tpu", rank=0, world_size=1, store=store, timeout=datetime.timedelta(seconds=10))
    try:
        y = torch.ones(4, device="tpu")
        g = torch.tpu.TPUGraph()
        with pytest.raises(RuntimeError, match="all_reduce inside a torch.tpu.graph capture"):
            with torch.tpu.graph(g):
                y.mul_(2)
                dist.all_reduce(y)
        dist.all_reduce(y)  # outside the capture it runs
        _same(y, torch.ones(4), "all_reduce after the refused capture")
    finally:
        dist.destroy_process_group()


def test_single_process_group_of_one():
    store = dist.HashStore()
    dist.init_process_group("tpu", rank=0, world_size=1, store=store, timeout=datetime.timedelta(seconds=10))
    try:
        t = torch.arange(3.0, device="tpu")
        dist.all_reduce(t, op=R.AVG)
        _same(t, torch.arange(3.0), "world of one")
        c = torch.arange(3.0)
        dist.all_reduce(c)  # CPU tensors on backend="tpu"
        _same(c, torch.arange(3.0), "cpu on backend tpu")
    finally:
        dist.destroy_process_group()
