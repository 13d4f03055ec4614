"""The TORCHTPU_* environment variables. torchtpu is imported by every
`import torch` (the autoload), so a bad value must not raise there: it warns,
naming the variable and the value, and the default is used. The settings of
the device's start (plugin, platform, number of devices, GPU memory) are
checked by runtime() and _plugin.find() and raised at the device's first use.

Every variable is read here (_plugin.py, which the Makefile imports without
torchtpu, imports this module as a top-level one); engine() gives the C core's
engine its settings (the eager mode, fused-mode and program-cache sizes,
donation, value checks, explained recompiles, the CPU plugin's optimization
level, and TORCHTPU_DEBUG and
TORCHTPU_DUMP_HLO, which any value turns on)."""

import math
import os
import warnings

_ON = ("1", "true", "yes", "on")
_OFF = ("0", "false", "no", "off")
_WARNED = set()

# name: (default, lowest, highest) of the whole-number settings
INTEGERS = {
    "TORCHTPU_FUSED_MAX_OPS": (4096, 1, 1 << 20),
    "TORCHTPU_PROGRAM_CACHE_SIZE": (4096, 1, 1 << 20),
    "TORCHTPU_BUCKET_MIN": (1, 1, 1 << 16),
    "TORCHTPU_CPU_OPT_LEVEL": (1, 1, 3),
}
# name: default of the on/off settings
FLAGS = {
    "TORCHTPU_DONATE": True,
    "TORCHTPU_CPU_FALLBACK": False,
    "TORCHTPU_METRICS": False,
    "TORCHTPU_EXPLAIN_RECOMPILES": False,
    "TORCHTPU_BUCKETS": True,
    "TORCHTPU_VALUE_CHECKS": True,
    "TORCHTPU_COLLECTIVE_CHECKS": True,
    "TORCHTPU_COLLECTIVE_IN_PLACE": True,
    "TORCHTPU_TENSOR_API": True,
    "TORCHTPU_AOT_STRICT": True,
    "TORCHTPU_SPMD_COMPILE_ONLY": False,
}
# read by the engine as "set: on" (any value, empty included)
SET_IS_ON = ("TORCHTPU_DEBUG", "TORCHTPU_DUMP_HLO")
CACHE_SIZE_MB = (4096.0, 0.0, float(1 << 24))  # 0: no limit; at most 16 TiB

# The CPU plugin makes every device up front (1024: about 2 s and 60 MB more
# than 1); torchtpu uses one device per process, so more is only for tests.
MAX_DEVICES = 1024
# The device's start: name: (default, lowest, highest); a bad value is raised
# at the device's first use (runtime()).
AT_START = {"TORCHTPU_NUM_DEVICES": (1, 1, MAX_DEVICES), "TORCHTPU_GPU_MEMORY_FRACTION": (0.0, 0.0, 1.0)}
# The plugin: a path and a platform (cpu, tpu, cuda); unset: found
# (_plugin.find(), which raises a bad value at the device's first use).
PLUGIN = ("TORCHTPU_PJRT_PLUGIN", "TORCHTPU_PLATFORM")
# name: default of the other settings (None: unset, see their readers)
OTHERS = {
    "TORCHTPU_EAGER": "fused",  # debug, strict or fused (engine())
    "TORCHTPU_STEP_BOUNDARY": "auto",  # auto, backward or optimizer (engine())
    "TORCHTPU_CACHE_DIR": None,  # default_cache_dir(); empty: no disk tier
    "TORCHTPU_AOT_TOPOLOGY": None,  # aot_topology()
    "TORCHTPU_CACHE_SIZE_MB": CACHE_SIZE_MB[0],  # cache_size_mb()
}
# Every variable torchtpu reads (README's table lists each).
ALL = (*INTEGERS, *FLAGS, *SET_IS_ON, *AT_START, *PLUGIN, *OTHERS)


def _warn(name, raw, expected, used):
    if (name, raw) in _WARNED:
        return
    _WARNED.add((name, raw))
    warnings.warn(f"torchtpu: {name}={raw!r} is not {expected}; using {used}", stacklevel=3)


def flag(name, default=None):
    """An on/off setting: 1/true/yes/on or 0/false/no/off (any case); unset
    or empty: the default."""
    if default is None:
        default = FLAGS[name]
    raw = os.environ.get(name, "")
    v = raw.strip().lower()
    if not v:
        return default
    if v in _ON:
        return True
    if v in _OFF:
        return False
    _warn(name, raw, "1 or 0", "on" if default else "off")
    return default


def _bounded(name, parse, default, lo, hi, expected, shown):
    """A number parsed from the variable, from lo to hi; else (garbage, NaN,
    out of range) one warning and the default."""
    raw = os.environ.get(name, "")
    if not raw.strip():
        return default
    try:
        v = parse(raw.strip())
    except ValueError:
        v = math.nan
    if not lo <= v <= hi:  # also false for nan
        _warn(name, raw, expected, shown)
        return default
    return v


def integer(name):
    default, lo, hi = INTEGERS[name]
    return _bounded(name, lambda r: int(r, 10), default, lo, hi, f"a whole number from {lo} to {hi}", default)


def cache_size_mb():
    default, lo, hi = CACHE_SIZE_MB
    return _bounded(
        "TORCHTPU_CACHE_SIZE_MB",
        float,
        default,
        lo,
        hi,
        f"a number of megabytes from {lo:.0f} to {hi:.0f}",
        f"{default:g}",
    )


def choice(name, choices, default):
    raw = os.environ.get(name, "")
    v = raw.strip().lower()
    if not v:
        return default
    if v in choices:
        return v
    _warn(name, raw, "one of " + ", ".join(choices), default)
    return default


def cpu_opt_level():
    """The CPU plugin's code-generation (LLVM) optimization level for every
    program, 1 to 3 (XLA's default is 3): TORCHTPU_CPU_OPT_LEVEL, default 1,
    which compiles about twice as fast. 0 when XLA_FLAGS names
    --xla_backend_optimization_level: the user's flag is left to decide."""
    if "xla_backend_optimization_level" in os.environ.get("XLA_FLAGS", ""):
        return 0
    return integer("TORCHTPU_CPU_OPT_LEVEL")


def aot_topology():
    """TORCHTPU_AOT_TOPOLOGY: the TPU topology every program is also compiled
    for (libtpu's names: v5e:2x2, v6e:2x2, v5p:2x2x1 ...); None when unset.
    A name libtpu does not know is raised at the device's first use."""
    return os.environ.get("TORCHTPU_AOT_TOPOLOGY", "").strip() or None


STEP_BOUNDARIES = ("auto", "backward", "optimizer")


def step_boundary():
    """TORCHTPU_STEP_BOUNDARY: where a fused-mode training step's program ends
    (docs/modes.md): auto (the default), backward or optimizer."""
    return choice("TORCHTPU_STEP_BOUNDARY", STEP_BOUNDARIES, OTHERS["TORCHTPU_STEP_BOUNDARY"])


def engine(modes):
    """The engine's settings for _C.init (modes: the eager modes' names)."""
    return {
        "mode": choice("TORCHTPU_EAGER", modes, OTHERS["TORCHTPU_EAGER"]),
        "fused_max_ops": integer("TORCHTPU_FUSED_MAX_OPS"),
        "program_cache_size": integer("TORCHTPU_PROGRAM_CACHE_SIZE"),
        "donate": flag("TORCHTPU_DONATE"),
        "value_checks": flag("TORCHTPU_VALUE_CHECKS"),
        "explain": flag("TORCHTPU_EXPLAIN_RECOMPILES"),
        "debug": os.environ.get("TORCHTPU_DEBUG") is not None,
        "dump_hlo": os.environ.get("TORCHTPU_DUMP_HLO") is not None,
        "cpu_opt_level": cpu_opt_level(),
        "step_boundary": step_boundary(),
    }


def check():
    """Warns once about each bad setting (those read by the C core included)."""
    for name in INTEGERS:
        integer(name)
    for name in FLAGS:
        flag(name)
    for name in SET_IS_ON:
        raw = os.environ.get(name)
        if raw is not None and raw.strip().lower() not in _ON and (name, raw) not in _WARNED:
            _WARNED.add((name, raw))
            warnings.warn(f"torchtpu: {name}={raw!r}: any value turns it on; unset it to turn it off", stacklevel=2)
    cache_size_mb()
    step_boundary()


def runtime():
    """(TORCHTPU_NUM_DEVICES, TORCHTPU_GPU_MEMORY_FRACTION), checked; a bad
    value is raised at the device's first use (RuntimeError naming it)."""
    default, lo, hi = AT_START["TORCHTPU_NUM_DEVICES"]
    raw = os.environ.get("TORCHTPU_NUM_DEVICES", "")
    try:
        ndev = int(raw.strip(), 10) if raw.strip() else default
        if not lo <= ndev <= hi:
            raise ValueError
    except ValueError:
        raise RuntimeError(f"TORCHTPU_NUM_DEVICES={raw!r}: expected a whole number from {lo} to {hi}") from None
    default, lo, hi = AT_START["TORCHTPU_GPU_MEMORY_FRACTION"]
    raw = os.environ.get("TORCHTPU_GPU_MEMORY_FRACTION", "")
    try:
        fraction = float(raw) if raw.strip() else default
        if not lo <= fraction <= hi:  # also false for nan
            raise ValueError
    except ValueError:
        raise RuntimeError(f"TORCHTPU_GPU_MEMORY_FRACTION={raw!r}: expected a number between 0 and 1") from None
    return ndev, fraction


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


def pjrt_plugin():
    """TORCHTPU_PJRT_PLUGIN: the path of the PJRT plugin to load; None when
    unset or empty (_plugin.find() looks for one)."""
    return os.environ.get("TORCHTPU_PJRT_PLUGIN") or None


def platform():
    """TORCHTPU_PLATFORM, lower-cased: cpu, tpu or cuda ("" when unset;
    _plugin.find() checks it)."""
    return os.environ.get("TORCHTPU_PLATFORM", "").strip().lower()


def xla_flags():
    """XLA_FLAGS (XLA's own variable, read by the plugin too): checked
    against the plugin before it is loaded."""
    return os.environ.get("XLA_FLAGS", "")
