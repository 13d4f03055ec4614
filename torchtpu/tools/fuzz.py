"""A differential fuzzer: random programs run on tpu in every eager mode and
compared with the CPU.

    python -m torchtpu.tools.fuzz --minutes N --seed S [--programs K]
                                  [--modes debug,strict,fused] [--out DIR]
                                  [--ops NAME,...] [--quiet]

A program is a list of steps over a pool of named tensors: random inputs
(ranks 0-4, sizes 0-5, some non-contiguous: a transpose, a strided slice or an
offset narrow of a larger tensor; float32, bfloat16, int64, int32, bool;
normal values with NaN and Inf sprinkled in, small integers, valid index
tensors), then elementwise ops (broadcasting and type promotion), reductions,
matmuls, indexing, views and in-place ops through views. Each step is a line
of Python, generated from a seeded random.Random while the CPU runs it (so
that operands fit and no step depends on a value check: out-of-range indices
and integer division by zero are not generated).

The same lines run on the CPU and on tpu in each mode, in a worker process (a
crash or a hang is counted, the run goes on). Compared, for every tensor of
the pool at the end (bases written through views included): dtype, shape and
values (integers and bool exactly; float32 with rtol 1e-5, bfloat16 with rtol
1.6e-2; NaN and Inf at the same places), and per step whether it raised (the
same exception type as the CPU, or nothing where the CPU raised nothing).
Values that are only approximately computable on either side (a comparison,
floor or argmax of a float that a transcendental, a reduction or bfloat16
arithmetic produced) are compared for dtype and shape only.

A failure is minimized (steps dropped, input shapes shrunk, values and
constants simplified, while it fails the same way) and printed as a
standalone Python reproducer, also written under --out. Counts at the end:
programs, mismatches, error mismatches, crashes, timeouts; the exit status is
1 if anything failed.
"""

import argparse
import json
import math
import os
import random
import select
import subprocess
import sys
import time
import traceback

MODES = ("debug", "strict", "fused")
DTYPES = ("float32", "bfloat16", "int64", "int32", "bool")
FLOATS = ("float32", "bfloat16")
INTS = ("int64", "int32")
RESULT_TAG = "@@FUZZ "
PER_PROGRAM_SECONDS = 120
MAX_STEPS = 8

# CPU errors that depend on values (a value check, not what this fuzzer
# compares): steps that raise them are not generated.
VALUE_ERRORS = ("ZeroDivisionError", "negative integer powers", "out of bounds", "index out of range")


# ---------------------------------------------------------------------------
# Inputs: a spec (shape, dtype, kind of values, seed, layout) makes a CPU
# tensor; the program's line builds it from literal values.


def make_base(spec):
    """The contiguous tensor an input is a view of (CPU)."""
    import torch

    shape = base_shape(spec)
    gen = torch.Generator().manual_seed(spec["seed"])
    n = 1
    for s in shape:
        n *= s
    kind, dtype = spec["kind"], getattr(torch, spec["dtype"])
    if kind == "index":  # valid indices into a dim of size spec["bound"]
        v = torch.randint(0, max(1, spec["bound"]), (n,), generator=gen) if spec["bound"] > 0 else torch.zeros(n)
    elif kind == "perm":  # distinct indices
        v = torch.randperm(max(spec["bound"], n), generator=gen)[:n]
    elif spec["dtype"] == "bool":
        v = torch.rand(n, generator=gen) < 0.5
    elif spec["dtype"] in INTS:
        lo, hi = (1, 4) if kind == "nonzero" else (-4, 5)
        v = torch.randint(lo, hi, (n,), generator=gen)
    else:
        v = torch.randn(n, generator=gen) * 2
        if kind == "positive":
            v = v.abs() + 0.5
        sp = spec.get("special", 0.0)
        if sp and n:
            m = torch.rand(n, generator=gen)
            pick = torch.randint(0, 3, (n,), generator=gen)
            specials = torch.tensor([float("nan"), float("inf"), float("-inf")])
            v = torch.where(m < sp, specials[pick], v)
    return v.to(dtype).reshape(shape)


def base_shape(spec):
    shape = list(spec["shape"])
    lay = spec.get("layout", "contig")
    if lay == "t":
        shape[-1], shape[-2] = shape[-2], shape[-1]
    elif lay == "step":
        shape[0] = shape[0] * 2
    elif lay == "offset":
        shape[-1] = shape[-1] + 1
    return shape


LAYOUT_CODE = {"contig": "", "t": ".transpose(-1, -2)", "step": "[::2]", "offset": "[..., 1:]"}


def _lit(x):
    """Python source for a nested list of numbers (nan, inf as names)."""
    if isinstance(x, list):
        return "[" + ", ".join(_lit(v) for v in x) + "]"
    if isinstance(x, float):
        if x != x:
            return "nan"
        if x in (math.inf, -math.inf):
            return "inf" if x > 0 else "-inf"
    return repr(x)


def input_line(name, spec, values=None):
    import torch  # noqa: F401

    v = make_base(spec) if values is None else values
    return (
        f"{name} = torch.tensor({_lit(v.tolist())}, dtype=torch.{spec['dtype']})"
        f".reshape({tuple(base_shape(spec))}).to(dev){LAYOUT_CODE[spec.get('layout', 'contig')]}"
    )


# ---------------------------------------------------------------------------
# Programs: {"inputs": {name: spec}, "order": [names], "steps": [step]} where a
# step is {"op", "fmt", "args": [names], "consts": [source], "simp": [const
# positions that are plain scalars], "out": name or None}. Its line is
# fmt.format(a0=..., c0=...), assigned to out when it has one.


def step_code(step):
    kw = {f"a{i}": a for i, a in enumerate(step["args"])}
    kw.update({f"c{i}": c for i, c in enumerate(step["consts"])})
    code = step["fmt"].format(**kw)
    return f"{step['out']} = {code}" if step["out"] else code


def program_lines(prog):
    return [input_line(n, prog["inputs"][n]) for n in prog["order"]] + [step_code(s) for s in prog["steps"]]


def defined_names(prog):
    return list(prog["order"]) + [s["out"] for s in prog["steps"] if s["out"]]


# How values flow, for the comparison: ops whose float results differ by
# rounding between implementations (transcendentals, reductions, matmuls),
# and ops whose results are discrete (a float that differs by an ulp can
# change them).
INEXACT = {
    "exp",
    "log",
    "sin",
    "cos",
    "tanh",
    "sigmoid",
    "erf",
    "expm1",
    "log1p",
    "rsqrt",
    "pow",
    "atan2",
    "mean",
    "sum",
    "prod",
    "mm",
    "bmm",
    "matmul",
    "remainder",
    "fmod",
    "reciprocal",
    "sqrt",
    "div",
    "true_divide",
    "div_",
    "index_put_acc",
}
DISCRETE = {"floor", "ceil", "round", "trunc", "frac", "sign", "floor_divide", "remainder", "fmod", "to"}
ARITH = {"add", "sub", "mul", "add_", "mul_", "sub_", "neg", "abs", "square", "rsub"}


def flow_flags(prog, unreliable_steps=()):
    """{name: (approx, unreliable)} for every defined name: approx when its
    float values are computed with rounding that may differ, unreliable when
    a discrete op consumed an approximate value (values not compared)."""
    flags = {}
    root = {}
    for n in prog["order"]:
        root[n] = n
        flags[n] = [False, False]
    for k, s in enumerate(prog["steps"]):
        ins = [flags[root[a]] for a in s["args"] if a in root]
        approx = any(f[0] for f in ins)
        unrel = any(f[1] for f in ins)
        op = s["op"]
        half = any(prog_dtype(prog, a) in ("bfloat16",) for a in s["args"]) or "bfloat16" in "".join(s["consts"])
        target = s["out"] or (s["args"][0] if s["args"] else None)
        is_float = prog_dtype(prog, target) in ("float32", "bfloat16", "float16", "float64")
        newapprox = is_float and (approx or op in INEXACT or (half and (op in ARITH or op in DISCRETE)))
        if approx and (op in DISCRETE or not is_float) or k in unreliable_steps:
            unrel = True
        if s["out"] and not s.get("view"):
            root[s["out"]] = s["out"]
            flags[s["out"]] = [newapprox, unrel]
        elif s["out"]:  # a view shares its base's flags
            root[s["out"]] = root[s["args"][0]]
        else:  # in place on args[0]: its storage takes the new flags
            f = flags[root[s["args"][0]]]
            f[0] = f[0] or newapprox
            f[1] = f[1] or unrel
    return {n: tuple(flags[root[n]]) for n in root}


def prog_dtype(prog, name):
    return prog.get("dtypes", {}).get(name)


# ---------------------------------------------------------------------------
# Running a program (in the worker).


def run_lines(lines, dev, ns_extra=None, before=None):
    """Run each line; returns (namespace, [exception or None per line]).
    before(i, namespace) is called before line i."""
    import torch

    ns = {"torch": torch, "dev": dev, "nan": float("nan"), "inf": float("inf")}
    if ns_extra:
        ns.update(ns_extra)
    excs = []
    for i, line in enumerate(lines):
        if before is not None:
            before(i, ns)
        try:
            exec(compile(line, "<fuzz>", "exec"), ns)
            excs.append(None)
        except Exception as e:  # noqa: BLE001
            excs.append(e)
    return ns, excs


def undefined_casts(prog):
    """A before() hook for the CPU run that collects the steps converting a
    float NaN, Inf or out-of-range value to an integer dtype (undefined in C:
    the result depends on the machine), whose results are then not compared."""
    import torch

    n_in = len(prog["order"])
    found = set()

    def before(i, ns):
        if i < n_in:
            return
        s = prog["steps"][i - n_in]
        target = s["out"] or (s["args"][0] if s["args"] else None)
        if prog_dtype(prog, target) not in INTS:
            return
        for a in s["args"]:
            v = ns.get(a)
            if isinstance(v, torch.Tensor) and v.is_floating_point() and v.numel():
                if not (v.isfinite() & (v.abs() < 2.0**31)).all():
                    found.add(i - n_in)

    return found, before


TOL = {"float32": (1e-5, 1e-5), "bfloat16": (1.6e-2, 1e-2), "float16": (2e-3, 1e-3)}


def compare_tensor(e, a, approx):
    """None if a (on tpu) matches e (CPU), else (subkind, detail)."""
    import torch

    if not isinstance(a, torch.Tensor):
        return "type", f"{type(a).__name__}, expected a tensor"
    if a.dtype != e.dtype:
        return "dtype", f"dtype {a.dtype}, expected {e.dtype}"
    if tuple(a.shape) != tuple(e.shape):
        return "shape", f"shape {tuple(a.shape)}, expected {tuple(e.shape)}"
    if approx is None:
        return None
    a = a.detach().cpu()
    e = e.detach()
    if e.numel() == 0:
        return None
    if not e.is_floating_point():
        if not torch.equal(a, e):
            bad = (a != e).nonzero()[0].tolist()
            return "value", f"at {bad}: {a[tuple(bad)].item()!r}, expected {e[tuple(bad)].item()!r}"
        return None
    af, ef = a.double(), e.double()
    an, en = af.isnan(), ef.isnan()
    if not torch.equal(an, en):
        bad = (an != en).nonzero()[0].tolist()
        return (
            "nan",
            f"NaN at different places: at {bad}: {af[tuple(bad)].item()!r}, expected {ef[tuple(bad)].item()!r}",
        )
    ai, ei = af.isinf(), ef.isinf()
    if not torch.equal(ai, ei) or not torch.equal(af[ei], ef[ei]):
        bad = ((ai != ei) | (ei & (af != ef))).nonzero()[0].tolist()
        return (
            "inf",
            f"Inf at different places: at {bad}: {af[tuple(bad)].item()!r}, expected {ef[tuple(bad)].item()!r}",
        )
    fin = ~(en | ei)
    rtol, atol = TOL.get(str(e.dtype).replace("torch.", ""), (1e-5, 1e-5))
    if approx:
        scale = ef[fin].abs().max().item() if fin.any() else 1.0
        atol = atol * max(1.0, scale)
    diff = (af - ef).abs()
    bad = fin & (diff > atol + rtol * ef.abs())
    if bad.any():
        i = bad.nonzero()[0].tolist()
        return (
            "value",
            f"at {i}: {af[tuple(i)].item()!r}, expected {ef[tuple(i)].item()!r} "
            f"(max abs diff {diff[fin].max().item():.3g})",
        )
    return None


def check_program(prog, modes, inject=None):
    """Run prog on the CPU and on tpu in each mode; returns a list of failures
    {kind, mode, sig, detail} (empty: it passed)."""
    import torch

    import torchtpu

    lines = program_lines(prog)
    n_in = len(prog["order"])
    casts, before = undefined_casts(prog)
    cpu_ns, cpu_exc = run_lines(lines, "cpu", before=before)
    flags = flow_flags(prog, casts)
    names = defined_names(prog)
    writer = last_writers(prog)
    failures = []
    extra = {"torch": _Injected(inject)} if inject else None
    for mode in modes:
        with torchtpu.eager_mode(mode):
            ns, excs = run_lines(lines, "tpu", extra)
            fail = None
            for i, (ce, te) in enumerate(zip(cpu_exc, excs)):
                if i < n_in and te is not None:
                    fail = ("error", f"input {prog['order'][i]}: {type(te).__name__}: {te}", "input")
                    break
                if ce is None and te is not None:
                    fail = (
                        "error",
                        f"step {i - n_in} `{lines[i]}`: the CPU succeeds, tpu raises "
                        f"{type(te).__name__}: {_first_line(te)}",
                        f"None->{type(te).__name__}:{_gist(te)}",
                    )
                    break
                if ce is not None and (te is None or type(te) is not type(ce)):
                    got = "nothing" if te is None else f"{type(te).__name__}: {_first_line(te)}"
                    fail = (
                        "error",
                        f"step {i - n_in} `{lines[i]}`: the CPU raises {type(ce).__name__}: "
                        f"{_first_line(ce)}; tpu raises {got}",
                        f"{type(ce).__name__}->{type(te).__name__ if te is not None else 'None'}:{_gist(ce)}",
                    )
                    break
            if fail is None:
                try:
                    for n in names:
                        if n not in cpu_ns:
                            continue
                        if n not in ns:
                            fail = ("mismatch", f"{n}: not defined on tpu", writer.get(n, "?") + ":missing")
                            break
                        approx, unrel = flags.get(n, (True, False))
                        r = compare_tensor(cpu_ns[n], ns[n], None if unrel else approx)
                        if r is not None:
                            fail = ("mismatch", f"{n}: {r[1]}", f"{writer.get(n, '?')}:{r[0]}")
                            break
                    torch.tpu.synchronize()
                except Exception as e:  # noqa: BLE001  (raised at a sync point)
                    fail = ("error", f"at the sync point: {type(e).__name__}: {_first_line(e)}", "sync")
            if fail:
                failures.append({"kind": fail[0], "mode": mode, "detail": fail[1][:600], "sig": f"{fail[0]}|{fail[2]}"})
    return failures


def _gist(e):
    """An error message without its numbers and quoted names: the cause, for
    grouping failures."""
    import re

    m = re.sub(
        r"\b(BFloat16|Float|Double|Half|Long|Int|Short|Byte|Char|Bool|bfloat16|float16|float32|float64|"
        r"int64|int32|int16|int8|uint8|bool)\b",
        "_",
        _first_line(e),
    )
    m = re.sub(r"'[^']*'|\"[^\"]*\"|`[^`]*`|\([^)]*\)|\[[^\]]*\]|-?\d+", "_", m)
    return re.sub(r"\s+", " ", m)[:60].strip()


def _first_line(e):
    s = str(e).strip().splitlines()
    return s[0][:300] if s else ""


def last_writers(prog):
    """{name: the op that last wrote the storage it is in}: signatures of
    value mismatches name it."""
    root, last = {}, {}
    for n in prog["order"]:
        root[n] = n
        last[n] = "input"
    for s in prog["steps"]:
        if s["out"] and not s.get("view"):
            root[s["out"]] = s["out"]
            last[s["out"]] = s["op"]
        elif s["out"]:
            root[s["out"]] = root[s["args"][0]]
        else:
            last[root[s["args"][0]]] = s["op"]
    return {n: last[root[n]] for n in root}


class _Injected:
    """A deliberately wrong torch, for testing the fuzzer itself: torch.<name>
    adds 1 to its result for tpu tensors with more than one element."""

    def __init__(self, name):
        import torch

        self._torch, self._name = torch, name

    def __getattr__(self, attr):
        f = getattr(self._torch, attr)
        if attr != self._name:
            return f

        def wrong(*args, **kwargs):
            r = f(*args, **kwargs)
            if isinstance(r, self._torch.Tensor) and r.device.type == "tpu" and r.numel() > 1:
                r = r + 1
            return r

        return wrong


# ---------------------------------------------------------------------------
# The generator.


class Gen:
    def __init__(self, seed, ops=None):
        import torch

        self.torch = torch
        self.rng = random.Random(seed)
        self.prog = {"inputs": {}, "order": [], "steps": [], "dtypes": {}}
        self.ns = {"torch": torch, "dev": "cpu", "nan": float("nan"), "inf": float("inf")}
        self.count = 0
        self.ops = ops

    # names and values
    def fresh(self):
        self.count += 1
        return f"x{self.count - 1}"

    def val(self, name):
        return self.ns[name]

    def tensors(self, pred=None):
        return [n for n in defined_names(self.prog) if n in self.ns and (pred is None or pred(self.ns[n]))]

    def rand_shape(self, rank=None, maxsize=5):
        r = self.rng
        if rank is None:
            rank = r.choice((0, 1, 1, 2, 2, 2, 3, 3, 4))
        if r.random() < 0.12:  # sizes 0 allowed
            return [r.randint(0, maxsize) for _ in range(rank)]
        return [r.randint(1, maxsize) for _ in range(rank)]

    def rand_dtype(self):
        return self.rng.choice(("float32",) * 4 + ("bfloat16",) * 2 + ("int64",) * 2 + ("int32", "bool"))

    def new_input(self, shape=None, dtype=None, kind=None, bound=0, layout=None):
        r = self.rng
        shape = self.rand_shape() if shape is None else list(shape)
        dtype = dtype or self.rand_dtype()
        if layout is None:
            layout = "contig"
            if r.random() < 0.3 and len(shape) >= 1:
                layout = r.choice(("t", "step", "offset")) if len(shape) >= 2 else r.choice(("step", "offset"))
        spec = {
            "shape": shape,
            "dtype": dtype,
            "kind": kind or "normal",
            "seed": r.randrange(1 << 30),
            "layout": layout,
            "bound": bound,
            "special": r.choice((0.0, 0.0, 0.1, 0.3)) if dtype in FLOATS and not kind else 0.0,
        }
        name = self.fresh()
        self.prog["inputs"][name] = spec
        self.prog["order"].append(name)
        exec(input_line(name, spec), self.ns)
        self.prog["dtypes"][name] = dtype
        self.prog.setdefault("shapes", {})[name] = list(self.ns[name].shape)
        return name

    def pick(self, pred=None, make=None, p_new=0.25):
        """A pool tensor satisfying pred, or a new input (make())."""
        cands = self.tensors(pred)
        if cands and self.rng.random() > p_new:
            # favour recent values, so that steps chain
            return cands[-1] if self.rng.random() < 0.4 else self.rng.choice(cands)
        if make:
            return make()
        for _ in range(10):
            name = self.new_input()
            if pred is None or pred(self.ns[name]):
                return name
            self.drop_input(name)
        return self.new_input([2, 3])

    def drop_input(self, name):
        del self.prog["inputs"][name]
        self.prog["order"].remove(name)
        del self.ns[name]

    def broadcast_shape_of(self, shape):
        """A shape that broadcasts with shape."""
        r = self.rng
        s = list(shape)
        if s and r.random() < 0.5:
            s = s[r.randint(0, len(s)) :]
        s = [1 if r.random() < 0.3 else d for d in s]
        if len(s) < 4 and r.random() < 0.15:
            s = [r.randint(1, 3)] + s
        return s

    def scalar(self, dtype_hint):
        r = self.rng
        c = r.random()
        if c < 0.1:
            return r.choice(("nan", "inf", "-inf"))
        if c < 0.2:
            return r.choice(("True", "False"))
        if c < 0.55 or dtype_hint in INTS:
            return str(r.randint(-3, 4))
        return repr(round(r.uniform(-3, 3), 2))

    # steps
    def add_step(self, op, fmt, args, consts=(), simp=(), out=True, view=False):
        step = {
            "op": op,
            "fmt": fmt,
            "args": list(args),
            "consts": list(consts),
            "simp": list(simp),
            "out": self.fresh() if out else None,
            "view": view,
        }
        code = step_code(step)
        try:
            exec(compile(code, "<fuzz>", "exec"), self.ns)
        except Exception as e:  # noqa: BLE001
            msg = f"{type(e).__name__}: {e}"
            if any(v in msg for v in VALUE_ERRORS):
                if step["out"]:
                    self.count -= 1
                return None
            self.prog["steps"].append(step)  # the CPU refuses it: tpu must too
            return step
        if step["out"]:
            v = self.ns[step["out"]]
            if not isinstance(v, self.torch.Tensor) or v.numel() > 4096:
                del self.ns[step["out"]]
                self.count -= 1
                return None
            self.prog["dtypes"][step["out"]] = str(v.dtype).replace("torch.", "")
            self.prog.setdefault("shapes", {})[step["out"]] = list(v.shape)
        self.prog["steps"].append(step)
        return step

    def step(self):
        fams = FAMILIES if self.ops is None else [f for f in FAMILIES if f[1] in self.ops or set(f[2]) & set(self.ops)]
        weights = [f[0] for f in fams]
        for _ in range(20):
            fam = self.rng.choices(fams, weights)[0]
            if fam[3](self, fam[2] if self.ops is None else [o for o in fam[2] if o in self.ops] or fam[2]):
                return True
        return False


UNARY = [
    "neg",
    "abs",
    "exp",
    "log",
    "sqrt",
    "sin",
    "cos",
    "tanh",
    "sigmoid",
    "relu",
    "floor",
    "ceil",
    "round",
    "trunc",
    "frac",
    "sign",
    "reciprocal",
    "rsqrt",
    "expm1",
    "log1p",
    "isnan",
    "isinf",
    "isfinite",
    "logical_not",
    "bitwise_not",
    "square",
    "erf",
    "nan_to_num",
]
BINARY = [
    "add",
    "sub",
    "mul",
    "div",
    "floor_divide",
    "remainder",
    "fmod",
    "maximum",
    "minimum",
    "eq",
    "ne",
    "lt",
    "le",
    "gt",
    "ge",
    "logical_and",
    "logical_or",
    "logical_xor",
    "bitwise_and",
    "bitwise_or",
    "bitwise_xor",
    "atan2",
    "pow",
    "rsub",
]
REDUCE = ["sum", "mean", "amax", "amin", "argmax", "argmin", "prod"]
VIEWS = ["transpose", "permute", "slice", "narrow", "expand", "view", "reshape", "unsqueeze", "select", "squeeze", "t"]
INPLACE = ["add_", "mul_", "sub_", "div_", "copy_", "fill_", "zero_", "masked_fill_", "clamp_"]


def g_unary(g, ops):
    op = g.rng.choice(ops)
    x = g.pick()
    return g.add_step(op, f"torch.{op}({{a0}})", [x])


def g_binary(g, ops):
    r = g.rng
    op = r.choice(ops)
    x = g.pick()
    xv = g.val(x)
    c = r.random()
    if c < 0.3:  # a scalar
        k = g.scalar(str(xv.dtype))
        if op in ("floor_divide", "remainder", "fmod", "div") and k in ("0", "False"):
            k = "2"
        if r.random() < 0.2 and op in ("add", "sub", "mul", "eq", "lt", "maximum"):
            return g.add_step(
                op,
                f"{{c0}} {_PYOP.get(op, '+')} {{a0}}" if op in _PYOP else f"torch.{op}({{a0}}, {{c0}})",
                [x],
                [k],
                [0],
            )
        return g.add_step(op, f"torch.{op}({{a0}}, {{c0}})", [x], [k], [0])
    shp = g.broadcast_shape_of(list(xv.shape))
    if c < 0.6:

        def ok(v):
            try:
                g.torch.broadcast_shapes(v.shape, xv.shape)
                return True
            except RuntimeError:
                return False

        y = g.pick(ok, lambda: g.new_input(shp), p_new=0.3)
    else:
        dt = str(xv.dtype).replace("torch.", "") if r.random() < 0.5 else None
        kind = "nonzero" if op in ("floor_divide", "remainder", "fmod", "div") else None
        y = g.new_input(shp, dt, kind)
    a, b = (x, y) if r.random() < 0.7 else (y, x)
    if op in ("add", "sub") and r.random() < 0.2:
        return g.add_step(op, f"torch.{op}({{a0}}, {{a1}}, alpha={{c0}})", [a, b], [r.choice(("2", "-1", "0.5"))], [0])
    if op in _PYOP and r.random() < 0.3:
        return g.add_step(op, f"{{a0}} {_PYOP[op]} {{a1}}", [a, b])
    return g.add_step(op, f"torch.{op}({{a0}}, {{a1}})", [a, b])


_PYOP = {
    "add": "+",
    "sub": "-",
    "mul": "*",
    "div": "/",
    "eq": "==",
    "lt": "<",
    "floor_divide": "//",
    "remainder": "%",
    "bitwise_and": "&",
    "bitwise_or": "|",
    "bitwise_xor": "^",
    "maximum": None,
}
_PYOP = {k: v for k, v in _PYOP.items() if v}


def g_where(g, ops):
    r = g.rng
    x = g.pick()
    xv = g.val(x)
    cond = g.pick(
        lambda v: v.dtype == g.torch.bool and _bcast(g, v.shape, xv.shape),
        lambda: g.new_input(g.broadcast_shape_of(list(xv.shape)), "bool"),
    )
    if r.random() < 0.3:
        return g.add_step("where", "torch.where({a0}, {a1}, {c0})", [cond, x], [g.scalar(str(xv.dtype))], [0])
    y = g.new_input(g.broadcast_shape_of(list(xv.shape)), r.choice((str(xv.dtype).replace("torch.", ""), None)))
    return g.add_step("where", "torch.where({a0}, {a1}, {a2})", [cond, x, y])


def g_clamp(g, ops):
    r = g.rng
    x = g.pick()
    xv = g.val(x)
    if r.random() < 0.5:
        lo, hi = sorted([r.randint(-3, 2), r.randint(-2, 3)])
        if r.random() < 0.3:
            return g.add_step("clamp", "torch.clamp({a0}, min={c0})", [x], [g.scalar(str(xv.dtype))], [0])
        if r.random() < 0.5:
            lo, hi = lo - 0.5, hi + 0.25
        return g.add_step("clamp", "torch.clamp({a0}, {c0}, {c1})", [x], [repr(lo), repr(hi)], [0, 1])
    dt = str(xv.dtype).replace("torch.", "")
    lo = g.new_input(g.broadcast_shape_of(list(xv.shape)), dt)
    hi = g.new_input(g.broadcast_shape_of(list(xv.shape)), dt)
    return g.add_step("clamp", "torch.clamp({a0}, {a1}, {a2})", [x, lo, hi])


def g_cast(g, ops):
    x = g.pick()
    dt = g.rand_dtype()
    return g.add_step("to", "{a0}.to(torch.%s)" % dt, [x])


def _bcast(g, a, b):
    try:
        g.torch.broadcast_shapes(a, b)
        return True
    except RuntimeError:
        return False


def g_reduce(g, ops):
    r = g.rng
    op = r.choice(ops)
    x = g.pick()
    nd = g.val(x).dim()
    c = r.random()
    if c < 0.25 or nd == 0:
        return g.add_step(op, f"torch.{op}({{a0}})", [x])
    dim = r.randint(-nd, nd - 1)
    kd = r.choice(("True", "False"))
    if op in ("sum", "mean", "amax", "amin") and nd >= 2 and r.random() < 0.4:
        dims = tuple(sorted(r.sample(range(nd), r.randint(1, nd))))
        return g.add_step(op, f"torch.{op}({{a0}}, {{c0}}, keepdim={{c1}})", [x], [repr(dims), kd])
    if op in ("sum", "prod") and r.random() < 0.15:
        return g.add_step(op, f"{{a0}}.{op}({{c0}}, dtype=torch.{r.choice(DTYPES)})", [x], [str(dim)])
    return g.add_step(op, f"torch.{op}({{a0}}, {{c0}}, keepdim={{c1}})", [x], [str(dim), kd])


def g_matmul(g, ops):
    r = g.rng
    op = r.choice(ops)
    dt = r.choice(("float32",) * 4 + ("bfloat16", "int64", "int32")) if r.random() < 0.9 else g.rand_dtype()
    dt2 = dt if r.random() < 0.9 else g.rand_dtype()
    m, k, n = (r.randint(0, 5) if r.random() < 0.1 else r.randint(1, 5) for _ in range(3))
    if op == "mm":
        a = g.pick(lambda v: v.dim() == 2 and str(v.dtype) == "torch." + dt, lambda: g.new_input([m, k], dt), 0.5)
        k = g.val(a).shape[1]
        b = g.new_input([k, n], dt2)
    elif op == "bmm":
        bsz = r.randint(1, 3)
        a = g.pick(lambda v: v.dim() == 3 and str(v.dtype) == "torch." + dt, lambda: g.new_input([bsz, m, k], dt), 0.5)
        bsz, _, k = g.val(a).shape
        b = g.new_input([bsz, k, n], dt2)
    else:
        ra, rb = r.randint(1, 4), r.randint(1, 4)
        a = g.pick(
            lambda v: v.dim() >= 1 and str(v.dtype) == "torch." + dt,
            lambda: g.new_input([r.randint(1, 3) for _ in range(ra - 2)] + ([m, k] if ra >= 2 else [k]), dt),
            0.5,
        )
        av = g.val(a)
        k = av.shape[-1]
        batch = list(av.shape[:-2])
        if rb >= 2:
            bb = g.broadcast_shape_of(batch) if batch and rb > 2 else [r.randint(1, 2) for _ in range(rb - 2)]
            b = g.new_input(bb[-2:] if len(bb) > 2 else bb + [k, n], dt2)
            if list(g.val(b).shape[-2:-1]) != [k]:
                b = g.new_input([k, n], dt2)
        else:
            b = g.new_input([k], dt2)
    if r.random() < 0.5:
        a, b = (b, a) if op == "matmul" and r.random() < 0.1 else (a, b)
        return g.add_step(op, f"torch.{op}({{a0}}, {{a1}})", [a, b])
    return g.add_step(op, "{a0} @ {a1}" if op == "matmul" else f"{{a0}}.{op}({{a1}})", [a, b])


def g_index(g, ops):
    r = g.rng
    op = r.choice(ops)
    if op == "index_select":
        x = g.pick(lambda v: v.dim() >= 1)
        xv = g.val(x)
        d = r.randrange(xv.dim()) if xv.dim() else 0
        size = xv.shape[d] if xv.dim() else 1
        idx = g.new_input([r.randint(0 if size else 0, 5) if size else 0], "int64", "index", size, "contig")
        return g.add_step(op, "torch.index_select({a0}, {c0}, {a1})", [x, idx], [str(d)])
    if op == "gather":
        x = g.pick(lambda v: v.dim() >= 1)
        xv = g.val(x)
        d = r.randrange(xv.dim()) if xv.dim() else 0
        shp = [r.randint(0, s) for s in xv.shape]
        shp[d] = r.randint(0, 4) if xv.shape[d] else 0
        idx = g.new_input(shp, "int64", "index", xv.shape[d], None)
        return g.add_step(op, "torch.gather({a0}, {c0}, {a1})", [x, idx], [str(d)])
    if op == "getitem":
        x = g.pick(lambda v: v.dim() >= 1)
        xv = g.val(x)
        d = 0 if xv.dim() < 2 or r.random() < 0.6 else 1
        idx = g.new_input(
            g.rand_shape(r.randint(0, 2)) if xv.shape[d] else [0],
            r.choice(("int64", "int64", "int32")),
            "index",
            xv.shape[d],
            None,
        )
        return g.add_step(op, "{a0}[{a1}]" if d == 0 else "{a0}[:, {a1}]", [x, idx])
    if op == "masked_fill":
        x = g.pick()
        xv = g.val(x)
        mask = g.new_input(g.broadcast_shape_of(list(xv.shape)), "bool")
        inplace = r.random() < 0.3
        return g.add_step(
            op + ("_" if inplace else ""),
            "{a0}.masked_fill%s({a1}, {c0})" % ("_" if inplace else ""),
            [x, mask],
            [g.scalar(str(xv.dtype))],
            [0],
            out=not inplace,
        )
    if op == "mask_getitem":
        x = g.pick(lambda v: v.dim() >= 1)
        xv = g.val(x)
        mask = g.new_input(list(xv.shape[: r.randint(1, xv.dim())]), "bool")
        return g.add_step(op, "{a0}[{a1}]", [x, mask])
    # index_put_ (unique indices unless accumulating)
    x = g.pick(lambda v: v.dim() >= 1)
    xv = g.val(x)
    acc = r.random() < 0.4
    n = r.randint(0, min(4, xv.shape[0])) if not acc else r.randint(0, 5)
    if xv.shape[0] == 0:
        n = 0
    idx = g.new_input([n], "int64", "index" if acc else "perm", xv.shape[0], "contig")
    vshape = [n] + list(xv.shape[1:])
    if r.random() < 0.3:
        vshape = vshape[r.randint(0, len(vshape)) :]
    dt = str(xv.dtype).replace("torch.", "") if r.random() < 0.85 else None
    v = g.new_input(vshape, dt, layout="contig")
    if not acc and r.random() < 0.4:
        return g.add_step("index_put_", "{a0}[{a1}] = {a2}", [x, idx, v], out=False)
    return g.add_step(
        "index_put_acc" if acc else "index_put_",
        "{a0}.index_put_(({a1},), {a2}, accumulate={c0})",
        [x, idx, v],
        [repr(acc)],
        out=False,
    )


def view_step(g, x, op=None):
    r = g.rng
    xv = g.val(x)
    nd = xv.dim()
    op = op or r.choice(VIEWS)
    if nd == 0 and op not in ("unsqueeze", "view", "reshape", "expand"):
        op = r.choice(("unsqueeze", "view", "reshape", "expand"))
    shp = list(xv.shape)
    if op == "transpose":
        return g.add_step(
            op, "{a0}.transpose({c0}, {c1})", [x], [str(r.randrange(nd)), str(r.randrange(-nd, nd))], view=True
        )
    if op == "t":
        if nd > 2:
            op = "permute"
        else:
            return g.add_step(op, "{a0}.t()", [x], view=True)
    if op == "permute":
        p = list(range(nd))
        r.shuffle(p)
        return g.add_step(op, "{a0}.permute({c0})", [x], [repr(tuple(p))], view=True)
    if op == "slice":
        d = r.randrange(nd)
        lo = r.randint(0, max(0, shp[d] - 1)) if r.random() < 0.6 else ""
        hi = r.choice(("", str(r.randint(-2, shp[d]))))
        st = r.choice(("", "2", "3"))
        sl = f"{lo}:{hi}" + (f":{st}" if st else "")
        return g.add_step(op, "{a0}[" + ":, " * d + sl + "]", [x], view=True)
    if op == "narrow":
        d = r.randrange(nd)
        st = r.randint(0, shp[d])
        ln = r.randint(0, shp[d] - st)
        return g.add_step(op, "{a0}.narrow({c0}, {c1}, {c2})", [x], [str(d), str(st), str(ln)], view=True)
    if op == "expand":
        new = [r.randint(1, 3) if s == 1 and r.random() < 0.6 else (-1 if r.random() < 0.3 else s) for s in shp]
        if len(new) < 4 and r.random() < 0.4:
            new = [r.randint(0, 3)] + new
        return g.add_step(op, "{a0}.expand({c0})", [x], [repr(tuple(new))], view=True)
    if op in ("view", "reshape"):
        n = xv.numel()
        if r.random() < 0.3:
            new = [n]
        elif r.random() < 0.3:
            new = [-1]
        else:
            new = []
            rest = n
            for f in (2, 3, 5, 4):
                if rest and rest % f == 0 and r.random() < 0.5:
                    new.append(f)
                    rest //= f
            new.append(rest if r.random() < 0.7 or not new else -1)
            r.shuffle(new)
        return g.add_step(op, "{a0}.%s({c0})" % op, [x], [repr(tuple(new))], view=True)
    if op == "unsqueeze":
        return g.add_step(op, "{a0}.unsqueeze({c0})", [x], [str(r.randint(-nd - 1, nd))], view=True)
    if op == "squeeze":
        return g.add_step(op, "{a0}.squeeze({c0})", [x], [str(r.randrange(nd))], view=True)
    d = r.randrange(nd)
    if shp[d] == 0:
        return None
    return g.add_step("select", "{a0}.select({c0}, {c1})", [x], [str(d), str(r.randrange(-shp[d], shp[d]))], view=True)


def g_view(g, ops):
    return view_step(g, g.pick(), g.rng.choice(ops))


def g_inplace(g, ops):
    """An in-place op through a view (or on a pool tensor directly)."""
    r = g.rng
    op = r.choice(ops)
    base = g.pick()
    tgt = base
    if r.random() < 0.75:
        s = view_step(g, base)
        if s is None or s["out"] is None or s["out"] not in g.ns:
            return s
        tgt = s["out"]
    tv = g.val(tgt)
    dt = str(tv.dtype).replace("torch.", "")
    if op in ("fill_",):
        return g.add_step(op, "{a0}.fill_({c0})", [tgt], [g.scalar(dt)], [0], out=False)
    if op == "zero_":
        return g.add_step(op, "{a0}.zero_()", [tgt], out=False)
    if op == "clamp_":
        return g.add_step(op, "{a0}.clamp_({c0}, {c1})", [tgt], ["-1", "2"], [0, 1], out=False)
    if op == "masked_fill_":
        m = g.new_input(g.broadcast_shape_of(list(tv.shape)), "bool")
        return g.add_step(op, "{a0}.masked_fill_({a1}, {c0})", [tgt, m], [g.scalar(dt)], [0], out=False)
    if op != "copy_" and r.random() < 0.4:
        k = g.scalar(dt)
        if op == "div_" and k in ("0", "False"):
            k = "2"
        return g.add_step(op, "{a0}.%s({c0})" % op, [tgt], [k], [0], out=False)
    src_dt = dt if r.random() < 0.7 else g.rand_dtype()
    src = g.pick(
        lambda v: (
            _bcast(g, v.shape, tv.shape)
            and len(v.shape) <= len(tv.shape)
            and g.torch.broadcast_shapes(v.shape, tv.shape) == tv.shape
        ),
        lambda: g.new_input(g.broadcast_shape_of(list(tv.shape)), src_dt, "nonzero" if op == "div_" else None),
        p_new=0.6,
    )
    return g.add_step(op, "{a0}.%s({a1})" % op, [tgt, src], out=False)


# (weight, family name, ops, generator)
FAMILIES = [
    (14, "unary", UNARY, g_unary),
    (18, "binary", BINARY, g_binary),
    (3, "where", ["where"], g_where),
    (3, "clamp", ["clamp"], g_clamp),
    (3, "cast", ["to"], g_cast),
    (10, "reduce", REDUCE, g_reduce),
    (7, "matmul", ["mm", "bmm", "matmul"], g_matmul),
    (9, "index", ["index_select", "gather", "getitem", "masked_fill", "index_put_", "mask_getitem"], g_index),
    (10, "view", VIEWS, g_view),
    (14, "inplace", INPLACE, g_inplace),
]


def generate(seed, ops=None):
    """A random program (a dict, JSON-able) from a seed."""
    g = Gen(seed, ops)
    r = g.rng
    for _ in range(r.randint(1, 2)):
        g.new_input()
    n = r.randint(2, MAX_STEPS)
    tries = 0
    while len(g.prog["steps"]) < n and tries < 4 * n:
        tries += 1
        g.step()
    return g.prog


# ---------------------------------------------------------------------------
# Minimization (in the driver): candidates run in the worker.


def _drop_steps(prog, drop):
    """prog without the steps at positions drop, nor those that use their
    names; unused inputs removed."""
    gone = set()
    steps = []
    for i, s in enumerate(prog["steps"]):
        if i in drop or any(a in gone for a in s["args"]):
            if s["out"]:
                gone.add(s["out"])
            continue
        steps.append(s)
    used = {a for s in steps for a in s["args"]}
    order = [n for n in prog["order"] if n in used or not steps]
    if not order and prog["order"]:
        order = prog["order"][:1]
    return dict(prog, steps=steps, order=order, inputs={n: prog["inputs"][n] for n in order})


def _variants(prog):
    """Smaller or simpler versions of prog, most promising first."""
    n = len(prog["steps"])
    # drop chunks of steps, then single steps
    size = n // 2
    while size >= 1:
        for start in range(0, n, size):
            yield _drop_steps(prog, set(range(start, min(n, start + size))))
        size //= 2
    # a value computed by a step becomes an input of its dtype and shape
    for i, s in enumerate(prog["steps"]):
        out = s["out"]
        if out and not s.get("view") and out in prog.get("shapes", {}) and prog["dtypes"].get(out) in DTYPES:
            spec = {
                "shape": prog["shapes"][out],
                "dtype": prog["dtypes"][out],
                "kind": "normal",
                "seed": 0,
                "layout": "contig",
                "bound": 0,
                "special": 0.0,
            }
            yield dict(
                prog,
                steps=prog["steps"][:i] + prog["steps"][i + 1 :],
                order=prog["order"] + [out],
                inputs=dict(prog["inputs"], **{out: spec}),
            )
    # inputs: fewer elements, simpler layout and values
    for name in prog["order"]:
        spec = prog["inputs"][name]
        for d, s in enumerate(spec["shape"]):
            for new in sorted({1, s - 1, s // 2}):
                if 0 < new < s:
                    yield _with_input(prog, name, shape=spec["shape"][:d] + [new] + spec["shape"][d + 1 :])
        if spec.get("layout", "contig") != "contig":
            yield _with_input(prog, name, layout="contig")
        if spec.get("special"):
            yield _with_input(prog, name, special=0.0)
        for seed in (0, 1, 2):
            if spec["seed"] > 2:
                yield _with_input(prog, name, seed=seed)
    # constants
    for i, s in enumerate(prog["steps"]):
        for j in s.get("simp", ()):
            for c in ("0", "1", "2", "1.5"):
                if s["consts"][j] != c and len(s["consts"][j]) >= len(c) and s["consts"][j] not in ("0", "1"):
                    steps = list(prog["steps"])
                    consts = list(s["consts"])
                    consts[j] = c
                    steps[i] = dict(s, consts=consts)
                    yield dict(prog, steps=steps)


def _with_input(prog, name, **kw):
    inputs = dict(prog["inputs"])
    inputs[name] = dict(inputs[name], **kw)
    return dict(prog, inputs=inputs)


def _size(prog):
    return (
        len(prog["steps"]),
        len(prog["order"]),
        sum(_numel(s["shape"]) for s in prog["inputs"].values()),
        sum(s.get("layout", "contig") != "contig" for s in prog["inputs"].values()),
        sum(bool(s.get("special")) for s in prog["inputs"].values()),
        sum(s["seed"] for s in prog["inputs"].values()),
        sum(len(c) for s in prog["steps"] for c in s["consts"]),
    )


def _numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def minimize(prog, sig, mode, check, budget_s=120.0, max_tries=400):
    """Shrink prog while check(candidate, mode) still fails with signature
    sig. Returns the smallest program found."""
    t0 = time.time()
    tries = 0
    best = prog
    improved = True
    while improved and time.time() - t0 < budget_s and tries < max_tries:
        improved = False
        for cand in _variants(best):
            if time.time() - t0 > budget_s or tries >= max_tries:
                break
            if _size(cand) >= _size(best):
                continue
            tries += 1
            try:
                cand_lines = program_lines(cand)  # noqa: F841  (a shrunk input must still build)
            except Exception:  # noqa: BLE001
                continue
            if sig in check(cand, mode):
                best = cand
                improved = True
                break
    return best


def reproducer(prog, mode, detail=""):
    """A standalone Python script that shows the failure."""
    import torch  # noqa: F401

    lines = program_lines(prog)
    cpu_ns, cpu_exc = run_lines(lines, "cpu")
    body = []
    for i, line in enumerate(lines):
        if cpu_exc[i] is not None:
            body += [
                "    try:",
                f"        {line}",
                "    except Exception as e:",
                f"        print(dev, 'raises', type(e).__name__)  # the CPU raises {type(cpu_exc[i]).__name__}",
            ]
        else:
            body.append(f"    {line}")
    names = [n for n in defined_names(prog) if n in cpu_ns]
    out = [
        f"# torchtpu fuzz: {detail}" if detail else "# torchtpu fuzz reproducer",
        "import torch",
        "import torchtpu",
        "",
        f'torchtpu.eager_mode("{mode}")',
        "nan, inf = float('nan'), float('inf')",
        "",
        "",
        "def run(dev):",
    ]
    out += body
    out += [
        f"    return [{', '.join(names)}]",
        "",
        "",
        "for c, t in zip(run(\"cpu\"), run(\"tpu\")):",
        "    print('cpu', c)",
        "    print('tpu', t.cpu())",
    ]
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------
# The worker and the driver.


def _worker():
    import warnings

    warnings.filterwarnings("ignore")
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    import torch  # noqa: F401

    import torchtpu  # noqa: F401

    inject = os.environ.get("TORCHTPU_FUZZ_INJECT") or None
    out.write(RESULT_TAG + json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        job = json.loads(line)
        try:
            fails = check_program(job["prog"], job["modes"], inject)
        except Exception:  # noqa: BLE001  (a bug of the harness itself)
            fails = [{"kind": "harness", "mode": "", "sig": "harness", "detail": traceback.format_exc(limit=3)[-600:]}]
        out.write(RESULT_TAG + json.dumps({"failures": fails}) + "\n")
        out.flush()


class Runner:
    """One worker process; run(prog, modes) returns failures, counting a
    dead worker as a crash and a slow one as a timeout."""

    def __init__(self, timeout=PER_PROGRAM_SECONDS, env=None):
        self.timeout = timeout
        self.env = dict(os.environ if env is None else env)
        self.env["TORCHTPU_CPU_FALLBACK"] = "0"
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "torchtpu.tools.fuzz", "--worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=self.env,
        )
        r = self._read(300)
        if not r or not r.get("ready"):
            raise RuntimeError("fuzz: a worker could not start (does `import torchtpu` work?)")

    def _read(self, timeout):
        end = time.time() + timeout
        while True:
            left = end - time.time()
            if left <= 0:
                return "timeout"
            ready, _, _ = select.select([self.proc.stdout], [], [], left)
            if not ready:
                return "timeout"
            line = self.proc.stdout.readline()
            if not line:
                return None
            if line.startswith(RESULT_TAG):
                return json.loads(line[len(RESULT_TAG) :])

    def run(self, prog, modes):
        if self.proc is None:
            self.start()
        try:
            self.proc.stdin.write(json.dumps({"prog": prog, "modes": list(modes)}) + "\n")
            self.proc.stdin.flush()
            r = self._read(self.timeout)
        except (BrokenPipeError, OSError):
            r = None
        if r is None or r == "timeout":
            code = self.kill()
            if r is None:
                return [
                    {
                        "kind": "crash",
                        "mode": ",".join(modes),
                        "sig": "crash",
                        "detail": f"the worker died (exit status {code})",
                    }
                ]
            return [{"kind": "timeout", "mode": ",".join(modes), "sig": "timeout", "detail": f"over {self.timeout} s"}]
        return r["failures"]

    def kill(self):
        code = None
        if self.proc is not None:
            try:
                self.proc.kill()
                code = self.proc.wait(timeout=10)
            except Exception:  # noqa: BLE001
                pass
            self.proc = None
        return code

    def close(self):
        if self.proc is not None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=10)
            except Exception:  # noqa: BLE001
                self.kill()
            self.proc = None


def _mode_of(f, modes):
    m = f["mode"]
    return [m] if m in MODES else list(modes)


def _minimize_failure(runner, prog, f, fails, pseed, modes, budget_s):
    sig = f["sig"]
    first_mode = _mode_of(f, modes)

    def check(cand, mode):
        return {x["sig"] for x in runner.run(cand, mode)}

    small = minimize(prog, sig, first_mode, check, budget_s=budget_s)
    again = runner.run(small, first_mode)
    detail = next((x["detail"] for x in again if x["sig"] == sig), f["detail"])
    mode = first_mode[0] if len(first_mode) == 1 else "strict"
    head = f"{f['kind']} ({sig}) in {f['mode']} mode: {detail}"[:400].replace("\n", " ")
    return {
        "sig": sig,
        "kind": f["kind"],
        "count": 1,
        "modes": {x["mode"] for x in fails if x["sig"] == sig},
        "seed": pseed,
        "detail": detail,
        "steps": len(small["steps"]),
        "reproducer": reproducer(small, mode, head),
        "program": small,
        "still_fails": any(x["sig"] == sig for x in again),
    }


def fuzz(
    minutes=None,
    seed=0,
    programs=None,
    modes=MODES,
    out=None,
    ops=None,
    quiet=False,
    minimize_budget_s=120.0,
    timeout=PER_PROGRAM_SECONDS,
    env=None,
    log=print,
):
    """Run the fuzzer; returns a summary dict (counts and the distinct
    failures with their reproducers)."""
    t0 = time.time()
    deadline = None if minutes is None else t0 + 60.0 * minutes
    runner = Runner(timeout, env)
    counts = {"programs": 0, "mismatches": 0, "error_mismatches": 0, "crashes": 0, "timeouts": 0, "harness": 0}
    key = {
        "mismatch": "mismatches",
        "error": "error_mismatches",
        "crash": "crashes",
        "timeout": "timeouts",
        "harness": "harness",
    }
    distinct = {}
    if out:
        os.makedirs(out, exist_ok=True)
    i = 0
    try:
        while True:
            if programs is not None and i >= programs:
                break
            if deadline is not None and time.time() > deadline:
                break
            if programs is None and deadline is None:
                break
            pseed = seed * 1_000_003 + i
            prog = generate(pseed, ops)
            i += 1
            fails = runner.run(prog, modes)
            counts["programs"] += 1
            if not fails:
                if not quiet and counts["programs"] % 25 == 0:
                    log(f"[{counts['programs']} programs, {time.time() - t0:.0f} s] ok", flush=True)
                continue
            counts[key[fails[0]["kind"]]] += 1
            for f in fails:
                if not quiet or f is fails[0]:
                    log(f"program {i - 1} (seed {pseed}): {f['kind']} in {f['mode']}: {f['detail'][:300]}", flush=True)
            seen = set()
            for f in fails:
                sig = f["sig"]
                if sig in seen:
                    continue
                seen.add(sig)
                if sig in distinct:
                    distinct[sig]["count"] += 1
                    distinct[sig]["modes"].update(x["mode"] for x in fails if x["sig"] == sig)
                    continue
                d = _minimize_failure(runner, prog, f, fails, pseed, modes, minimize_budget_s)
                distinct[sig] = d
                if not quiet:
                    log(f"--- minimized reproducer ({sig}, {d['steps']} steps) ---\n{d['reproducer']}---", flush=True)
                if out:
                    fname = os.path.join(out, "repro_%03d.py" % len(distinct))
                    with open(fname, "w") as fh:
                        fh.write(d["reproducer"])
                    d["file"] = fname
    finally:
        runner.close()
    failed = sum(counts[k] for k in ("mismatches", "error_mismatches", "crashes", "timeouts", "harness"))
    summary = {
        "counts": counts,
        "failed": failed,
        "seconds": round(time.time() - t0, 1),
        "distinct": list(distinct.values()),
    }
    if out:
        with open(os.path.join(out, "summary.json"), "w") as fh:
            json.dump(
                {
                    **summary,
                    "distinct": [
                        {k: (sorted(v) if isinstance(v, set) else v) for k, v in d.items()} for d in distinct.values()
                    ],
                },
                fh,
                indent=1,
            )
    return summary


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m torchtpu.tools.fuzz", description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--programs", type=int, default=None)
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--out", default=None, help="a folder for the reproducers and summary.json")
    p.add_argument("--ops", default=None, help="only these ops (comma-separated names)")
    p.add_argument("--timeout", type=float, default=PER_PROGRAM_SECONDS, help="seconds per program")
    p.add_argument("--minimize-seconds", type=float, default=120.0)
    p.add_argument("--show", type=int, default=None, help="print the program of this seed and exit")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        return _worker()
    ops = [o.strip() for o in a.ops.split(",")] if a.ops else None
    if a.show is not None:
        print("\n".join(program_lines(generate(a.show, ops))))
        return 0
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad:
        p.error(f"unknown mode(s) {bad}; choose from {MODES}")
    if a.minutes is None and a.programs is None:
        a.minutes = 1.0
    s = fuzz(a.minutes, a.seed, a.programs, modes, a.out, ops, a.quiet, a.minimize_seconds, a.timeout)
    c = s["counts"]
    print(
        f"programs {c['programs']}, mismatches {c['mismatches']}, error mismatches {c['error_mismatches']}, "
        f"crashes {c['crashes']}, timeouts {c['timeouts']}"
        + (f", harness errors {c['harness']}" if c["harness"] else "")
        + f" ({s['seconds']:.0f} s); distinct failures {len(s['distinct'])}"
    )
    for d in s["distinct"]:
        print(
            f"  {d['sig']}: {d['count']}x, modes {','.join(sorted(d['modes']))}, first seed {d['seed']}, "
            f"minimized to {d['steps']} steps" + (f" ({d['file']})" if d.get("file") else "")
        )
    return 1 if s["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
