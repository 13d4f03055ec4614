"""The fuzzer's programs (tests.sweeps.fuzz): the inputs a spec makes, a
program's lines of Python, running them on a device (in the worker) and
comparing the results with the CPU's."""

import math

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
