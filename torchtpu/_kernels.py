"""The kernels written in Python: the ATen overloads registered under
PrivateUse1 that are not a row of the C op table as they are (_registry's
PYTHON_KERNELS, WRAPPERS, CPU_VIEWS, CPU_KERNELS): making, resizing and
copying storage, the data-dependent shapes (nonzero, masks, unique,
histogramdd: the size is read back, then C rows build the result), long
tensor lists cut to what one call takes, the fused optimizers, the foreach
matching, and the fallback of ops without a lowering. Each is a few lines
around calls of the C core; the math stays in the C lowerings. Also the
reading of a schema into a Kernel's argument spec (_spec)."""

import functools
import warnings

import torch

from . import _C, _settings

_REQUIRED = object()  # a Kernel's argument without a default
_FALLBACK_WARNED = set()
# The Kernels of the C table's ATen rows by name (filled by _registry._register_rows).
_KERNELS = {}
# The internal rows' op ids by name, "tpu::..." (filled by _registry.setup), and
# the Kernels made for them (_row).
INTERNAL = {}
_ROWS = {}


def _row(name, spec, nreturns=1):
    """The Kernel of internal row name (spec: [(argument, kind, default)], as _spec)."""
    k = _ROWS.get(name)
    if k is None:
        k = _ROWS[name] = _C.kernel(INTERNAL[name], spec, nreturns, _REQUIRED)
    return k


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


def _uninitialized(t, start=0):
    """New memory as torch leaves it: with torch.use_deterministic_algorithms(True)
    and torch.utils.deterministic.fill_uninitialized_memory, the storage's
    elements from start on hold NaN (floating and complex dtypes) or the
    dtype's largest value (True for bool), as the CPU's do; else untouched."""
    if not (torch.are_deterministic_algorithms_enabled() and torch.utils.deterministic.fill_uninitialized_memory):
        return t
    n = t.untyped_storage().nbytes() // t.element_size() - start
    if n > 0:
        fill = (
            float("nan")
            if t.is_floating_point() or t.is_complex()
            else True
            if t.dtype == torch.bool
            else torch.iinfo(t.dtype).max
        )
        t.as_strided((n,), (1,), start).fill_(fill)
    return t


def _format_strides(size, memory_format):
    """The strides torch gives a new tensor of this size in memory_format
    (None: row-major), with torch's error for a rank the format cannot take."""
    if memory_format in (None, torch.contiguous_format, torch.preserve_format):
        return None
    rank = 4 if memory_format == torch.channels_last else 5 if memory_format == torch.channels_last_3d else 0
    if not rank:
        raise RuntimeError(f"Unsupported memory format {memory_format}")
    if len(size) != rank:
        raise RuntimeError(f"required rank {rank} tensor to use {str(memory_format).split('.')[-1]} format")
    st = [0] * rank
    st[1], acc = 1, int(size[1])
    for d in range(rank - 1, 1, -1):
        st[d] = acc
        acc *= int(size[d])
    st[0] = acc
    return st


def _empty_memory_format(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    stride = _format_strides(size, memory_format)
    return _uninitialized(_C.empty(size, dtype or torch.get_default_dtype(), stride, _dev(device)))


def _efficientzerotensor(size, dtype=None, layout=None, device=None, pin_memory=None):
    """The zeros torch.func and some backward formulas make: ordinary zeros
    here (CPU's carry a ZeroTensor flag that only skips work)."""
    t = _C.empty([int(s) for s in size], dtype or torch.get_default_dtype(), None, _dev(device))
    return t.zero_()


def _empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    return _uninitialized(_C.empty(size, dtype or torch.get_default_dtype(), stride, _dev(device)))


def _empty_like(self, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    """torch's empty_like; for a whole contiguous tensor laid over a mesh
    (torchtpu.spmd), a tensor laid out as it (zeros_like of a sharded
    parameter is a sharded optimizer state)."""
    dt = dtype or self.dtype
    dev = self.device if device is None else torch.device(device)
    keep = memory_format in (None, torch.preserve_format, torch.contiguous_format)
    if keep and dev == self.device and self.is_contiguous() and self.storage_offset() == 0:
        if self.untyped_storage().nbytes() == self.numel() * self.element_size() and _C.sharding(self) is not None:
            return _uninitialized(_C.mesh_like(self, dt))
    dense = (memory_format is None or memory_format == torch.preserve_format) and _C.dense(self)
    if dev.type != "tpu":
        if dense:
            return torch.empty_strided(self.shape, self.stride(), dtype=dt, device=dev, pin_memory=bool(pin_memory))
        return torch.empty(self.shape, dtype=dt, device=dev, memory_format=memory_format or torch.contiguous_format)
    return _uninitialized(_C.empty(list(self.shape), dt, list(self.stride()) if dense else None, _dev(dev)))


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


def _clone_resolving_bits(c_clone):
    """clone: torch materialises lazily conjugated or negated tensors by
    cloning them, so such an input comes back resolved (the C kernel copies
    the stored, unconjugated values)."""

    def clone(self, memory_format=None):
        if self.is_conj() or self.is_neg():
            self = _resolve_bits(self)
            if memory_format in (None, torch.preserve_format):
                return self
        return _laid_out(self, memory_format, c_clone)

    return clone


def _laid_out(self, memory_format, c_clone):
    """clone(memory_format) as torch lays it out: preserve keeps the strides of
    a dense tensor, else takes its suggested format; channels_last(_3d) their
    strides. The C kernel copies row-major; another layout is a copy into a
    tensor of those strides."""
    mf = torch.preserve_format if memory_format is None else memory_format
    if mf == torch.preserve_format:
        if _C.dense(self):
            if self.is_contiguous():
                return c_clone(self)
            out = torch.empty_strided(self.shape, self.stride(), dtype=self.dtype, device=self.device)
            return out.copy_(self)
        mf = _suggest_format(self)
    if mf == torch.contiguous_format:
        return c_clone(self)
    return torch.empty(self.shape, dtype=self.dtype, device=self.device, memory_format=mf).copy_(self)


def _stored(self, dst):
    """The values to write into dst's storage so that dst reads as self: a
    lazily conjugated (or negated) destination stands for the conjugate (or
    negation) of what it stores, so the values are conjugated (negated) and
    written through the view without the bit. (source, plain destination)."""
    if self.is_conj() or self.is_neg():
        self = _resolve_bits(self)
    if dst.is_conj():
        self, dst = torch.conj_physical(self.to(dst.dtype)), dst.conj()
    if dst.is_neg():
        self, dst = torch.neg(self.to(dst.dtype)), dst._neg_view()
    return self, dst


def _copy_from(self, dst, non_blocking=False):
    src, plain = _stored(self, dst)
    _C.copy_from(src, plain)
    return dst


def _copy_from_and_resize(self, dst):
    if dst.numel() == 0 and self.numel() != 0:
        raise NotImplementedError("aten::_copy_from_and_resize: resizing a tpu tensor is not supported yet")
    src, plain = _stored(self, dst)
    _C.copy_from(src, plain)
    return dst


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
    cl = 4 if memory_format == torch.channels_last else 5 if memory_format == torch.channels_last_3d else 0
    strides = _C.contiguous_strides(size, cl)
    itemsize = self.element_size()
    have = self.untyped_storage().nbytes() // itemsize
    if self.storage_offset() + n <= have:
        return self.set_(self.untyped_storage(), self.storage_offset(), size, strides)
    new = _C.empty([n], self.dtype, None, self.device.index)
    old = self.numel()
    kept = min(old, n) if old and self.is_contiguous() else 0
    if kept:
        new[:kept].copy_(self.reshape(-1)[:kept])
    _uninitialized(new, kept)
    return self.set_(new.untyped_storage(), 0, size, strides)


def _set_empty(self):
    return self.set_(_C.empty([0], self.dtype, None, self.device.index).untyped_storage(), 0, [0], [1])


def _to_copy(self, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False, memory_format=None):
    """_to_copy from a tpu tensor. torch's own version pins the host copy when
    non_blocking is set, which a Python-registered device cannot provide; our
    device->host copy is synchronous anyway, so non_blocking changes nothing."""
    dtype = dtype if dtype is not None else self.dtype
    device = torch.device(device) if device is not None else self.device
    if self.is_conj() or self.is_neg():
        self = _resolve_bits(self)
    mf = memory_format if memory_format is not None else torch.preserve_format
    if mf == torch.preserve_format and _C.dense(self):
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


def _nonzero_out(self, *, out):
    """nonzero(out=): the CPU's dtype and overlap checks, then out resized
    (as the CPU, with a warning when it had elements) and written."""
    if out.dtype != torch.long:
        name = torch.empty(0, dtype=out.dtype).type().removeprefix("torch.").removesuffix("Tensor")
        raise RuntimeError(f"nonzero: Expected out tensor to have scalar type Long but got scalar type{name}")
    _C.check_out_overlap(out, self)
    return _write_out(out, _nonzero(self), "nonzero.out")


def _write_out(out, r, op):
    """r written into the out= tensor of aten::op, which is resized to r's
    shape first (with torch's warning when it held elements); an out tensor
    on another device is torch's RuntimeError, and is left as it was."""
    if out.device != r.device:
        raise RuntimeError(
            f"Expected all tensors to be on the same device, but found at least two devices, {r.device} and "
            f"{out.device}! (in aten::{op}; move the out tensor with .to({str(r.device.type)!r}))"
        )
    if out.shape != r.shape:
        if out.numel():
            _C.warn_resized()
        out.resize_(r.shape)
    return out.copy_(r)


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
            if ix.dtype == torch.uint8:  # the CPU's deprecation warning, word for word
                warnings.warn(
                    "indexing with dtype torch.uint8 is now deprecated, please use a dtype torch.bool instead.",
                    UserWarning,
                    stacklevel=3,
                )
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
    """Each dim's edges, computed on the device (tpu::histogramdd_edges, its
    checks too); the counting is a C lowering (_histogramdd_from_bin_tensors)."""
    spec = [("self", "T", _REQUIRED), ("bins", "I", _REQUIRED), ("range", "F", None)]
    return list(_row("tpu::histogramdd_edges", spec, 2)(self, bins, range))


def _histogramdd_from_bin_cts(self, bins, *, range=None, weight=None, density=False):
    edges = _histogramdd_bin_edges(self, bins, range=range)
    return torch.ops.aten._histogramdd_from_bin_tensors(self, edges, weight=weight, density=density)


def _masked_select(self, mask):
    a, m = torch.broadcast_tensors(self, mask.to(self.device))
    return a[m]


def _masked_select_out(self, mask, *, out):
    _C.check_out_overlap(out, self, mask)
    r = _masked_select(self, mask)
    if r.dtype != out.dtype:
        raise RuntimeError("masked_select(): self and result must have the same scalar type")
    return _write_out(out, r, "masked_select.out")


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
    device (tpu::unique_count), read back once."""
    spec = [("self", "T", _REQUIRED), ("consecutive", "b", _REQUIRED)]
    return int(_row("tpu::unique_count", spec)(self, consecutive).item())


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
        if output_size is None and repeats.numel():
            # one read back for the size and the check (with output_size, the program checks)
            total, least = torch.stack([repeats.sum(), repeats.min()]).tolist()
            if least < 0:
                raise RuntimeError("repeats can not be negative")
            output_size = int(total)
        return c_repeat_interleave(repeats, output_size=output_size or 0)

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


# The most tensors one call may take in a list (TPU_MAX_LIST in
# csrc/lower/lower.h); longer lists are split here.
_LIST_MAX = 64


def _suggest_format(t):
    """torch's suggest_memory_format (C++ only): channels_last(_3d) when a 4-d
    (5-d) tensor's strides order its dims as that format does, ambiguous
    cases row-major."""
    order = {4: (1, 3, 2, 0), 5: (1, 4, 3, 2, 0)}.get(t.dim())
    size, stride = t.shape, t.stride()
    if order is None or stride[1] == 0:
        return torch.contiguous_format
    low = 0
    for d in order:
        if size[d] == 0 or stride[d] < low or (d == 0 and low == stride[1]):
            return torch.contiguous_format
        low = stride[d] * (size[d] if size[d] > 1 else 1)
    return torch.channels_last if t.dim() == 4 else torch.channels_last_3d


def _common_format(tensors):
    """channels_last(_3d) when every tensor suggests it, else None."""
    fmt = None
    for t in tensors:
        f = _suggest_format(t)
        if f == torch.contiguous_format or (fmt is not None and f != fmt):
            return None
        fmt = f
    return fmt


def _chunked_cat(c_cat):
    """aten::cat of any number of tensors (torch.stack and clip_grad_norm_
    over a model's parameters make long lists): cats of at most _LIST_MAX,
    then a cat of their results (in fused mode all one program)."""

    def cat(tensors, dim=0):
        tensors = list(tensors)
        fmt = _common_format(tensors)
        while len(tensors) > _LIST_MAX:
            tensors = [c_cat(tensors[k : k + _LIST_MAX], dim) for k in range(0, len(tensors), _LIST_MAX)]
        out = c_cat(tensors, dim)
        # the CPU's cat lays its result out in the inputs' common format
        return out.contiguous(memory_format=fmt) if fmt is not None and out.dim() == len(tensors[0].shape) else out

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
    for prefix, key in _MAKES_LAYOUT:
        if name.startswith(prefix):
            _layout_refusal(key)(op)
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


# The dispatch keys of tpu tensors of other layouts: what they are, and what to do instead
_LAYOUT_KEYS = {
    "SparsePrivateUse1": (
        "sparse tensors (torch.sparse_coo)",
        "keep them on the CPU or make them dense there (.to_dense(); nn.Embedding: sparse=False)",
    ),
    "SparseCsrPrivateUse1": (
        "sparse tensors (a compressed sparse layout)",
        "keep them on the CPU or make them dense there (.to_dense())",
    ),
    "QuantizedPrivateUse1": (
        "quantized tensors (torch.quint8, torch.qint8, torch.qint32, ...)",
        "keep them on the CPU or dequantize them there (.dequantize()); for low precision on tpu, use "
        "bfloat16 (torch.autocast) or integer dtypes",
    ),
}


# Ops of dense tpu tensors whose result would be of another layout (first match)
_MAKES_LAYOUT = (
    ("aten::quantize_per_", "QuantizedPrivateUse1"),
    ("aten::_to_sparse_", "SparseCsrPrivateUse1"),  # to_sparse_csr/csc/bsr/bsc
    ("aten::_to_sparse", "SparsePrivateUse1"),
)


def _layout_refusal(key):
    """The fallback of a tpu dispatch key of another layout (sparse,
    quantized): one line saying that the layout is not supported and what to
    do (instead of torch's 50-line list of the backends an op has)."""
    what, instead = _LAYOUT_KEYS[key]

    def refuse(op, *args, **kwargs):
        name = op._schema.name + (("." + op._schema.overload_name) if op._schema.overload_name else "")
        raise NotImplementedError(f"{name}: {what} are not supported on tpu; {instead}")

    return refuse


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
