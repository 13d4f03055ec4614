"""Registers the "tpu" device with PyTorch and every row of the C op table as
a PrivateUse1 kernel. Thin by design: argument parsing, lowering and execution
are in the C core. What is registered is data (the tables below); the kernels
written in Python are in _kernels.py and _attention.py, the wiring into
torch's C++ (device guard, hooks, profiler, tensor API) in _native.py, the
settings in _settings.py."""

import warnings

import torch

from . import _C, _attention, _kernels, _native, _patches, _settings
from ._kernels import (
    _chunked_cat,
    _chunked_unscale,
    _clone_resolving_bits,
    _copy_from,
    _copy_from_and_resize,
    _efficientzerotensor,
    _empty_like,
    _empty_memory_format,
    _empty_strided,
    _equal,
    _histogramdd_bin_edges,
    _histogramdd_from_bin_cts,
    _index_put_with_masks,
    _index_with_masks,
    _local_scalar_dense,
    _masked_outputs,
    _masked_select,
    _masked_select_out,
    _narrow_copy,
    _nonzero,
    _nonzero_out,
    _pin_memory,
    _resize_,
    _set_empty,
    _sized_repeat_interleave,
    _to_copy,
    _unique1,
    _unique2,
    _unique_consecutive,
    _unique_dim,
)

_LIB = None
_IMPL = None
# ATen overloads with a torchtpu kernel that this torch lacks (or whose schema
# torchtpu cannot read): not registered, so they raise NotImplementedError
# (torchtpu.metrics()["ops_not_registered"] counts them).
NOT_REGISTERED = set()
# The torch versions torchtpu is tested with: [lowest, first untested) (pyproject.toml).
TESTED_TORCH = ((2, 11), (2, 16))

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


# Ops that PyTorch hands lazily conjugated (or negated) tensors as they are:
# its Conjugate and Negative fallbacks resolve the bits for every other op,
# but let these through (CPU and CUDA kernels fold the conjugation into their
# BLAS calls; the backward of a complex matmul passes a.mH this way). Their C
# kernels resolve such inputs with _kernels._resolve_bits; only the triangular
# solve also gets negated real tensors.
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


# ---- what setup() registers, as data ---------------------------------------
# Every ATen row of the C op table (_C.ops(): csrc/lower/ops.def) is registered
# for PrivateUse1 as its Kernel (_C.kernel, made from the overload's schema);
# the Kernels are kept in _kernels._KERNELS by name. The tables below are the
# exceptions and the kernels written in Python. Adding an op that needs a
# Python wrapper is one entry in WRAPPERS.

# Rows whose Kernel is registered through a Python wrapper: name ->
# wrapper(kernel), the function registered in the Kernel's place
# (_kernels._KERNELS keeps the Kernel itself).
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
INTERNAL = _kernels.INTERNAL


# ATen overloads without a row, served by a Python kernel under PrivateUse1.
PYTHON_KERNELS = {
    # data-dependent shapes: the size is computed on the device and read back,
    # then static-shape C rows build the result
    "nonzero": _nonzero,
    "nonzero.out": _nonzero_out,
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
# serves tpu tensors as they are (_kernels._redispatch_cpu).
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


def _not_implemented(fn):
    """Whether fn raises NotImplementedError (else a RuntimeError, or nothing)."""
    try:
        fn()
    except NotImplementedError:
        return True
    except RuntimeError:
        pass
    return False


def _torch_compat():
    """What differs between torch versions, as this torch's CPU kernels do it
    (one probe each, on the CPU): the C core does the same. A bool subtraction
    raises NotImplementedError from torch 2.14 (RuntimeError before), argmax
    of bool from 2.15; an int64 arange of float bounds counts its values from
    the float bounds from 2.14 (from the truncated ones before: arange(0.5, 5,
    1.5) has 3 int64 values, 5 before)."""
    b = torch.ones(2, dtype=torch.bool)
    _C.torch_compat(
        _not_implemented(lambda: b - b),
        _not_implemented(lambda: b.argmax()),
        torch.arange(0.5, 5, 1.5, dtype=torch.int64).numel() == 3,
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
    internal, direct, req = {}, [], _kernels._REQUIRED
    for name, op_id, flags in _C.ops():
        if name.startswith("tpu::"):
            internal[name] = op_id
            continue
        opov = _overload(name)
        if opov is None:
            continue
        schema = opov._schema
        try:
            spec = _kernels._spec(schema)
        except NotImplementedError:
            NOT_REGISTERED.add(name)  # a schema this torch changed: left to the fallback
            continue
        if name in _BIT_AWARE:
            k = _C.kernel(op_id, spec, len(schema.returns), req, _kernels._resolve_bits, _BIT_AWARE[name])
        else:
            k = _C.kernel(op_id, spec, len(schema.returns), req)
        _kernels._KERNELS[name] = k
        wrap = WRAPPERS.get(name)
        if wrap is None:
            direct.append((name, k))
        else:
            _IMPL.impl(name, wrap(k), "PrivateUse1")
    taken = _native._cpp_kernels(direct)
    for name, k in direct:
        if name not in taken:
            _IMPL.impl(name, k, "PrivateUse1")
    return internal


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
            found = _kernels._element_kernel(fs, fname.endswith("_"))
        except (AttributeError, RuntimeError, NotImplementedError):
            continue  # an op this torch lacks in part: torch's own loop serves it
        inplace = fname.endswith("_")
        if [str(r.type) for r in fs.returns] != ([] if inplace else ["List[Tensor]"]) or any(
            a.kwarg_only and a.name == "out" for a in fs.arguments
        ):
            continue  # out= overloads, and those returning anything else, keep torch's loop
        pos = _kernels._positional(fs)
        lists = sum(1 << i for i, a in enumerate(pos) if str(a.type).startswith("List["))
        found = found if lists & 1 else None
        if found is None or (found[2] and str(pos[0].type) != "List[Tensor]"):
            continue
        k, kwnames, out_self = found
        _IMPL.impl(name, _C.foreach(name, k, lists, kwnames, out_self, not inplace), "PrivateUse1")
        done.append(name)
    return done


def _register_fused_optimizers(internal):
    for name, (row, flags) in FUSED_OPTIMIZERS.items():
        for qualified in (name, f"{name}.tensor_lr"):
            opov = _overload(qualified)
            if opov is not None:
                _IMPL.impl(qualified, _kernels._fused_optimizer(internal[row], opov, **flags), "PrivateUse1")


def _register_attention(internal):
    fused, math = (
        _overload("_scaled_dot_product_fused_attention_overrideable"),
        _overload("_scaled_dot_product_attention_math"),
    )
    if fused is None or math is None:
        return  # torch's own composition serves attention
    attn = _attention.kernels(internal["tpu::sdpa"], internal["tpu::sdpa_backward"], fused, math)
    _impl("scaled_dot_product_attention", attn["sdpa"])
    _impl("scaled_dot_product_attention", attn["sdpa"], "AutogradPrivateUse1")
    _impl("_scaled_dot_product_fused_attention_overrideable", attn["fused"])
    _impl("_scaled_dot_product_fused_attention_overrideable_backward", attn["backward"])


def setup(device_module):
    global _LIB, _IMPL
    # The plugin is loaded at the device's first use (as CUDA's context is
    # made), so a missing plugin or a bad setting is raised there: `import
    # torch`, which imports torchtpu through the autoload, keeps working.
    # So does a newer torch: what it lacks is not registered, and a torch
    # without the hooks a Python device needs leaves the device unavailable.
    _check_torch_version()
    _torch_compat()
    _settings.check()
    (path, platform, ndev, fraction), error = _native._device_error()
    try:
        torch.utils.rename_privateuse1_backend("tpu")
        _native._register_device_guard()
        _native._register_hooks(device_module)
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
    _native._use_tensor_api()
    _native._register_profiler()
    device_module._setup_error = error
    device_module._num_devices_setting = ndev
    device_module._platform_setting = platform
    if not registered:
        return
    _native.setup_disk_cache()

    warnings.filterwarnings("ignore", message=".*Overriding a previously registered kernel.*")
    _IMPL = torch.library.Library("aten", "IMPL")
    internal = _register_rows()
    INTERNAL.update(internal)
    for name, fn in PYTHON_KERNELS.items():
        _impl(name, fn)
    # _copy_from's schema does not mark dst as written, so torch's conjugate and
    # negative fallbacks would hand the kernel a resolved clone of a lazily
    # conjugated (negated) destination and drop the write (x.conj().copy_(y),
    # and every in-place op on such a view, which ends in that copy): the
    # kernels see the bits and write through the view themselves (_stored)
    for name in ("_copy_from", "_copy_from_and_resize"):
        for key in ("Conjugate", "Negative"):
            _IMPL.impl(name, torch.library.fallthrough_kernel, key)
    for name in CPU_VIEWS:
        opov = _overload(name)
        if opov is not None:
            _IMPL.impl(name, _kernels._redispatch_cpu(opov), "PrivateUse1")
    _register_foreach()
    # clip_grad_norm_'s norms: one op per _LIST_MAX tensors, not torch's loop over norm
    _impl("_foreach_norm.Scalar", _kernels._foreach_norm(internal["tpu::foreach_norm"]))
    _register_fused_optimizers(internal)
    _register_attention(internal)
    for name, fn in CPU_KERNELS.items():
        _impl(name, fn, "CPU")
    _patches.apply(device_module)
    from . import _autocast

    _autocast.setup()
    _LIB = torch.library.Library("_", "IMPL")
    _LIB.fallback(_kernels._fallback, dispatch_key="PrivateUse1")
    for key in _kernels._LAYOUT_KEYS:
        _LIB.fallback(_kernels._layout_refusal(key), dispatch_key=key)
    _native._skip_kernel_frames()


def runtime_info():
    return dict(_C.info())
