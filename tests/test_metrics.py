"""Metrics: counters, the report at exit (TORCHTPU_METRICS=1) and the
recompile explainer (TORCHTPU_EXPLAIN_RECOMPILES=1)."""

import logging
import os
import re
import subprocess
import sys
import textwrap

import torch

import torchtpu


def _run(code, **env):
    e = dict(os.environ, **env)
    p = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=e, capture_output=True, text=True, timeout=300
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return p.stderr


def test_counters_move():
    before = torchtpu.metrics()
    x = torch.randn(3, 5, device="tpu")
    (x * 2).cpu()
    after = torchtpu.metrics()
    assert after["ops_dispatched"] >= before["ops_dispatched"] + 2
    assert after["d2h_bytes"] >= before["d2h_bytes"] + 60
    for k in (
        "cache_hits",
        "cache_misses",
        "disk_cache_hits",
        "disk_cache_misses",
        "compile_seconds",
        "execute_seconds",
        "programs_compiled",
    ):
        assert k in after
    assert "programs_compiled" in torchtpu.metrics_report()


def test_report_at_exit():
    err = _run("import torch; (torch.ones(3, device='tpu') + 1).cpu()", TORCHTPU_METRICS="1")
    assert "torchtpu metrics" in err and "programs_compiled" in err
    assert "torchtpu metrics" not in _run("import torch; torch.ones(3, device='tpu')", TORCHTPU_METRICS="0")


def test_report_is_grouped_with_units_and_leaves_bookkeeping_out():
    (torch.ones(1000, device="tpu") + 1).cpu()
    text = torchtpu.metrics_report()
    lines = text.splitlines()
    groups = [ln.strip() for ln in lines[1:] if ln.startswith("  ") and not ln.startswith("    ")]
    assert groups[:8] == [
        "ops",
        "programs",
        "disk cache",
        "TPU compile-only target (TORCHTPU_AOT_TOPOLOGY)",
        "execution",
        "memory and transfers",
        "torch.profiler",
        "torch.distributed",
    ]
    assert "fused programs launched, by what launched them" in groups
    # every user-facing counter is there once, with its unit; the core's bookkeeping is not
    m = torchtpu.metrics()
    for key in m:
        hits = [ln for ln in lines if f"({key})" in ln]
        assert len(hits) == (0 if key in ("live_records", "unwind_tables_ignored") else 1) or (
            key.startswith("flushes_") and m[key] == 0 and not hits
        ), key
    seconds = next(ln for ln in lines if "(compile_seconds)" in ln)
    assert seconds.rstrip().endswith(" s")
    d2h = next(ln for ln in lines if "(d2h_bytes)" in ln)  # 4000 bytes or more came back
    assert re.search(r"\(d2h_bytes\)\s+\d+\.\d (KiB|MiB|GiB) \(\d+ B\)$", d2h), d2h
    # a counter no group names is still shown
    from torchtpu import _report

    assert "brand_new_counter" in _report.report(dict(m, brand_new_counter=3))


def test_explain_recompiles_names_what_differs():
    err = _run(
        """
        import torch
        a, b = torch.ones(4, 8, device="tpu"), torch.ones(8, 3, device="tpu")
        a @ b; a @ b                                   # same program: no message
        torch.ones(4, 9, device="tpu") @ torch.ones(9, 3, device="tpu")
        a.sum(0); a.sum(1)
        a.double().sum(1)
        a + 1; a + 2.5
    """,
        TORCHTPU_EXPLAIN_RECOMPILES="1",
    )
    lines = [l for l in err.splitlines() if l.startswith("torchtpu: recompiling")]
    mm = [l for l in lines if "aten::mm" in l]
    assert len(mm) == 1, lines
    assert "self: float32[4, 8] -> float32[4, 9]" in mm[0] and "mat2: float32[8, 3] -> float32[9, 3]" in mm[0]
    assert any("aten::sum.dim_IntList" in l and "dim: [0] -> [1]" in l for l in lines), lines
    assert any("aten::sum.dim_IntList" in l and "self: float32[4, 8] -> float64[4, 8]" in l for l in lines), lines
    assert any("aten::add.Tensor" in l and "other: a Python int -> a Python float" in l for l in lines), lines
    quiet = _run("import torch; a = torch.ones(2, device='tpu'); a + 1; a + 2.5")
    assert "recompiling" not in quiet


def test_fused_recompiles_of_the_same_ops_are_explained():
    # a fused program compiled for the same ops as one compiled before says
    # which part of the key differs: here a foreach call's scalar list, whose
    # items are equal in one step and not in the next, then a tensor the step
    # makes that the caller keeps in one step only
    err = _run(
        """
        import torch, torchtpu
        torchtpu.eager_mode("fused")
        ts = [torch.ones(3, device="tpu") for _ in range(4)]
        x = torch.randn(8, 8, device="tpu")
        kept = []
        def step(vals, keep):
            torch._foreach_mul_(ts, vals)
            y = x * 2 + 1
            if keep:
                kept.append(y)
            return ts[1].sum() + (y @ y).sum()
        for vals, keep in [([0.5] * 4, False)] * 3 + [([0.5, 2.0, 0.5, 0.5], False), ([0.5] * 4, True)]:
            step(vals, keep).item()
            print("step", file=__import__("sys").stderr)
    """,
        TORCHTPU_EXPLAIN_RECOMPILES="1",
        TORCHTPU_CACHE_DIR="",
    )
    lines = [l for l in err.splitlines() if l.startswith("torchtpu: recompiling a fused program") or l == "step"]
    fused = [i for i, l in enumerate(lines) if l != "step"]
    # steps 1 and 2 record the same ops (step 0 also made the tensors): the
    # explained recompiles are those of steps 4 and 5, each before its step ends
    assert len(fused) == 2 and lines[fused[0] + 1 :].count("step") == 2, lines
    assert "torch._foreach_* call are equal differs" in lines[fused[0]], lines
    assert "still held when it runs" in lines[fused[1]] and "foreach" not in lines[fused[1]], lines


def test_compiles_are_logged_to_the_torchtpu_logger(caplog):
    # each compile is a line of the "torchtpu" logger (DEBUG; INFO from a
    # second on): what compiled, its seconds and the cache tiers that missed;
    # a program found in the cache logs nothing
    def run():
        x = torch.arange(37 * 3, dtype=torch.float32, device="tpu").reshape(37, 3)
        return (torch.cos(x) * 5 - x.sum(0)).sum().item()

    with caplog.at_level(logging.DEBUG, logger="torchtpu"):
        with torchtpu.eager_mode("fused"):
            a = run()
        lines = [r for r in caplog.records if r.name == "torchtpu"]
        assert lines and all(r.levelno in (logging.DEBUG, logging.INFO) for r in lines), caplog.text
        assert any(
            re.fullmatch(
                r"compiled a fused program of \d+ ops in \d+\.\d\d s \(not in the memory cache.*\)", r.getMessage()
            )
            for r in lines
        ), [r.getMessage() for r in lines]
        caplog.clear()
        with torchtpu.eager_mode("fused"):
            assert run() == a
        assert [r for r in caplog.records if r.name == "torchtpu"] == []
    with caplog.at_level(logging.WARNING, logger="torchtpu"):
        with torchtpu.eager_mode("strict"):
            torch.tan(torch.ones(41, 5, device="tpu")).cpu()
        assert [r for r in caplog.records if r.name == "torchtpu"] == []  # below the logger's level


def test_an_ops_recompile_is_logged_at_info(caplog):
    # strict mode compiles a program per op: an op's second program (new shapes) says it is a recompile
    with caplog.at_level(logging.INFO, logger="torchtpu"):
        with torchtpu.eager_mode("strict"):
            torch.atan2(torch.ones(43, 7, device="tpu"), torch.ones(43, 7, device="tpu")).cpu()
            caplog.clear()
            torch.atan2(torch.ones(43, 8, device="tpu"), torch.ones(43, 8, device="tpu")).cpu()
    again = [r for r in caplog.records if r.name == "torchtpu" and "aten::atan2" in r.getMessage()]
    assert len(again) == 1 and again[0].levelno == logging.INFO, [r.getMessage() for r in caplog.records]
    assert re.search(r"a recompile: program \d+ of this op, for new shapes", again[0].getMessage())
