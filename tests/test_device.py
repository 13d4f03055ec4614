"""The tpu device: creation, copies in all directions, views sharing storage,
in-place writes through views, printing, errors."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import torchtpu

# The device these tests run on: tpu:0, or the one TORCHTPU_TEST_DEVICE names
# (tests/test_other_device.py runs this file on tpu:1).
DEV = torch.device("tpu", int(os.environ.get("TORCHTPU_TEST_DEVICE", "0")))


def test_device_basics():
    assert torch.tpu.is_available()
    assert torch.tpu.device_count() == int(os.environ.get("TORCHTPU_NUM_DEVICES", "1"))
    assert torch.tpu.current_device() == DEV.index
    assert "XLA" in torch.tpu.get_device_name()
    torch.tpu.synchronize()
    x = torch.randn(3, 4)
    t = x.to("tpu")
    assert t.device == DEV and (t + 1).device == DEV
    assert t.shape == x.shape and t.dtype == x.dtype
    torch.testing.assert_close(t.cpu(), x, rtol=0, atol=0)


@pytest.mark.parametrize(
    "dtype",
    [
        torch.float32,
        torch.float64,
        torch.bfloat16,
        torch.float16,
        torch.int64,
        torch.int32,
        torch.int8,
        torch.uint8,
        torch.bool,
        torch.complex64,
    ],
)
def test_round_trip_dtypes(dtype):
    x = (torch.randn(5, 3) * 10).to(dtype)
    assert torch.equal(x.to("tpu").cpu(), x)


def test_copy_directions():
    x = torch.randn(4, 5)
    t = torch.empty(4, 5, device="tpu")
    t.copy_(x)  # cpu -> tpu
    u = torch.empty(4, 5, device="tpu")
    u.copy_(t)  # tpu -> tpu
    y = torch.empty(4, 5)
    y.copy_(u)  # tpu -> cpu
    assert torch.equal(y, x)
    # with dtype conversion and broadcasting
    v = torch.zeros(4, 5, device="tpu", dtype=torch.float64)
    v.copy_(torch.arange(5, dtype=torch.int32))
    assert torch.equal(v.cpu(), torch.arange(5, dtype=torch.float64).expand(4, 5))
    # into a non-contiguous CPU destination
    z = torch.zeros(5, 4).t()
    z.copy_(t)
    assert torch.equal(z, x)


def test_item_and_print():
    t = torch.tensor([2.5], device="tpu")
    assert t.item() == 2.5
    assert torch.tensor(7, device="tpu").item() == 7
    assert torch.tensor(True, device="tpu").item() is True
    s = str(torch.arange(4, device="tpu"))
    assert f"tensor([0, 1, 2, 3], device='{DEV}')" == s


def test_views_share_storage():
    x = torch.arange(12.0).reshape(3, 4)
    t = x.to("tpu")
    views = {
        "view": lambda a: a.view(4, 3),
        "reshape": lambda a: a.reshape(2, 6),
        "permute": lambda a: a.permute(1, 0),
        "transpose": lambda a: a.transpose(0, 1),
        "t": lambda a: a.t(),
        "expand": lambda a: a[:1].expand(5, 4),
        "slice": lambda a: a[1:, ::2],
        "select": lambda a: a.select(1, 2),
        "squeeze": lambda a: a[:1].squeeze(0),
        "unsqueeze": lambda a: a.unsqueeze(1),
        "narrow": lambda a: a.narrow(1, 1, 2),
        "diagonal": lambda a: a.diagonal(),
    }
    for name, f in views.items():
        v = f(t)
        assert v.untyped_storage().data_ptr() == t.untyped_storage().data_ptr(), name
        assert v._base is t or v._base is t._base or v._base is None, name
        torch.testing.assert_close(v.cpu(), f(x), rtol=0, atol=0, msg=name)


def test_inplace_on_views_writes_through():
    x = torch.arange(12.0).reshape(3, 4)
    t = x.to("tpu")
    x[:, 0] += 1
    t[:, 0] += 1
    assert torch.equal(t.cpu(), x)
    x.t().mul_(2)
    t.t().mul_(2)
    assert torch.equal(t.cpu(), x)
    x[1:, ::2] = 7.0
    t[1:, ::2] = 7.0
    assert torch.equal(t.cpu(), x)
    x[0].fill_(-1)
    t[0].fill_(-1)
    assert torch.equal(t.cpu(), x)
    x.view(-1)[3:9].zero_()
    t.view(-1)[3:9].zero_()
    assert torch.equal(t.cpu(), x)


def test_manual_seed_reproducible():
    torch.manual_seed(3)
    a = torch.randn(100, device="tpu").cpu()
    torch.manual_seed(3)
    b = torch.randn(100, device="tpu").cpu()
    c = torch.randn(100, device="tpu").cpu()
    assert torch.equal(a, b)
    assert not torch.equal(b, c)


def test_cpu_tensor_mix_error():
    t = torch.ones(3, device="tpu")
    with pytest.raises(RuntimeError, match="same device"):
        t + torch.ones(3)
    # 0-d CPU tensors are allowed, as on CUDA
    assert torch.equal((t * torch.tensor(2.0)).cpu(), torch.full((3,), 2.0))


def test_unlowered_op_raises_not_implemented():
    # antialiased bicubic resampling has no lowering yet
    t = torch.eye(4, device="tpu")[None, None]
    with pytest.raises(NotImplementedError, match=r"aten::_upsample_bicubic2d_aa"):
        torch.nn.functional.interpolate(t, size=(2, 2), mode="bicubic", antialias=True)


def test_cpu_fallback_counts_and_warns():
    code = (
        "import warnings, torch, torchtpu\n"
        "import torch.nn.functional as F\n"
        "x = torch.arange(16.).reshape(1, 1, 4, 4)\n"
        "t = x.to('tpu')\n"
        "up = lambda v: F.interpolate(v, size=(2, 2), mode='bicubic', antialias=True)\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        "    r = up(t); r2 = up(t)\n"
        "assert r.device.type == 'tpu', r.device\n"
        "assert torch.allclose(r.cpu(), up(x))\n"
        "assert sum('_upsample_bicubic2d_aa' in str(x.message) for x in w) == 1, [str(x.message) for x in w]\n"
        "assert torchtpu.metrics()['fallback_ops'] == 2\n"
        "print('ok')\n"
    )
    env = dict(os.environ, TORCHTPU_CPU_FALLBACK="1")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "ok" in r.stdout


def test_missing_plugin_names_package():
    # import torch (which autoloads torchtpu) and CPU work go on without the
    # plugin; the device's first use raises what to install
    code = (
        "import torch, torchtpu\n"
        "print((torch.ones(2) + 1).tolist(), torch.tpu.is_initialized(), torch.tpu.is_available())\n"
        "torch.ones(2, device='tpu')\n"
    )
    # a platform whose plugin is not installed (make setup installs libtpu, not the CUDA plugin)
    platform, package = next((p, k) for p, k in (("cuda", "jax-cuda13-pjrt"), ("tpu", "libtpu")) if not _plugin_of(p))
    env = dict(os.environ, TORCHTPU_PLATFORM=platform)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 1
    assert "[2.0, 2.0] False False" in r.stdout, r.stderr
    assert f"pip install {package}" in r.stderr and "Traceback" in r.stderr


def _plugin_of(platform):
    from torchtpu import _plugin

    return any(os.path.exists(c) for c in _plugin._candidates(platform))


def test_bad_plugin_is_an_error_not_a_crash():
    code = (
        "import torch, torchtpu\n"
        "for _ in range(2):\n"
        "    try:\n"
        "        torch.tpu.init()\n"
        "    except RuntimeError as e:\n"
        "        print('error:', 'GetPjrtApi' in str(e))\n"
    )
    env = dict(os.environ, TORCHTPU_PJRT_PLUGIN="/lib/x86_64-linux-gnu/libc.so.6")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("error: True") == 2


def test_the_plugin_is_loaded_at_first_use_not_at_import():
    # torch's autoload imports torchtpu in every `import torch`: a CPU-only
    # process (a script, a data-loader or compile worker) must not load the
    # plugin or open the device; settings made before the first use hold after it
    code = textwrap.dedent("""
        import torch
        def plugin_loaded():
            return "pjrt" in open("/proc/self/maps").read()
        torch.manual_seed(5)
        torch.set_float32_matmul_precision("high")
        import torchtpu
        torchtpu.eager_mode("fused")
        m = torch.nn.Linear(4, 2)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        m(torch.ones(3, 4)).sum().backward()
        opt.step()
        torch.tpu.synchronize()
        before = (plugin_loaded(), torch.tpu.is_initialized(), torchtpu.metrics()["ops_dispatched"],
                  torch.tpu.memory_allocated())
        x = torch.rand(3, device="tpu")
        torch.manual_seed(5)
        y = torch.rand(3, device="tpu")
        after = (plugin_loaded(), torch.tpu.is_initialized(), torchtpu.get_eager_mode(),
                 torch.tpu.get_matmul_precision(), torch.equal(x.cpu(), y.cpu()))
        print(before, after)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "(False, False, 0, 0) (True, True, 'fused', 'high', True)" in r.stdout, r.stdout


def test_fork_after_first_use_is_an_error_in_the_child_and_before_it_works():
    # the plugin's threads do not survive fork(): a child of a process that
    # used the tpu gets an error naming the fix (not a hang); a child forked
    # before the first use starts its own runtime
    code = textwrap.dedent("""
        import os, torch
        def child(use):
            pid = os.fork()
            if pid == 0:
                try:
                    ok = (torch.ones(2, device="tpu") + 1).cpu().tolist() == [2.0, 2.0]
                    os._exit(0 if ok else 5)
                except RuntimeError as e:
                    os._exit(3 if "spawn" in str(e) and torch.tpu._is_in_bad_fork() else 4)
            return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        before = child(True)
        x = torch.ones(2, device="tpu") + 1
        after = child(True)
        print("codes", before, after, x.cpu().tolist(), torch.tpu._is_in_bad_fork())
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "codes 0 3 [2.0, 2.0] False" in r.stdout, r.stdout + r.stderr


def test_gpu_memory_fraction_is_checked():
    # TORCHTPU_GPU_MEMORY_FRACTION (the CUDA plugin's up-front reservation) must be in [0, 1];
    # the other plugins ignore a valid one
    for value, ok in (("2", False), ("half", False), ("0.5", True)):
        code = "import torch, torchtpu; print((torch.ones(2, device='tpu') + 1).cpu().tolist())"
        env = dict(os.environ, TORCHTPU_GPU_MEMORY_FRACTION=value)
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        if ok:
            assert r.returncode == 0 and "[2.0, 2.0]" in r.stdout, r.stderr
        else:
            assert r.returncode == 1 and f"TORCHTPU_GPU_MEMORY_FRACTION={value!r}" in r.stderr, r.stderr


def test_autoload_without_import():
    code = "import torch; t = torch.ones(2, device='tpu'); print((t + 1).cpu().tolist())"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "[2.0, 2.0]" in r.stdout


def test_program_cache_reuses_compiles():
    a = torch.randn(7, 3, device="tpu")
    b = torch.randn(7, 3, device="tpu")
    a + b
    before = torchtpu.metrics()["programs_compiled"]
    for _ in range(5):
        a + b
        a + 2.5  # a different scalar value is a program input, not a new program
        a + 3.5
    assert torchtpu.metrics()["programs_compiled"] - before <= 1


def test_empty_and_zero_dim_tensors():
    e = torch.empty(0, 3, device="tpu")
    assert (e + 1).cpu().shape == (0, 3)
    assert torch.equal(e.sum(0).cpu(), torch.zeros(3))
    z = torch.zeros((), device="tpu")
    assert (z + 2).item() == 2.0


def test_storage_freed_with_tensors():
    import gc

    gc.collect()
    before = torchtpu.metrics()["live_records"]
    ts = [torch.randn(16, 16, device="tpu") for _ in range(10)]
    views = [t.t()[1:] for t in ts]
    torch.tpu.synchronize()  # fused mode: recorded ops hold their records until a sync
    assert torchtpu.metrics()["live_records"] >= before + 10
    del ts
    assert torchtpu.metrics()["live_records"] >= before + 10  # views keep their storage alive
    del views
    gc.collect()
    assert torchtpu.metrics()["live_records"] == before


def test_errors_after_many_compiles_do_not_crash():
    """XLA's CPU plugin registers unwind tables for the code it compiles and
    can leave them dangling; the core binds those registrations to no-op
    stubs, so a Python error crossing torch's dispatcher (a C++ exception)
    after many compiles raises normally instead of killing the process."""
    code = (
        "import torch, torchtpu\n"
        "for n in range(1, 120):\n"
        "    x = torch.arange(n, device='tpu', dtype=torch.float32)\n"
        "    torch.sort(x * 3 - n).values.cpu()\n"
        "    try:\n"
        "        torch.unique(x, dim=3)\n"
        "    except IndexError:\n"
        "        pass\n"
        "m = torchtpu.metrics()\n"
        "assert m['programs_compiled'] > 0, m\n"
        "print('ok')\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), (r.returncode, r.stderr[-2000:])


def test_program_cache_is_bounded():
    """Past TORCHTPU_PROGRAM_CACHE_SIZE programs the cache is emptied, so the
    plugin's memory mappings stay bounded and results stay right."""
    code = (
        "import torch, torchtpu\n"
        "def maps(): return sum(1 for _ in open('/proc/self/maps'))\n"
        "seen = []\n"
        "for n in range(1, 121):\n"
        "    x = torch.arange(n, device='tpu', dtype=torch.float32)\n"
        "    assert torch.equal((x * 3 - n).cpu(), torch.arange(n, dtype=torch.float32) * 3 - n)\n"
        "    if n in (60, 120): seen.append(maps())\n"
        "assert torchtpu.metrics()['cache_entries'] <= 20 and torchtpu.metrics()['cache_evictions'] >= 5\n"
        "assert seen[1] <= seen[0] + 20, seen\n"
        "print('ok')\n"
    )
    env = dict(os.environ, TORCHTPU_PROGRAM_CACHE_SIZE="20")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), (r.returncode, r.stderr[-2000:])


def test_streams_and_events_like_cuda():
    """torch.tpu.Stream/Event/stream as torch.cuda's: one in-order stream per
    device; an event's query/synchronize cover the work launched before it;
    timing events give the wall time between two drained points."""
    s = torch.tpu.current_stream()
    assert s == torch.tpu.default_stream() == torch.tpu.Stream() and s.device == DEV
    with torch.tpu.stream(torch.tpu.Stream()) as got:
        y = torch.ones(64, 64, device="tpu") @ torch.ones(64, 64, device="tpu")
    assert got == s
    with torch.tpu.StreamContext(s) as ctx:  # the class torch.cuda.stream makes
        assert ctx == s
    with torch.tpu.StreamContext(None) as ctx:
        assert ctx is None
    with pytest.raises(TypeError, match="expected a torch.tpu.Stream"):
        torch.tpu.StreamContext("s")
    s.wait_stream(torch.tpu.Stream())
    s.synchronize()
    assert s.query()
    for mode in ("strict", "fused"):
        with torchtpu.eager_mode(mode):
            e = torch.tpu.Event()
            assert e.query()  # not recorded yet
            z = y * 2
            e.record()
            e.synchronize()
            assert e.query() and torch.tpu.current_stream().query()
            assert z[0, 0].item() == 128.0
    start, end = torch.tpu.Event(enable_timing=True), torch.tpu.Event(enable_timing=True)
    start.record()
    w = (y @ y).sum()
    end.record()
    end.synchronize()
    assert start.elapsed_time(end) > 0
    assert w.item() == 64.0**5
    plain = torch.tpu.Event()
    plain.record()
    with pytest.raises(RuntimeError, match="enable_timing"):
        start.elapsed_time(plain)
    with pytest.raises(RuntimeError, match="recorded"):
        torch.tpu.Event(enable_timing=True).elapsed_time(end)
    with pytest.raises(TypeError):
        torch.tpu.stream("not a stream")
    assert s.record_event().query()


def test_memory_summary():
    x = torch.ones(1024, device="tpu")
    text = torch.tpu.memory_summary()
    assert "allocated_bytes.all.current" in text and "MiB" in text
    del x


@pytest.mark.skipif(DEV.index != 0, reason="a process of one device")
def test_set_device_takes_index_0_or_the_process_local_rank(monkeypatch):
    # torchrun sets LOCAL_RANK and DeviceMesh calls set_device(LOCAL_RANK): in a
    # process of one device that is tpu:0; another index is an invalid ordinal
    # (RuntimeError, as CUDA's)
    monkeypatch.setenv("LOCAL_RANK", "3")
    torch.tpu.set_device(0)
    torch.tpu.set_device(3)
    torch.tpu.set_device("tpu:3")
    assert torch.tpu.current_device() == 0
    with pytest.raises(RuntimeError, match="tpu:2: invalid device ordinal"):
        torch.tpu.set_device(2)
    monkeypatch.delenv("LOCAL_RANK")
    with pytest.raises(RuntimeError, match="invalid device ordinal"):
        torch.tpu.set_device(3)
    with pytest.raises(RuntimeError, match="tpu:1: invalid device ordinal"):
        torch.ones(2, device="tpu:1")


def test_device_queries_of_a_device_this_process_lacks_raise(monkeypatch):
    """memory, synchronize, RNG state and generators of tpu:9 in a process of fewer devices:
    RuntimeError naming the ordinal (as CUDA's), not an answer about another device; in a
    process of one device, LOCAL_RANK names tpu:0 too."""
    n = torch.tpu.device_count()
    assert n < 9
    for call in (
        lambda: torch.tpu.memory_allocated(9),
        lambda: torch.tpu.max_memory_allocated("tpu:9"),
        lambda: torch.tpu.memory_stats(torch.device("tpu", 9)),
        lambda: torch.tpu.reset_peak_memory_stats(9),
        lambda: torch.tpu.synchronize(9),
        lambda: torch.tpu.get_rng_state(9),
        lambda: torch.tpu.set_rng_state(torch.tpu.get_rng_state(), 9),
        lambda: torch.Generator(device="tpu:9"),
    ):
        with pytest.raises(RuntimeError, match=rf"tpu:9: invalid device ordinal \({n} local devices\)"):
            call()
    assert torch.tpu.memory_allocated(0) >= 0 and torch.tpu.memory_allocated() >= 0
    torch.tpu.synchronize(0)
    g = torch.Generator(device="tpu:0")
    assert g.device == torch.device("tpu", 0)
    if n == 1:
        monkeypatch.setenv("LOCAL_RANK", "3")
        torch.tpu.synchronize("tpu:3")
        assert torch.tpu.memory_allocated(3) == torch.tpu.memory_allocated(0)
