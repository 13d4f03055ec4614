"""bench/tpu_parity.py on its tiny config (one GPT layer, d=32, T=16): the
default mode's and the captured step's programs compiled for v5e:1x1 beside
JAX's step, each one program a step, and HBM bytes accessed (libtpu's cost
analysis: deterministic for a given libtpu, so not a timing test) not more
than 1.10x the figure committed in bench/tpu_bytes.json for that libtpu;
libtpu's summed cycle estimates are read for every program."""

import importlib.metadata
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
FIGURES = json.load(open(os.path.join(ROOT, "bench", "tpu_bytes.json")))


def test_tiny_step_bytes_do_not_regress(tmp_path):
    out = tmp_path / "out.json"
    r = subprocess.run(
        [sys.executable, os.path.join(ROOT, "bench", "tpu_parity.py"), "--configs", "tiny", "--dtypes", "f32"]
        + ["--modes", "fused,graph", "--steps", "3", "--timeout", "300", "--json", str(out)],
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "| tiny | f32 | graph | 1 |" in r.stdout and "| tiny | f32 | fused | 1 |" in r.stdout, r.stdout
    (res,) = json.loads(out.read_text())
    got, cycles = {}, {}
    for side in ("jax", "fused", "graph"):
        x = res["result"][side]
        assert "error" not in x, x
        progs = x["programs"]
        assert progs and all(p["ok"] for p in progs)
        got[side] = sum(p["bytes_accessed"] * (p.get("launches") or 1) for p in progs)
        # libtpu's cycle estimates, read from the programs it dumped
        assert all(isinstance(p.get("est_cycles"), int) and p["est_cycles"] > 0 for p in progs), progs
        cycles[side] = sum(p["est_cycles"] * (p.get("launches") or 1) for p in progs)
        assert x["programs_per_step"] == 1, (side, x["programs_per_step"])
    assert got["graph"] < 2 * got["jax"] and got["fused"] < 2 * got["jax"], got
    assert cycles["graph"] < 2 * cycles["jax"] and cycles["fused"] < 2 * cycles["jax"], cycles
    version = importlib.metadata.version("libtpu")
    if version != FIGURES["libtpu"]:
        pytest.skip(f"bench/tpu_bytes.json holds figures of libtpu {FIGURES['libtpu']}, this is {version}")
    assert got["jax"] == FIGURES["bytes_accessed"]["jax"], got  # the reference itself is deterministic
    for mode in ("fused", "graph"):
        assert got[mode] <= 1.10 * FIGURES["bytes_accessed"][mode], (mode, got[mode], FIGURES["bytes_accessed"])
