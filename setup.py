"""Builds torchtpu._C: pure C11, warnings are errors."""

import glob

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
    ],
)
