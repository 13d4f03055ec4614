"""A compile-only mesh (TORCHTPU_SPMD_COMPILE_ONLY=1 with TORCHTPU_AOT_TOPOLOGY):
programs over a mesh are compiled by libtpu for the topology's chips and
never run, so a mesh may span more chips than the process has devices. The
layouts of the values the programs write are libtpu's partitioner's, read
from its optimized program (Shardy's named form). Checked against the same
step run for real on 4 CPU devices: the same layouts, and the same programs
(libtpu's figures for them are equal)."""

import os
import subprocess
import sys
import textwrap

from _libtpu import needs_libtpu

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = needs_libtpu

# A tensor-parallel MLP step on a (dp x tp) mesh, three AdamW steps; prints
# the layouts and libtpu's figures of every program over the mesh.
STEP = """
import torch, torchtpu
from torchtpu import spmd
from torchtpu.spmd import Replicate, Shard
mesh = spmd.Mesh(MESH, ("dp", "tp"))
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 32)).to("tpu")
spmd.shard_(model[0].weight, mesh, [Replicate(), Shard(0)])
spmd.shard_(model[0].bias, mesh, [Replicate(), Shard(0)])
spmd.shard_(model[2].weight, mesh, [Replicate(), Shard(1)])
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(3):
    x = spmd.shard(torch.randn(16, 32), mesh, [Shard(0), Replicate()])
    opt.zero_grad(set_to_none=True)
    h = model[1](model[0](x))
    loss = model[2](h).square().mean()
    loss.backward()
    opt.step()
print("LAYOUT h", spmd.sharding(h))
for name, p in model.named_parameters():
    print("LAYOUT", name, spmd.sharding(p), spmd.sharding(p.grad), spmd.sharding(opt.state[p]["exp_avg"]))
m = torchtpu.metrics()
print("RAN", m["spmd_programs_run"], "UNRUN", m["spmd_programs_compile_only"])
for p in torchtpu.aot_report().programs:
    if p.partitions > 1:
        print("PROG", p.partitions, p.ok, p.flops, p.bytes_accessed, p.argument_bytes, p.peak_bytes)
"""


def run(code, topology="v5e:2x2", devices=1, only=True, **env):
    e = dict(os.environ)
    e.pop("TORCHTPU_NUM_DEVICES", None)
    e.update(
        TORCHTPU_AOT_TOPOLOGY=topology or "",
        TORCHTPU_NUM_DEVICES=str(devices),
        TORCHTPU_SPMD_COMPILE_ONLY="1" if only else "0",
        TORCHTPU_CACHE_DIR="",
        PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])),
        **env,
    )
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=e, capture_output=True, text=True, timeout=240
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return r


def lines(out, tag):
    return [ln for ln in out.splitlines() if ln.startswith(tag)]


def test_same_layouts_and_programs_as_a_real_run():
    code = STEP.replace("MESH", "(2, 2)")
    only = run(code).stdout
    real = run(code, devices=4, only=False).stdout
    assert lines(only, "LAYOUT") == lines(real, "LAYOUT") and lines(only, "LAYOUT")
    assert lines(only, "PROG") == lines(real, "PROG") and lines(only, "PROG")
    (ran,) = lines(only, "RAN")
    assert ran.split()[1] == "0" and int(ran.split()[3]) >= 3
    assert lines(real, "RAN")[0].split()[3] == "0"
    # the layouts are the partitioner's: the column-parallel weight's gradient
    # and moment split as it, the activation between the layers over both axes
    assert "LAYOUT h ((2, 2), (0, 1))" in lines(only, "LAYOUT h")
    w0 = next(ln for ln in lines(only, "LAYOUT 0.weight") if ln)
    assert w0.count("((2, 2), (1, -1))") == 3, w0


def test_a_mesh_of_the_topologys_chips_on_one_device():
    out = run(STEP.replace("MESH", "(4, 4)"), topology="v5e:4x4").stdout
    assert all(ln.split()[1:3] == ["16", "True"] for ln in lines(out, "PROG")) and lines(out, "PROG")
    assert "LAYOUT h ((4, 4), (0, 1))" in out
    r = run(
        """
        import torch, torchtpu
        from torchtpu import spmd
        try:
            spmd.Mesh((8, 4))
        except ValueError as e:
            print("REFUSED", e)
        """,
        topology="v5e:4x4",
    )
    assert "REFUSED a mesh of 32 devices; this process has 1" in r.stdout


def test_values_are_not_computed_and_nothing_else_changes():
    r = run(
        """
        import torch, torchtpu
        from torchtpu import spmd
        from torchtpu.spmd import Replicate, Shard
        mesh = spmd.Mesh((2, 2))
        x = spmd.shard(torch.ones(4, 4), mesh, [Shard(0), Replicate()])
        y = (x * 2).sum()
        for read in (lambda: y.item(), lambda: x.cpu(), lambda: print(x)):
            try:
                read()
            except RuntimeError as e:
                print("REFUSED", e)
        x.copy_(torch.zeros(4, 4))  # host data into a mesh tensor: accepted, not sent
        print("SHAPE", tuple((x + 1).shape), spmd.sharding(x + 1))
        print("ONE", torch.ones(3, device="tpu").sum().item())  # one device still computes
        """
    )
    refused = lines(r.stdout, "REFUSED")
    assert len(refused) == 3, r.stdout
    assert all("compile-only mesh (TORCHTPU_SPMD_COMPILE_ONLY=1)" in ln and "v5e:2x2" in ln for ln in refused)
    assert "SHAPE (4, 4) ((2, 2), (0, -1))" in r.stdout
    assert "ONE 3.0" in r.stdout


def test_a_captured_step_replays_without_running():
    r = run(
        """
        import torch, torchtpu
        from torchtpu import spmd
        from torchtpu.spmd import Replicate, Shard
        mesh = spmd.Mesh((2, 2))
        w = spmd.shard(torch.randn(8, 8), mesh, [Replicate(), Shard(0)]).requires_grad_()
        x = spmd.shard(torch.randn(4, 8), mesh, [Shard(0), Replicate()])
        opt = torch.optim.SGD([w], lr=0.1)
        with torchtpu.eager_mode("fused"):
            g = torch.tpu.TPUGraph()
            with torch.tpu.graph(g):
                loss = (x @ w.t()).square().mean()
                loss.backward()
                opt.step()
            for _ in range(3):
                x.copy_(torch.randn(4, 8))
                g.replay()
        m = torchtpu.metrics()
        print("RAN", m["spmd_programs_run"], "UNRUN", m["spmd_programs_compile_only"])
        print("GRAD", spmd.sharding(w.grad))
        """
    )
    (ran,) = lines(r.stdout, "RAN")
    assert ran.split()[1] == "0" and int(ran.split()[3]) >= 3, ran  # a replay each
    assert "GRAD ((2, 2), (1, -1))" in r.stdout


def test_a_refused_program_raises_even_when_not_strict():
    r = run(
        """
        import torch, torchtpu
        from torchtpu import spmd
        from torchtpu.spmd import Replicate, Shard
        mesh = spmd.Mesh((2, 2))
        x = spmd.shard(torch.zeros(4, 1), mesh, [Shard(0), Replicate()])
        y = x.expand(4, 2**33).contiguous() * 2  # 64 GiB a chip
        try:
            spmd.sharding(y)
        except torch.OutOfMemoryError as e:
            print("OOM", e)
        """,
        TORCHTPU_AOT_STRICT="0",
    )
    assert "OOM a program of 2 ops over 4 devices" in r.stdout and "does not fit in the memory" in r.stdout


def test_without_a_topology_it_says_so():
    r = run(
        """
        import torch, torchtpu
        from torchtpu import spmd
        try:
            spmd.Mesh((2, 2))
        except ValueError as e:
            print("REFUSED", e)
        """,
        topology=None,
    )
    assert "REFUSED a mesh of 4 devices; this process has 1" in r.stdout
    assert "TORCHTPU_SPMD_COMPILE_ONLY=1 compiles programs over a mesh for the TPU topology" in r.stderr
