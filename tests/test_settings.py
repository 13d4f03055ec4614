"""`import torch` imports torchtpu (the autoload), so no setting and no torch
version may break it: bad values warn and fall back to the default, or are
raised at the device's first use; what a torch lacks is not registered."""

import glob
import os
import re
import subprocess
import sys
import textwrap
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Read at import; a bad value warns, naming it, and the default is used.
WARNED = [
    "TORCHTPU_EAGER",
    "TORCHTPU_FUSED_MAX_OPS",
    "TORCHTPU_DONATE",
    "TORCHTPU_CACHE_SIZE_MB",
    "TORCHTPU_METRICS",
    "TORCHTPU_EXPLAIN_RECOMPILES",
    "TORCHTPU_BUCKET_MIN",
    "TORCHTPU_BUCKETS",
    "TORCHTPU_PROGRAM_CACHE_SIZE",
    "TORCHTPU_CPU_FALLBACK",
    "TORCHTPU_VALUE_CHECKS",
    "TORCHTPU_COLLECTIVE_CHECKS",
    "TORCHTPU_COLLECTIVE_IN_PLACE",
    "TORCHTPU_TENSOR_API",
    "TORCHTPU_CPU_OPT_LEVEL",
    "TORCHTPU_AOT_STRICT",
    "TORCHTPU_SPMD_COMPILE_ONLY",
    "TORCHTPU_STEP_BOUNDARY",
]
# Read when the device starts; a bad value is raised at its first use.
AT_FIRST_USE = ["TORCHTPU_PJRT_PLUGIN", "TORCHTPU_PLATFORM", "TORCHTPU_NUM_DEVICES", "TORCHTPU_GPU_MEMORY_FRACTION"]
# Any value turns them on (the engine's reading); another value than 1 warns.
SET_IS_ON = ["TORCHTPU_DEBUG", "TORCHTPU_DUMP_HLO"]
# A path: any text names a folder.
PATHS = ["TORCHTPU_CACHE_DIR"]
# A TPU topology libtpu knows; another name is raised at the device's first use (tests/test_aot.py).
TOPOLOGY = ["TORCHTPU_AOT_TOPOLOGY"]
ALL = WARNED + AT_FIRST_USE + SET_IS_ON + PATHS + TOPOLOGY

GARBAGE = ["abc", "nan", "inf", "-inf", "1e30", "-7", "99999999999999999999999", "0x10", "2.5.1"]

CPU_AND_FIRST_USE = textwrap.dedent("""
    import torch
    print("cpu", (torch.ones(2) + 1).tolist(), "available", torch.tpu.is_available())
    try:
        print("tpu", (torch.ones(2, device="tpu") + 1).cpu().tolist())
    except RuntimeError as e:
        print("first use:", e)
""")


def run(code, env=None, unset=(), timeout=240, cwd=None):
    env = dict(os.environ, **(env or {}))
    for k in unset:
        env.pop(k, None)
    return subprocess.run(
        [sys.executable, "-W", "always", "-c", code], env=env, capture_output=True, text=True, timeout=timeout, cwd=cwd
    )


def test_every_variable_in_the_sources_is_known_and_documented():
    # a variable added to the code must be added here (so the garbage sweep covers it) and to the README
    found = set()
    files = glob.glob(os.path.join(ROOT, "torchtpu", "*.py")) + glob.glob(
        os.path.join(ROOT, "csrc", "**", "*.c"), recursive=True
    )
    for path in files:
        found |= set(re.findall(r'"(TORCHTPU_[A-Z_]+)"', open(path).read()))
    assert found == set(ALL), (sorted(found - set(ALL)), sorted(set(ALL) - found))
    from torchtpu import _settings  # its table of every variable, each read there

    assert sorted(_settings.ALL) == sorted(ALL)
    readers = [
        os.path.basename(path)
        for path in glob.glob(os.path.join(ROOT, "torchtpu", "*.py"))
        if re.search(r"(environ\.get|environ\[|getenv)\(?\s*\"TORCHTPU_", open(path).read())
    ]
    assert readers == ["_settings.py"], readers
    readme = open(os.path.join(ROOT, "README.md")).read()
    table = readme[readme.index("## Environment variables") :]
    assert [v for v in ALL if f"`{v}" not in table] == []


@pytest.mark.parametrize("value", GARBAGE)
def test_import_torch_survives_every_variable_set_to_garbage(value, tmp_path):
    env = {name: value for name in ALL}
    r = run(CPU_AND_FIRST_USE, env, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "cpu [2.0, 2.0] available False" in r.stdout, r.stdout + r.stderr[-3000:]
    # the first setting the device's start reads is the plugin's path
    assert f"first use: TORCHTPU_PJRT_PLUGIN={value!r}: no such file" in r.stdout, r.stdout
    for name in WARNED + SET_IS_ON:
        assert f"{name}={value!r}" in r.stderr, (name, r.stderr[-3000:])
    assert "Traceback" not in r.stderr and "Failed to load" not in r.stderr


def test_garbage_settings_fall_back_to_their_defaults_and_the_device_works(tmp_path):
    env = {name: "abc" for name in WARNED}
    code = CPU_AND_FIRST_USE + "import torchtpu; print('mode', torchtpu.get_eager_mode())\n"
    r = run(code, env, unset=AT_FIRST_USE + SET_IS_ON, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "tpu [2.0, 2.0]" in r.stdout and "mode fused" in r.stdout, r.stdout + r.stderr[-3000:]
    assert r.stderr.count("TORCHTPU_FUSED_MAX_OPS='abc'") == 1  # once, though read in Python and in C


@pytest.mark.parametrize(
    "name, value, says",
    [
        ("TORCHTPU_NUM_DEVICES", "100000", "TORCHTPU_NUM_DEVICES='100000': expected a whole number from 1 to 1024"),
        ("TORCHTPU_NUM_DEVICES", "0", "TORCHTPU_NUM_DEVICES='0'"),
        ("TORCHTPU_GPU_MEMORY_FRACTION", "nan", "TORCHTPU_GPU_MEMORY_FRACTION='nan'"),
        ("TORCHTPU_PLATFORM", "gpu", "TORCHTPU_PLATFORM='gpu': expected one of cpu, tpu, cuda"),
    ],
)
def test_a_bad_start_setting_is_raised_at_first_use_fast(name, value, says):
    start = time.monotonic()
    r = run(CPU_AND_FIRST_USE, {name: value}, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "available False" in r.stdout and f"first use: {says}" in r.stdout, r.stdout + r.stderr[-3000:]
    assert time.monotonic() - start < 60  # 100000 CPU devices took minutes and gigabytes


@pytest.mark.parametrize("kind", ["program", "text", "missing", "library"])
def test_a_file_that_is_not_a_plugin_is_not_available(kind, tmp_path):
    path = {
        "program": "/bin/ls",
        "text": str(tmp_path / "notes.txt"),
        "missing": str(tmp_path / "nothing.so"),
        "library": "/lib/x86_64-linux-gnu/libc.so.6",
    }[kind]
    if kind == "text":
        open(path, "w").write("not a plugin\n")
    if not os.path.exists(path) and kind != "missing":
        pytest.skip(f"{path} is not on this machine")
    code = CPU_AND_FIRST_USE + f'print("mapped", {path!r} in open("/proc/self/maps").read())\n'
    r = run(code, {"TORCHTPU_PJRT_PLUGIN": path})
    assert r.returncode == 0, r.stderr[-3000:]
    assert "available False" in r.stdout, r.stdout
    if kind != "library":  # libc is in every process
        assert "mapped False" in r.stdout, r.stdout  # found out without loading it
    why = {
        "program": "exports no GetPjrtApi",
        "text": "not an ELF file",
        "missing": "no such file",
        "library": "exports no GetPjrtApi",
    }[kind]
    assert "first use: TORCHTPU_PJRT_PLUGIN" in r.stdout and path in r.stdout and why in r.stdout, r.stdout


def test_plugin_check_reads_the_symbol_table():
    sys.path.insert(0, os.path.join(ROOT, "torchtpu"))
    try:
        import _plugin
    finally:
        sys.path.pop(0)
    assert _plugin.check(_plugin.find()[0]) is None
    assert "GetPjrtApi" in _plugin.check("/bin/ls")
    assert _plugin._xla_flag_names(' --a=1 --b="x y" -c --d=\'p q\' e --f') == ["a", "b", "c", "d"]


def test_an_unknown_xla_flag_is_an_error_not_the_end_of_the_process():
    code = CPU_AND_FIRST_USE + "print('still here')\n"
    r = run(code, {"XLA_FLAGS": "--xla_cpu_enable_fast_math=false --xla_no_such_flag"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert "first use: XLA_FLAGS names a flag" in r.stdout and "--xla_no_such_flag" in r.stdout, r.stdout
    assert "xla_cpu_enable_fast_math" not in r.stdout.split("first use:")[1] and "still here" in r.stdout
    r = run(code, {"XLA_FLAGS": "xla_dump_to=/nowhere"})  # XLA reads such a value as a file of flags
    assert "first use: XLA_FLAGS='xla_dump_to=/nowhere'" in r.stdout and "still here" in r.stdout, r.stdout
    r = run(code, {"XLA_FLAGS": "--xla_cpu_enable_fast_math=false"})
    assert "tpu [2.0, 2.0]" in r.stdout, r.stdout + r.stderr[-3000:]


LACKING = textwrap.dedent("""
    import os, warnings
    os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    import torch
    # a torch that lacks some of the overloads torchtpu lowers, and is newer than the tested range
    real = torch.ops.aten
    HIDDEN = {"cholesky", "_scaled_dot_product_fused_attention_overrideable", "_fused_adam_.tensor_lr",
              "_foreach_add_.List", "nonzero"}

    class Packet:
        def __init__(self, packet):
            self.packet = packet
        def overloads(self):
            return [o for o in self.packet.overloads() if f"{self.packet.__name__}.{o}" not in HIDDEN]
        def __getattr__(self, ov):
            if f"{self.packet.__name__}.{ov}" in HIDDEN:
                raise AttributeError(ov)
            return getattr(self.packet, ov)

    class Aten:
        def __getattr__(self, name):
            if name in HIDDEN:
                raise AttributeError(name)
            return Packet(getattr(real, name))

    torch.ops.aten = Aten()
    torch.__version__ = "2.99.0"
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        import torchtpu
    torch.ops.aten = real
    print("version warnings", sum("tested with torch 2.11 to 2.15, not 2.99.0" in str(x.message) for x in w))
    print("not registered", torchtpu.metrics()["ops_not_registered"])
    x = torch.tensor([[2.0, 0.0], [0.0, 3.0]])
    try:
        torch.cholesky(x.to("tpu"))
    except NotImplementedError as e:
        print("cholesky:", e)
    print("nonzero:", end=" ")
    try:
        torch.nonzero(x.to("tpu"))
    except NotImplementedError as e:
        print(e)
    print("add", (x.to("tpu") + 1).cpu().tolist())
    q = torch.rand(1, 2, 4, 8)
    out = torch.nn.functional.scaled_dot_product_attention(q.to("tpu"), q.to("tpu"), q.to("tpu"))
    print("sdpa", torch.allclose(out.cpu(), torch.nn.functional.scaled_dot_product_attention(q, q, q), atol=1e-5))
""")


def test_a_torch_lacking_overloads_imports_and_raises_not_implemented():
    r = run(LACKING, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout
    assert "version warnings 1" in out, out
    assert "not registered 6" in out, out  # the five hidden names: "nonzero" hides nonzero and nonzero.out
    assert "cholesky: torchtpu: aten::cholesky is not lowered" in out, out
    assert "nonzero: torchtpu: aten::nonzero is not lowered" in out, out
    assert "add [[3.0, 1.0], [1.0, 4.0]]" in out and "sdpa True" in out, out


def test_the_tested_torch_range_is_declared_and_held():
    toml = open(os.path.join(ROOT, "pyproject.toml")).read()
    assert '"torch>=2.11,<2.16"' in toml
    import torch

    import torchtpu

    lo, hi = torchtpu._registry.TESTED_TORCH
    assert (lo, hi) == ((2, 11), (2, 16))
    assert lo <= tuple(int(p) for p in torch.__version__.split(".")[:2]) < hi
    assert torchtpu.metrics()["ops_not_registered"] == 0


def test_plugin_info_logs_are_quiet_unless_asked_for(tmp_path):
    # absl's INFO lines (the device count, "logging before InitializeLog") are
    # not printed on every run; a user who sets TF_CPP_MIN_LOG_LEVEL gets them
    code = "import torch; print((torch.ones(2, device='tpu') + 1).cpu().tolist())"
    quiet = run(code, unset=("TF_CPP_MIN_LOG_LEVEL",), cwd=str(tmp_path))
    assert quiet.returncode == 0 and "[2.0, 2.0]" in quiet.stdout, quiet.stderr[-3000:]
    assert "cpu_device_count" not in quiet.stderr and "InitializeLog" not in quiet.stderr, quiet.stderr
    loud = run(code, {"TF_CPP_MIN_LOG_LEVEL": "0"}, cwd=str(tmp_path))
    assert loud.returncode == 0 and "cpu_device_count" in loud.stderr, loud.stderr[-3000:]


@pytest.mark.skipif(
    bool(glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*")), reason="this machine has TPU chips"
)
def test_the_tpu_platform_without_a_chip_says_so():
    """TORCHTPU_PLATFORM=tpu on a machine without a TPU: a RuntimeError at the first use that says no
    chip was found and what to do, quoting libtpu; the process goes on."""
    pytest.importorskip("libtpu")
    code = (
        "import torch, torchtpu\n"
        "try:\n    torch.ones(2, device='tpu')\nexcept RuntimeError as e:\n    print('ERR', e)\n"
    )
    r = run(code, env={"TORCHTPU_PLATFORM": "tpu"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert "ERR" in r.stdout and "no TPU chip was found on this machine" in r.stdout, r.stdout + r.stderr[-2000:]
    assert "TORCHTPU_AOT_TOPOLOGY" in r.stdout and "No jellyfish device found" in r.stdout


UNLOADABLE = textwrap.dedent("""
    import os, warnings
    os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    import importlib.machinery
    import torch
    # the C++ extension is there but does not load (built for another torch: a missing symbol)
    create = importlib.machinery.ExtensionFileLoader.create_module
    def refuse(self, spec):
        if spec.name == "torchtpu._device_guard":
            raise ImportError("undefined symbol: _ZN3c1013GeneratorImplC2Ev (a stand-in)")
        return create(self, spec)
    importlib.machinery.ExtensionFileLoader.create_module = refuse
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        import torchtpu
    print("warned", [str(x.message) for x in w if "does not load with torch" in str(x.message)])
    print("guard", torchtpu._native.DEVICE_GUARD)
    print("add", (torch.ones(2, device="tpu") + 1).cpu().tolist())
""")


def test_an_extension_that_does_not_load_is_said_once():
    """Installed beside another torch than it was built for, the C++ part
    fails to load: the import says so (it was silent), and the device works
    without it."""
    import torchtpu

    if torchtpu._native.DEVICE_GUARD != "torchtpu":
        pytest.skip("the C++ extension is not built")
    r = run(UNLOADABLE, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "warned ['torchtpu: its C++ extension does not load with torch" in r.stdout, r.stdout
    assert "undefined symbol" in r.stdout and "reinstall torchtpu against this torch" in r.stdout, r.stdout
    assert "guard torch" in r.stdout and "add [2.0, 2.0]" in r.stdout, r.stdout
