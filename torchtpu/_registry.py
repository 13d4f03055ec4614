"""Registers the "tpu" device with PyTorch and every row of the C op table as
a PrivateUse1 kernel. Thin by design: argument parsing, lowering and execution
are in the C core."""

import functools
import math
import os
import sys
import types
import warnings

import torch
import torch.utils.backend_registration as _br

from . import _C, _patches, _plugin, _settings

_LIB = None
_IMPL = None
_REQUIRED = object()
_FALLBACK_WARNED = set()
_KERNELS = {}
# ATen overloads with a torchtpu kernel that this torch lacks (or whose schema
# torchtpu cannot read): not registered, so they raise NotImplementedError
# (torchtpu.metrics()["ops_not_registered"] counts them).
NOT_REGISTERED = set()
# The torch versions torchtpu is tested with: [lowest, first untested) (pyproject.toml).
TESTED_TORCH = ((2, 11), (2, 14))

# ATen overloads run through torch._decomp decompositions (rare composite ops
# only; everything else is a C lowering). The coverage report counts them.
DECOMPOSED = ()

# torch dtypes by tpu_dtype code (the PJRT_Buffer_Type numbering).
_DTYPES = [
    None,
    torch.bool,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint8,
    torch.uint16,
    torch.uint32,
    torch.uint64,
    torch.float16,
    torch.float32,
    torch.float64,
    torch.bfloat16,
    torch.complex64,
    torch.complex128,
]

# c10::ScalarType codes (schema defaults of dtype arguments come as these ints).
_C10_SCALAR_TYPES = [
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.float32,
    torch.float64,
    None,
    torch.complex64,
    torch.complex128,
    torch.bool,
]

_IGNORED = {"device", "layout", "pin_memory", "memory_format"}


def _kind(arg):
    """One character per schema argument type, as torchtpu._C.kernel expects."""
    t = str(arg.type)
    opt = t.startswith("Optional[")
    base = t[9:-1] if opt else t
    if base == "Generator":
        return "r"  # the random ops' generator=: drawn from when it is a tpu generator of its own
    if arg.name in _IGNORED or base in ("Device", "Layout", "MemoryFormat"):
        return "_"
    if "dtype" in arg.name and base == "int":
        return "d"
    table = {
        "Tensor": "tT",
        "List[Tensor]": "lL",
        "List[Optional[Tensor]]": "lL",
        "number": "sS",
        "int": "ji",
        "SymInt": "ji",
        "List[int]": "JI",
        "List[SymInt]": "JI",
        "float": "gf",
        "List[float]": "FF",
        "bool": "cb",
        "str": "yx",
        "List[bool]": "JI",
    }
    if base not in table:
        raise NotImplementedError(f"argument type {t}")
    return table[base][0 if opt else 1]


def _spec(schema):
    spec = []
    for a in schema.arguments:
        dflt = a.default_value if a.has_default_value() else _REQUIRED
        if _kind(a) == "d" and isinstance(dflt, int) and not isinstance(dflt, bool):
            dflt = _C10_SCALAR_TYPES[dflt]  # a schema default such as randperm's dtype=long
        spec.append((a.name, _kind(a), dflt))
    return spec


def _redispatch_cpu(op):
    """View kernels: the CPU kernels of these ops only alias metadata, so they
    serve tpu tensors unchanged (the storage is shared, as views require)."""
    ks = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
    handle = getattr(op, "_handle", None)
    if hasattr(handle, "redispatch_boxed"):
        # no Python frame between torch's dispatcher and the CPU kernel
        return functools.partial(handle.redispatch_boxed, ks)

    def kernel(*args, **kwargs):
        return op.redispatch(ks, *args, **kwargs)

    return kernel


def _dev(device):
    """A factory's device argument as a local device index (-1: the current one)."""
    return -1 if device is None or device.index is None else device.index


def _empty_memory_format(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return _C.empty(size, dtype or torch.get_default_dtype(), None, _dev(device))


def _efficientzerotensor(size, dtype=None, layout=None, device=None, pin_memory=None):
    """The zeros torch.func and some backward formulas make: ordinary zeros
    here (CPU's carry a ZeroTensor flag that only skips work)."""
    t = _C.empty([int(s) for s in size], dtype or torch.get_default_dtype(), None, _dev(device))
    return t.zero_()


def _empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    return _C.empty(size, dtype or torch.get_default_dtype(), stride, _dev(device))


def _empty_like(self, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    """torch's empty_like; for a whole contiguous tensor laid over a mesh
    (torchtpu.spmd), a tensor laid out as it (zeros_like of a sharded
    parameter is a sharded optimizer state)."""
    dt = dtype or self.dtype
    dev = self.device if device is None else torch.device(device)
    keep = memory_format in (None, torch.preserve_format, torch.contiguous_format)
    if keep and dev == self.device and self.is_contiguous() and self.storage_offset() == 0:
        if self.untyped_storage().nbytes() == self.numel() * self.element_size() and _C.sharding(self) is not None:
            return _C.mesh_like(self, dt)
    dense = (memory_format is None or memory_format == torch.preserve_format) and _dense(self)
    if dev.type != "tpu":
        if dense:
            return torch.empty_strided(self.shape, self.stride(), dtype=dt, device=dev, pin_memory=bool(pin_memory))
        return torch.empty(self.shape, dtype=dt, device=dev, memory_format=memory_format or torch.contiguous_format)
    return _C.empty(list(self.shape), dt, list(self.stride()) if dense else None, _dev(dev))


def _resolve_bits(t):
    """The values a lazily conjugated or negated tensor stands for, as a
    plain tensor: the core copies storage, which holds the unconjugated,
    unnegated values."""
    if t.device.type != "tpu":
        return t.resolve_conj().resolve_neg()
    if t.is_conj():
        t = torch.conj_physical(t.conj())  # t.conj() clears the bit: a view of the stored values
    if t.is_neg():
        t = torch.neg(t._neg_view())
    return t


# Ops that PyTorch hands lazily conjugated (or negated) tensors as they are:
# its Conjugate and Negative fallbacks resolve the bits for every other op,
# but let these through (CPU and CUDA kernels fold the conjugation into their
# BLAS calls; the backward of a complex matmul passes a.mH this way). Their C
# kernels resolve such inputs with _resolve_bits; only the triangular solve
# also gets negated real tensors.
_BIT_AWARE = {
    "mm": False,
    "mm.out": False,
    "addmm": False,
    "addmm_": False,
    "addmm.out": False,
    "bmm": False,
    "bmm.out": False,
    "baddbmm": False,
    "baddbmm_": False,
    "baddbmm.out": False,
    "dot": False,
    "dot.out": False,
    "vdot": False,
    "vdot.out": False,
    "linalg_vecdot": False,
    "linalg_vecdot.out": False,
    "linalg_solve_triangular": True,
    "linalg_solve_triangular.out": True,
}


def _clone_resolving_bits(c_clone):
    """clone: torch materialises lazily conjugated or negated tensors by
    cloning them, so such an input comes back resolved (the C kernel copies
    the stored, unconjugated values)."""

    def clone(self, memory_format=None):
        if self.is_conj() or self.is_neg():
            return _resolve_bits(self)
        return c_clone(self, memory_format=memory_format)

    return clone


def _copy_from(self, dst, non_blocking=False):
    if self.is_conj() or self.is_neg():
        self = _resolve_bits(self)
    return _C.copy_from(self, dst)


def _copy_from_and_resize(self, dst):
    if dst.numel() == 0 and self.numel() != 0:
        raise NotImplementedError("aten::_copy_from_and_resize: resizing a tpu tensor is not supported yet")
    return _C.copy_from(self, dst)


def _contiguous_strides(size, memory_format):
    cl = {torch.channels_last: (0, 2, 3, 1), torch.channels_last_3d: (0, 2, 3, 4, 1)}.get(memory_format)
    order = cl if cl and len(cl) == len(size) else tuple(range(len(size)))
    strides, acc = [0] * len(size), 1
    for d in reversed(order):
        strides[d] = acc
        acc *= max(int(size[d]), 1)
    return strides


def _resize_(self, size, memory_format=None):
    """resize_: metadata only when the storage is big enough (as on CPU);
    otherwise the tensor moves to a new, larger storage that keeps the old
    elements in storage order."""
    size = [int(s) for s in size]
    if any(s < 0 for s in size):
        raise RuntimeError(f"Trying to create tensor with negative dimension: {size}")
    n = 1
    for s in size:
        n *= s
    strides = _contiguous_strides(size, memory_format)
    itemsize = self.element_size()
    have = self.untyped_storage().nbytes() // itemsize
    if self.storage_offset() + n <= have:
        return self.set_(self.untyped_storage(), self.storage_offset(), size, strides)
    new = _C.empty([n], self.dtype, None, self.device.index)
    old = self.numel()
    if old and self.is_contiguous():
        new[: min(old, n)].copy_(self.reshape(-1)[: min(old, n)])
    return self.set_(new.untyped_storage(), 0, size, strides)


def _set_empty(self):
    return self.set_(_C.empty([0], self.dtype, None, self.device.index).untyped_storage(), 0, [0], [1])


def _dense(t):
    """Non-overlapping and dense: some permutation of the dims is contiguous."""
    dims = sorted((st, sz) for st, sz in zip(t.stride(), t.shape) if sz != 1)
    expect = 1
    for st, sz in dims:
        if st != expect:
            return False
        expect *= sz
    return True


def _to_copy(self, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False, memory_format=None):
    """_to_copy from a tpu tensor. torch's own version pins the host copy when
    non_blocking is set, which a Python-registered device cannot provide; our
    device->host copy is synchronous anyway, so non_blocking changes nothing."""
    dtype = dtype if dtype is not None else self.dtype
    device = torch.device(device) if device is not None else self.device
    if self.is_conj() or self.is_neg():
        self = _resolve_bits(self)
    mf = memory_format if memory_format is not None else torch.preserve_format
    if mf == torch.preserve_format and _dense(self):
        out = torch.empty_strided(self.shape, self.stride(), dtype=dtype, device=device)
    else:
        if mf == torch.preserve_format:
            mf = torch.contiguous_format
        out = torch.empty(self.shape, dtype=dtype, device=device, memory_format=mf)
    return out.copy_(self)


# Data-dependent shapes: the size is computed on the device and read back
# (one small device->host read), then a static-shape program builds the
# result. The math stays in the C lowerings (count_nonzero, nonzero_static,
# index.Tensor, _index_put_impl_).
def _nonzero(self):
    n = int(torch.count_nonzero(self).item())
    return torch.nonzero_static(self, size=n)


def _masks_to_indices(self, indices):
    """Boolean (or uint8) mask indices become the long indices of their
    nonzero elements; CPU index tensors move to the tpu."""
    out = []
    for ix in indices:
        if ix is None:
            out.append(None)
            continue
        if ix.device.type != "tpu":
            ix = ix.to("tpu")
        if ix.dtype in (torch.bool, torch.uint8):
            k = len(out)
            for j in range(ix.dim()):
                if ix.shape[j] != self.shape[k + j]:
                    raise IndexError(
                        f"The shape of the mask {list(ix.shape)} at index {j} does not match the shape of the "
                        f"indexed tensor {list(self.shape)} at index {k + j}"
                    )
            out.extend(_nonzero(ix).unbind(1))
        else:
            out.append(ix)
    return out


def _index_with_masks(c_index):
    """index.Tensor: mask indices become long indices first (_masks_to_indices)."""

    def index(self, indices):
        return c_index(self, _masks_to_indices(self, indices))

    return index


def _index_put_with_masks(c_index_put):
    """_index_put_impl_: mask indices become long indices first (_masks_to_indices)."""

    def index_put_impl(self, indices, values, accumulate=False, unsafe=False):
        return c_index_put(self, _masks_to_indices(self, indices), values, accumulate, unsafe)

    return index_put_impl


def _equal(self, other):
    """torch.equal: same shape and the same elements (a bool on the host)."""
    if self.shape != other.shape:
        return False
    return bool(torch.eq(self, other.to(self.device)).all().item())


def _histogramdd_bin_edges(self, bins, *, range=None, weight=None, density=False):
    """Each dim's edges: a linspace over the given range or the data's min and
    max (read back, as the CPU reads them), a single point widened by half a
    unit each way, [0, 1] with no data; the counting is a C lowering
    (_histogramdd_from_bin_tensors)."""
    if self.dim() < 2:
        raise RuntimeError(f"torch.histogramdd: input tensor should have at least 2 dimensions, but got {self.dim()}")
    D = self.shape[-1]
    if len(bins) != D:
        raise RuntimeError(
            f"torch.histogramdd: expected {D} sequences of bin edges for each of the {D} dimensions "
            f"of the input, but got {len(bins)}"
        )
    if range is not None and len(range) != 2 * D:
        raise RuntimeError(
            f"torch.histogramdd: for a {D}-dimensional histogram, range should have {2 * D} elements, "
            f"but got {len(range)}"
        )
    x = self.reshape(-1, D)
    edges = []
    for d in list(enumerate(bins)):
        d = d[0]
        if bins[d] <= 0:
            raise RuntimeError(f"torch.histogramdd(): bins must be > 0, but got {bins[d]} for dim {d}")
        if range is not None:
            lo, hi = float(range[2 * d]), float(range[2 * d + 1])
        elif x.shape[0] > 0:
            lo, hi = float(x[:, d].min().item()), float(x[:, d].max().item())
        else:
            lo, hi = 0.0, 1.0
        if not (math.isfinite(lo) and math.isfinite(hi)):
            raise RuntimeError(f"torch.histogramdd: dimension {d}'s range [{lo}, {hi}] is not finite")
        if lo > hi:
            raise RuntimeError(
                f"torch.histogramdd: min should not exceed max, but got min {lo} max {hi} for dimension {d}"
            )
        if lo == hi:
            lo, hi = lo - 0.5, hi + 0.5
        edges.append(torch.linspace(lo, hi, bins[d] + 1, dtype=self.dtype, device=self.device))
    return edges


def _histogramdd_from_bin_cts(self, bins, *, range=None, weight=None, density=False):
    edges = _histogramdd_bin_edges(self, bins, range=range, weight=weight, density=density)
    return torch.ops.aten._histogramdd_from_bin_tensors(self, edges, weight=weight, density=density)


def _masked_select(self, mask):
    a, m = torch.broadcast_tensors(self, mask.to(self.device))
    return a[m]


def _check_out_overlap(out, *inputs):
    """torch's refusals of an out= tensor that overlaps itself or an input."""
    if any(st == 0 and sz > 1 for st, sz in zip(out.stride(), out.shape)):
        raise RuntimeError(
            "unsupported operation: more than one element of the written-to tensor refers to a single "
            "memory location. Please clone() the tensor before performing the operation."
        )
    if out.numel() == 0:
        return
    o0 = out.data_ptr()
    o1 = o0 + out.element_size() * (1 + sum((s - 1) * st for s, st in zip(out.shape, out.stride())))
    for x in inputs:
        if x.device != out.device or x.numel() == 0:
            continue
        x0 = x.data_ptr()
        x1 = x0 + x.element_size() * (1 + sum((s - 1) * st for s, st in zip(x.shape, x.stride())))
        if x0 < o1 and o0 < x1:
            raise RuntimeError(
                "unsupported operation: some elements of the input tensor and the written-to tensor "
                "refer to a single memory location. Please clone() the tensor before performing the "
                "operation."
            )


def _masked_select_out(self, mask, *, out):
    _check_out_overlap(out, self, mask)
    r = _masked_select(self, mask)
    if r.dtype != out.dtype:
        raise RuntimeError("masked_select(): self and result must have the same scalar type")
    if out.shape != r.shape:
        out.resize_(r.shape)
    return out.copy_(r)


def _narrow_copy(self, dim, start, length):
    """narrow_copy: torch's CPU kernel refuses a dim past the last with a
    RuntimeError (narrow's own check is an IndexError)."""
    if self.dim() == 0:
        raise RuntimeError("narrow() cannot be applied to a 0-dim tensor.")
    if dim >= self.dim():
        raise RuntimeError(f"narrow_copy(): dim {dim} is out of range for a tensor of {self.dim()} dims")
    return self.narrow(dim, start, length).clone()


def _unique_count(self, consecutive):
    """Distinct values (or runs, when consecutive) of self: counted on the
    device, read back once."""
    f = self.reshape(-1)
    if f.numel() == 0:
        return 0
    if not consecutive:
        f = torch.sort(f).values
    return int((f[1:] != f[:-1]).sum().item()) + 1


# unique and friends: the size is read first, then the C lowering of the
# .out overload builds the results (it reads the size from out0).
def _unique_outs(self, n, inverse, counts):
    long = dict(dtype=torch.long, device=self.device)
    return (
        torch.empty(n, dtype=self.dtype, device=self.device),
        torch.empty(self.shape if inverse else (0,), **long),
        torch.empty(n if counts else 0, **long),
    )


def _unique_slices(self, dim, inverse, counts, run):
    """Unique slices along dim: the C lowering fills results with room for
    every slice; the count is the largest inverse + 1, read back once."""
    n = self.shape[dim]
    long = dict(dtype=torch.long, device=self.device)
    v, i, c = run(
        (
            torch.empty(self.shape, dtype=self.dtype, device=self.device),
            torch.empty(n, **long),
            torch.empty(n, **long),
        )
    )
    u = int(i.max().item()) + 1 if n else 0
    none = torch.empty(0, **long)
    return v.narrow(dim, 0, u).clone(), i if inverse else none, c[:u].clone() if counts else none


def _unique_dim(self, dim, sorted=True, return_inverse=False, return_counts=False):
    return _unique_slices(
        self,
        dim,
        return_inverse,
        return_counts,
        lambda o: _KERNELS["unique_dim.out"](
            self, dim, sorted, return_inverse, return_counts, out0=o[0], out1=o[1], out2=o[2]
        ),
    )


def _unique2(self, sorted=True, return_inverse=False, return_counts=False):
    o = _unique_outs(self, _unique_count(self, False), return_inverse, return_counts)
    return _KERNELS["_unique2.out"](self, sorted, return_inverse, return_counts, out0=o[0], out1=o[1], out2=o[2])


def _unique_consecutive(self, return_inverse=False, return_counts=False, dim=None):
    if dim is not None:
        return _unique_slices(
            self,
            dim,
            return_inverse,
            return_counts,
            lambda o: _KERNELS["unique_consecutive.out"](
                self, return_inverse, return_counts, dim, out0=o[0], out1=o[1], out2=o[2]
            ),
        )
    o = _unique_outs(self, _unique_count(self, True), return_inverse, return_counts)
    return _KERNELS["unique_consecutive.out"](
        self, return_inverse, return_counts, None, out0=o[0], out1=o[1], out2=o[2]
    )


def _unique1(self, sorted=True, return_inverse=False):
    o = _unique_outs(self, _unique_count(self, False), return_inverse, False)
    return _KERNELS["_unique.out"](self, sorted, return_inverse, out0=o[0], out1=o[1])


def _sized_repeat_interleave(c_repeat_interleave):
    """repeat_interleave.Tensor: the output size (the sum of repeats) is read
    back first when the caller did not give it."""

    def repeat_interleave(repeats, output_size=None):
        if output_size is None:
            output_size = int(repeats.sum().item()) if repeats.numel() else 0
        return c_repeat_interleave(repeats, output_size=output_size)

    return repeat_interleave


def _masked_outputs(index):
    """A backward whose argument `index` is an output_mask: the C row computes
    every gradient (zeros where the mask is off); an output the mask turns
    off is None, as torch's own kernels return it (DTensor's sharding rules
    give such an output no placement and refuse a tensor there)."""

    def wrap(kernel):
        def masked(*args, **kwargs):
            return tuple(o if m else None for o, m in zip(kernel(*args, **kwargs), args[index]))

        return masked

    return wrap


# Fused optimizers (aten::_fused_adam_, _fused_adamw_, _fused_sgd_,
# _fused_adagrad_): one C program per group of parameters. A group is
# bounded by what one call may write (up to 4 tensors per parameter).
_FUSED_GROUP = 24


def _fused_optimizer(op_id, opov, **flags):
    """The overload opov run by the internal row op_id, whose arguments are
    the overload's own followed by flags (bools). Float hyper-parameters are
    passed as numbers, so they are program inputs and a new learning rate
    does not recompile; the tensor lists are split into groups."""
    spec = [(n, "S" if k == "f" else k, d) for n, k, d in _spec(opov._schema)]
    names = [n for n, _, _ in spec]
    lists = [n for n, k, _ in spec if k == "L"]
    kernel = _C.kernel(op_id, spec + [(n, "b", _REQUIRED) for n in flags], 0, _REQUIRED)
    g = _FUSED_GROUP

    def fused(*args, **kwargs):
        call = dict(zip(names, args), **kwargs, **flags)
        whole = {n: call[n] for n in lists}
        for k in range(0, len(whole[lists[0]]), g):
            call.update({n: v[k : k + g] for n, v in whole.items()})
            kernel(**call)

    return fused


def _attention(sdpa_row, backward_row, fused, math):
    """scaled_dot_product_attention as one op (csrc/lower/emit_attention.c).
    torch picks an attention kernel per device only for its own devices; for
    this one it would run its math composition, some 15 ops each way. The
    kernel registered for scaled_dot_product_attention (PrivateUse1 and its
    autograd key) routes the common case to aten's overrideable fused
    attention, whose autograd formula calls its backward, both served by
    tpu::sdpa and tpu::sdpa_backward; dropout, grouped-query attention,
    mixed dtypes and other ranks keep the math composition (which also
    raises torch's errors for bad arguments), and so do graphs traced with
    symbolic sizes, whose shape buckets mask the padding op by op (_bucket.py)."""
    fwd = _C.kernel(
        sdpa_row,
        [
            ("query", "T", _REQUIRED),
            ("key", "T", _REQUIRED),
            ("value", "T", _REQUIRED),
            ("attn_mask", "t", None),
            ("is_causal", "b", False),
            ("scale", "g", None),
            ("out_order", "I", []),
        ],
        2,
        _REQUIRED,
    )
    bwd = _C.kernel(
        backward_row,
        [
            ("grad_out", "T", _REQUIRED),
            ("query", "T", _REQUIRED),
            ("key", "T", _REQUIRED),
            ("value", "T", _REQUIRED),
            ("attn_mask", "t", None),
            ("out", "T", _REQUIRED),
            ("logsumexp", "T", _REQUIRED),
            ("is_causal", "b", False),
            ("scale", "g", None),
            ("grad_mask", "b", False),
            ("query_order", "I", []),
            ("key_order", "I", []),
            ("value_order", "I", []),
        ],
        4,
        _REQUIRED,
    )

    def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        dt = query.dtype
        if (
            dropout_p == 0.0
            and not enable_gqa
            and query.dim() in (3, 4)
            and key.dim() == query.dim()
            and value.dim() == query.dim()
            and key.dtype == dt
            and value.dtype == dt
            and dt.is_floating_point
            and query.shape[:-2] == key.shape[:-2] == value.shape[:-2]
            and key.shape[-2] == value.shape[-2]
            and key.shape[-1] == query.shape[-1]
            and not any(isinstance(n, torch.SymInt) for n in (*query.shape, *key.shape[-2:], value.shape[-1]))
            and (
                attn_mask is None
                or (not is_causal and attn_mask.device == query.device and attn_mask.dtype in (torch.bool, dt))
            )
        ):
            return fused(query, key, value, attn_mask, 0.0, is_causal, False, scale=scale)[0]
        return math(query, key, value, attn_mask, dropout_p, is_causal, None, scale=scale, enable_gqa=enable_gqa)[0]

    def empty_long(device):
        return _C.empty([], torch.int64, None, device.index)

    def order(t):
        """t's dims from the largest stride to the smallest (the layout torch's
        meta kernels give the outputs that follow t: empty_like(t)); [] when
        that is the plain order."""
        st = t.stride()
        o = sorted(range(len(st)), key=lambda d: -st[d])
        return [] if o == list(range(len(st))) else o

    def laid_out(v, o):
        """A result the kernel wrote in the dim order o, as a view in logical order."""
        return v.permute([o.index(d) for d in range(len(o))]) if o else v

    def fused_attention(
        query, key, value, attn_bias=None, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None
    ):
        if dropout_p != 0.0 or return_debug_mask:
            raise NotImplementedError(
                "torchtpu: aten::_scaled_dot_product_fused_attention_overrideable with dropout "
                "or a debug mask is not lowered; call scaled_dot_product_attention"
            )
        o = order(query)
        out, lse = fwd(query, key, value, attn_bias, is_causal, scale, o)
        out = laid_out(out, o)
        if query.dim() == 3:
            lse = lse.unsqueeze(0)  # (1, H, L), the shape of aten's meta kernel
        return (
            out,
            lse,
            None,
            None,
            query.shape[-2],
            key.shape[-2],
            empty_long(query.device),
            empty_long(query.device),
            None,
        )

    def fused_attention_backward(
        grad_out,
        query,
        key,
        value,
        attn_bias,
        grad_input_mask,
        out,
        logsumexp,
        cum_seq_q,
        cum_seq_k,
        max_q,
        max_k,
        dropout_p,
        is_causal,
        philox_seed,
        philox_offset,
        *,
        scale=None,
    ):
        if query.dim() == 3:
            logsumexp = logsumexp.squeeze(0)
        want_bias = attn_bias is not None and attn_bias.dtype != torch.bool and bool(grad_input_mask[3])
        o = [order(query), order(key), order(value)]
        grads = bwd(grad_out, query, key, value, attn_bias, out, logsumexp, is_causal, scale, want_bias, *o)
        # a gradient the mask turns off is None, as torch's kernels return it
        qkv = tuple(laid_out(grads[i], o[i]) if grad_input_mask[i] else None for i in range(3))
        return (*qkv, grads[3] if want_bias else None)

    return {"sdpa": sdpa, "fused": fused_attention, "backward": fused_attention_backward}


# The most tensors one call may take in a list (TPU_MAX_LIST in
# csrc/lower/lower.h); longer lists are split here.
_LIST_MAX = 64


def _chunked_cat(c_cat):
    """aten::cat of any number of tensors (torch.stack and clip_grad_norm_
    over a model's parameters make long lists): cats of at most _LIST_MAX,
    then a cat of their results (in fused mode all one program)."""

    def cat(tensors, dim=0):
        tensors = list(tensors)
        while len(tensors) > _LIST_MAX:
            tensors = [c_cat(tensors[k : k + _LIST_MAX], dim) for k in range(0, len(tensors), _LIST_MAX)]
        return c_cat(tensors, dim)

    return cat


def _positional(schema):
    return [a for a in schema.arguments if not a.kwarg_only]


def _element_kernel(fschema, inplace):
    """The kernel of the element op of a torch._foreach_* overload: an overload
    of the same op (in place, functional, or out= with each item of the first
    list as out) taking one item of each list, in the same positions (or, past
    its positional parameters, as its keyword parameters of the same types, in
    order), with any other arguments defaulted. (kernel, kwnames, out_self) or
    None."""
    elem = fschema.name.split("::")[1][len("_foreach_") :]
    base = elem.rstrip("_")
    fpos = _positional(fschema)
    types = [str(a.type)[5:-1] if str(a.type).startswith("List[") else str(a.type) for a in fpos]
    fkw = {a.name: str(a.type) for a in fschema.arguments if a.kwarg_only}
    packet = getattr(torch.ops.aten, base, None)
    if packet is None:
        return None
    tries = []
    if inplace:
        ipacket = getattr(torch.ops.aten, base + "_", None)
        for ov in ipacket.overloads() if ipacket is not None else ():
            tries.append((base + "_" + ("." + ov if ov != "default" else ""), False))
    for ov in packet.overloads():
        out = ov == "out" or ov.endswith("_out")
        if out == inplace:
            tries.append((base + ("." + ov if ov != "default" else ""), out))
    for name, out_self in tries:
        k = _KERNELS.get(name)
        if k is None:
            continue
        op, _, ov = name.partition(".")
        es = getattr(getattr(torch.ops.aten, op), ov or "default")._schema
        pos = _positional(es)
        ekw = [a for a in es.arguments if a.kwarg_only and a.name not in fkw and not (out_self and a.name == "out")]
        extra = types[len(pos) :]
        if any(str(a.type) != t for a, t in zip(pos, types)) or len(extra) > len(ekw):
            continue
        if any(str(a.type) != t for a, t in zip(ekw, extra)):
            continue
        kwnames = (None,) * min(len(pos), len(types)) + tuple(a.name for a in ekw[: len(extra)])
        rest = pos[len(types) :] + ekw[len(extra) :]
        if any(not a.has_default_value() for a in rest):
            continue
        named = {a.name: str(a.type) for a in es.arguments if a.kwarg_only}
        if any(named.get(n) != t for n, t in fkw.items()) or (out_self and "out" not in named):
            continue
        return k, kwnames, out_self
    return None


def _register_foreach():
    """torch._foreach_* overloads whose element op has a kernel run it item by
    item from C (_C.foreach): the optimizers' and clip_grad_norm_'s foreach
    calls cost one call from torch each, not one dispatch per parameter. The
    others keep torch's own loop (which dispatches each item)."""
    done = []
    names = getattr(torch._C, "_dispatch_get_all_op_names", lambda: ())()
    for qual in names:
        if not qual.startswith("aten::_foreach_"):
            continue
        name = qual[len("aten::") :]
        fname, _, ov = name.partition(".")
        try:
            fs = getattr(getattr(torch.ops.aten, fname), ov or "default")._schema
            found = _element_kernel(fs, fname.endswith("_"))
        except (AttributeError, RuntimeError, NotImplementedError):
            continue  # an op this torch lacks in part: torch's own loop serves it
        inplace = fname.endswith("_")
        if [str(r.type) for r in fs.returns] != ([] if inplace else ["List[Tensor]"]) or any(
            a.kwarg_only and a.name == "out" for a in fs.arguments
        ):
            continue  # out= overloads, and those returning anything else, keep torch's loop
        pos = _positional(fs)
        lists = sum(1 << i for i, a in enumerate(pos) if str(a.type).startswith("List["))
        found = found if lists & 1 else None
        if found is None or (found[2] and str(pos[0].type) != "List[Tensor]"):
            continue
        k, kwnames, out_self = found
        _IMPL.impl(name, _C.foreach(name, k, lists, kwnames, out_self, not inplace), "PrivateUse1")
        done.append(name)
    return done


def _foreach_norm(row):
    """torch._foreach_norm (clip_grad_norm_'s first step) as one op per
    _LIST_MAX tensors (tpu::foreach_norm), not one dispatch per tensor."""
    kernel = _C.kernel(row, [("tensors", "L", _REQUIRED), ("ord", "S", 2), ("dtype", "d", None)], _LIST_MAX, _REQUIRED)

    def foreach_norm(self, ord=2, dtype=None):
        tensors, out = list(self), []
        for k in range(0, len(tensors), _LIST_MAX):
            out.extend(kernel(tensors[k : k + _LIST_MAX], ord, dtype))
        return out

    return foreach_norm


def _chunked_unscale(c_unscale):
    """GradScaler's unscale over any number of gradients: found_inf gathers
    the check over every group."""

    def unscale(grads, found_inf, inv_scale):
        grads = list(grads)
        for k in range(0, max(len(grads), 1), _LIST_MAX):
            c_unscale(grads[k : k + _LIST_MAX], found_inf, inv_scale)

    return unscale


def _local_scalar_dense(self):
    return _C.to_cpu(self).item()


def _fallback(op, *args, **kwargs):
    """Ops without a lowering: NotImplementedError naming the overload, or,
    with TORCHTPU_CPU_FALLBACK=1, run on the CPU (warned once per op, counted)."""
    name = op._schema.name + (("." + op._schema.overload_name) if op._schema.overload_name else "")
    if not _settings.flag("TORCHTPU_CPU_FALLBACK"):
        raise NotImplementedError(
            f"torchtpu: {name} is not lowered for the tpu device yet. "
            "Set TORCHTPU_CPU_FALLBACK=1 to run unsupported ops on the CPU."
        )
    if name not in _FALLBACK_WARNED:
        _FALLBACK_WARNED.add(name)
        warnings.warn(f"torchtpu: {name} is not lowered; running it on the CPU (TORCHTPU_CPU_FALLBACK=1)", stacklevel=2)
    _C.count_fallback()
    return _cpu_fallback(op, args, kwargs)


def _cpu_fallback(op, args, kwargs):
    tpu = torch.device("tpu")
    moved = []

    def to_cpu(x):
        if isinstance(x, torch.Tensor) and x.device.type == "tpu":
            c = x.cpu()
            moved.append((x, c))
            return c
        if isinstance(x, (list, tuple)):
            return type(x)(to_cpu(v) for v in x)
        return x

    cargs = [to_cpu(a) for a in args]
    ckw = {k: to_cpu(v) for k, v in kwargs.items()}
    out = op(*cargs, **ckw)
    # Write back arguments the op mutated (schema alias annotations with writes).
    schema = op._schema
    for i, a in enumerate(schema.arguments):
        if a.alias_info is not None and a.alias_info.is_write:
            orig = args[i] if i < len(args) else kwargs.get(a.name)
            if isinstance(orig, torch.Tensor) and orig.device.type == "tpu":
                cpu_version = cargs[i] if i < len(cargs) else ckw.get(a.name)
                orig.copy_(cpu_version)

    def back(x):
        if isinstance(x, torch.Tensor):
            for o, c in moved:
                if x is c:
                    return o
            return x.to(tpu)
        if isinstance(x, (list, tuple)):
            return type(x)(back(v) for v in x)
        return x

    return back(out)


def _pin_memory(self, device=None):
    """pin_memory() of a CPU tensor. torchtpu has no page-locked host
    allocator (a Python-registered device cannot provide one, and host->tpu
    copies are synchronous, so pinning would buy nothing): the tensor comes
    back as an ordinary copy (is_pinned() stays False), with one warning, so
    DataLoader(pin_memory=True) and .pin_memory() keep working."""
    if device is not None and torch.device(device).type != "tpu":
        raise RuntimeError(
            f"pin_memory(device={device}): this process runs the tpu device (torchtpu), "
            "which is the only accelerator it can pin memory for"
        )
    if "pin_memory" not in _FALLBACK_WARNED:
        _FALLBACK_WARNED.add("pin_memory")
        warnings.warn(
            "torchtpu: pinned host memory is not supported; pin_memory() returns an ordinary "
            "copy (host to tpu copies are synchronous, so nothing is lost)",
            stacklevel=3,
        )
    return self.clone()


# ---- what setup() registers, as data ---------------------------------------
# Every ATen row of the C op table (_C.ops(): csrc/lower/ops.def) is registered
# for PrivateUse1 as its Kernel (_C.kernel, made from the overload's schema);
# the Kernels are kept in _KERNELS by name. The tables below are the
# exceptions and the kernels written in Python. Adding an op that needs a
# Python wrapper is one entry in WRAPPERS.

# Rows whose Kernel is registered through a Python wrapper: name ->
# wrapper(kernel), the function registered in the Kernel's place (_KERNELS
# keeps the Kernel itself).
WRAPPERS = {
    # any number of tensors (torch.stack and clip_grad_norm_ over a model's
    # parameters make long lists): cats of at most _LIST_MAX, then a cat of those
    "cat": _chunked_cat,
    # GradScaler's unscale over any number of gradients, _LIST_MAX at a time
    "_amp_foreach_non_finite_check_and_unscale_": _chunked_unscale,
    # torch materialises lazily conjugated or negated tensors with clone
    "clone": _clone_resolving_bits,
    # boolean (or uint8) mask indices become long indices, whose count is read
    # back first; CPU index tensors move to the tpu
    "index.Tensor": _index_with_masks,
    "_index_put_impl_": _index_put_with_masks,
    # the output size is read back first when the caller gave none
    "repeat_interleave.Tensor": _sized_repeat_interleave,
    # outputs the output_mask turns off are None
    "native_layer_norm_backward": _masked_outputs(7),
    "native_batch_norm_backward": _masked_outputs(9),
    "batch_norm_backward": _masked_outputs(9),
    "native_group_norm_backward": _masked_outputs(9),
    "convolution_backward_overrideable": _masked_outputs(9),
    "grid_sampler_2d_backward": _masked_outputs(6),
    "grid_sampler_3d_backward": _masked_outputs(6),
}

# The internal rows' op ids by name ("tpu::..."), for the Python kernels that call them.
INTERNAL = {}

# ATen overloads without a row, served by a Python kernel under PrivateUse1.
PYTHON_KERNELS = {
    # data-dependent shapes: the size is computed on the device and read back,
    # then static-shape C rows build the result
    "nonzero": _nonzero,
    "masked_select": _masked_select,
    "masked_select.out": _masked_select_out,
    "_histogramdd_bin_edges": _histogramdd_bin_edges,
    "_histogramdd_from_bin_cts": _histogramdd_from_bin_cts,
    "_unique2": _unique2,
    "unique_consecutive": _unique_consecutive,
    "_unique": _unique1,
    "unique_dim": _unique_dim,
    # the CPU kernel's error for a dim past the last (narrow's is an IndexError)
    "narrow_copy": _narrow_copy,
    # a bool on the host
    "equal": _equal,
    # storage: making, resizing and setting it, copies across devices, reading a scalar back
    "set_": _set_empty,
    "resize_": _resize_,
    "_to_copy": _to_copy,
    "empty.memory_format": _empty_memory_format,
    "empty_strided": _empty_strided,
    "empty_like": _empty_like,
    "_efficientzerotensor": _efficientzerotensor,
    "_copy_from": _copy_from,
    "_copy_from_and_resize": _copy_from_and_resize,
    "_local_scalar_dense": _local_scalar_dense,
}

# View ops: the CPU kernel only makes metadata over the same storage, so it
# serves tpu tensors as they are (_redispatch_cpu).
CPU_VIEWS = (
    "view",
    "as_strided",
    "_reshape_alias",
    "alias",
    "_unsafe_view",
    "unfold",
    "set_.source_Storage_storage_offset",
    "set_.source_Storage",
    "set_.source_Tensor",
    "view.dtype",
    "view_as_real",
    "view_as_complex",
)

# Fused optimizers, each with its .tensor_lr overload: name -> (the internal
# row that runs it, the flags passed after the overload's own arguments).
FUSED_OPTIMIZERS = {
    "_fused_adam_": ("tpu::fused_adam", {"adamw": False}),
    "_fused_adamw_": ("tpu::fused_adam", {"adamw": True}),
    "_fused_sgd_": ("tpu::fused_sgd", {}),
    "_fused_adagrad_": ("tpu::fused_adagrad", {}),
}

# Kernels for CPU tensors that torch asks of the accelerator.
CPU_KERNELS = {
    # pinned memory: an ordinary copy (no page-locked allocator here)
    "_pin_memory": _pin_memory,
}


def default_cache_dir():
    """TORCHTPU_CACHE_DIR, else torchtpu/ under the user's own cache folder
    (XDG_CACHE_HOME when it is an absolute path, else ~/.cache, ~ from HOME or
    else the user's passwd entry). An empty TORCHTPU_CACHE_DIR turns the disk
    tier off (returns ""); None when the user has no home folder to put it
    in (never a shared folder such as /tmp: entries are code this process
    runs)."""
    d = os.environ.get("TORCHTPU_CACHE_DIR")
    if d is not None:
        return d
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):  # the XDG spec: a relative path is ignored
        home = os.environ.get("HOME", "")
        if not os.path.isabs(home):
            try:
                import pwd

                home = pwd.getpwuid(os.geteuid()).pw_dir
            except (ImportError, KeyError):
                home = ""
        if not os.path.isabs(home):
            return None
        base = os.path.join(home, ".cache")
    return os.path.join(base, "torchtpu")


def setup_disk_cache(directory=None, max_mb=None):
    """Turns on the disk tier of the compilation cache in directory (default:
    default_cache_dir()); an unusable folder (one that cannot be made, or is
    not the user's own and private to writes) warns once and leaves programs
    cached in memory only."""
    import sys

    directory = default_cache_dir() if directory is None else directory
    if directory is None:
        warnings.warn(
            "torchtpu: compilation cache disabled (no home folder to keep it in; set TORCHTPU_CACHE_DIR "
            "to a folder of your own); programs are cached in memory only",
            stacklevel=2,
        )
        directory = ""
    if max_mb is None:
        max_mb = _settings.cache_size_mb()
    version = getattr(sys.modules.get("torchtpu"), "__version__", "unknown")
    try:
        _C.disk_cache(directory or None, int(max_mb * 2**20), f"torchtpu={version}")
    except OSError as e:
        warnings.warn(f"torchtpu: compilation cache disabled ({e}); programs are cached in memory only", stacklevel=2)
        _C.disk_cache(None, 0, "")


def _skip_kernel_frames():
    """Our Python kernels (views, indexing, cat, autocast, ...) run inside the
    dispatcher, and the patches of _patches.py around torch's own functions;
    when eager code runs between compiled graphs (a graph break, as at
    nn.LSTM) Dynamo must not try to compile their frames. Marked
    through Dynamo's C hook (importing torch._dynamo here would cost most of
    a second at import)."""
    try:
        from torch._C._dynamo.eval_frame import _FrameAction, _FrameExecStrategy, set_code_exec_strategy

        strategy = _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.DEFAULT)
    except (ImportError, AttributeError, TypeError):
        return  # this torch lacks the hook: Dynamo may trace these frames (slower, not wrong)

    def skip(code):
        set_code_exec_strategy(code, strategy)

    def walk(code):
        skip(code)
        for c in code.co_consts:
            if isinstance(c, types.CodeType):
                walk(c)

    from . import _autocast

    for mod in (sys.modules[__name__], _autocast, _patches):
        for v in list(vars(mod).values()):
            if isinstance(v, types.FunctionType) and v.__module__ == mod.__name__:
                walk(v.__code__)


# The CPU plugin makes every device up front (1024: about 2 s and 60 MB more
# than 1); torchtpu uses one device per process, so more is only for tests.
MAX_DEVICES = 1024


def _runtime_settings():
    """(TORCHTPU_NUM_DEVICES, TORCHTPU_GPU_MEMORY_FRACTION), checked; a bad
    value is raised at the device's first use (RuntimeError naming it)."""
    raw = os.environ.get("TORCHTPU_NUM_DEVICES", "")
    try:
        ndev = int(raw.strip(), 10) if raw.strip() else 1
        if not 1 <= ndev <= MAX_DEVICES:
            raise ValueError
    except ValueError:
        raise RuntimeError(f"TORCHTPU_NUM_DEVICES={raw!r}: expected a whole number from 1 to {MAX_DEVICES}") from None
    raw = os.environ.get("TORCHTPU_GPU_MEMORY_FRACTION", "")
    try:
        fraction = float(raw) if raw.strip() else 0.0
        if not 0.0 <= fraction <= 1.0:  # also false for nan
            raise ValueError
    except ValueError:
        raise RuntimeError(f"TORCHTPU_GPU_MEMORY_FRACTION={raw!r}: expected a number between 0 and 1") from None
    return ndev, fraction


def _check_torch_version():
    """One warning when this torch is outside the tested range."""
    import re

    m = re.match(r"(\d+)\.(\d+)", getattr(torch, "__version__", ""))
    lo, hi = TESTED_TORCH
    if m and lo <= (int(m[1]), int(m[2])) < hi:
        return
    warnings.warn(
        f"torchtpu is tested with torch {lo[0]}.{lo[1]} to {hi[0]}.{hi[1] - 1}, not "
        f"{getattr(torch, '__version__', '?')}; ops this torch lacks or has changed are not registered "
        "(torchtpu.metrics()['ops_not_registered'])",
        stacklevel=2,
    )


def _overload(name):
    """The overload aten::name ("op" or "op.overload"), or None when this torch
    lacks it (recorded in NOT_REGISTERED)."""
    base, _, ov = name.partition(".")
    try:
        return getattr(getattr(torch.ops.aten, base), ov or "default")
    except (AttributeError, RuntimeError):
        NOT_REGISTERED.add(name)
        return None


def _impl(name, fn, key="PrivateUse1"):
    if _overload(name) is not None:
        _IMPL.impl(name, fn, key)


def _register_rows():
    """Registers a Kernel for every ATen row of the C table (through its
    WRAPPERS entry where it has one); returns the internal rows' op ids by
    name (tpu::..., not ATen overloads: the Python kernels call them)."""
    internal, direct = {}, []
    for name, op_id, flags in _C.ops():
        if name.startswith("tpu::"):
            internal[name] = op_id
            continue
        opov = _overload(name)
        if opov is None:
            continue
        schema = opov._schema
        try:
            spec = _spec(schema)
        except NotImplementedError:
            NOT_REGISTERED.add(name)  # a schema this torch changed: left to the fallback
            continue
        if name in _BIT_AWARE:
            k = _C.kernel(op_id, spec, len(schema.returns), _REQUIRED, _resolve_bits, _BIT_AWARE[name])
        else:
            k = _C.kernel(op_id, spec, len(schema.returns), _REQUIRED)
        _KERNELS[name] = k
        wrap = WRAPPERS.get(name)
        if wrap is None:
            direct.append((name, k))
        else:
            _IMPL.impl(name, wrap(k), "PrivateUse1")
    taken = _cpp_kernels(direct)
    for name, k in direct:
        if name not in taken:
            _IMPL.impl(name, k, "PrivateUse1")
    return internal


# The rows torch's dispatcher calls with no Python in between (boxed.cpp).
CPP_KERNELS = set()


def _guard_module():
    """torchtpu._device_guard, when it was built for the running torch: its
    C++ uses torch's C++ ABI, which changes between releases (a wheel built
    for torch 2.13 under torch 2.12 may load and then misread torch's
    structs). None, with a warning, for another torch; None when not built."""
    try:
        from . import _device_guard
    except ImportError:
        return None  # not built (or not loadable with this torch)
    built = getattr(_device_guard, "torch_version", None)
    if built != torch.__version__:
        warnings.warn(
            f"torchtpu: its C++ extension was built for torch {built}, this is torch {torch.__version__}: "
            "it is not used (one local device for backward, no tpu generators, kernels called through Python); "
            "reinstall torchtpu against this torch",
            stacklevel=4,
        )
        return None
    return _device_guard


def _cpp_kernels(rows):
    """Registers the Kernels of rows [(name, kernel)] as boxed C++ kernels
    (torchtpu._device_guard, csrc/guard/boxed.cpp) where it can: the names
    taken. Not with TORCHTPU_TENSOR_API=0, nor without the extension."""
    if not TENSOR_API:
        return set()
    try:
        CPP_KERNELS.update(_GUARD.register_kernels(_C.fast_api, rows))
    except (AttributeError, ImportError):
        pass  # not built, or built before register_kernels existed
    return CPP_KERNELS


def _register_fused_optimizers(internal):
    for name, (row, flags) in FUSED_OPTIMIZERS.items():
        for qualified in (name, f"{name}.tensor_lr"):
            opov = _overload(qualified)
            if opov is not None:
                _IMPL.impl(qualified, _fused_optimizer(internal[row], opov, **flags), "PrivateUse1")


def _register_attention(internal):
    fused, math = (
        _overload("_scaled_dot_product_fused_attention_overrideable"),
        _overload("_scaled_dot_product_attention_math"),
    )
    if fused is None or math is None:
        return  # torch's own composition serves attention
    attn = _attention(internal["tpu::sdpa"], internal["tpu::sdpa_backward"], fused, math)
    _impl("scaled_dot_product_attention", attn["sdpa"])
    _impl("scaled_dot_product_attention", attn["sdpa"], "AutogradPrivateUse1")
    _impl("_scaled_dot_product_fused_attention_overrideable", attn["fused"])
    _impl("_scaled_dot_product_fused_attention_overrideable_backward", attn["backward"])


def _device_error():
    """Why the device cannot be used, found without loading the plugin (raised
    at its first use), or None."""
    try:
        path, platform = _plugin.find()
        ndev, fraction = _runtime_settings()
    except RuntimeError as e:
        return ("", "", 1, 0.0), str(e)
    why = _plugin.check(path)
    if why is None and os.environ.get("XLA_FLAGS", "").strip():
        why = _plugin.check_xla_flags(path, os.environ["XLA_FLAGS"])
    if why is not None and os.environ.get("TORCHTPU_PJRT_PLUGIN"):
        why = f"TORCHTPU_PJRT_PLUGIN: {why}"
    return (path, platform, ndev, fraction), why


# Whose device guard torch uses for the tpu: "torchtpu" (every local device,
# torchtpu._device_guard) or "torch" (torch's guard for Python backends: one
# device, so backward on tpu:1 and above fails).
DEVICE_GUARD = "torch"
_GUARD = None  # torchtpu._device_guard when usable (_guard_module)


def _register_device_guard():
    """Registers torchtpu's device guard (the C++ of csrc/guard/, built when
    torch was importable at build time) before torch's guard for Python
    backends, which then stays unregistered; without it, torch's serves."""
    global DEVICE_GUARD, _GUARD
    _GUARD = _guard_module()
    if _GUARD is None:
        return  # not built (or built for another torch): torch's guard, one device
    try:
        if _GUARD.register_guard(_C.guard_api):
            DEVICE_GUARD = "torchtpu"
    except (ImportError, RuntimeError) as e:
        warnings.warn(f"torchtpu: device guard not registered ({e}); backward runs on tpu:0 only", stacklevel=3)


# Whether torch.Generator(device="tpu") makes tpu generators (generator.cpp).
GENERATORS = False


def _register_hooks(device_module):
    """The tpu's PrivateUse1 hooks (csrc/guard/hooks.cpp), through which torch
    makes tpu generators (torch.Generator(device="tpu"), the default ones of
    torch.tpu.default_generators; csrc/guard/generator.cpp), and the random
    ops' generator= read through torchtpu._device_guard. Then the rest of
    torch's setup for a device registered from Python, whose hooks object
    (it answers only availability) torch takes only once. Without the
    extension, torch's setup with its hooks: no tpu generator can be made."""
    global GENERATORS
    try:
        ours = _GUARD is not None and _GUARD.register_hooks(_C.guard_api)
    except (AttributeError, ImportError):
        ours = False
    if not ours:
        _br._setup_privateuseone_for_python_backend("tpu", backend_module=device_module)
        return
    torch.utils.generate_methods_for_privateuse1_backend()
    torch._register_device_module("tpu", device_module)
    torch._C._acc.register_python_privateuseone_device_guard(_br._DummyDeviceGuard())
    _C.set_generator_api(_GUARD.generator_api)
    GENERATORS = True


# Whether torch's profiler records the tpu's work (torchtpu._device_guard's
# profiler.cpp: a Kineto child profiler through torch's
# PrivateUse1ProfilerRegistry; docs/profiler.md).
PROFILER = False


def _register_profiler():
    """torch.profiler's sessions get the engine's compiles, launches,
    transfers and the programs' spans on the device (csrc/guard/profiler.cpp);
    without the extension, or a torch without Kineto, the profile shows only
    the aten ops."""
    global PROFILER
    try:
        from . import _device_guard

        PROFILER = bool(_device_guard.register_profiler(_C.prof_api))
    except (AttributeError, ImportError):
        pass  # not built, or built before the profiler existed
    except RuntimeError as e:
        warnings.warn(f"torchtpu: torch's profiler will not show the tpu's work ({e})", stacklevel=3)


# Whether tensor arguments are read from torch's C++ tensors (tensor_api).
TENSOR_API = False


def _use_tensor_api():
    """Tensor arguments read from torch's C++ tensors (torchtpu._device_guard's
    tensor_api) instead of six Python attribute calls each; without the
    extension, or with TORCHTPU_TENSOR_API=0, through Python."""
    global TENSOR_API
    if not _settings.flag("TORCHTPU_TENSOR_API"):
        return
    if _GUARD is None:
        return
    try:
        _C.set_tensor_api(_GUARD.tensor_api, torch._C.TensorBase)
        TENSOR_API = True
    except (AttributeError, ImportError):
        pass  # not built, or built before tensor_api existed


def setup(device_module):
    global _LIB, _IMPL
    # The plugin is loaded at the device's first use (as CUDA's context is
    # made), so a missing plugin or a bad setting is raised there: `import
    # torch`, which imports torchtpu through the autoload, keeps working.
    # So does a newer torch: what it lacks is not registered, and a torch
    # without the hooks a Python device needs leaves the device unavailable.
    _check_torch_version()
    _settings.check()
    (path, platform, ndev, fraction), error = _device_error()
    try:
        torch.utils.rename_privateuse1_backend("tpu")
        _register_device_guard()
        _register_hooks(device_module)
        registered = True
    except (AttributeError, TypeError, RuntimeError) as e:
        registered = False
        error = f"torchtpu cannot register the tpu device with torch {torch.__version__}: {e}"
        warnings.warn(error, stacklevel=2)
    _C.init(
        path, platform, ndev, _DTYPES, torch._C._from_dlpack, torch.empty, fraction, error, _settings.engine(_C.modes())
    )
    from . import _aot

    _aot.setup()
    _use_tensor_api()
    _register_profiler()
    device_module._setup_error = error
    device_module._num_devices_setting = ndev
    device_module._platform_setting = platform
    if not registered:
        return
    setup_disk_cache()

    warnings.filterwarnings("ignore", message=".*Overriding a previously registered kernel.*")
    _IMPL = torch.library.Library("aten", "IMPL")
    internal = _register_rows()
    INTERNAL.update(internal)
    for name, fn in PYTHON_KERNELS.items():
        _impl(name, fn)
    for name in CPU_VIEWS:
        opov = _overload(name)
        if opov is not None:
            _IMPL.impl(name, _redispatch_cpu(opov), "PrivateUse1")
    _register_foreach()
    # clip_grad_norm_'s norms: one op per _LIST_MAX tensors, not torch's loop over norm
    _impl("_foreach_norm.Scalar", _foreach_norm(internal["tpu::foreach_norm"]))
    _register_fused_optimizers(internal)
    _register_attention(internal)
    for name, fn in CPU_KERNELS.items():
        _impl(name, fn, "CPU")
    _patches.apply(device_module)
    from . import _autocast

    _autocast.setup()
    _LIB = torch.library.Library("_", "IMPL")
    _LIB.fallback(_fallback, dispatch_key="PrivateUse1")
    _skip_kernel_frames()


def runtime_info():
    return dict(_C.info())
