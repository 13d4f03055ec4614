"""torch.compile(model, backend="tpu").

Dynamo captures the graphs, AOTAutograd splits each into a forward and a
backward graph of core ATen ops (with PyTorch's decompositions, inputs
functionalized: mutation and aliasing of inputs are handled by its
wrappers). Each graph runs in the fused eager mode: its nodes are recorded
through the same C lowering table as eager ops and become one StableHLO
program, compiled through the shared cache (memory and disk) and launched
asynchronously when the graph returns. That first call also keeps a plan:
which graph input, held tensor, constant or generator offset feeds each
program input, and where each program output goes. Later calls whose inputs
have the same layout run the program from the plan, without dispatching or
recording the graph's ops again: nothing recompiles, and the per-op cost of
Python and the recorder is paid once.

Graphs with symbolic sizes (dynamic=True, mark_dynamic) run padded to
shape buckets (see _bucket.py): one program per bucket, not per size.

Registered lazily through the "torch_dynamo_backends" entry point.
"""

import sys
from typing import Any, Callable

import torch
import torch.fx

from . import _C, _settings

_EXPLAIN = _settings.flag("TORCHTPU_EXPLAIN_RECOMPILES")
_BUCKETS = _settings.flag("TORCHTPU_BUCKETS")

_MAX_PLANS = 8


def _explain(msg):
    if _EXPLAIN:
        print(f"torchtpu: {msg}", file=sys.stderr)


class _Plans:
    """Runs body(*args) recorded in fused mode on the first call with a given
    input layout, keeping a plan of its program; later calls with that layout
    run the program straight from the plan (_C.graph_replay)."""

    def __init__(self, body):
        self.body = body
        self.plans = []
        self.why = None

    def __call__(self, args):
        out = _C.graph_replay(self.plans, args)
        if out is not None:
            return out
        token = _C.graph_capture_begin()
        try:
            out = self.body(*args)
        except BaseException:
            _C.graph_capture_end(token, (), ())  # runs what was recorded, restores the mode
            raise
        plan, why = _C.graph_capture_end(token, args, out if isinstance(out, (list, tuple)) else (out,))
        if plan is not None and isinstance(out, (list, tuple)) and len(self.plans) < _MAX_PLANS:
            self.plans.append(plan)
        if why is not None and self.why is None:
            self.why = why
            _explain(f"a compiled graph will be recorded on each call: {why}")
        return out


def _run_fused(gm):
    """The graph's callable (boxed: it takes the list of arguments)."""
    plans = _Plans(gm)

    def run(args):
        return plans(args)

    run._boxed_call = True
    run._torchtpu_plans = plans.plans
    run._torchtpu_state = plans
    return run


def _is_dynamic(gm):
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            v = n.meta.get("val")
            if (
                isinstance(v, torch.SymInt)
                or isinstance(v, torch.Tensor)
                and any(isinstance(s, torch.SymInt) for s in v.shape)
            ):
                return True
    return False


def _num_returns():
    ctx = torch._guards.TracingContext.try_get()
    meta = getattr(ctx, "fw_metadata", None) if ctx is not None else None
    return getattr(meta, "num_forward_returns", None)


def _bucketed(gm, an, nret):
    """The callable of a graph with symbolic sizes: arguments padded to the
    bucket of each real size, one plan per bucket; outputs that leave
    AOTAutograd (the first nret) are cut back to their real sizes, saved
    tensors stay padded for the backward graph."""
    import sympy

    from . import _bucket

    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    outs = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    syms = {}  # symbol -> (placeholder index, tensor dim or None)
    for i, n in enumerate(phs):
        d = an.desc[n]
        if hasattr(d, "is_Symbol") and d.is_Symbol:
            syms.setdefault(d, (i, None))
        elif isinstance(d, tuple):
            for k, x in enumerate(d):
                if x is not None and len(x) == 1 and x[0] in an.symbols:
                    syms.setdefault(x[0], (i, k))
    missing = an.symbols - set(syms)
    if missing:
        from ._bucket import Unsupported

        raise Unsupported(f"sizes {sorted(map(str, missing))} that no argument gives")
    order = sorted(an.symbols, key=str)
    # integer outputs (sizes saved for the backward) as functions of the real sizes
    int_outs = {
        o: sympy.lambdify(order, an.desc[o], "math")
        for o in outs
        if isinstance(o, torch.fx.Node) and hasattr(an.desc.get(o), "subs")
    }
    runners = {}
    state = {}

    def run(args):
        real = {}
        for s, (i, k) in syms.items():
            a = args[i]
            real[s] = int(a) if k is None else int(a.shape[k])
        pad = {}
        for s in order:
            p = _bucket.bucket(real[s])
            b = an.bounds.get(s)
            pad[s] = p if b is None or p <= b else max(real[s], b)  # a static slice bounds the bucket
        key = tuple(pad[s] for s in order)
        device = next(a.device for a in args if isinstance(a, torch.Tensor))
        targs = []
        for n, a in zip(phs, args):
            if isinstance(a, torch.Tensor):
                targs.append(_bucket.to_padded(a, an.desc[n], pad, real))
        nts = [torch.tensor(real[s], device=device) for s in order]
        runner = runners.get(key)
        if runner is None:

            def body(*flat, pad=pad):
                it = iter(flat)
                full = [
                    next(it)
                    if isinstance(a, torch.Tensor)
                    else int(an.desc[n].subs(pad))
                    if hasattr(an.desc.get(n), "subs")
                    else a
                    for n, a in zip(phs, state["args"])
                ]
                nt = dict(zip(order, flat[len(flat) - len(order) :]))
                res = _bucket.run_graph(an, full, pad, nt, device)
                return [x for x in res if isinstance(x, torch.Tensor)]

            runner = runners[key] = _Plans(body)
        state["args"] = args
        res = iter(runner(targs + nts))
        out = []
        for j, o in enumerate(outs):
            if o is None:
                out.append(None)
            elif o in int_outs:
                out.append(int_outs[o](*(real[s] for s in order)))
            elif isinstance(o.meta.get("val"), torch.Tensor):
                t = next(res)
                out.append(_bucket.to_real(t, an.desc[o], pad, real) if nret is None or j < nret else t)
            else:
                out.append(o.meta.get("val"))
        return out

    run._boxed_call = True
    run._torchtpu_runners = runners
    return run


def _unpadding(gm, known):
    """A backward graph that cannot be bucketed after a bucketed forward: its
    saved tensors arrive padded and are cut back before it runs."""
    from . import _bucket

    inner = _run_fused(gm)
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    sym_args = [
        (i, _bucket._expr(n.meta["val"]))
        for i, n in enumerate(phs)
        if isinstance(n.meta.get("val"), torch.SymInt) and _bucket._expr(n.meta["val"]).is_Symbol
    ]

    def run(args):
        real = {s: int(args[i]) for i, s in sym_args}
        pad = {s: _bucket.bucket(r) for s, r in real.items()}
        fixed = []
        for n, a in zip(phs, args):
            d = known.get(n.name)
            if (
                isinstance(a, torch.Tensor)
                and d is not None
                and all(f in real for x in d if x is not None for f in x if hasattr(f, "is_Symbol") and f.is_Symbol)
            ):
                a = _bucket.to_real(a, d, pad, real)
            fixed.append(a)
        return inner(fixed)

    run._boxed_call = True
    return run


def _make_compiler(shared, kind):
    def compile(gm, example_inputs):
        if not (_BUCKETS and _is_dynamic(gm)):
            return _run_fused(gm)
        from ._bucket import Analysis, Unsupported

        known = shared.get("descs") if kind == "bw" else None
        if kind == "bw" and known is None:
            return _run_fused(gm)  # the forward runs unpadded
        try:
            an = Analysis(gm, known)
            fn = _bucketed(gm, an, _num_returns() if kind != "bw" else None)
        except Unsupported as e:
            _explain(f"a graph with symbolic sizes compiles per size (not bucketed): {e}")
            return _unpadding(gm, known) if kind == "bw" else _run_fused(gm)
        if kind == "fw":
            shared["descs"] = {n.name: d for n, d in an.desc.items() if isinstance(d, tuple)}
        return fn

    return compile


def backend(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor], **kwargs: Any) -> Callable[..., Any]:
    """The "tpu" torch.compile backend: AOTAutograd with core ATen
    decompositions, each forward, backward and inference graph run by the
    fused recorder and replayed from its plan (see the module's doc)."""
    from torch._decomp import core_aten_decompositions
    from torch._dynamo.backends.common import aot_autograd

    shared = {}
    return aot_autograd(
        fw_compiler=_make_compiler(shared, "fw"),
        bw_compiler=_make_compiler(shared, "bw"),
        inference_compiler=_make_compiler(shared, "inf"),
        keep_inference_input_mutations=True,
        decompositions=core_aten_decompositions(),
    )(gm, example_inputs, **kwargs)
