"""Process start to first training step, with a cold and a warm disk cache.

Runs the GPT example's first step in fresh processes: one with an empty
TORCHTPU_CACHE_DIR (cold: every program compiles), then two that find the
programs on disk (warm). Prints each phase and the ratio of compile time
(XLA compiles, or loads from disk) cold against warm, measured in this run.

Usage: python bench/startup_cache.py [--mode strict|fused|debug]
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import torch, torchtpu
sys.path.insert(0, EXAMPLES)
import char_gpt
torchtpu.eager_mode(MODE)
t1 = time.perf_counter()
tok, data = char_gpt.load_corpus()
model = char_gpt.make_model(tok.vocab_size, seed=0, device="tpu")
opt = char_gpt.make_optimizer(model)
x, y = char_gpt.get_batch(data, 16, 32, torch.Generator().manual_seed(0))
loss = char_gpt.train_step(model, opt, x.to("tpu"), y.to("tpu"))
t2 = time.perf_counter()
m = torchtpu.metrics()
print("RESULT " + json.dumps({"import_s": t1 - t0, "first_step_s": t2 - t1, "loss": loss,
      "compile_s": m["compile_seconds"] + m["disk_load_seconds"], "compiled": m["programs_compiled"],
      "disk_hits": m["disk_cache_hits"]}))
"""


def run(cache, mode):
    here = os.path.dirname(os.path.abspath(__file__))
    code = CHILD.replace("EXAMPLES", repr(os.path.join(here, "..", "examples"))).replace("MODE", repr(mode))
    p = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ, TORCHTPU_CACHE_DIR=cache)
    )
    if p.returncode != 0:
        raise SystemExit(p.stderr[-3000:])
    return json.loads([x for x in p.stdout.splitlines() if x.startswith("RESULT ")][-1][7:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", default="strict")
    args = ap.parse_args()
    cache = tempfile.mkdtemp(prefix="torchtpu-bench-cache-")
    try:
        rows = [("cold", run(cache, args.mode)), ("warm", run(cache, args.mode)), ("warm", run(cache, args.mode))]
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    print(f"mode: {args.mode}")
    print(f"{'cache':<6}{'import s':>10}{'first step s':>14}{'compile s':>11}{'compiled':>10}{'disk hits':>11}")
    for name, r in rows:
        print(
            f"{name:<6}{r['import_s']:>10.2f}{r['first_step_s']:>14.2f}{r['compile_s']:>11.3f}"
            f"{r['compiled']:>10}{r['disk_hits']:>11}"
        )
    cold, warm = rows[0][1], min(r["compile_s"] for _, r in rows[1:])
    print(f"compile phase: cold {cold['compile_s']:.3f} s, warm {warm:.3f} s: {cold['compile_s'] / warm:.1f}x faster")
    assert all(r["loss"] == cold["loss"] for _, r in rows), "warm runs must give the same loss"


if __name__ == "__main__":
    main()
