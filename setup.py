"""Builds torchtpu._C: pure C11, warnings are errors; and, where torch is
importable at build time (pip's --no-build-isolation, as `make build` runs
it), torchtpu._device_guard: the C++ that registers the tpu's device guard
with PyTorch (csrc/guard/device_guard.cpp), reads tensors' metadata
(tensor_meta.cpp), lets torch's dispatcher call the kernels with no Python
in between (boxed.cpp) and gives torch's profiler the tpu's activities
(profiler.cpp, where torch ships Kineto's headers). It is optional: a build without it leaves torch's
guard for Python backends (one device) and the kernels' Python calls."""

import glob
import os

from setuptools import Extension, setup

sources = sorted(
    glob.glob("csrc/*.c")
    + glob.glob("csrc/runtime/*.c")
    + glob.glob("csrc/hlo/*.c")
    + glob.glob("csrc/cache/*.c")
    + glob.glob("csrc/lower/*.c")
    + glob.glob("csrc/engine/*.c")
    + glob.glob("csrc/python/*.c")
)


def device_guard():
    """torchtpu._device_guard, built against the installed torch's headers and
    libc10 with torch's C++ ABI; [] when torch is not importable here."""
    # not torchtpu itself (torch's device autoload would import the installed
    # one, whose _C this build is about to replace)
    os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    try:
        import torch
        from torch.utils import cpp_extension
    except Exception:  # not installed, or a torch that cannot start
        return []
    abi = int(bool(torch._C._GLIBCXX_USE_CXX11_ABI))
    # Kineto's headers, where this torch ships them (its profiler session for
    # the tpu, csrc/guard/profiler.cpp, is built only then)
    kineto = [d for d in (os.path.join(p, "kineto") for p in cpp_extension.include_paths()) if os.path.isdir(d)]
    return [
        Extension(
            "torchtpu._device_guard",
            sources=[
                "csrc/guard/device_guard.cpp",
                "csrc/guard/tensor_meta.cpp",
                "csrc/guard/boxed.cpp",
                "csrc/guard/layout.cpp",
                "csrc/guard/generator.cpp",
                "csrc/guard/hooks.cpp",
                "csrc/guard/profiler.cpp",
            ],
            depends=[
                "csrc/python/guard_api.h",
                "csrc/python/tensor_api.h",
                "csrc/python/fast_api.h",
                "csrc/python/generator_api.h",
                "csrc/python/prof_api.h",
                "csrc/engine/prof.h",
                "csrc/guard/meta.hpp",
                "csrc/guard/generator.hpp",
            ],
            # the torch it is built for: torchtpu uses it with that torch only
            define_macros=[("TPU_TORCH_VERSION", f'"{torch.__version__}"')],
            library_dirs=cpp_extension.library_paths(),
            libraries=["c10", "torch", "torch_cpu", "torch_python"],
            language="c++",
            # torch's headers as system headers: their warnings are not ours
            extra_compile_args=[f"-isystem{d}" for d in cpp_extension.include_paths() + kineto]
            + (["-DUSE_KINETO"] if kineto else [])
            + [
                "-std=c++20",
                "-Wall",
                "-Wextra",
                "-O2",
                "-fvisibility=hidden",
                f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
            ],
            optional=True,  # a failed build warns; torchtpu then uses torch's guard
        )
    ]


setup(
    ext_modules=[
        Extension(
            "torchtpu._C",
            sources=sources,
            # headers and op tables: a change to any of them rebuilds the module
            depends=sorted(glob.glob("csrc/**/*.h", recursive=True) + glob.glob("csrc/**/*.def", recursive=True)),
            include_dirs=["csrc"],
            extra_compile_args=[
                "-std=c11",
                "-Wall",
                "-Wextra",
                "-Werror",
                "-Wmissing-prototypes",
                "-O2",
                "-fvisibility=hidden",
            ],
            libraries=["dl", "pthread", "m"],
        )
    ]
    + device_guard(),
)
