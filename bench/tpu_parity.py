"""The training step torchtpu sends one TPU chip, against JAX's, compiled for
the same topology by libtpu (no chip needed): programs per step, flops,
bytes accessed, transcendentals, libtpu's time estimate, per-chip memory and
the TPU compile time until the step is steady, each with its ratio to JAX's;
and the sum of libtpu's per-instruction cycle estimates over each program
(`estimated_cycles` in the optimized programs it dumps), a second figure
beside bytes accessed, which counts VMEM prefetch traffic too and moves with
XLA's memory space assignment for the same math.

The step is bench/spmd_scale.py's GPT (the char_gpt example's architecture,
AdamW) on one device (--layout none), run by it in fresh child processes:
torchtpu in the default mode (fused), captured with torch.tpu.graph (graph),
with torch.compile of the model (compile) and with the compiled model and
optimizer captured (compile-graph); JAX's jax.jit of the same step. bf16: the
forward pass and loss under torch.autocast("tpu", dtype=torch.bfloat16),
against JAX's step with its matrix products in bfloat16 (parameters and
moments float32 in both).

Configurations (--configs, comma separated):
  lm     the issue's small LM: d=128, 4 layers, 4 heads, T=64, batch 8, vocab 256
  gpt    the char_gpt example: d=64, 2 layers, 4 heads, T=32, batch 16, vocab 65
  gpt25  a 25M-parameter GPT: d=512, 8 layers, 8 heads, T=256, batch 8, vocab 65
  tiny   one layer, d=32, T=16, batch 2, vocab 64 (the regression test's)

Usage: python bench/tpu_parity.py [--configs lm,gpt] [--dtypes f32,bf16]
           [--modes fused,graph,compile,compile-graph] [--json out.json]
Figures are libtpu's for the programs the last step launched (a step that
compiled nothing), each counted as often as it was launched.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

CONFIGS = {
    "lm": dict(d=128, layers=4, heads=4, seq=64, batch=8, vocab=256),
    "gpt": dict(d=64, layers=2, heads=4, seq=32, batch=16, vocab=65),
    "gpt25": dict(d=512, layers=8, heads=8, seq=256, batch=8, vocab=65),
    "tiny": dict(d=32, layers=1, heads=4, seq=16, batch=2, vocab=64),  # tests/test_tpu_parity.py
}
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import spmd_scale  # noqa: E402  the children, the totals


def run(cfg, amp, modes, steps, timeout):
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "r.json")
        flags = [f"--{k}={v}" for k, v in cfg.items()]
        cmd = [sys.executable, os.path.join(HERE, "spmd_scale.py"), "--n", "1", "--layout", "none"]
        cmd += ["--modes", modes, "--steps", str(steps), "--timeout", str(timeout), "--json", out, "--cycles", *flags]
        if amp:
            cmd += ["--autocast", "bfloat16"]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode or not os.path.exists(out):
            return {"error": p.stderr[-2000:]}
        return json.load(open(out))["results"][0]


def fmt(v, scale=1.0, digits=1):
    return "-" if v is None else f"{v / scale:,.{digits}f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default="lm,gpt")
    ap.add_argument("--dtypes", default="f32,bf16")
    ap.add_argument("--modes", default="fused,graph,compile,compile-graph")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--timeout", type=int, default=3600)
    ap.add_argument("--json")
    a = ap.parse_args()
    head = (
        "| config | dtype | side | progs/step | GFLOP | MB accessed | transc. M | optimal ms | est. Mcycles | arg MiB "
        "| temp MiB | peak MiB | TPU compile s | flops/JAX | bytes/JAX | cycles/JAX | peak/JAX | compile/JAX |"
    )
    rows, results = [head, "|" + "---|" * (head.count("|") - 1)], []
    for name in a.configs.split(","):
        for dt in a.dtypes.split(","):
            r = run(CONFIGS[name], dt == "bf16", a.modes, a.steps, a.timeout)
            results.append({"config": name, "dtype": dt, "result": r})
            if "error" in r:
                rows.append(f"| {name} | {dt} | error: {r['error'].strip().splitlines()[-1][:120]} |" + " |" * 15)
                continue
            jt = spmd_scale.totals(r["jax"]) if "error" not in r.get("jax", {"error": 1}) else None
            for side in ["jax"] + a.modes.split(","):
                x = r.get(side)
                if x is None:
                    continue
                if "error" in x:
                    rows.append(f"| {name} | {dt} | {side} | error |" + " |" * 14)
                    continue
                t = spmd_scale.totals(x)
                t["compile_all"] = x.get("tpu_compile_s_all", t["compile_seconds"])
                if side == "jax":
                    t["compile_all"] = t["compile_seconds"]
                    jt["compile_all"] = t["compile_all"]
                steady = "" if side == "jax" or x.get("steady") else " (not steady)"
                ratios = " | ".join(
                    f"{t[k] / jt[k]:.2f}" if jt and t.get(k) is not None and jt.get(k) else "-"
                    for k in ("flops", "bytes_accessed", "est_cycles", "peak_bytes", "compile_all")
                )
                opt = t.get("optimal_seconds")
                rows.append(
                    f"| {name} | {dt} | {side}{steady} | {x.get('programs_per_step')} | {fmt(t['flops'], 1e9, 2)} | "
                    f"{fmt(t['bytes_accessed'], 1e6)} | {fmt(t.get('transcendentals'), 1e6, 2)} | "
                    f"{fmt(opt * 1e3 if opt is not None and opt >= 0 else None, 1, 3)} | "
                    f"{fmt(t.get('est_cycles'), 1e6, 3)} | {fmt(t['argument_bytes'], spmd_scale.MIB)} | "
                    f"{fmt(t['temp_bytes'], spmd_scale.MIB)} | "
                    f"{fmt(t['peak_bytes'], spmd_scale.MIB)} | {fmt(t['compile_all'])} | {ratios} |"
                )
            print(rows[-1], file=sys.stderr, flush=True)
    print("\n".join(rows))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
