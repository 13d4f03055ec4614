"""The native setup: what setup() wires into torch's C++ through
torchtpu._device_guard (csrc/guard/, built for the running torch): the
device guard, the PrivateUse1 hooks and tpu generators, the profiler, the
tensor API and the boxed C++ kernels; why the device cannot be used (found
before the plugin is loaded); the disk tier of the compilation cache; and
the marking of the Python kernels' frames for Dynamo to skip. Each part
falls back to torch's own when the extension is not there."""

import sys
import types
import warnings

import torch
import torch.utils.backend_registration as _br

from . import _C, _plugin, _settings

# The rows torch's dispatcher calls with no Python in between (boxed.cpp).
CPP_KERNELS = set()


def _guard_module():
    """torchtpu._device_guard, when it was built for the running torch: its
    C++ uses torch's C++ ABI, which changes between releases (a wheel built
    for torch 2.13 under torch 2.12 may load and then misread torch's
    structs). None, with a warning, for another torch; None when not built."""
    try:
        from . import _device_guard
    except ImportError as e:
        import importlib.util

        if importlib.util.find_spec(f"{__package__}._device_guard") is None:
            return None  # not built
        # built, but not loadable by this torch (a symbol the torch it was built for has)
        warnings.warn(
            f"torchtpu: its C++ extension does not load with torch {torch.__version__} ({e}); it was built "
            "for another torch: it is not used (one local device for backward, no tpu generators, kernels "
            "called through Python); reinstall torchtpu against this torch",
            stacklevel=4,
        )
        return None
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


def _device_error():
    """Why the device cannot be used, found without loading the plugin (raised
    at its first use), or None."""
    try:
        path, platform = _plugin.find()
        ndev, fraction = _settings.runtime()
    except RuntimeError as e:
        return ("", "", 1, 0.0), str(e)
    why = _plugin.check(path)
    if why is None and _settings.xla_flags().strip():
        why = _plugin.check_xla_flags(path, _settings.xla_flags())
    if why is not None and _settings.pjrt_plugin():
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


def setup_disk_cache(directory=None, max_mb=None):
    """Turns on the disk tier of the compilation cache in directory (default:
    _settings.default_cache_dir()); an unusable folder (one that cannot be
    made, or is not the user's own and private to writes) warns once and
    leaves programs cached in memory only."""
    directory = _settings.default_cache_dir() if directory is None else directory
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

    from . import _attention, _autocast, _kernels, _patches

    for mod in (_kernels, _attention, _autocast, _patches):
        for v in list(vars(mod).values()):
            if isinstance(v, types.FunctionType) and v.__module__ == mod.__name__:
                walk(v.__code__)
