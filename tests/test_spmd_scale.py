"""bench/spmd_scale.py in its smallest form: a one-layer GPT (d=32, T=16)
over 4 and 8 CPU devices, compiled for v5e:2x2 and v5e:2x4 in fused mode and
as a torch.tpu.graph capture, and on a compile-only mesh of 16 chips
(v5e:4x4, one local device), against JAX's step for the same topology; the
table and the JSON have their fields, every program compiled, the fused and
captured steps are steady at one program over the mesh, and (libtpu's
figures are deterministic) weak scaling holds: per-chip peak memory and
bytes accessed at N=8 and 16 within 1.25x of N=4's, arguments and bytes
accessed within 1.5x of JAX's."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest
from _libtpu import needs_libtpu

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = [
    needs_libtpu,
    pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="jax is not installed"),
]


def test_smallest_config_on_v5e_2x2(tmp_path):
    out = tmp_path / "out.json"
    flags = "--n 4,8,16 --max-n 8 --d 32 --layers 1 --heads 4 --seq 16 --vocab 64 --batch 2 --steps 3 --timeout 240"
    r = subprocess.run(
        [sys.executable, os.path.join(ROOT, "bench", "spmd_scale.py"), *flags.split(), "--json", str(out)],
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    head = next(ln for ln in r.stdout.splitlines() if ln.startswith("| N |"))
    for field in ("progs/step", "arg MiB", "peak MiB", "GFLOP", "TPU compile s", "max RSS MB", "bytes/JAX"):
        assert field in head
    assert sum(ln.startswith("| 4 | v5e:2x2 | 1x4 |") for ln in r.stdout.splitlines()) == 3, r.stdout
    assert sum(ln.startswith("| 8 | v5e:2x4 | 2x4 |") for ln in r.stdout.splitlines()) == 3, r.stdout
    assert sum(ln.startswith("| 16 | v5e:4x4 | 4x4 |") for ln in r.stdout.splitlines()) == 3, r.stdout
    res4, res8, res16 = json.loads(out.read_text())["results"]
    assert not res8["fused"]["compile_only"] and res16["fused"]["compile_only"] and res16["graph"]["compile_only"]
    for res, chips in ((res4, 4), (res8, 8), (res16, 16)):
        jax_p = res["jax"]["programs"][0]
        assert res["jax"]["chips"] == chips and jax_p["flops"] > 0
        for mode in ("fused", "graph"):
            x = res[mode]
            assert "error" not in x, x
            assert x["steady"] and x["programs_per_step"] == 1
            assert x["programs_refused"] == 0 and x["max_rss_mb"] > 0
            (p,) = x["programs"]
            assert p["ok"] and p["partitions"] == chips
            for k in ("argument_bytes", "output_bytes", "temp_bytes", "peak_bytes", "flops", "bytes_accessed"):
                assert p[k] is not None and p[k] >= 0, (k, p)
            assert 0.5 < p["flops"] / jax_p["flops"] < 2
            # the loop reads the loss with the gradients alive: they are outputs of the step
            assert p["output_bytes"] > p["argument_bytes"], (mode, chips, p)
            assert p["argument_bytes"] <= 1.5 * jax_p["argument_bytes"], (mode, chips, p, jax_p)
            assert p["bytes_accessed"] <= 1.5 * jax_p["bytes_accessed"], (mode, chips, p, jax_p)
    for mode in ("fused", "graph"):
        (p4,) = res4[mode]["programs"]
        for res in (res8, res16):
            (pn,) = res[mode]["programs"]
            assert pn["peak_bytes"] <= 1.25 * p4["peak_bytes"], (mode, p4, pn)
            assert pn["bytes_accessed"] <= 1.25 * p4["bytes_accessed"], (mode, p4, pn)


def test_zero_grad_after_the_step_returns_no_gradients(tmp_path):
    """--zero-grad after: opt.zero_grad(set_to_none=True) right after opt.step(), so no
    gradient outlives the step: the step's outputs are the new parameters and moments
    (donated into their own buffers) and the loss, no more than its arguments."""
    out = tmp_path / "out.json"
    flags = "--n 4 --max-n 4 --d 32 --layers 1 --heads 4 --seq 16 --vocab 64 --batch 2 --steps 3 --timeout 240"
    r = subprocess.run(
        [sys.executable, os.path.join(ROOT, "bench", "spmd_scale.py"), *flags.split(), "--zero-grad", "after"]
        + ["--no-jax", "--json", str(out)],
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    (res,) = json.loads(out.read_text())["results"]
    for mode in ("fused", "graph"):
        x = res[mode]
        assert "error" not in x, x
        assert x["steady"] and x["programs_per_step"] == 1
        (p,) = x["programs"]
        assert p["ok"] and p["output_bytes"] <= p["argument_bytes"], (mode, p)
        assert all(v is not None and v == v for v in x["losses"]), x["losses"]
