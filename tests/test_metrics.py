"""Metrics: counters, the report at exit (TORCHTPU_METRICS=1) and the
recompile explainer (TORCHTPU_EXPLAIN_RECOMPILES=1)."""
import os
import subprocess
import sys
import textwrap

import torch

import torchtpu


def _run(code, **env):
    e = dict(os.environ, **env)
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=e, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return p.stderr


def test_counters_move():
    before = torchtpu.metrics()
    x = torch.randn(3, 5, device="tpu")
    (x * 2).cpu()
    after = torchtpu.metrics()
    assert after["ops_dispatched"] >= before["ops_dispatched"] + 2
    assert after["d2h_bytes"] >= before["d2h_bytes"] + 60
    for k in ("cache_hits", "cache_misses", "disk_cache_hits", "disk_cache_misses", "compile_seconds",
              "execute_seconds", "programs_compiled"):
        assert k in after
    assert "programs_compiled" in torchtpu.metrics_report()


def test_report_at_exit():
    err = _run("import torch; (torch.ones(3, device='tpu') + 1).cpu()", TORCHTPU_METRICS="1")
    assert "torchtpu metrics" in err and "programs_compiled" in err
    assert "torchtpu metrics" not in _run("import torch; torch.ones(3, device='tpu')", TORCHTPU_METRICS="0")


def test_explain_recompiles_names_what_differs():
    err = _run("""
        import torch
        a, b = torch.ones(4, 8, device="tpu"), torch.ones(8, 3, device="tpu")
        a @ b; a @ b                                   # same program: no message
        torch.ones(4, 9, device="tpu") @ torch.ones(9, 3, device="tpu")
        a.sum(0); a.sum(1)
        a.double().sum(1)
        a + 1; a + 2.5
    """, TORCHTPU_EXPLAIN_RECOMPILES="1")
    lines = [l for l in err.splitlines() if l.startswith("torchtpu: recompiling")]
    mm = [l for l in lines if "aten::mm" in l]
    assert len(mm) == 1, lines
    assert "self: float32[4, 8] -> float32[4, 9]" in mm[0] and "mat2: float32[8, 3] -> float32[9, 3]" in mm[0]
    assert any("aten::sum.dim_IntList" in l and "dim: [0] -> [1]" in l for l in lines), lines
    assert any("aten::sum.dim_IntList" in l and "self: float32[4, 8] -> float64[4, 8]" in l for l in lines), lines
    assert any("aten::add.Tensor" in l and "other: a Python int -> a Python float" in l for l in lines), lines
    quiet = _run("import torch; a = torch.ones(2, device='tpu'); a + 1; a + 2.5")
    assert "recompiling" not in quiet
