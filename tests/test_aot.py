"""TORCHTPU_AOT_TOPOLOGY: every program also compiled for a TPU topology by
libtpu, on this CPU-only host (no TPU is needed to compile for one). Each test
runs in a child process with the variables set, since the target is opened
with the runtime: a small GPT training step's programs compile for v5e in
strict eager mode and for v6e in fused mode under bfloat16 autocast; the
compiler's numbers are sane; 64-bit integer matmuls, convolutions and
pools compile (and equal CPU's); a program larger than a chip's memory is a
torch.OutOfMemoryError naming it (only counted with TORCHTPU_AOT_STRICT=0);
a bad topology name is a clear error; the numbers survive a warm start from
the disk cache; a program sharded over a 4-device mesh, and a replica
collective over 4 devices, compile over the 4 chips (over 8: refused).
(That a program compiles to the same executable twice, by its fingerprint,
is tests/c/test_aot.c's.)"""

import json
import os
import subprocess
import sys
import textwrap

import pytest
from _libtpu import needs_libtpu

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = needs_libtpu


def _env(env):
    return dict(os.environ, **{"TORCHTPU_CACHE_DIR": "", **{k: str(v) for k, v in env.items()}})


def _result(rc, out, err):
    lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
    assert rc == 0 and lines, out[-3000:] + err[-3000:]
    return json.loads(lines[-1][len("RESULT ") :])


def run(code, timeout=300, **env):
    """Runs code in a child with env set (the disk cache off unless given);
    returns the JSON object it printed on its last line starting with RESULT."""
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=_env(env), capture_output=True, text=True, timeout=timeout
    )
    return _result(r.returncode, r.stdout, r.stderr)


class Child:
    """run() started now, its result awaited later (the children of this file
    run side by side: most of their time is libtpu's compiler, one core each)."""

    def __init__(self, tmp, name, code, **env):
        self.out, self.err = open(tmp / f"{name}.out", "w+"), open(tmp / f"{name}.err", "w+")
        self.p = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(code)], env=_env(env), stdout=self.out, stderr=self.err, text=True
        )

    def result(self, timeout=400):
        try:
            rc = self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            raise
        self.out.seek(0)
        self.err.seek(0)
        return _result(rc, self.out.read(), self.err.read())


GPT_STEP = (
    """
import importlib.util, json, os, torch, torchtpu
spec = importlib.util.spec_from_file_location("char_gpt", os.path.join(%r, "examples", "char_gpt.py"))
g = importlib.util.module_from_spec(spec)
spec.loader.exec_module(g)
tok, data = g.load_corpus()
model = g.make_model(tok.vocab_size, seed=0, device="tpu", block_size=16, n_layer=1, n_head=2, n_embd=32)
opt = g.make_optimizer(model)
x, y = g.get_batch(data, 4, 16, torch.Generator().manual_seed(1))
ac = torch.bfloat16 if os.environ.get("AUTOCAST") else None
loss = g.train_step(model, opt, x.to("tpu"), y.to("tpu"), autocast=ac)
r = torchtpu.aot_report()
m = torchtpu.metrics()
print(r)
print("RESULT", json.dumps(dict(
    topology=r.topology, kind=r.kind, devices=r.devices, hbm=r.hbm_bytes, peak=r.peak_bytes, loss=loss,
    programs=[p.as_dict() for p in r], compiled=m["aot_programs_compiled"], failed=m["aot_programs_failed"],
    report=torchtpu.metrics_report())))
"""
    % ROOT
)


@pytest.fixture(scope="module")
def children(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("aot")
    kids = dict(
        strict=Child(tmp, "strict", GPT_STEP, TORCHTPU_EAGER="strict", TORCHTPU_AOT_TOPOLOGY="v5e:2x2"),
        fused=Child(tmp, "fused", GPT_STEP, TORCHTPU_EAGER="fused", TORCHTPU_AOT_TOPOLOGY="v6e:2x2", AUTOCAST="1"),
        costs=Child(
            tmp, "costs", COSTS, TORCHTPU_EAGER="strict", TORCHTPU_AOT_TOPOLOGY="v5e:2x2", TORCHTPU_NUM_DEVICES="8"
        ),
        meshes=Child(
            tmp,
            "meshes",
            MESHES,
            TORCHTPU_EAGER="fused",
            TORCHTPU_AOT_TOPOLOGY="v5e:2x2",
            TORCHTPU_AOT_STRICT="0",
            TORCHTPU_NUM_DEVICES="8",
        ),
        bad=Child(tmp, "bad", BAD_NAME, TORCHTPU_AOT_TOPOLOGY="v5e:bogus"),
    )
    yield kids
    for k in kids.values():
        if k.p.poll() is None:
            k.p.kill()
            k.p.wait()


def _check_step(res, topology, kind):
    assert res["topology"] == topology and res["kind"] == kind and res["devices"] == 4
    progs = res["programs"]
    assert progs and all(p["ok"] for p in progs), [p for p in progs if not p["ok"]]
    assert res["compiled"] == len(progs) and res["failed"] == 0
    assert 0 < res["peak"] < res["hbm"]
    for p in progs:
        assert p["peak_bytes"] <= res["hbm"] and p["hbm_limit_bytes"] == res["hbm"]
        assert p["serialized_bytes"] > 0 and p["compile_seconds"] > 0 and p["flops"] >= 0
    assert "programs compiled for the TPU topology (aot_programs_compiled)" in res["report"]
    return progs


def test_gpt_step_compiles_for_v5e_in_strict_mode(children):
    res = children["strict"].result()
    progs = _check_step(res, "v5e:2x2", "TPU v5 lite")
    names = {p["name"] for p in progs}
    assert len(progs) > 50 and {"aten::mm", "aten::tpu::sdpa", "aten::tpu::sdpa_backward"} <= names, names


def test_gpt_step_compiles_for_v6e_fused_under_bf16_autocast(children):
    res = children["fused"].result()
    progs = _check_step(res, "v6e:2x2", "TPU v6 lite")
    assert all(p["name"].startswith("a fused program of ") for p in progs), [p["name"] for p in progs]
    # compiling for a TPU, the step's boundary is the optimizer (TORCHTPU_STEP_BOUNDARY=auto): forward,
    # backward and AdamW are one program, made at loss.item()
    assert len(progs) == 1, [p["name"] for p in progs]


COSTS = """
import json, torch, torchtpu
a = torch.ones(128, 128, device="tpu")
(a + a).cpu()
x, w = torch.randn(256, 512, device="tpu"), torch.randn(512, 64, device="tpu")
(x @ w).cpu()
oom = None
try:
    torch.zeros(8192, 1048576, device="tpu")  # 32 GiB: refused before it runs
except torch.OutOfMemoryError as e:
    oom = str(e)
after = (torch.ones(3, device="tpu") * 2).tolist()  # the device still works
from torchtpu import spmd
try:  # a program over 8 devices (the CPU plugin has them) on v5e:2x2's 4 chips
    x = spmd.shard(torch.randn(16, 4), spmd.Mesh((8,), ("x",)), [spmd.Shard(0)])
    (x * 2).sum().item()
    refused = None
except RuntimeError as e:
    refused = str(e)
import torch.nn.functional as F
g = torch.Generator().manual_seed(0)
a64, b64 = torch.randint(-2**62, 2**62, (2, 5, 7), generator=g), torch.randint(-2**62, 2**62, (2, 7, 3), generator=g)
x64, w64 = torch.randint(-50, 50, (2, 4, 6, 6), generator=g), torch.randint(-50, 50, (6, 2, 3, 3), generator=g)
int64 = {  # 64-bit integer dot and convolution: TPU's compiler has neither; the builder spells them as sums
    "bmm": torch.equal(torch.bmm(a64.to("tpu"), b64.to("tpu")).cpu(), torch.bmm(a64, b64)),
    "conv": torch.equal(F.conv2d(x64.to("tpu"), w64.to("tpu"), padding=1, groups=2).cpu(),
                        F.conv2d(x64, w64, padding=1, groups=2)),
    "avg_pool2d": torch.equal(F.avg_pool2d(x64.to("tpu"), 2).cpu(), F.avg_pool2d(x64, 2)),
}
c64, m64, n64 = (torch.randint(-2**62, 2**62, s, generator=g) for s in ((300, 280), (300, 257), (257, 280)))
# products over 2^22 elements: a loop over blocks of the contracting dim
int64["addmm"] = torch.equal(torch.addmm(c64.to("tpu"), m64.to("tpu"), n64.to("tpu")).cpu(), torch.addmm(c64, m64, n64))
r = torchtpu.aot_report()
print("RESULT", json.dumps(dict(programs={p.name: p.as_dict() for p in r}, oom=oom, after=after, refused=refused,
                                int64=int64, m=torchtpu.metrics(), summary=str(r))))
"""


def test_costs_and_the_hbm_guard(children):
    res = children["costs"].result()
    add, mm = res["programs"]["aten::add.Tensor"], res["programs"]["aten::mm"]
    assert add["flops"] == 128 * 128 and add["transcendentals"] == 0
    assert add["argument_bytes"] == 2 * 128 * 128 * 4 and add["output_bytes"] == 128 * 128 * 4
    assert add["peak_bytes"] >= add["argument_bytes"]
    assert add["optimal_seconds"] is None or add["optimal_seconds"] > 0
    assert abs(mm["flops"] - 2 * 256 * 512 * 64) <= 0.01 * 2 * 256 * 512 * 64
    assert mm["argument_bytes"] == (256 * 512 + 512 * 64) * 4 and mm["output_bytes"] == 256 * 64 * 4
    assert mm["partitions"] == 1 and len(mm["fingerprint"]) > 8
    oom = res["oom"]
    assert oom and "does not fit in the memory of a TPU v5e:2x2" in oom and "HBM" in oom, oom
    assert "aten::" in oom  # names the program
    assert res["after"] == [2.0, 2.0, 2.0]
    refused = res["refused"]
    assert refused and "over 8 devices" in refused and "does not compile for TPU v5e:2x2" in refused, refused
    big = [p for p in res["programs"].values() if p["error_kind"] == "out of memory"]
    assert len(big) == 1 and not big[0]["ok"]
    m = res["m"]
    assert m["aot_programs_too_big"] == 1 and m["aot_programs_failed"] == 2
    assert "refused (out of memory) x1" in res["summary"]
    assert res["int64"] == {"bmm": True, "conv": True, "avg_pool2d": True, "addmm": True}, res["int64"]
    for name in ("aten::bmm", "aten::convolution_overrideable", "aten::avg_pool2d", "aten::addmm"):
        assert res["programs"][name]["ok"], res["programs"].get(name)


MESHES = """
import json, torch, torchtpu
from torchtpu import spmd
out = {}
a0, w0 = torch.randn(1024, 256), torch.randn(256, 256)
for n in (4, 8):  # v5e:2x2 has 4 chips; the CPU plugin 8 devices
    mesh = spmd.Mesh((n,), ("x",))
    a = spmd.shard(a0, mesh, [spmd.Shard(0)])
    w = spmd.shard(w0, mesh, [spmd.Replicate()])
    out[n] = (a @ w).sum().item()  # runs on the CPU devices all the same
from torchtpu import replicas
for n in (4, 8):  # a replica collective over 4 devices, then over 8
    ys = replicas.all_reduce([torch.full((256,), float(i)).to(f"tpu:{i}") for i in range(n)])
    out[f"replicas{n}"] = ys[-1][0].item()
r = torchtpu.aot_report()
print("RESULT", json.dumps(dict(out=out, programs=[p.as_dict() for p in r], m=torchtpu.metrics())))
"""


def test_sharded_programs_compile_over_the_chips_and_not_strict_counts_what_does_not(children):
    res = children["meshes"].result()
    assert abs(res["out"]["4"] - res["out"]["8"]) < 1e-2 * abs(res["out"]["4"]) + 1e-2
    over = [p for p in res["programs"] if p["partitions"] == 4]
    assert over and all(p["ok"] for p in over), res["programs"]
    # per chip: a quarter of a, all of w
    assert over[0]["argument_bytes"] == (1024 * 256 // 4 + 256 * 256) * 4, over[0]
    refused = [p for p in res["programs"] if not p["ok"]]
    assert refused and "8 devices" in refused[0]["error"] and refused[0]["error_kind"] == "compile error", refused
    assert res["m"]["aot_programs_failed"] == len(refused) and res["m"]["aot_programs_too_big"] == 0
    # replica collectives (torchtpu.replicas): over the 4 chips each holds one replica's 256 floats
    assert res["out"]["replicas4"] == 6.0 and res["out"]["replicas8"] == 28.0
    rep = [p for p in res["programs"] if p["name"] == "a replica collective"]
    assert len(rep) == 2 and rep[0]["ok"] and rep[0]["argument_bytes"] == 256 * 4, rep
    assert not rep[1]["ok"] and "a program over 8 devices" in rep[1]["error"], rep


BAD_NAME = """
import json, torch, torchtpu
try:
    torch.ones(2, device="tpu") + 1
    err = None
except RuntimeError as e:
    err = str(e)
print("RESULT", json.dumps(dict(err=err)))
"""


def test_a_bad_topology_name_is_a_clear_error(children):
    err = children["bad"].result()["err"]
    assert err and "TORCHTPU_AOT_TOPOLOGY=v5e:bogus" in err and "whole numbers joined by 'x'" in err, err


@pytest.mark.parametrize(
    "name, says",
    [
        ("v5e:0x0", "from 1 to 64 chips"),  # libtpu: SIGFPE
        ("v5e:64x64", "at most 16x16"),  # libtpu: a CHECK failure, abort
        ("v9z:2x2", "Invalid TPU external name"),  # libtpu's own error, quoted
    ],
)
def test_topologies_libtpu_would_end_the_process_on_are_refused(name, says):
    r = subprocess.run(
        [sys.executable, "-c", BAD_NAME],
        env=dict(os.environ, TORCHTPU_AOT_TOPOLOGY=name, TORCHTPU_CACHE_DIR=""),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert r.returncode == 0, r.stderr[-2000:]  # the process goes on
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("RESULT "))
    err = json.loads(line[len("RESULT ") :])["err"]
    assert err and f"TORCHTPU_AOT_TOPOLOGY={name}" in err and says in err, err


WARM = """
import json, torch, torchtpu
a = torch.randn(64, 32, device="tpu")
b = torch.randn(32, 16, device="tpu")
(torch.tanh(a @ b) + 1).sum().item()
r = torchtpu.aot_report()
print("RESULT", json.dumps(dict(programs=[p.as_dict() for p in r], m=torchtpu.metrics())))
"""


def test_the_disk_cache_keeps_the_report(tmp_path):
    env = dict(TORCHTPU_EAGER="strict", TORCHTPU_AOT_TOPOLOGY="v5e:2x2")
    cold = run(WARM, TORCHTPU_CACHE_DIR=tmp_path, **env)
    warm = run(WARM, TORCHTPU_CACHE_DIR=tmp_path, **env)
    assert cold["programs"] and not any(p["cached"] for p in cold["programs"])
    assert all(p["cached"] for p in warm["programs"]) and warm["m"]["aot_programs_compiled"] == 0
    assert warm["m"]["aot_disk_cache_hits"] == len(cold["programs"])
    for c, w in zip(cold["programs"], warm["programs"]):
        c.pop("cached"), w.pop("cached")
        assert c == w
