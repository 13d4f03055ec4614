"""The fuzzer's generator (tests.sweeps.fuzz): random programs, each step
drawn from an op family while the CPU runs it, so that operands fit and no
step depends on a value check."""

import random

from .fuzz_program import DTYPES, FLOATS, INTS, MAX_STEPS, VALUE_ERRORS, defined_names, input_line, step_code

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
