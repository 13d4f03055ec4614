"""Per-op latency of small elementwise ops on tpu against CPU eager, in one
run, in each eager mode: debug (each op runs to completion), strict (each op
launched asynchronously; a sync after each batch) and fused (each op recorded;
one program per batch at the sync).

Prints medians over repeated batches and the ratio to CPU eager; for fused
mode also the host's part alone (recording the ops, without the sync that
runs their program).
Usage: python bench/op_latency.py [--n 64] [--iters 200]
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


def bench_synced(fn, iters, repeats):
    """Like bench, keeping every result alive until a device sync at the end
    of each batch (counted): fused mode computes only values still held.
    Returns the median per-op time with the sync, and without it (the host's
    part: dispatching, and recording or launching)."""
    fn()
    torch.tpu.synchronize()
    samples, host = [], []
    for _ in range(repeats):
        kept = []
        t0 = time.perf_counter()
        for _ in range(iters):
            kept.append(fn())
        t1 = time.perf_counter()
        torch.tpu.synchronize()
        samples.append((time.perf_counter() - t0) / iters)
        host.append((t1 - t0) / iters)
    return statistics.median(samples), statistics.median(host)


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
        per_mode = []
        for mode in ("debug", "strict", "fused"):
            with torchtpu.eager_mode(mode):
                total, host = bench_synced(f_tpu, args.iters, args.repeats)
                per_mode.append(total)
        per_mode.append(host)  # fused mode's recording alone (its program runs at the sync)
        rows.append((name, c, per_mode))
    print(f"platform: {torch.tpu.get_device_name()}  shape: {args.n}x{args.n}")
    cols = ("debug", "strict", "fused", "fused host")
    print(f"{'op':<12}{'cpu eager us':>14}" + "".join(f"{m + ' us':>15}{'/cpu':>6}" for m in cols))
    for name, c, ts in rows:
        print(f"{name:<12}{c * 1e6:>14.1f}" + "".join(f"{t * 1e6:>15.1f}{t / c:>6.1f}" for t in ts))
    print("fused host: the recording alone, without the sync that runs the batch's program")
    m = torchtpu.metrics()
    print(
        f"programs compiled: {m['programs_compiled']} (disk cache hits {m['disk_cache_hits']})  "
        f"fused programs run: {m['fused_programs_run']}"
    )


if __name__ == "__main__":
    main()
