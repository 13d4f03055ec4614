"""Per-op latency of a small elementwise op on tpu against CPU eager, in one run.

Prints medians over repeated batches and their ratio. No target yet; this is
the number to improve.  Usage: python bench/op_latency.py [--n 64] [--iters 200]
"""
import argparse
import statistics
import time

import torch

import torchtpu


def bench(fn, iters, repeats):
    fn()  # warm-up: compiles once
    fn()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        samples.append((time.perf_counter() - t0) / iters)
    return statistics.median(samples)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    torch.set_num_threads(1)
    x = torch.randn(args.n, args.n)
    y = torch.randn(args.n, args.n)
    xt, yt = x.to("tpu"), y.to("tpu")
    rows = []
    for name, f_cpu, f_tpu in [
        ("add", lambda: x + y, lambda: xt + yt),
        ("mul_scalar", lambda: x * 1.5, lambda: xt * 1.5),
        ("relu", lambda: torch.relu(x), lambda: torch.relu(xt)),
    ]:
        c = bench(f_cpu, args.iters, args.repeats)
        t = bench(f_tpu, args.iters, args.repeats)
        rows.append((name, c, t))
    print(f"platform: {torch.tpu.get_device_name()}  shape: {args.n}x{args.n}  mode: debug (synchronous)")
    print(f"{'op':<12}{'cpu eager us':>14}{'tpu us':>10}{'tpu/cpu':>10}")
    for name, c, t in rows:
        print(f"{name:<12}{c * 1e6:>14.1f}{t * 1e6:>10.1f}{t / c:>10.1f}")
    m = torchtpu.metrics()
    print(f"programs compiled: {m['programs_compiled']}  cache hits: {m['cache_hits']}")


if __name__ == "__main__":
    main()
