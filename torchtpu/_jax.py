"""torchtpu.jax_op and torchtpu.stablehlo_op: functions written in JAX (Pallas
kernels included) or as StableHLO text, called as torch ops on tpu tensors.

A function's StableHLO text is registered with the C core, which reads its
@main's signature, renames its symbols and keeps it under an id
(csrc/hlo/hlo_extern.c, csrc/engine/fns.c). Every call goes through one custom
op, torchtpu::stablehlo_call(Tensor[] args, int fn) -> Tensor[]: its tpu kernel
is the core's row tpu::stablehlo_call, which inlines the function into the
program of the eager op, the fused flush or the graph (any eager mode,
torch.tpu.graph, torch.compile); its fake kernel gives the registered result
types (torch.compile traces with it); its autograd formula calls the
function's backward, registered per id (jax_op: jax.vjp of the function,
itself a jax_op, so higher derivatives work too).

jax is imported at a jax_op's first call, never by `import torchtpu`. JAX is
used only to trace and lower (jax.export, for the shapes and dtypes of each
call's tensors): if jax has not chosen its platforms yet, it is kept to its
CPU backend (torchtpu owns the accelerator; jax's TPU backend would take
libtpu). A Pallas TPU kernel lowers to a Mosaic custom call only the TPU
compiler compiles: on the CPU plugin the kernel runs through Pallas's
interpret mode, and its TPU form is registered beside it, which a program's
text for the TPU takes instead (lower_text(..., target="tpu"),
_C.stablehlo_retarget).
"""

import functools
import threading

import torch

from . import _C, _kernels, _registry

_LOCK = threading.RLock()
_LIB = None
_OP = None
# A call's `fn` is a handle: the core's id of the function (the same text has
# the same id) and, per stablehlo_op or jax_op signature, its own backward.
_IDS = []  # handle -> the core's function id
_SIGS = {}  # core id -> ([(shape, dtype)] of the arguments, [...] of the results)
_BACKWARD = {}  # handle -> backward(primals, grads) -> grads of the primals (None where not differentiable)
_KERNEL = None


def _setup():
    """Defines torchtpu::stablehlo_call once: its tpu kernel, fake kernel and autograd."""
    global _LIB, _OP, _KERNEL
    with _LOCK:
        if _OP is not None:
            return _OP
        row = _registry.INTERNAL.get("tpu::stablehlo_call")
        if row is None:
            raise RuntimeError("torchtpu: the tpu device is not available, so stablehlo_op and jax_op are not")
        req = _kernels._REQUIRED
        _KERNEL = _C.kernel(row, [("args", "L", req), ("fn", "i", req)], 128, req)
        lib = torch.library.Library("torchtpu", "FRAGMENT")  # noqa: TOR901
        lib.define("stablehlo_call(Tensor[] args, int fn) -> Tensor[]")

        def tpu_kernel(args, fn):
            return list(_KERNEL(list(args), _IDS[fn]))

        lib.impl("stablehlo_call", tpu_kernel, "PrivateUse1")
        torch.library.register_fake("torchtpu::stablehlo_call", _fake, lib=lib)
        torch.library.register_autograd("torchtpu::stablehlo_call", _backward, setup_context=_setup_context, lib=lib)
        _LIB = lib
        _OP = torch.ops.torchtpu.stablehlo_call.default
        return _OP


def _handle(text, tpu_text=None):
    """Registers text (and its TPU form) with the core: a new handle."""
    cid = _C.stablehlo_register(text, tpu_text)
    if cid not in _SIGS:
        _SIGS[cid] = _C.stablehlo_signature(cid)
    with _LOCK:
        _IDS.append(cid)
        return len(_IDS) - 1


def _signature(fn):
    return _SIGS[_IDS[fn]]


def _check(name, args, fn):
    """The core's checks of a call (emit_extern.c), made before dispatch so
    that torch.compile's tracing raises them too."""
    params, _ = _signature(fn)
    if len(args) != len(params):
        raise TypeError(
            f"{name}: the function takes {len(params)} tensors (the arguments of its @main), got {len(args)}"
        )
    for j, (a, (shape, dt)) in enumerate(zip(args, params)):
        if not isinstance(a, torch.Tensor):
            raise TypeError(f"{name}: argument {j} is {type(a).__name__}, the function takes a tensor")
        if a.device.type != "tpu":
            raise RuntimeError(f"{name}: argument {j} is on {a.device}, expected a tpu tensor")
        if a.dtype != dt:
            raise RuntimeError(f"{name}: argument {j} has dtype {a.dtype}, the function takes {dt}")
        if tuple(a.shape) != tuple(shape):
            raise RuntimeError(f"{name}: argument {j} has shape {list(a.shape)}, the function takes {list(shape)}")


def _fake(args, fn):
    _, results = _signature(fn)
    dev = args[0].device if len(args) else torch.device("tpu")
    return [torch.empty(shape, dtype=dt, device=dev) for shape, dt in results]


def _setup_context(ctx, inputs, output):
    args, fn = inputs
    ctx.fn = fn
    ctx.device = args[0].device if len(args) else None
    ctx.save_for_backward(*args)


def _backward(ctx, grads):
    bwd = _BACKWARD.get(ctx.fn)
    if bwd is None:
        raise RuntimeError(
            "stablehlo_op: this function has no backward (pass backward= to torchtpu.stablehlo_op, or use jax_op)"
        )
    _, results = _signature(ctx.fn)
    cts = [
        g if g is not None else torch.zeros(shape, dtype=dt, device=ctx.device)
        for g, (shape, dt) in zip(grads, results)
    ]
    return list(bwd(list(ctx.saved_tensors), cts)), None


def _call(fn, tensors):
    return _setup()(list(tensors), fn)


# ---- stablehlo_op ---------------------------------------------------------------------


class StableHLOOp:
    """A function given as StableHLO text, called on tpu tensors (see stablehlo_op)."""

    def __init__(self, text, *, tpu_text=None, backward=None, name="stablehlo_op"):
        if not isinstance(text, str):
            raise TypeError(f"stablehlo_op: expected the text of a StableHLO module, got {type(text).__name__}")
        if tpu_text is not None and not isinstance(tpu_text, str):
            raise TypeError(f"stablehlo_op: tpu_text must be a str, got {type(tpu_text).__name__}")
        if backward is not None and not callable(backward):
            raise TypeError("stablehlo_op: backward must be callable(*primals, *grads) -> grads of the primals")
        _setup()
        self.fn = _handle(text, tpu_text)
        self.name = name
        self.params, self.results = _signature(self.fn)
        if backward is not None:
            n = len(self.params)

            def bwd(primals, cts, backward=backward):
                g = backward(*primals, *cts)
                g = list(g) if isinstance(g, (list, tuple)) else [g]
                if len(g) != n:
                    raise RuntimeError(f"{name}: backward returned {len(g)} gradients for {n} arguments")
                return g

            _BACKWARD[self.fn] = bwd

    def __call__(self, *args):
        _check(self.name, args, self.fn)
        out = _call(self.fn, args)
        return out[0] if len(out) == 1 else tuple(out)

    def lower_text(self, target=None):
        """The text of a program of one call of this function, for target
        (None: as compiled here; "tpu": with its TPU form, if it has one)."""
        return _C.stablehlo_program(_IDS[self.fn], target)


def stablehlo_op(text, *, tpu_text=None, backward=None):
    """A torch op on tpu tensors from a StableHLO module's text: its @main's
    arguments (tensors of static shapes) are the op's tensor arguments, its
    results the op's results (one tensor, or a tuple). Works in every eager
    mode, in torch.tpu.graph and under torch.compile(backend="tpu").
    tpu_text: the same function for the TPU compiler (a Mosaic custom call).
    backward(*primals, *grads) -> the grads of the primals (tensors or None):
    without it the op is not differentiable."""
    op = StableHLOOp(text, tpu_text=tpu_text, backward=backward)

    def call(*args):
        return op(*args)

    call.lower_text = op.lower_text
    call.fn = op.fn
    return _opaque(call)


def _opaque(call):
    """call as one node of torch.compile's graphs (Dynamo does not trace
    into it; AOTAutograd traces it with fake tensors, which reach the fake
    kernel of torchtpu::stablehlo_call)."""
    try:
        import torch.compiler

        return torch.compiler.allow_in_graph(call)
    except (ImportError, AttributeError, RuntimeError):
        return call


# ---- jax_op ------------------------------------------------------------------------------------

_JAX = None


def _jax():
    """jax and jax.export, imported on first use, jax kept to its CPU backend
    for its own use unless its platforms were chosen already."""
    global _JAX
    if _JAX is None:
        try:
            import jax
            from jax import export
        except ImportError as e:
            raise ImportError("torchtpu.jax_op needs jax: pip install 'torchtpu[jax]'") from e
        from jax._src import xla_bridge

        if not xla_bridge.backends_are_initialized() and not jax.config.jax_platforms:
            jax.config.update("jax_platforms", "cpu")
        _JAX = (jax, export)
    return _JAX


def _interpreted(thunk):
    """thunk() with Pallas kernels run in interpret mode (lowered to plain
    StableHLO loops): what pltpu.force_tpu_interpret_mode does, with
    Pallas's own HLO interpreter, which jax.export can lower (the TPU
    interpreter calls back into Python)."""
    from jax._src import config as jax_config

    flag = jax_config.pallas_tpu_interpret_mode_context_manager
    prev = flag.swap_local(True)
    try:
        return thunk()
    finally:
        flag.set_local(prev)


_64BIT = (torch.float64, torch.int64, torch.uint64, torch.complex128)


def _platform():
    from . import device_module

    p = getattr(device_module, "_platform_setting", None) or "cpu"
    return {"gpu": "cuda"}.get(p, p)


def _is_float(dt):
    return dt.is_floating_point or dt.is_complex


class _Entry:
    """One signature's registered function: its id, the output tree, and (lazily) its backward."""

    __slots__ = ("fn", "treedef", "outs", "bwd")


class JaxOp:
    """A JAX function called on tpu tensors (see jax_op)."""

    def __init__(self, fn, *, name=None):
        self.jax_fn = fn
        self.name = name or getattr(fn, "__name__", "jax_op")
        self.cache = {}
        functools.update_wrapper(self, fn)

    # the function over the flat tensors
    def _flat(self, where, template, kwargs, box):
        jax, _ = _jax()

        def flat(*arrays):
            args = list(template)
            for i, a in zip(where, arrays):
                args[i] = a
            out = self.jax_fn(*args, **kwargs)
            leaves, box[0] = jax.tree_util.tree_flatten(out)
            return tuple(leaves)

        return flat

    def _export(self, flat, specs, name):
        """Registers flat, exported for specs [(shape, torch dtype)]: its id."""
        jax, export = _jax()
        import jax.numpy as jnp

        avals = [jax.ShapeDtypeStruct(tuple(s), jnp.dtype(str(d).split(".")[-1])) for s, d in specs]
        x64 = any(d in _64BIT for _, d in specs)
        plat = _platform()

        def lower(platform):
            # keep_unused: @main takes every tensor, used or not (a backward's primals)
            return export.export(jax.jit(flat, keep_unused=True), platforms=[platform])(*avals).mlir_module()

        with jax.enable_x64(x64):
            try:
                text, tpu_text = lower(plat), None
            except ValueError as e:
                if "interpret mode" not in str(e) or plat != "cpu":
                    raise
                # a Pallas TPU kernel: interpret mode here, its Mosaic form for the TPU
                text = _interpreted(lambda: lower("cpu"))
                tpu_text = lower("tpu")
        return _handle(text, tpu_text)

    def _entry(self, args, kwargs, key):
        with _LOCK:
            e = self.cache.get(key)
            if e is not None:
                return e
            where = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
            template = [None if isinstance(a, torch.Tensor) else a for a in args]
            specs = [(tuple(args[i].shape), args[i].dtype) for i in where]
            box = [None]
            flat = self._flat(where, template, kwargs, box)
            e = _Entry()
            e.fn = self._export(flat, specs, self.name)
            e.treedef = box[0]
            e.outs = _signature(e.fn)[1]
            e.bwd = None
            self._backward_for(e, flat, specs)
            self.cache[key] = e
            return e

    def _backward_for(self, e, flat, specs):
        """The backward of e: jax.vjp of flat over its float inputs, a jax_op
        of (*primals, *cotangents of the float results)."""
        n = len(specs)
        diff = [i for i, (_, d) in enumerate(specs) if _is_float(d)]
        fouts = [k for k, (_, d) in enumerate(e.outs) if _is_float(d)]
        name = self.name

        def vjp_flat(*xs):
            jax, _ = _jax()
            import numpy as np

            primals, cts = xs[:n], xs[n:]

            def f_diff(*dp):
                full = list(primals)
                for i, v in zip(diff, dp):
                    full[i] = v
                return flat(*full)

            outs, pullback = jax.vjp(f_diff, *[primals[i] for i in diff])
            full_cts, k = [], 0
            for j, o in enumerate(outs):
                if j in fouts:
                    full_cts.append(cts[k])
                    k += 1
                else:
                    full_cts.append(np.zeros(o.shape, dtype=jax.dtypes.float0))
            return tuple(pullback(tuple(full_cts)))

        bwd_op = JaxOp(vjp_flat, name=f"{name}_backward")

        def bwd(primals, cts):
            if not diff:
                return [None] * n
            try:
                grads = bwd_op(*primals, *[cts[k] for k in fouts])
            except (ValueError, TypeError, NotImplementedError) as err:
                if type(err).__module__.startswith("torch"):
                    raise
                raise RuntimeError(
                    f"{name}: jax could not differentiate the function ({type(err).__name__}: {err}); "
                    "a Pallas kernel needs a jax.custom_vjp"
                ) from err
            grads = grads if isinstance(grads, tuple) else (grads,)
            out = [None] * n
            for i, g in zip(diff, grads):
                out[i] = g
            return out

        _BACKWARD[e.fn] = bwd

    def _key(self, args, kwargs):
        key = (
            tuple((tuple(a.shape), a.dtype) if isinstance(a, torch.Tensor) else ("static", type(a), a) for a in args),
            tuple(sorted(kwargs.items())),
        )
        try:
            hash(key)
        except TypeError:
            raise TypeError(
                f"{self.name}: arguments other than tensors are static (part of the cache key) and must be hashable"
            ) from None
        return key

    def __call__(self, *args, **kwargs):
        key = self._key(args, kwargs)
        e = self._entry(args, kwargs, key)
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        _check(self.name, tensors, e.fn)
        outs = _call(e.fn, tensors)
        if e.treedef is None:
            return outs[0] if len(outs) == 1 else tuple(outs)
        jax, _ = _jax()
        return jax.tree_util.tree_unflatten(e.treedef, list(outs))

    def lower_text(self, *args, target=None, **kwargs):
        """The text of a program of one call of this function for these
        arguments (tensors or anything with .shape and .dtype: torch dtypes),
        for target (None: as compiled here; "tpu": the TPU form of its Pallas
        kernels)."""
        key = self._key(args, kwargs)
        return _C.stablehlo_program(_IDS[self._entry(args, kwargs, key).fn], target)


def jax_op(fn=None, *, name=None):
    """Decorator: a JAX function (jax.numpy, lax, Pallas kernels) as a torch
    op on tpu tensors. Its tensor arguments become JAX arrays of the same
    shapes and dtypes (other arguments are static: part of the cache key);
    it returns an array or a tree of arrays, given back as tpu tensors in the
    same tree. Traced and lowered once per signature; works in every eager
    mode, in torch.tpu.graph and under torch.compile(backend="tpu");
    gradients through jax.vjp."""
    if fn is None:
        return functools.partial(jax_op, name=name)
    op = JaxOp(fn, name=name)

    @functools.wraps(fn)
    def call(*args, **kwargs):
        return op(*args, **kwargs)

    call.lower_text = op.lower_text
    call._torchtpu_jax_op = op
    return _opaque(call)
