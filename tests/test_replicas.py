"""torchtpu.replicas: replica-mode collectives over local devices, each against
the same computation on CPU tensors. The test process has one device, so every
case runs in one subprocess with TORCHTPU_NUM_DEVICES=4 that prints a line per
case; the tests read their lines."""

import functools
import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    r"""
    import json, torch, torchtpu
    from torchtpu import replicas as R

    results = {}

    def case(name):
        def wrap(f):
            try:
                f()
                results[name] = "ok"
            except Exception as e:  # reported to the test
                results[name] = f"{type(e).__name__}: {e}"
            return f
        return wrap

    DTYPES = {"float32": torch.float32, "int32": torch.int32, "bfloat16": torch.bfloat16}
    SHAPES = [(), (8,), (4, 3), (8, 2, 3)]

    def inputs(n, shape, dt, seed):
        g = torch.Generator().manual_seed(seed)
        if dt.is_floating_point:
            return [(torch.rand(shape, generator=g) * 4 - 2).to(dt) for _ in range(n)]
        return [torch.randint(-5, 6, shape, generator=g, dtype=dt) for _ in range(n)]

    def up(xs):
        return [x.to(f"tpu:{i}") for i, x in enumerate(xs)]

    def check(got, want, dt):
        assert len(got) == len(want), (len(got), len(want))
        for i, (g, w) in enumerate(zip(got, want)):
            assert g.device == torch.device(f"tpu:{i}"), (i, g.device)
            assert g.dtype == w.dtype and g.shape == w.shape, (i, g.dtype, g.shape, w.dtype, w.shape)
            g = g.cpu()
            if dt == torch.bfloat16:
                torch.testing.assert_close(g.float(), w.float(), rtol=2e-2, atol=5e-2)
            elif dt.is_floating_point:
                torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)
            else:
                assert torch.equal(g, w), (i, g, w)

    def reduce(xs, op):
        acc = xs[0].float() if xs[0].dtype == torch.bfloat16 else xs[0].clone()
        for x in xs[1:]:
            x = x.float() if x.dtype == torch.bfloat16 else x
            acc = {"sum": torch.add, "avg": torch.add, "prod": torch.mul,
                   "min": torch.minimum, "max": torch.maximum}[op](acc, x)
        if op == "avg":
            acc = acc / len(xs)
        return acc.to(xs[0].dtype)

    seed = 0
    for n in (4, 2):
        for dname, dt in DTYPES.items():
            for shape in SHAPES:
                seed += 1
                xs = inputs(n, shape, dt, seed)
                tag = f"n{n}-{dname}-{'x'.join(map(str, shape)) or 'scalar'}"
                ops = ["sum", "prod", "min", "max"] + (["avg"] if dt.is_floating_point else [])
                for op in ops:
                    @case(f"all_reduce-{op}-{tag}")
                    def _():
                        w = reduce(xs, op)
                        check(R.all_reduce(up(xs), op), [w] * n, dt)
                @case(f"all_gather-{tag}")
                def _():
                    w = torch.stack(xs) if not shape else torch.cat(xs)
                    check(R.all_gather(up(xs)), [w] * n, dt)
                @case(f"broadcast-{tag}")
                def _():
                    for src in range(n):
                        check(R.broadcast(up(xs), src=src), [xs[src]] * n, dt)
                @case(f"permute-{tag}")
                def _():
                    pairs = [(i, (i + 1) % n) for i in range(n)]
                    want = [xs[(i - 1) % n] for i in range(n)]
                    check(R.permute(up(xs), pairs), want, dt)
                    # a replica no pair targets gets zeros
                    want = [torch.zeros_like(xs[0])] * n
                    want[1] = xs[0]
                    check(R.permute(up(xs), [(0, 1)]), want, dt)
                if shape and shape[0] % n == 0:
                    for op in ["sum", "max"] + (["avg"] if dt.is_floating_point else []):
                        @case(f"reduce_scatter-{op}-{tag}")
                        def _():
                            w = reduce(xs, op).chunk(n)
                            check(R.reduce_scatter(up(xs), op), list(w), dt)
                    @case(f"all_to_all-{tag}")
                    def _():
                        want = [torch.cat([x.chunk(n)[i] for x in xs]) for i in range(n)]
                        check(R.all_to_all(up(xs)), want, dt)

    @case("non-contiguous and offset inputs; inputs unchanged")
    def _():
        xs = [torch.arange(24.0).reshape(4, 6) * (i + 1) for i in range(4)]
        ts = [x.to(f"tpu:{i}") for i, x in enumerate(xs)]
        views = [t.t()[1:5] for t in ts]  # a transposed slice
        want = reduce([x.t()[1:5] for x in xs], "sum")
        check(R.all_reduce(views), [want] * 4, torch.float32)
        for t, x in zip(ts, xs):
            assert torch.equal(t.cpu(), x)

    @case("inputs whose storages were made in other shapes")
    def _():
        # tpu:0's buffer is a 4x6 matrix viewed flat, the others are flat: the
        # one program takes them alike (replicas clones tpu:0's)
        xs = [torch.arange(24.0) * (i + 1) for i in range(4)]
        ts = [xs[0].reshape(4, 6).to("tpu:0").view(24)] + [x.to(f"tpu:{i}") for i, x in enumerate(xs) if i]
        assert torchtpu._C.storage_shape(ts[0]) == (4, 6) and torchtpu._C.storage_shape(ts[1]) == (24,)
        check(R.all_reduce(ts), [reduce(xs, "sum")] * 4, torch.float32)
        for y in R.all_gather([t.view(2, 12) for t in ts]):  # results are made in their own shape
            assert y.dim() == 2 and torchtpu._C.storage_shape(y) == tuple(y.shape), y.shape
        # the core refuses buffers of two shapes, naming both
        try:
            torchtpu._C.replica_collective(ts[:2], R._ALL_REDUCE, R._OPS["sum"], None, 0)
        except ValueError as e:
            assert "tensor 1 was made as tensor<24xf32> and that of tensor 0 as tensor<4x6xf32>" in str(e), e
        else:
            raise AssertionError("no error")

    @case("fused mode: pending inputs run first")
    def _():
        prev = torchtpu.get_eager_mode()
        torchtpu.eager_mode("fused")
        try:
            xs = [torch.full((3,), float(i + 1), device=f"tpu:{i}") * 2 for i in range(4)]
            check(R.all_reduce(xs), [torch.full((3,), 20.0)] * 4, torch.float32)
        finally:
            torchtpu.eager_mode(prev)

    @case("empty tensors")
    def _():
        xs = [torch.empty(0, 3, device=f"tpu:{i}") for i in range(4)]
        assert [tuple(y.shape) for y in R.all_gather(xs)] == [(0, 3)] * 4
        assert [y.device.index for y in R.all_reduce(xs)] == [0, 1, 2, 3]

    @case("a single replica")
    def _():
        x = torch.arange(4.0)
        check(R.all_reduce([x.to("tpu:0")]), [x], torch.float32)

    @case("programs are kept; counted")
    def _():
        xs = [torch.ones(5, device=f"tpu:{i}") for i in range(4)]
        m0 = torchtpu.metrics()
        R.all_reduce(xs)
        R.all_reduce(xs)
        m1 = torchtpu.metrics()
        d = {k: m1[k] - m0[k] for k in ("replica_collectives", "programs_compiled")}
        assert d == {"replica_collectives": 2, "programs_compiled": 1}, d

    def raises(exc, needle, f):
        try:
            f()
        except exc as e:
            assert needle in str(e), f"{needle!r} not in {e}"
            return
        raise AssertionError(f"no {exc.__name__}")

    T = [torch.ones(4, 2, device=f"tpu:{i}") for i in range(4)]
    errors = {
        "empty list": (ValueError, "empty", lambda: R.all_reduce([])),
        "not a list": (TypeError, "list", lambda: R.all_reduce(T[0])),
        "too many": (ValueError, "5 tensors for 4", lambda: R.all_reduce(T + [T[0]])),
        "wrong device": (ValueError, "tensor 1 is on tpu:2", lambda: R.all_reduce([T[0], T[2]])),
        "cpu tensor": (ValueError, "tensor 0 is on cpu", lambda: R.all_reduce([torch.ones(4, 2)])),
        "dtype": (TypeError, "dtype", lambda: R.all_reduce([T[0], T[1].int()])),
        "shape": (ValueError, "shape", lambda: R.all_reduce([T[0], torch.ones(2, 4, device="tpu:1")])),
        "bad op": (ValueError, "unknown reduce op 'mean'", lambda: R.all_reduce(T, "mean")),
        "op type": (TypeError, "op must be", lambda: R.all_reduce(T, 3)),
        "avg of ints": (TypeError, "avg", lambda: R.all_reduce([t.int() for t in T], "avg")),
        "bool sum": (TypeError, "bool", lambda: R.all_reduce([t.bool() for t in T])),
        "scatter indivisible": (ValueError, "not divisible", lambda: R.reduce_scatter(T[:3])),
        "scatter 0-d": (ValueError, "at least one dimension", lambda: R.reduce_scatter([t.sum() for t in T])),
        "all_to_all indivisible": (ValueError, "not divisible", lambda: R.all_to_all(T[:3])),
        "permute range": (ValueError, "outside", lambda: R.permute(T[:2], [(0, 2)])),
        "permute two targets": (ValueError, "two pairs", lambda: R.permute(T, [(0, 1), (2, 1)])),
        "permute pairs": (TypeError, "pairs", lambda: R.permute(T, [0, 1])),
        "broadcast src": (ValueError, "src 4", lambda: R.broadcast(T, src=4)),
    }
    for name, (exc, needle, f) in errors.items():
        case(f"error-{name}")(lambda exc=exc, needle=needle, f=f: raises(exc, needle, f))

    print("RESULTS " + json.dumps(results))
    """
)


@functools.cache
def _results():
    env = dict(os.environ, TORCHTPU_NUM_DEVICES="4")
    r = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    for line in r.stdout.splitlines():
        if line.startswith("RESULTS "):
            return json.loads(line[len("RESULTS ") :])
    raise AssertionError(f"the replicas script failed (rc {r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")


GROUPS = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "permute", "broadcast", "error", "other"]


def _group(name):
    head = name.split("-", 1)[0]
    return head if head in GROUPS else "other"


@pytest.mark.parametrize("group", GROUPS)
def test_replicas(group):
    res = {k: v for k, v in _results().items() if _group(k) == group}
    assert res, f"no {group} cases ran"
    bad = {k: v for k, v in res.items() if v != "ok"}
    assert not bad, f"{len(bad)} of {len(res)} {group} cases failed:\n" + "\n".join(
        f"{k}: {v}" for k, v in list(bad.items())[:20]
    )


def _def_rows(macro):
    """The (ID, name) rows of csrc/engine/collectives.def for one macro."""
    path = os.path.join(os.path.dirname(__file__), "..", "csrc", "engine", "collectives.def")
    with open(path) as f:
        text = f.read()
    return re.findall(rf'^{macro}\((\w+), "(\w+)"', text, re.M)


def test_collective_kinds_by_name():
    from torchtpu import _C, replicas

    rows = _def_rows("TPU_COLLECTIVE")
    assert rows and _C.collective_kinds() == {name: i for i, (_, name) in enumerate(rows)}
    # every collective of torchtpu.replicas is a row, named as its function
    assert set(replicas.__all__) == {name for _, name in rows}
    ops = _def_rows("TPU_REDUCE_OP")
    assert ops and _C.reduce_ops() == {name: i for i, (_, name) in enumerate(ops)}
    assert replicas._OPS == _C.reduce_ops()
