"""The disk tier of the compilation cache, across real processes: cold then
warm starts, the default folder, damaged entries, concurrent writers, the
size limit, unwritable folders and a changed plugin."""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

import torchtpu

SCRIPT = textwrap.dedent("""
    import json, sys, warnings
    warnings.simplefilter("always")
    caught = []
    warnings.showwarning = lambda m, *a, **k: caught.append(str(m))
    import torch, torchtpu
    x = torch.arange(64, dtype=torch.float32, device="tpu").reshape(8, 8) / 64
    for i in range(int(sys.argv[1])):
        x = torch.tanh(x @ x + i) if i % 2 else (x * 1.5 - 0.25).relu()
    out = x.cpu().sum().item()
    m = torchtpu.metrics()
    print(json.dumps({"out": out, "warnings": [w for w in caught if "torchtpu" in w],
                      **{k: m[k] for k in ("programs_compiled", "disk_cache_hits", "disk_cache_misses",
                                           "disk_cache_writes", "disk_cache_corrupt")}}))
""")


def run(env_extra, n=6, unset=()):
    env = dict(os.environ)
    for k in unset:
        env.pop(k, None)
    # strict mode: one program per op signature, so the script writes several
    # entries that the tests below damage, share and evict one by one (the
    # default, fused mode, writes one or two: test_warm_start_loads_every_program_from_disk)
    env["TORCHTPU_EAGER"] = "strict"
    env.update(env_extra)
    p = subprocess.run([sys.executable, "-c", SCRIPT, str(n)], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def entries(d):
    return sorted(f for f in os.listdir(d) if f.endswith(".xc"))


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_warm_start_loads_every_program_from_disk(tmp_path, mode):
    d = str(tmp_path / "cache")
    cold = run({"TORCHTPU_CACHE_DIR": d, "TORCHTPU_EAGER": mode})
    assert cold["programs_compiled"] > 0 and cold["disk_cache_hits"] == 0
    assert cold["disk_cache_writes"] == cold["programs_compiled"] == len(entries(d))
    warm = run({"TORCHTPU_CACHE_DIR": d, "TORCHTPU_EAGER": mode})
    assert warm["programs_compiled"] == 0
    assert warm["disk_cache_hits"] == cold["programs_compiled"]
    assert warm["out"] == cold["out"] and warm["warnings"] == []
    assert not [f for f in os.listdir(d) if ".tmp." in f]


def test_default_folder_and_switching_off(tmp_path):
    got = run({"XDG_CACHE_HOME": str(tmp_path)}, unset=("TORCHTPU_CACHE_DIR",))
    assert got["disk_cache_writes"] > 0
    assert len(entries(tmp_path / "torchtpu")) == got["disk_cache_writes"]
    off = run({"TORCHTPU_CACHE_DIR": "", "XDG_CACHE_HOME": str(tmp_path / "other")})
    assert off["disk_cache_misses"] == off["disk_cache_writes"] == 0
    assert not (tmp_path / "other").exists()
    assert torchtpu._settings.default_cache_dir() == ""  # the suite itself runs with it off


@pytest.mark.parametrize("damage", ["flip", "truncate", "garbage", "empty"])
def test_damaged_entries_are_reported_once_removed_and_recompiled(tmp_path, damage):
    d = str(tmp_path)
    cold = run({"TORCHTPU_CACHE_DIR": d})
    names = entries(d)
    for name in names:
        path = os.path.join(d, name)
        data = open(path, "rb").read()
        if damage == "flip":
            data = data[:-5] + bytes([data[-5] ^ 0xFF]) + data[-4:]
        elif damage == "truncate":
            data = data[: len(data) // 2]
        elif damage == "garbage":
            data = os.urandom(len(data))
        else:
            data = b""
        open(path, "wb").write(data)
    again = run({"TORCHTPU_CACHE_DIR": d})
    assert again["out"] == cold["out"]
    assert again["disk_cache_corrupt"] == len(names)
    assert again["programs_compiled"] == len(names)
    assert len(again["warnings"]) == len(names)
    assert all("damaged compilation cache entry" in w for w in again["warnings"])
    healed = run({"TORCHTPU_CACHE_DIR": d})  # rewritten whole by the recompile
    assert healed["programs_compiled"] == 0 and healed["warnings"] == []


def test_concurrent_writers_of_the_same_entries(tmp_path):
    d = str(tmp_path)
    env = dict(os.environ, TORCHTPU_CACHE_DIR=d, TORCHTPU_EAGER="strict")  # as run() does
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", SCRIPT, "8"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(4)
    ]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
        outs.append(json.loads(out.strip().splitlines()[-1]))
    assert len({o["out"] for o in outs}) == 1 and all(o["warnings"] == [] for o in outs)
    assert not [f for f in os.listdir(d) if ".tmp." in f]
    warm = run({"TORCHTPU_CACHE_DIR": d}, n=8)
    assert warm["programs_compiled"] == 0 and warm["disk_cache_corrupt"] == 0
    assert warm["out"] == outs[0]["out"]


def test_size_limit_evicts_the_oldest(tmp_path):
    d = str(tmp_path)
    full = run({"TORCHTPU_CACHE_DIR": d}, n=10)
    sizes = [os.path.getsize(os.path.join(d, f)) for f in entries(d)]
    total = sum(sizes)
    shutil.rmtree(d)
    limit_mb = total / 2 / 2**20
    small = run({"TORCHTPU_CACHE_DIR": d, "TORCHTPU_CACHE_SIZE_MB": str(limit_mb)}, n=10)
    assert small["out"] == full["out"] and small["warnings"] == []
    kept = sum(os.path.getsize(os.path.join(d, f)) for f in entries(d))
    assert 0 < kept <= total / 2
    assert len(entries(d)) < len(sizes)


def _readonly_dir(tmp_path):
    if os.geteuid() != 0:
        d = tmp_path / "ro"
        d.mkdir()
        d.chmod(0o555)
        return str(d)
    # root writes through permission bits: use a folder of a read-only file system
    for d in ("/proc/self/fdinfo", "/sys/kernel"):
        try:
            open(os.path.join(d, "torchtpu-probe.xc"), "wb").close()
        except OSError:
            return d
    pytest.skip("no read-only folder is available on this machine")


def test_unwritable_folder_falls_back_to_memory_with_one_warning(tmp_path):
    got = run({"TORCHTPU_CACHE_DIR": _readonly_dir(tmp_path)})
    assert got["programs_compiled"] > 1 and got["disk_cache_writes"] == 0
    assert len(got["warnings"]) == 1 and "cannot be written" in got["warnings"][0]
    ref = run({"TORCHTPU_CACHE_DIR": ""})
    assert got["out"] == ref["out"]


def test_folder_that_cannot_be_created_warns_once(tmp_path):
    f = tmp_path / "file"
    f.write_text("not a folder")
    got = run({"TORCHTPU_CACHE_DIR": str(f / "cache")})
    assert len(got["warnings"]) == 1 and "compilation cache disabled" in got["warnings"][0]
    assert got["disk_cache_misses"] == 0 and got["programs_compiled"] > 0


def test_compiler_flags_are_part_of_the_key(tmp_path):
    # XLA_FLAGS can change the code XLA emits (fast math, say): an entry
    # compiled under other flags is not found, and the flags' own entries are
    d = str(tmp_path / "cache")
    flags = "--xla_cpu_enable_fast_math=false"
    cold = run({"TORCHTPU_CACHE_DIR": d}, unset=("XLA_FLAGS", "LIBTPU_INIT_ARGS"))
    flagged = run({"TORCHTPU_CACHE_DIR": d, "XLA_FLAGS": flags}, unset=("LIBTPU_INIT_ARGS",))
    assert flagged["disk_cache_hits"] == 0 and flagged["programs_compiled"] == cold["programs_compiled"]
    again = run({"TORCHTPU_CACHE_DIR": d, "XLA_FLAGS": flags}, unset=("LIBTPU_INIT_ARGS",))
    assert again["programs_compiled"] == 0 and again["out"] == cold["out"]


def test_the_cpu_optimization_level_is_part_of_the_key_and_reaches_the_compiler(tmp_path):
    # TORCHTPU_CPU_OPT_LEVEL goes into every compile's options (XLA refuses an
    # option it does not know, so these runs compiling at all shows it is
    # taken) and into the key: code made at level 1 is not found at level 3;
    # XLA_FLAGS naming the level decides instead of the setting
    d = str(tmp_path / "cache")
    base = {"TORCHTPU_CACHE_DIR": d}
    lvl1 = run({**base, "TORCHTPU_CPU_OPT_LEVEL": "1"}, unset=("XLA_FLAGS", "LIBTPU_INIT_ARGS"))
    default = run(base, unset=("XLA_FLAGS", "LIBTPU_INIT_ARGS", "TORCHTPU_CPU_OPT_LEVEL"))
    assert lvl1["programs_compiled"] > 0 and default["programs_compiled"] == 0  # 1 is the default
    lvl3 = run({**base, "TORCHTPU_CPU_OPT_LEVEL": "3"}, unset=("XLA_FLAGS", "LIBTPU_INIT_ARGS"))
    assert lvl3["disk_cache_hits"] == 0 and lvl3["programs_compiled"] == lvl1["programs_compiled"]
    assert lvl3["out"] == lvl1["out"]
    flags = {**base, "XLA_FLAGS": "--xla_backend_optimization_level=1", "TORCHTPU_CPU_OPT_LEVEL": "3"}
    xla = run(flags, unset=("LIBTPU_INIT_ARGS",))
    assert xla["disk_cache_hits"] == 0 and xla["programs_compiled"] == lvl1["programs_compiled"]


def test_a_different_plugin_build_does_not_reuse_entries(tmp_path):
    d = str(tmp_path / "cache")
    cold = run({"TORCHTPU_CACHE_DIR": d})
    plugin = torchtpu.runtime_info()["plugin"]
    other = tmp_path / "plugin" / os.path.basename(plugin)
    other.parent.mkdir()
    shutil.copy(plugin, other)  # another file: another size/mtime/path, as after an upgrade
    changed = run({"TORCHTPU_CACHE_DIR": d, "TORCHTPU_PJRT_PLUGIN": str(other)})
    assert changed["disk_cache_hits"] == 0 and changed["programs_compiled"] == cold["programs_compiled"]
    back = run({"TORCHTPU_CACHE_DIR": d})
    assert back["programs_compiled"] == 0


# The trust rules: a cache entry is code this process runs, so the folder is
# the trust boundary (the user's own, written by nobody else) and every entry
# carries a MAC under the folder's secret key; a checksum anyone can recompute
# proves nothing.

OP_SCRIPT = textwrap.dedent("""
    import json, sys, warnings
    warnings.simplefilter("always")
    caught = []
    warnings.showwarning = lambda m, *a, **k: caught.append(str(m))
    import torch, torchtpu
    x = torch.linspace(-1, 1, 64).reshape(8, 8)
    y = getattr(torch, sys.argv[1])(x.to("tpu")).cpu()
    m = torchtpu.metrics()
    print(json.dumps({"right": torch.equal(y, getattr(torch, sys.argv[1])(x)),
                      "warnings": [w for w in caught if "torchtpu" in w],
                      **{k: m[k] for k in ("programs_compiled", "disk_cache_hits", "disk_cache_misses",
                                           "disk_cache_writes", "disk_cache_corrupt", "disk_cache_refused")}}))
""")

HEADER = 64  # magic, key length, payload length, FNV-1a checksum, MAC (csrc/cache/cache.h)


def run_op(op, d, umask=None):
    env = dict(os.environ, TORCHTPU_CACHE_DIR=d, TORCHTPU_EAGER="strict")  # the op's own program
    p = subprocess.run(
        [sys.executable, "-c", OP_SCRIPT, op],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=(lambda: os.umask(umask)) if umask is not None else None,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def fnv1a(data):
    h = 14695981039346656037
    for b in data:
        h = ((h ^ b) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h


def parse(path):
    data = open(path, "rb").read()
    kl, pl = int.from_bytes(data[8:16], "little"), int.from_bytes(data[16:24], "little")
    assert len(data) == HEADER + kl + pl
    return data[:HEADER], data[HEADER : HEADER + kl], data[HEADER + kl :]


def entry_of(d, marker):
    """The path of the only entry whose key (the program text) holds marker."""
    found = [os.path.join(d, f) for f in entries(d) if marker in parse(os.path.join(d, f))[1]]
    assert len(found) == 1, (marker, entries(d))
    return found[0]


def rewrite(path, head, key, payload):
    """head's magic and MAC with key and payload, lengths and checksum made right."""
    head = (
        head[:8]
        + len(key).to_bytes(8, "little")
        + len(payload).to_bytes(8, "little")
        + fnv1a(key + payload).to_bytes(8, "little")
        + head[32:]
    )
    with open(path, "wb") as f:
        f.write(head + key + payload)


def test_entry_with_another_programs_payload_is_not_run(tmp_path):
    # the reproducer: neg's key with abs's compiled code
    d = str(tmp_path / "cache")
    assert run_op("neg", d)["disk_cache_writes"] == 1
    assert run_op("abs", d)["disk_cache_writes"] == 1
    neg, ab = entry_of(d, b"negate"), entry_of(d, b"abs")
    (nh, nk, npay), (ah, ak, apay) = parse(neg), parse(ab)
    rewrite(neg, nh, nk, apay)
    rewrite(ab, ah, ak, npay)
    got = run_op("neg", d)
    assert got["right"], "torch.neg ran another program from the cache"
    assert got["disk_cache_hits"] == 0 and got["disk_cache_refused"] == 1 and got["programs_compiled"] == 1
    assert len(got["warnings"]) == 1 and "tampered or foreign entry" in got["warnings"][0], got["warnings"]
    assert got["disk_cache_corrupt"] == 0  # the checksum matched: only the MAC could tell
    # the recompile replaced the entry; abs's (neg's code) is still refused
    again = run_op("neg", d)
    assert again["right"] and again["disk_cache_hits"] == 1 and again["warnings"] == []
    other = run_op("abs", d)
    assert other["right"] and other["disk_cache_refused"] == 1 and len(other["warnings"]) == 1


def test_entry_copied_from_another_cache_folder_is_refused(tmp_path):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    run_op("neg", a)
    run_op("neg", b)
    ea, eb = entry_of(a, b"negate"), entry_of(b, b"negate")
    shutil.copy(eb, ea)  # a whole, well-formed entry, made under b's key
    got = run_op("neg", a)
    assert got["right"] and got["disk_cache_refused"] == 1 and len(got["warnings"]) == 1


def test_folder_and_entries_are_private_whatever_the_umask(tmp_path):
    d = str(tmp_path / "parent" / "cache")
    got = run_op("neg", d, umask=0)
    assert got["disk_cache_writes"] == 1

    def mode(p):
        return os.stat(p).st_mode & 0o7777

    assert mode(d) == 0o700 and mode(tmp_path / "parent") == 0o700
    assert mode(os.path.join(d, "hmac.key")) == 0o600
    assert [mode(os.path.join(d, f)) for f in entries(d)] == [0o600]


@pytest.mark.parametrize("perm", [0o775, 0o777])
def test_folder_writable_by_others_is_refused_once(tmp_path, perm):
    d = tmp_path / "cache"
    d.mkdir()
    d.chmod(perm)
    got = run_op("neg", str(d))
    assert got["right"] and got["programs_compiled"] == 1
    assert got["disk_cache_writes"] == 0 and got["disk_cache_misses"] == 0
    assert len(got["warnings"]) == 1 and "writable by group or others" in got["warnings"][0], got["warnings"]
    assert "compilation cache disabled" in got["warnings"][0]
    assert os.listdir(d) == []  # nothing written there


def test_entry_writable_by_others_is_refused_once(tmp_path):
    d = str(tmp_path / "cache")
    run_op("neg", d)
    run_op("abs", d)
    for f in entries(d):
        os.chmod(os.path.join(d, f), 0o666)
    got = run_op("neg", d)
    assert got["right"] and got["disk_cache_hits"] == 0 and got["disk_cache_refused"] == 1
    assert len(got["warnings"]) == 1 and "writable by group or others" in got["warnings"][0]


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_folder_or_entry_of_another_user_is_refused(tmp_path):
    d = str(tmp_path / "cache")
    run_op("neg", d)
    (e,) = entries(d)
    os.chown(os.path.join(d, e), 65534, 65534)
    got = run_op("neg", d)
    assert got["right"] and got["disk_cache_refused"] == 1
    assert len(got["warnings"]) == 1 and "owned by another user" in got["warnings"][0]
    os.chown(d, 65534, 65534)
    got = run_op("neg", d)
    assert got["right"] and got["disk_cache_writes"] == 0
    assert len(got["warnings"]) == 1 and "owned by another user" in got["warnings"][0]


def test_default_folder_is_per_user_never_a_shared_one(monkeypatch):
    import pwd

    from torchtpu import _native, _settings

    monkeypatch.delenv("TORCHTPU_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", "/somewhere/xdg")
    assert _settings.default_cache_dir() == "/somewhere/xdg/torchtpu"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/xdg")  # ignored (the XDG spec)
    monkeypatch.setenv("HOME", "/home/someone")
    assert _settings.default_cache_dir() == "/home/someone/.cache/torchtpu"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.delenv("HOME")  # the passwd entry's home
    assert _settings.default_cache_dir() == os.path.join(pwd.getpwuid(os.geteuid()).pw_dir, ".cache", "torchtpu")

    def no_entry(uid):
        raise KeyError(uid)

    monkeypatch.setattr(pwd, "getpwuid", no_entry)
    assert _settings.default_cache_dir() is None  # no home: no disk tier, not /tmp
    with pytest.warns(UserWarning, match="compilation cache disabled"):
        _native.setup_disk_cache()
