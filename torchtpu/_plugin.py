"""Where the PJRT plugin is: TORCHTPU_PJRT_PLUGIN (a path), else
TORCHTPU_PLATFORM=cpu|tpu|cuda, else the TPU plugin when libtpu is installed and
a TPU is present, else XLA's CPU plugin. Finding installed packages is
Python's business; loading and checking the plugin is the C runtime's."""

import glob
import importlib.util
import os

_INSTALL = {
    "cpu": "pip install xla-cpu-pjrt` (or, for a newer XLA, `pip install --no-deps lammps-jax-pjrt-cpu",
    "tpu": "pip install libtpu",
    "cuda": "pip install jax-cuda13-pjrt",
}


def _package_dir(name):
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def _candidates(platform):
    if platform == "cpu":
        # The newer XLA first (faster programs); xla-cpu-pjrt (2025-11) after.
        d = _package_dir("lammps_jax_pjrt_cpu")
        if d:
            yield os.path.join(d, "pjrt_c_api_cpu_plugin.so")
        d = _package_dir("xla_plugins.xla_cpu_pjrt")
        if d:
            yield os.path.join(d, "xla_cpu_pjrt.so")
    elif platform == "tpu":
        d = _package_dir("libtpu")
        if d:
            yield os.path.join(d, "libtpu.so")
    elif platform == "cuda":
        for pkg in ("jax_plugins.xla_cuda13", "jax_plugins.xla_cuda12"):
            d = _package_dir(pkg)
            if d:
                yield from sorted(glob.glob(os.path.join(d, "xla_cuda_plugin*.so")))


def _tpu_present():
    return bool(glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"))


def find():
    """Returns (plugin path, platform name). Raises RuntimeError naming what
    to install when no plugin is found."""
    path = os.environ.get("TORCHTPU_PJRT_PLUGIN")
    platform = os.environ.get("TORCHTPU_PLATFORM", "").strip().lower()
    if path:
        if not os.path.exists(path):
            raise RuntimeError(f"TORCHTPU_PJRT_PLUGIN={path!r}: no such file")
        return path, platform or "cpu"
    if platform and platform not in _INSTALL:
        raise RuntimeError(f"TORCHTPU_PLATFORM={platform!r}: expected one of cpu, tpu, cuda")
    if not platform:
        tpu = next(_candidates("tpu"), None)
        platform = "tpu" if tpu and os.path.exists(tpu) and _tpu_present() else "cpu"
    for cand in _candidates(platform):
        if os.path.exists(cand):
            return cand, platform
    raise RuntimeError(
        f"torchtpu: no PJRT plugin for platform {platform!r} was found. "
        f"Install it with `{_INSTALL[platform]}`, or point TORCHTPU_PJRT_PLUGIN at a plugin library."
    )
