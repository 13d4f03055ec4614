"""Shape buckets for torch.compile(dynamic=True).

A graph traced with symbolic sizes (s0, s1, ...) runs with every symbolic
size padded up to its bucket (the next power of two, at least
TORCHTPU_BUCKET_MIN), so all sizes in a bucket share one program. The
padding is masked so that results are exactly those of the unpadded graph:
before an op whose result mixes positions along a padded dimension (a
reduction, a contraction, a softmax, an accumulating scatter) the padded
positions are replaced by the op's identity (0, -inf, False, ...); a mean
divides by the real count. Everything else computes garbage in the padded
positions, which nothing real ever reads. The real sizes enter the program
as 0-d tensors (arguments of its plan), so a new size in a bucket replays
the bucket's program.

This module only decides, per FX node, which dimensions are padded and where
masks go; the masks are ordinary tpu ops recorded with the graph into the
same program. A graph that uses an op without a rule here (convolution over a
symbolic size, a sort along one, ...) is not bucketed: it compiles per size
as before, and TORCHTPU_EXPLAIN_RECOMPILES=1 says which op stopped it.

A dimension descriptor is None for a static size, or a tuple of factors in
row-major order (ints and sympy symbols) whose product is the size: (s0,) for
a plain symbolic size, (s0, s1) for a batch and a sequence merged by a view.
"""

import functools
import math
import operator

import sympy
import torch

from . import _settings

aten = torch.ops.aten

_HOST_PAD_BYTES = 1 << 20
# What floating-point inputs are padded with: nothing real may read it (the
# tests pad with NaN, which any missing mask would let through).
FLOAT_PAD = 0.0
_MIN = _settings.integer("TORCHTPU_BUCKET_MIN")


def bucket(n):
    """The padded size of a symbolic size n: the next power of two (>= the minimum)."""
    return max(_MIN, 1 << max(0, int(n) - 1).bit_length())


class Unsupported(Exception):
    pass


def _expr(s):
    """The size as a sympy expression, in the shape environment's canonical
    symbols (two inputs traced with their own symbols may have been found
    equal)."""
    if isinstance(s, torch.SymInt):
        return s.node.shape_env.replace(s.node.expr)
    return sympy.Integer(int(s))


def _shape(node):
    v = node.meta.get("val")
    return [_expr(s) for s in v.shape] if isinstance(v, torch.Tensor) else None


def _plain(e):
    if e.is_Integer:
        return None
    if e.is_Symbol:
        return (e,)
    raise Unsupported(f"a size {e} whose layout is unknown")


def _prod(fs):
    return sympy.Mul(*fs) if fs else sympy.Integer(1)


def _size(f, sizes):
    """A factor's size: sizes[f] for a symbol, else the integer itself."""
    return sizes[f] if isinstance(f, sympy.Symbol) else int(f)


def _dim_sizes(dims, sizes):
    """Sizes of a tensor whose dims are factor tuples, given sizes of the
    symbols (plain integer arithmetic: this runs on every call)."""
    return [math.prod(_size(f, sizes) for f in d) for d in dims]


def _factor_sizes(dims, sizes):
    """The size of every factor of every dim, flattened."""
    return [_size(f, sizes) for d in dims for f in d]


_POINTWISE_EXTRA = {
    aten.full_like.default,
    aten._to_copy.default,
    aten.alias.default,
    aten.zeros_like.default,
    aten.ones_like.default,
    aten.empty_like.default,
    aten.rand_like.default,
    aten.randn_like.default,
    aten.bernoulli.p,
    aten.bernoulli.default,
    aten.native_dropout.default,
    aten.detach.default,
    aten.lift_fresh_copy.default,
    aten.masked_fill.Scalar,
    aten.masked_fill.Tensor,
}
_CREATE = {
    aten.full.default,
    aten.zeros.default,
    aten.ones.default,
    aten.empty.memory_format,
    aten.empty_strided.default,
    aten.new_zeros.default,
    aten.new_ones.default,
    aten.new_full.default,
    aten.new_empty.default,
    aten.scalar_tensor.default,
    aten.rand.default,
    aten.randn.default,
}
_ARANGE = {aten.arange.default, aten.arange.start, aten.arange.start_step}
# reduction -> the identity that padded positions take (None: a mean)
_REDUCE = {
    aten.sum.dim_IntList: 0,
    aten.sum.default: 0,
    aten.amax.default: "min",
    aten.amin.default: "max",
    aten.any.dim: False,
    aten.any.dims: False,
    aten.any.default: False,
    aten.all.dim: True,
    aten.all.default: True,
    aten.prod.dim_int: 1,
    aten.max.dim: "min",
    aten.min.dim: "max",
    aten.mean.dim: None,
    aten.mean.default: None,
    aten.logsumexp.default: float("-inf"),
    aten.argmax.default: "min",
    aten.argmin.default: "max",
}
_SCAN = {aten.cumsum.default: 0, aten.cumprod.default: 1}  # padding inside a merged dimension comes before real rows
_SOFTMAX = {aten._softmax.default, aten._log_softmax.default}
# ops independent along the batch (dim 0) when no other dimension is padded
_BATCH_ONLY_BWD = {
    aten.convolution_backward.default,
    aten.max_pool2d_with_indices_backward.default,
    aten.avg_pool2d_backward.default,
    aten._adaptive_avg_pool2d_backward.default,
}
_BATCH_ONLY = {
    aten.convolution.default,
    aten.max_pool2d_with_indices.default,
    aten.avg_pool2d.default,
    aten._adaptive_avg_pool2d.default,
    aten._native_batch_norm_legit_no_training.default,
} | _BATCH_ONLY_BWD
_SOFTMAX_BWD = {aten._softmax_backward_data.default, aten._log_softmax_backward_data.default}
_SHAPE_ARG_TYPES = ("SymInt", "int", "List[int]", "Optional[int]", "List[Optional[int]]")


def _reduced(d, dims, keep):
    """A reduction's dims (all when none are given, made non-negative) and
    its output descriptor."""
    r = len(d)
    dims = [dims] if isinstance(dims, int) else dims
    dims = list(range(r)) if not dims else [k % r for k in dims]
    return dims, tuple(None if k in dims else d[k] for k in range(r) if keep or k not in dims)


def _is_sym(node):
    return isinstance(node, torch.fx.Node) and isinstance(node.meta.get("val"), (torch.SymInt, torch.SymFloat))


class Analysis:
    """Descriptors of every value of an FX graph (raises Unsupported).

    known: descriptors of placeholders by name (a backward graph's saved
    tensors, from the forward's analysis)."""

    def __init__(self, gm, known=None):
        self.gm = gm
        self.desc = {}
        self.masks = {}  # node -> list of (arg index, dims, fill): mask before the call
        self.special = {}  # node -> "mean" | "index_put"
        self.symbols = set()
        self.bounds = {}  # symbol -> largest padded size a static slice allows
        self.alias = {}  # symbol -> a symbol an op proved equal to it
        self.values = {}  # node -> list of (arg index, expr): a size used as a value
        known = known or {}
        for n in gm.graph.nodes:
            try:
                self._visit(n, known)
            except Unsupported as e:
                raise Unsupported(f"{n.target if n.op == 'call_function' else n.op}: {e}") from None
        if not self.symbols:
            raise Unsupported("no symbolic size")
        self._canonicalize()

    def _find(self, s):
        while s in self.alias:
            s = self.alias[s]
        return s

    def _same(self, x, y):
        """Whether two dimension descriptors are the same padding. Sizes that an
        op requires to be equal (traced with their own symbols, as the inputs
        and the targets of a loss) are unified."""
        if x == y:
            return True
        if x is None or y is None or len(x) != len(y):
            return False
        for f, g in zip(x, y):
            if isinstance(f, sympy.Symbol) and isinstance(g, sympy.Symbol):
                f, g = self._find(f), self._find(g)
                if f != g:
                    self.alias[g] = f
            elif f != g:
                return False
        return True

    def _canonicalize(self):
        if not self.alias:
            return
        sub = {s: self._find(s) for s in self.alias}

        def dim(d):
            return None if d is None else tuple(sub.get(f, f) if isinstance(f, sympy.Symbol) else f for f in d)

        def desc(d):
            if isinstance(d, tuple):
                return tuple(dim(x) for x in d)
            if isinstance(d, list):
                return [desc(x) for x in d]
            if isinstance(d, sympy.Expr):
                return d.subs(sub)
            return d

        self.desc = {n: desc(d) for n, d in self.desc.items()}
        self.values = {n: [(i, e.subs(sub)) for i, e in v] for n, v in self.values.items()}
        self.special = {
            n: (sp[0], desc(sp[1])) + sp[2:] if sp[0] == "index_put" else sp for n, sp in self.special.items()
        }
        bounds = {}
        for k, b in self.bounds.items():
            k = sub.get(k, k)
            bounds[k] = min(b, bounds.get(k, b))
        self.bounds = bounds
        self.symbols = {sub.get(x, x) for x in self.symbols}

    def _note(self, d):
        for dim in d or ():
            for f in dim or ():
                if isinstance(f, sympy.Symbol):
                    self.symbols.add(f)
        return d

    def _d(self, a):
        if not isinstance(a, torch.fx.Node):
            return None
        return self.desc.get(a)

    def _visit(self, n, known):
        shape = _shape(n)
        if n.op == "placeholder":
            v = n.meta.get("val")
            if isinstance(v, torch.SymInt):
                e = _expr(v)
                if e.is_Symbol:
                    self.symbols.add(e)
                self.desc[n] = e
            elif shape is not None:
                if n.name in known and known[n.name] is not None:
                    d = known[n.name]
                else:
                    d = tuple(_plain(e) for e in shape)
                self.desc[n] = self._note(d)
            return
        if n.op == "output":
            return
        if n.op != "call_function":
            raise Unsupported(f"a {n.op} node")
        v = n.meta.get("val")
        if isinstance(v, torch.SymFloat):
            # a size as a float (a variance's count - correction)
            es = [self.desc.get(a) if isinstance(a, torch.fx.Node) else sympy.sympify(a) for a in n.args]
            ops = {
                torch.sym_float: lambda x: x,
                operator.add: operator.add,
                operator.sub: operator.sub,
                operator.mul: operator.mul,
                operator.truediv: operator.truediv,
            }
            if n.target not in ops or not all(isinstance(e, sympy.Expr) for e in es):
                raise Unsupported(f"{n.target}: a size as a float")
            self.desc[n] = ops[n.target](*es)
            return
        if isinstance(v, torch.SymInt) or isinstance(v, (int, float, bool)) and not isinstance(v, torch.Tensor):
            if isinstance(v, torch.SymInt):
                self.desc[n] = _expr(v)
            return
        if n.target is operator.getitem:
            src = self.desc.get(n.args[0])
            self.desc[n] = src[n.args[1]] if isinstance(src, list) else None
            return
        if not isinstance(n.target, torch._ops.OpOverload):
            raise Unsupported("not an ATen op")
        self._check_args(n)
        ins = [a for a in n.args if isinstance(a, torch.fx.Node) and isinstance(self.desc.get(a), tuple)]
        padded_in = any(any(d is not None for d in self.desc[a]) for a in ins)
        outs = v if isinstance(v, (list, tuple)) else [v]
        padded_out = any(isinstance(o, torch.Tensor) and any(not _expr(s).is_Integer for s in o.shape) for o in outs)
        if not padded_in and not padded_out:
            self.desc[n] = [self._static(o) for o in outs] if isinstance(v, (list, tuple)) else self._static(v)
            return
        d = self._rule(n, shape)
        self.desc[n] = self._note(d) if isinstance(d, tuple) else [self._note(x) for x in d]

    @staticmethod
    def _static(o):
        return tuple(None for _ in o.shape) if isinstance(o, torch.Tensor) else None

    def _check_args(self, n):
        """A symbolic int may be a size, not a value: as a value it would
        be the padded size."""
        schema = n.target._schema.arguments
        for i, a in enumerate(list(n.args) + list(n.kwargs.values())):
            name = schema[i].name if i < len(n.args) else list(n.kwargs)[i - len(n.args)]
            ty = next((str(x.type) for x in schema if x.name == name), "")
            uses = [x for x in (a if isinstance(a, (list, tuple)) else [a]) if _is_sym(x)]
            if uses and not (ty in _SHAPE_ARG_TYPES or n.target in _ARANGE):
                # as a value it must be the real size: a 0-d tensor computed
                # in the program, through the op's Tensor overload
                tensor_op = getattr(n.target.overloadpacket, "Tensor", None)
                if (
                    i >= len(n.args)
                    or tensor_op is None
                    or not (ty == "number" and n.target._overloadname == "Scalar" or ty == "Tensor")
                ):
                    raise Unsupported(f"a symbolic size used as the value {name}")
                e = self.desc.get(n.args[i])
                if not isinstance(e, sympy.Expr):
                    e = _expr(n.args[i].meta["val"])
                if not e.is_rational_function(*e.free_symbols) or any(not x.is_Symbol for x in e.free_symbols):
                    raise Unsupported(f"a size {e} used as the value {name}")
                self.values.setdefault(n, []).append((i, e))

    def _mask(self, n, argi, dims, fill):
        d = self.desc.get(n.args[argi])
        dims = [k for k in dims if d is not None and d[k] is not None]
        if dims:
            self.masks.setdefault(n, []).append((argi, tuple(dims), fill))

    def _from_inputs(self, n, shape, inputs, plain=True):
        """Pointwise: each output dimension (right-aligned) takes the descriptor
        of an input dimension of the same size."""
        r = len(shape)
        out = []
        for i, e in enumerate(shape):
            if e.is_Integer:
                out.append(None)
                continue
            cands = set()
            for a in inputs:
                d, s = self.desc.get(a), _shape(a)
                if not isinstance(d, tuple) or s is None:
                    continue
                j = len(s) - (r - i)
                if j >= 0 and d[j] is not None and not (s[j] == 1):
                    cands.add(d[j])
            cands = list(cands)
            if any(not self._same(cands[0], c) for c in cands[1:]):
                raise Unsupported(f"inputs padded differently along a dimension of size {e}")
            out.append(cands[0] if cands else _plain(e) if plain else None)
        return tuple(out)

    def _rule(self, n, shape):
        t, a = n.target, n.args
        tensors = [x for x in a if isinstance(x, torch.fx.Node) and isinstance(self.desc.get(x), tuple)]
        if t in _SOFTMAX or t in _SOFTMAX_BWD:
            dim = a[1] if t in _SOFTMAX else a[2]
            r = len(shape)
            dim %= r
            if t in _SOFTMAX:
                self._mask(n, 0, [dim], float("-inf"))
            else:
                self._mask(n, 0, [dim], 0)
                if t is aten._softmax_backward_data.default:
                    self._mask(n, 1, [dim], 0)
            return self.desc[a[0]] if t in _SOFTMAX else self._from_inputs(n, shape, tensors)
        if (torch.Tag.pointwise in t.tags or t in _POINTWISE_EXTRA) and shape is not None:
            return self._from_inputs(n, shape, tensors)
        if t in _SCAN:
            d = self.desc[a[0]]
            self._mask(n, 0, [a[1] % max(1, len(d))], _SCAN[t])
            return d
        if t in (aten.tril.default, aten.triu.default):
            return self.desc[a[0]]
        if t is aten.native_dropout.default:
            d = self.desc[a[0]]
            return [d, d]
        if t in _CREATE:
            return tuple(_plain(e) for e in shape)
        if t in _ARANGE:
            return tuple(_plain(e) for e in shape)
        if t in _REDUCE:
            d = self.desc[a[0]]
            dims = (
                a[1]
                if len(a) > 1 and t not in (aten.sum.default, aten.mean.default, aten.any.default, aten.all.default)
                else n.kwargs.get("dim")
            )
            keep = bool(a[2]) if len(a) > 2 else bool(n.kwargs.get("keepdim", False))
            dims, out = _reduced(d, dims, keep)
            fill = _REDUCE[t]
            if fill is None:
                if any(d[k] is not None for k in dims):
                    self.special[n] = ("mean", tuple(dims), keep)
            else:
                self._mask(n, 0, dims, fill)
            return [out, out] if t in (aten.max.dim, aten.min.dim) else out
        if t in (aten.sort.default, aten.sort.stable, aten.topk.default):
            # along a padded dim the padding is filled to sort after every real
            # value (sorts are stable: a real value equal to the fill stays first)
            d = self.desc[a[0]]
            kw = n.kwargs
            if t is aten.topk.default:
                k = a[1]
                dim = a[2] if len(a) > 2 else kw.get("dim", -1)
                desc = a[3] if len(a) > 3 else kw.get("largest", True)
                if not isinstance(k, int):
                    raise Unsupported("a topk of a symbolic count")
            else:
                dim = kw.get("dim", -1) if t is aten.sort.stable else (a[1] if len(a) > 1 else kw.get("dim", -1))
                desc = (
                    kw.get("descending", False)
                    if t is aten.sort.stable
                    else (a[2] if len(a) > 2 else kw.get("descending", False))
                )
            dim %= len(d)
            if d[dim] is not None:
                self._mask(n, 0, [dim], "min" if desc else "sort_last")
            out = tuple(None if (k2 == dim and t is aten.topk.default) else x for k2, x in enumerate(d))
            return [out, out]
        if t in (aten.var.correction, aten.var_mean.correction):
            # over padded dims: the masked mean, then the masked squares / (count - correction)
            d = self.desc[a[0]]
            keep = bool(n.kwargs.get("keepdim", False))
            dims, out = _reduced(d, a[1] if len(a) > 1 else n.kwargs.get("dim"), keep)
            if any(d[k] is not None for k in dims):
                self.special[n] = ("var", tuple(dims), keep)
            return [out, out] if t is aten.var_mean.correction else out
        if t in (aten.mm.default, aten.bmm.default, aten.addmm.default, aten.baddbmm.default):
            off = 1 if t in (aten.addmm.default, aten.baddbmm.default) else 0
            x, y = self.desc[a[off]], self.desc[a[off + 1]]
            self._mask(n, off, [len(x) - 1], 0)
            self._mask(n, off + 1, [len(y) - 2], 0)
            if len(x) == 3 and x[0] is not None and y[0] is not None and not self._same(x[0], y[0]):
                raise Unsupported("batch dimensions padded differently")
            out = (x[0], y[1]) if len(x) == 2 else (x[0] if x[0] is not None else y[0], x[1], y[2])
            if off:
                bias = self._from_inputs(n, shape, [a[0]], plain=False)
                out = tuple(o if o is not None else b for o, b in zip(out, bias))
            return out
        if t in (aten.view.default, aten._unsafe_view.default, aten.reshape.default):
            return self._view(self.desc[a[0]], _shape(a[0]), shape)
        if t is aten.permute.default:
            d = self.desc[a[0]]
            return tuple(d[k % len(d)] for k in a[1])
        if t is aten.t.default:
            return tuple(reversed(self.desc[a[0]]))
        if t is aten.transpose.int:
            d = list(self.desc[a[0]])
            i, j = a[1] % len(d), a[2] % len(d)
            d[i], d[j] = d[j], d[i]
            return tuple(d)
        if t is aten.unsqueeze.default:
            d = list(self.desc[a[0]])
            d.insert(a[1] % (len(d) + 1), None)
            return tuple(d)
        if t in (aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default):
            d, s = self.desc[a[0]], _shape(a[0])
            ks = range(len(d)) if len(a) < 2 else ([a[1]] if isinstance(a[1], int) else a[1])
            ks = {k % len(d) for k in ks if s[k % len(d)] == 1}
            return tuple(x for k, x in enumerate(d) if k not in ks)
        if t is aten.expand.default:
            return self._from_inputs(n, shape, [a[0]])
        if t is aten.slice.Tensor:
            d, s = self.desc[a[0]], _shape(a[0])
            dim = (a[1] if len(a) > 1 else 0) % len(d)
            start = a[2] if len(a) > 2 else 0
            step = a[4] if len(a) > 4 else 1
            out = list(d)
            end = a[3] if len(a) > 3 else None
            if d[dim] is not None:
                if start in (0, None) and step == 1 and sympy.simplify(shape[dim] - s[dim]) == 0:
                    pass  # the whole dimension
                elif (
                    len(d[dim]) == 1
                    and shape[dim].is_Integer
                    and step == 1
                    and isinstance(start, (int, type(None)))
                    and isinstance(end, int)
                    and (start or 0) >= 0
                    and end >= 0
                ):
                    out[dim] = None  # a static range of real positions: the padding is at the end
                else:
                    raise Unsupported("a slice of a padded dimension")
            elif not shape[dim].is_Integer:
                if start not in (0, None) or step != 1 or not s[dim].is_Integer:
                    raise Unsupported("a slice of symbolic length")
                out[dim] = _plain(shape[dim])
                sym = shape[dim]
                self.bounds[sym] = min(self.bounds.get(sym, 1 << 62), int(s[dim]))
            return tuple(out)
        if t is aten.select.int:
            d = list(self.desc[a[0]])
            dim = a[1] % len(d)
            if d[dim] is not None:
                raise Unsupported("a select along a padded dimension")
            del d[dim]
            return tuple(d)
        if t in (aten.split_with_sizes.default, aten.split.Tensor):
            d = self.desc[a[0]]
            dim = (a[2] if len(a) > 2 else 0) % len(d)
            if d[dim] is not None:
                raise Unsupported("a split along a padded dimension")
            return [d for _ in n.meta["val"]]
        if t is aten.cat.default:
            dim = a[1] if len(a) > 1 else 0
            ds = [self.desc[x] for x in a[0] if isinstance(self.desc.get(x), tuple) and len(self.desc[x]) == len(shape)]
            dim %= len(shape)
            if any(x[dim] is not None for x in ds):
                raise Unsupported("a cat along a padded dimension")
            return self._from_inputs(n, shape, [x for x in a[0]])
        if t is aten.embedding.default:
            return tuple(self.desc[a[1]]) + (None,)
        if t is aten.index_select.default:
            d = list(self.desc[a[0]])
            dim = a[1] % len(d)
            if d[dim] is not None:
                raise Unsupported("an index_select along a padded dimension")
            d[dim] = self.desc[a[2]][0]
            return tuple(d)
        if t is aten.gather.default:
            return self.desc[a[2]]
        if t in (aten.scatter.value, aten.scatter.src, aten.scatter_add.default):
            d, di = self.desc[a[0]], self.desc[a[2]]
            dim = a[1] % len(d)
            if d[dim] is not None or any(not self._same(x, y) for k, (x, y) in enumerate(zip(d, di)) if k != dim):
                raise Unsupported("a scatter whose index is padded unlike its target")
            return d
        if t in (aten.index_put.default, aten.index_put_.default):
            d = self.desc[a[0]]
            accumulate = a[3] if len(a) > 3 else n.kwargs.get("accumulate", False)
            if any(x is not None for x in d):
                raise Unsupported("an index_put into a padded tensor")
            idx = [self.desc.get(x) for x in a[1] if x is not None]
            if any(i is not None and any(k is not None for k in i) for i in idx):
                if not accumulate:
                    raise Unsupported("an index_put (not accumulating) with padded indices")
                self.special[n] = ("index_put", idx[0])
            return d
        if t is aten.native_layer_norm.default:
            d = self.desc[a[0]]
            k = len(a[1])
            if any(x is not None for x in d[len(d) - k :]):
                raise Unsupported("a layer norm over a padded dimension")
            stat = tuple(d[: len(d) - k]) + (None,) * k
            return [d, stat, stat]
        if t is aten.copy.default:
            return self.desc[a[0]]
        if t in (aten._native_batch_norm_legit_functional.default, aten.native_batch_norm_backward.default):
            # statistics over the batch: computed over the real rows
            xi = 0 if t is aten._native_batch_norm_legit_functional.default else 1
            d = self.desc[a[xi]]
            if any(x is not None for x in d[1:]):
                raise Unsupported(f"{t}: padded along a dimension other than the batch")
            c = (None,)
            if t is aten._native_batch_norm_legit_functional.default:
                if a[5]:
                    self.special[n] = ("batch_norm",)
                return [d, c, c, c, c]
            self.special[n] = ("batch_norm_backward",)
            return [d, c, c]
        if t in _BATCH_ONLY:
            # independent along the batch (dim 0): only that dim may be padded
            d = self.desc[a[0]]
            if any(x is not None for x in d[1:]) or any(
                any(x is not None for x in self.desc[w][:]) for w in tensors[1:] if t not in _BATCH_ONLY_BWD
            ):
                raise Unsupported(f"{t}: padded along a dimension other than the batch")
            outs = n.meta.get("val")
            outs = outs if isinstance(outs, (list, tuple)) else [outs]
            res = [tuple([d[0]] + [None] * (o.dim() - 1)) if isinstance(o, torch.Tensor) else None for o in outs]
            if t is aten.convolution_backward.default:
                # the weight and bias gradients sum over the batch
                self._mask(n, 0, [0], 0)
                self._mask(n, 1, [0], 0)
                res = [d] + [
                    tuple(None for _ in range(o.dim())) if isinstance(o, torch.Tensor) else None for o in outs[1:]
                ]
            return res if isinstance(n.meta.get("val"), (list, tuple)) else res[0]
        raise Unsupported("no bucketing rule")

    def _view(self, d, sin, sout):
        atoms = []
        for dim, e in zip(d, sin):
            if dim is None:
                atoms.append(int(e))
            else:
                atoms.extend(dim)
        out = []
        for e in sout:
            fs = []
            if e.is_Integer:
                need = int(e)
                while need > 1:
                    if not atoms or not isinstance(atoms[0], int):
                        raise Unsupported("a view splitting a padded dimension")
                    x = atoms[0]
                    if x <= need and need % x == 0:
                        atoms.pop(0)
                        need //= x
                    elif x > need and x % need == 0:
                        atoms[0] = x // need
                        need = 1
                    else:
                        raise Unsupported("a view regrouping a padded dimension")
                out.append(None)
                continue
            while sympy.simplify(_prod(fs) - e) != 0:
                if not atoms:
                    raise Unsupported("a view regrouping a padded dimension")
                fs.append(atoms.pop(0))
            fs = tuple(f for f in fs if f != 1)
            if not any(isinstance(f, sympy.Symbol) for f in fs):
                raise Unsupported("a view regrouping a padded dimension")
            out.append(fs)
        return tuple(out)


def _fill_value(fill, dtype):
    # sort_last: after every real value in an ascending sort (NaN sorts last in torch's
    # order; a descending sort takes "min")
    if fill == "sort_last":
        return float("nan") if dtype.is_floating_point else (True if dtype == torch.bool else torch.iinfo(dtype).max)
    if fill == "min":
        return float("-inf") if dtype.is_floating_point else (False if dtype == torch.bool else torch.iinfo(dtype).min)
    if fill == "max":
        return float("inf") if dtype.is_floating_point else (True if dtype == torch.bool else torch.iinfo(dtype).max)
    return fill


class _Run:
    """One padded run of an analysed graph: pad (symbol -> padded size),
    real (symbol -> real size), nt (symbol -> 0-d tpu tensor of the real size)."""

    def __init__(self, an, pad, nt, device):
        self.an, self.pad, self.nt, self.device = an, pad, nt, device
        self.cache = {}

    def dim_mask(self, factors):
        m = self.cache.get(factors)
        if m is None:
            sizes = [_size(f, self.pad) for f in factors]
            idx = torch.arange(math.prod(sizes), device=self.device)
            inner = 1
            for f, p in zip(reversed(factors), reversed(sizes)):
                if isinstance(f, sympy.Symbol):
                    digit = idx if inner == 1 and p == math.prod(sizes) else torch.remainder(idx // inner, p)
                    c = digit < self.nt[f]
                    m = c if m is None else torch.logical_and(m, c)
                inner *= p
            self.cache[factors] = m
        return m

    def mask(self, d, dims, rank):
        """A bool tensor broadcastable to the value: True at real positions along dims."""
        m = None
        for k in dims:
            shape = [1] * rank
            dm = self.dim_mask(d[k])
            shape[k] = dm.numel()
            dm = dm.view(shape)
            m = dm if m is None else torch.logical_and(m, dm)
        return m

    def count(self, d, dims):
        c, t = 1, None
        for k in dims:
            for f in d[k]:
                if isinstance(f, sympy.Symbol):
                    t = self.nt[f] if t is None else t * self.nt[f]
                else:
                    c *= int(f)
        return t * c if c != 1 else t

    def call(self, n, args, kwargs):
        an = self.an
        args = list(args)
        for argi, dims, fill in an.masks.get(n, ()):
            x = args[argi]
            args[argi] = x.masked_fill(
                torch.logical_not(self.mask(an.desc[n.args[argi]], dims, x.dim())), _fill_value(fill, x.dtype)
            )
        target = n.target
        for i, e in an.values.get(n, ()):
            args[i] = self.value(e)
            target = n.target.overloadpacket.Tensor
        sp = an.special.get(n)
        if sp and sp[0] == "mean":
            _, dims, keep = sp
            d = an.desc[n.args[0]]
            return self.masked_mean(args[0], d, dims, keep, kwargs.get("dtype"))
        if sp and sp[0] == "var":
            _, dims, keep = sp
            d = an.desc[n.args[0]]
            x = args[0]
            pad = torch.logical_not(self.mask(d, dims, x.dim()))
            cnt = self.count(d, dims)
            mean = self.masked_mean(x, d, dims, True)
            dev = (x - mean).masked_fill(pad, 0)
            corr = kwargs.get("correction")
            var = (dev * dev).sum(dim=list(dims), keepdim=keep) / (cnt - (1 if corr is None else corr))
            if n.target is aten.var_mean.correction:
                return var, (mean if keep else mean.squeeze(list(dims)))
            return var
        if sp and sp[0] in ("batch_norm", "batch_norm_backward"):
            return self.batch_norm(n, sp[0], args)
        if sp and sp[0] == "index_put":
            idx_desc = sp[1]
            vals = args[2]
            m = self.mask(idx_desc, [k for k, x in enumerate(idx_desc) if x is not None], len(idx_desc))
            m = m.view(list(m.shape) + [1] * (vals.dim() - m.dim()))
            args[2] = vals.masked_fill(torch.logical_not(m), 0)
        return target(*args, **kwargs)

    def masked_mean(self, x, d, dims, keep, dtype=None):
        """The mean of x over dims (of descriptor d) counting the real positions only."""
        x = x.masked_fill(torch.logical_not(self.mask(d, dims, x.dim())), 0)
        return torch.sum(x, dim=list(dims), keepdim=keep, dtype=dtype) / self.count(d, dims)

    def batch_norm(self, n, kind, args):
        """Training batch norm and its backward with statistics over the
        real rows of a padded batch (the padded rows' results are not used)."""
        fwd = kind == "batch_norm"
        x = args[0] if fwd else args[1]
        d = self.an.desc[n.args[0] if fwd else n.args[1]]
        pad = torch.logical_not(self.mask(d, [0], x.dim()))
        dims = [0] + list(range(2, x.dim()))
        cnt = self.count(d, [0]) * math.prod(x.shape[2:])
        shape = [1, x.shape[1]] + [1] * (x.dim() - 2)
        if fwd:
            _, w, b, rm, rv, _, momentum, eps = args
            mean = x.masked_fill(pad, 0).sum(dims) / cnt
            xc = (x - mean.view(shape)).masked_fill(pad, 0)
            var = (xc * xc).sum(dims) / cnt
            rstd = torch.rsqrt(var + eps)
            out = xc * rstd.view(shape)
            if w is not None:
                out = out * w.view(shape)
            if b is not None:
                out = out + b.view(shape)
            new_rm = None if rm is None else rm * (1 - momentum) + mean * momentum
            new_rv = None if rv is None else rv * (1 - momentum) + var * (cnt / (cnt - 1)) * momentum
            return out, mean, rstd, new_rm, new_rv
        g, _, w, rm, rv, sm, si, train, eps, omask = args
        mean, invstd = (sm, si) if train else (rm, torch.rsqrt(rv + eps))
        gm = g.masked_fill(pad, 0)
        xhat = ((x - mean.view(shape)) * invstd.view(shape)).masked_fill(pad, 0)
        sum_g, sum_gx = gm.sum(dims), (gm * xhat).sum(dims)
        scale = invstd.view(shape) if w is None else invstd.view(shape) * w.view(shape)
        gi = gm - sum_g.view(shape) / cnt - xhat * (sum_gx.view(shape) / cnt) if train else gm
        return (gi * scale if omask[0] else None, sum_gx if omask[1] else None, sum_g if omask[2] else None)

    def value(self, e):
        """A size expression (products of sizes and integers) at the real
        sizes, as a 0-d tensor."""
        if e.is_Number:
            return int(e) if e.is_Integer else float(e)
        if e.is_Symbol:
            return self.nt[e]
        if e.is_Mul or e.is_Add:
            return functools.reduce(operator.mul if e.is_Mul else operator.add, map(self.value, e.args))
        if e.is_Pow and e.exp.is_Integer and e.exp > 0:
            return self.value(e.base) ** int(e.exp)
        if e.is_Pow and e.exp.is_Integer and e.exp < 0:
            # 1 / size (a variance's backward): in f64, as Python's float would be
            b = self.value(e.base)
            b = b.double() if isinstance(b, torch.Tensor) else float(b)
            return (1.0 / b) ** (-int(e.exp))
        raise ValueError(f"size expression {e}")


def run_graph(an, args, pad, nt, device):
    """Runs an's graph on padded arguments (symbolic ints: padded sizes);
    returns the output node's values (padded)."""
    r = _Run(an, pad, nt, device)
    env = {}
    it = iter(args)
    out = None
    for n in an.gm.graph.nodes:
        if n.op == "placeholder":
            env[n] = next(it)
        elif n.op == "output":
            out = torch.fx.node.map_arg(n.args[0], lambda x: env[x])
        elif isinstance(an.desc.get(n), sympy.Expr):
            env[n] = (float if n.target is torch.sym_float else int)(an.desc[n].subs(pad))
        elif n.target is operator.getitem:
            env[n] = env[n.args[0]][n.args[1]]
        else:
            a = torch.fx.node.map_arg(n.args, lambda x: env[x])
            k = torch.fx.node.map_arg(n.kwargs, lambda x: env[x])
            env[n] = r.call(n, a, k)
    return out


def to_padded(t, d, pad, real):
    """t (real or already padded sizes) as a tensor of padded sizes."""
    if d is None or all(x is None for x in d):
        return t
    dd = [x if x is not None else (int(s),) for x, s in zip(d, t.shape)]
    psz = _dim_sizes(dd, pad)
    if list(t.shape) == psz:
        return t
    rsz = _dim_sizes(dd, real)
    if list(t.shape) != rsz:
        raise ValueError(f"a graph input of sizes {list(t.shape)}: expected {rsz} or {psz}")
    pf, rf = _factor_sizes(dd, pad), _factor_sizes(dd, real)
    if t.numel() * t.element_size() <= _HOST_PAD_BYTES:
        # Padded on the host: a device copy into the padding would be a
        # program compiled for each real size.
        z = torch.full(pf, FLOAT_PAD if t.is_floating_point() else 0, dtype=t.dtype)
        z[tuple(slice(0, k) for k in rf)] = t.cpu().reshape(rf)
        return z.reshape(psz).to(t.device)
    z = t.new_full(pf, FLOAT_PAD if t.is_floating_point() else 0)
    z[tuple(slice(0, k) for k in rf)] = t.reshape(rf)
    return z.reshape(psz)


def to_real(t, d, pad, real):
    """The real part of a padded tensor (a view where the layout allows)."""
    if d is None or not isinstance(t, torch.Tensor) or all(x is None for x in d):
        return t
    dd = [x if x is not None else (int(s),) for x, s in zip(d, t.shape)]
    psz, rsz = _dim_sizes(dd, pad), _dim_sizes(dd, real)
    if list(t.shape) == rsz:
        return t
    if all(len(x) == 1 for x in dd):
        for k, (p, q) in enumerate(zip(psz, rsz)):
            if p != q:
                t = t.narrow(k, 0, q)
        return t
    pf, rf = _factor_sizes(dd, pad), _factor_sizes(dd, real)
    return t.reshape(pf)[tuple(slice(0, k) for k in rf)].reshape(rsz)
