"""Every change torchtpu makes to torch's own Python objects, in one place.

A device registered from Python (PrivateUse1 renamed "tpu") gets most of what
a built-in device gets through torch's public hooks: dispatcher kernels, the
device module, autocast keys, optimizer step hooks. What those hooks cannot
reach is patched here, one function per patch, each saying what it works
around and which torch versions need it (the supported range is torch 2.11 to
2.15, pyproject.toml; the reasons were checked against torch 2.13's source,
and 2.14 and 2.15 pass `make test-torch` with every patch applied).

apply() runs PATCHES, once, from torchtpu._registry.setup(), after the
kernels are registered and before autocast; apply_distributed() runs
DISTRIBUTED_PATCHES (FSDP2's) when the first tpu process group is made. A
patch whose target this torch lacks is skipped with one warning; the others
still apply.
"""

import warnings

import torch


def _patch_printing(device_module):
    """Tensor printing formats on the CPU (as torch does for XLA tensors):
    the formatter's statistics would otherwise be dozens of device ops.

    torch._tensor_str._str_intern copies only "xla", "lazy", "ipu" and "mtia"
    tensors to the CPU before formatting (a fixed list, no hook for another
    device); a tpu tensor would be sliced, reduced and compared on the device,
    each a small program. Needed by torch 2.11 to 2.13 (2.13 keeps the list;
    checked on 2.13: printing a 2x3 tensor without the patch dispatches 27 ops
    and compiles 18 programs)."""
    import torch._tensor_str as ts

    inner = ts._tensor_str

    def tensor_str(self, indent):
        if self.device.type == "tpu":
            self = self.cpu()
        return inner(self, indent)

    ts._tensor_str = tensor_str


def _patch_storage_constructor(device_module):
    """torch.UntypedStorage(n, device="tpu") would ask PyTorch's allocator
    registry, which a Python-registered device leaves empty (a crash in
    C++): such storages are made from tpu tensors instead. torch.load's
    restore path builds storages this way.

    UntypedStorage's constructor is C++ (StorageBase) and takes its allocator
    from c10's per-device table, which only a C++ extension can fill; torch's
    own storage.to(device) (torch/_utils.py _to, used by storage.tpu() and so
    by torch.load's map_location) calls it for any device but the CPU. Needed
    by torch 2.11 to 2.13 (checked on 2.13: a segmentation fault without the
    patch)."""
    cls = torch.UntypedStorage
    orig = cls.__new__

    def new(klass, *args, device=None, **kwargs):
        if device is not None and torch.device(device).type == "tpu":
            if kwargs or len(args) > 1:
                raise TypeError("torch.UntypedStorage(..., device='tpu') takes a size or a sequence of bytes")
            if not args or isinstance(args[0], int):
                n = int(args[0]) if args else 0
                return torch.empty(n, dtype=torch.uint8, device="tpu").untyped_storage()
            return torch.tensor(list(args[0]), dtype=torch.uint8).to("tpu").untyped_storage()
        if device is not None:
            kwargs["device"] = device
        return orig(klass, *args, **kwargs)

    cls.__new__ = new


def _crosses_tpu(module, device):
    """Whether moving module to device takes a tensor onto or off the tpu."""
    if device is None:
        return False
    if torch.device(device).type == "tpu":
        return True
    return any(t.device.type == "tpu" for t in module.parameters())


def _patch_module_moves(device_module):
    """module.to("tpu"), .tpu() and .cpu() keep each Parameter object, as
    they do for CUDA. PyTorch keeps them by assigning `param.data`, which it
    allows only between its built-in dense backends; for any other device it
    makes new Parameters, which unties tied weights (an embedding shared with
    the output layer) and leaves an optimizer made before the move holding
    the old ones. Across the tpu boundary the move swaps the tensors instead
    (torch.utils.swap_tensors, PyTorch's own mechanism for this), so identity,
    and with it every tie, is kept. A parameter that cannot be swapped (one
    with a weak reference) falls back to PyTorch's default behaviour.

    The rule is Module._apply's compute_should_use_set_data:
    torch._has_compatible_shallow_copy_type is false between a CPU tensor and
    a PrivateUse1 one, so without the swap future flag _apply makes new
    Parameters. Needed by torch 2.11 to 2.13 (the flag stays off by default;
    checked on 2.13: without the patch an embedding tied to its output layer
    comes back untied from .to("tpu"))."""
    Module = torch.nn.Module
    fut = torch.__future__

    def moving(orig, device_of):
        def move(self, *args, **kwargs):
            if fut.get_swap_module_params_on_conversion() or not _crosses_tpu(self, device_of(*args, **kwargs)):
                return orig(self, *args, **kwargs)
            fut.set_swap_module_params_on_conversion(True)
            try:
                return orig(self, *args, **kwargs)
            except RuntimeError as e:
                if "Couldn't swap" not in str(e):
                    raise
            finally:
                fut.set_swap_module_params_on_conversion(False)
            return orig(self, *args, **kwargs)

        move.__name__, move.__doc__ = orig.__name__, orig.__doc__
        return move

    Module.to = moving(Module.to, lambda *a, **k: torch._C._nn._parse_to(*a, **k)[0])
    Module.tpu = moving(Module.tpu, lambda device=None: torch.device("tpu"))
    Module.cpu = moving(Module.cpu, lambda: torch.device("cpu"))


def _patch_matmul_precision(device_module):
    """torch.set_float32_matmul_precision also sets the tpu's precision.

    Not a workaround but a reach: torch's knob sets only its own global (read
    by its CPU, CUDA and MKLDNN kernels) and tells no device module, so the
    tpu's precision (torch.tpu.set_matmul_precision, an XLA operand precision
    in the core) would not follow it. Needed by torch 2.11 to 2.13 (checked on
    2.13: the unpatched knob leaves torch.tpu.get_matmul_precision() as it
    was)."""
    orig = torch.set_float32_matmul_precision

    def set_float32_matmul_precision(precision):
        orig(precision)
        device_module.set_matmul_precision(precision)

    set_float32_matmul_precision.__doc__ = orig.__doc__
    torch.set_float32_matmul_precision = set_float32_matmul_precision
    device_module.set_matmul_precision(torch.get_float32_matmul_precision())


def _patch_accelerator(device_module):
    """torch.accelerator's memory and synchronize calls reach PyTorch's C++
    DeviceAllocator registry, which a Python-registered device cannot fill
    (an internal assert). In a torchtpu process the accelerator is the tpu,
    so they answer from torch.tpu. (accelerate's Trainer calls
    torch.accelerator.empty_cache() on every train().)

    torch.accelerator.memory's functions call torch._C._accelerator_* (the
    C++ DeviceAllocator of the current accelerator; even 2.13's
    _accelerator_isAllocatorInitialized guard asserts for a device without
    one) and synchronize calls torch._C._accelerator_synchronizeDevice,
    which the Python device guard refuses ("Backend doesn't support
    synchronizing all streams"); neither looks at the Python device module.
    Needed by torch 2.11 to 2.13 (checked on 2.13: every one of them raises
    without the patch)."""
    import torch.accelerator as acc
    import torch.accelerator.memory as accmem

    def stats(device_index=None, /):
        from collections import OrderedDict

        return OrderedDict(sorted(device_module.memory_stats().items()))

    table = {
        "empty_cache": lambda: device_module.empty_cache(),
        "memory_stats": stats,
        "memory_allocated": lambda device_index=None, /: device_module.memory_allocated(),
        "max_memory_allocated": lambda device_index=None, /: device_module.max_memory_allocated(),
        "memory_reserved": lambda device_index=None, /: device_module.memory_reserved(),
        "max_memory_reserved": lambda device_index=None, /: device_module.max_memory_reserved(),
        "reset_accumulated_memory_stats": lambda device_index=None, /: None,
        "reset_peak_memory_stats": lambda device_index=None, /: device_module.reset_peak_memory_stats(),
        "get_memory_info": lambda device_index=None, /: device_module.mem_get_info(),
        "synchronize": lambda device=None, /: device_module.synchronize(),
    }
    for name, fn in table.items():
        for mod in (acc, accmem):
            orig = getattr(mod, name, None)
            if orig is not None:
                fn.__name__, fn.__doc__ = name, orig.__doc__
                setattr(mod, name, fn)


def _patch_ddp_used_map(device_module):
    """DistributedDataParallel(find_unused_parameters=True) and
    static_graph=True raise at construction, naming why, on a model with tpu
    parameters, instead of a hooks error at the first backward.

    Both make DDP's C++ reducer all-reduce its map of used parameters, and
    for a PrivateUse1 device it stages that map through pinned host memory,
    which needs PrivateUse1HooksInterface::getPinnedMemoryAllocator: a C++
    hook that torch's Python hooks object does not expose (torch 2.11 to
    2.13; checked on 2.13). torchtpu registers no C++."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    init = DDP.__init__

    def __init__(self, module, *args, **kwargs):
        wanted = [k for k in ("find_unused_parameters", "static_graph") if kwargs.get(k)]
        if wanted and any(p.device.type == "tpu" for p in module.parameters()):
            raise NotImplementedError(
                f"DistributedDataParallel({'=True, '.join(wanted)}=True) on tpu: torch "
                f"{torch.__version__}'s DDP reducer needs a C++ device hook (pinned host memory for "
                f"its map of used parameters) that a device registered from Python cannot provide; "
                f"leave it False (every parameter must then get a gradient in each step)"
            )
        init(self, module, *args, **kwargs)

    __init__.__doc__ = init.__doc__
    DDP.__init__ = __init__


def _patch_fsdp_storage(device_module):
    """FSDP2 frees the memory of a module's unsharded parameters between
    uses and gets it back before the next all-gather; on tpu both go through
    torchtpu's core, which drops the device buffer behind the storage and
    later gives the storage memory again.

    FSDP2 (torch.distributed.fsdp._fully_shard._fsdp_param: free_storage,
    alloc_storage; _fsdp_param_group imports alloc_storage by name) calls
    tensor.untyped_storage().resize_(0) and resize_(n). For PrivateUse1,
    torch's resize_ calls the C++ PrivateUse1HooksInterface's
    resizePrivateUse1Bytes, which the Python hooks object of 2.11 to 2.13
    (torch._C._acc.PrivateUse1Hooks) cannot provide: it raises
    NotImplementedError. torch's storage size cannot change from outside C++
    either, so the tpu versions keep it and move only the device memory
    (torchtpu._C.storage_free, storage_alloc): a tpu tensor of a freed storage
    is refused by every op until the storage is allocated again, so a use
    FSDP2 does not expect is an error, not stale or zero values. Needed by
    torch 2.11 to 2.13 (checked on 2.13: fully_shard's first forward raises
    at free_storage without the patch). Applied when the first tpu process
    group is made (importing FSDP2 at torchtpu's import would cost ~0.7 s)."""
    import torch.distributed.fsdp._fully_shard._fsdp_param as fsdp_param
    import torch.distributed.fsdp._fully_shard._fsdp_param_group as fsdp_param_group

    from . import _C

    orig_free, orig_alloc = fsdp_param.free_storage, fsdp_param.alloc_storage

    def free_storage(tensor):
        if tensor.device.type != "tpu":
            return orig_free(tensor)
        if tensor.untyped_storage().nbytes() != 0:
            _C.storage_free(tensor)

    def alloc_storage(tensor):
        if tensor.device.type != "tpu":
            return orig_alloc(tensor)
        size = tensor.numel() * tensor.itemsize
        have = tensor.untyped_storage().nbytes()
        if have != size:
            raise RuntimeError(
                f"FSDP alloc_storage: a tpu storage of {have} bytes cannot be resized to {size} bytes "
                "(torchtpu gives a freed storage back its memory at its own size only)"
            )
        if size:
            _C.storage_alloc(tensor)

    for f, orig in ((free_storage, orig_free), (alloc_storage, orig_alloc)):
        f.__name__, f.__doc__ = orig.__name__, orig.__doc__
    fsdp_param.free_storage = free_storage
    fsdp_param.alloc_storage = alloc_storage
    fsdp_param_group.alloc_storage = alloc_storage


def _patch_default_compile_backend(device_module):
    """torch.compile(model) with no backend= on tpu tensors compiles with
    torchtpu's "tpu" backend (Keras 3's jit_compile=True is this call).

    torch.compile's default backend is an _TorchCompileInductorWrapper
    instance made by torch.compile itself, not a name looked up in Dynamo's
    backend registry, so registering a backend cannot reach it; and Inductor
    in torch 2.13 takes "tpu" for Google's torch_tpu and lowers through
    Pallas, which needs jax ("No module named 'jax'"). A graph with a tpu
    tensor among its inputs (parameters are inputs too) goes to torchtpu's
    backend; every other graph still goes to Inductor. Needed by torch 2.11
    to 2.13 (checked on 2.13)."""
    wrapper = torch._TorchCompileInductorWrapper
    inner = wrapper.__call__

    def call(self, model_, inputs_, **kwargs):
        if any(isinstance(t, torch.Tensor) and t.device.type == "tpu" for t in inputs_):
            from . import _dynamo

            return _dynamo.backend(model_, inputs_)
        return inner(self, model_, inputs_, **kwargs)

    wrapper.__call__ = call


# In the order they are applied; each takes the device module (torch.tpu),
# which only some of them use.
PATCHES = (
    _patch_printing,
    _patch_storage_constructor,
    _patch_module_moves,
    _patch_matmul_precision,
    _patch_accelerator,
    _patch_ddp_used_map,
    _patch_default_compile_backend,
)


# Applied by apply_distributed(), when torch.distributed is first used on tpu
# (the first tpu process group).
DISTRIBUTED_PATCHES = (_patch_fsdp_storage,)
_distributed_applied = False


def apply(device_module, patches=PATCHES):
    """Applies every patch, in order; one whose target this torch lacks is
    skipped with a warning (naming it; the warning points at the caller of
    torchtpu._registry.setup, as it did when the patches lived there)."""
    for patch in patches:
        try:
            patch(device_module)
        except (AttributeError, ImportError, TypeError) as e:
            warnings.warn(
                f"torchtpu: {patch.__name__[1:]} skipped: torch {torch.__version__} lacks what it patches ({e})",
                stacklevel=3,
            )


def apply_distributed():
    """Applies DISTRIBUTED_PATCHES, once."""
    global _distributed_applied
    if not _distributed_applied:
        _distributed_applied = True
        apply(torch.tpu, DISTRIBUTED_PATCHES)
