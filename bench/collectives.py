"""Collective bandwidth on tpu tensors against gloo on CPU tensors, world size 2 or 4.

`--world` processes (spawned here), one group of each kind. For each collective and
size, rounds alternate the two (gloo on CPU tensors first in even rounds, the
tpu group first in odd ones); each timing is `iters` calls followed by a sync
of the device. On the XLA CPU plugin the tpu collective is staged through the
host, gloo reading and writing the device buffers in place: its cost over
gloo's is the sync point, the ranks' comparison of each collective
(TORCHTPU_COLLECTIVE_CHECKS) and, with TORCHTPU_COLLECTIVE_IN_PLACE=0, the
read-back and the write-back. Prints the
median time per call, the bus bandwidth of each (all_reduce moves
2(n-1)/n of the bytes per rank, all_gather (n-1)/n) and the ratio
gloo time / tpu time (1 = staging is free; the target is >= 0.8).

Usage: python bench/collectives.py [--world 2] [--rounds 5] [--sizes 4K,64K,1M,16M,64M] [--json out.json]
"""

import argparse
import datetime
import json
import os
import socket
import statistics
import time

SIZES = {"4K": 4 << 10, "64K": 64 << 10, "1M": 1 << 20, "16M": 16 << 20, "64M": 64 << 20}


def _iters(nbytes):
    return max(3, min(200, (32 << 20) // nbytes))


def rank_main(rank, world, port, sizes, rounds, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch
    import torch.distributed as dist

    import torchtpu  # noqa: F401

    dist.init_process_group(rank=rank, world_size=world, timeout=datetime.timedelta(seconds=300))
    gloo = dist.new_group(backend="gloo")
    rows = []
    for name in sizes:
        nbytes = SIZES[name]
        n = nbytes // 4
        iters = _iters(nbytes)
        cpu = torch.ones(n)
        tpu = torch.ones(n, device="tpu")
        cpu_out = torch.empty(n * world)
        tpu_out = torch.empty(n * world, device="tpu")
        calls = {
            "all_reduce": (lambda: dist.all_reduce(cpu, group=gloo), lambda: dist.all_reduce(tpu)),
            "all_gather": (
                lambda: dist.all_gather_into_tensor(cpu_out, cpu, group=gloo),
                lambda: dist.all_gather_into_tensor(tpu_out, tpu),
            ),
        }
        for coll, (on_cpu, on_tpu) in calls.items():
            on_cpu(), on_tpu()  # warm up: connections, programs
            torch.tpu.synchronize()
            times = {"gloo": [], "tpu": []}
            for r in range(rounds):
                order = (("gloo", on_cpu), ("tpu", on_tpu)) if r % 2 == 0 else (("tpu", on_tpu), ("gloo", on_cpu))
                for kind, call in order:
                    dist.barrier(group=gloo)
                    t0 = time.perf_counter()
                    for _ in range(iters):
                        call()
                    torch.tpu.synchronize()
                    times[kind].append((time.perf_counter() - t0) / iters)
            rows.append({"collective": coll, "size": name, "bytes": nbytes, "iters": iters, **times})
    if rank == 0:
        with open(out, "w") as f:
            json.dump(rows, f)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=2, choices=(2, 4))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--sizes", default="4K,64K,1M,16M,64M")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    sizes = args.sizes.split(",")
    import tempfile

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "rows.json")
        mp.spawn(rank_main, args=(args.world, port, sizes, args.rounds, out), nprocs=args.world)
        with open(out) as f:
            rows = json.load(f)
    world = args.world
    print(f"world size {world}, medians of {args.rounds} alternating rounds")
    print(f"{'collective':<12}{'size':>6}{'gloo ms':>10}{'tpu ms':>10}{'gloo GB/s':>11}{'tpu GB/s':>10}{'ratio':>8}")
    for row in rows:
        g, t = statistics.median(row["gloo"]), statistics.median(row["tpu"])
        factor = 2 * (world - 1) / world if row["collective"] == "all_reduce" else (world - 1) / world
        moved = row["bytes"] * (world if row["collective"] == "all_gather" else 1) * factor
        row.update(gloo_ms=g * 1e3, tpu_ms=t * 1e3, ratio=g / t)
        print(
            f"{row['collective']:<12}{row['size']:>6}{g * 1e3:>10.3f}{t * 1e3:>10.3f}"
            f"{moved / g / 1e9:>11.2f}{moved / t / 1e9:>10.2f}{g / t:>8.2f}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
