"""A training step of the char-GPT example at world size 2 against one process.

Each configuration runs in fresh processes, the configurations alternate over
rounds: one process on the global batch; DDP over two processes, each on half
of it, in strict and fused mode (torchtpu's eager modes); with --fsdp, FSDP2
(fully_shard per block and at the root) the same way. Prints per
configuration the median step time (after warm-up steps), its ratio to the
one-process step, the share of the step spent in collectives (torchtpu.metrics()'s
collective_seconds: staging through the host included), and per step the
collectives, the programs run in fused mode and the flushes.

On the 2-core machines this project is measured on, two processes share the
cores one process has: the ratio is the cost of distributing, not a speed-up.

Usage: python bench/distributed_step.py [--rounds 3] [--steps 20] [--warmup 5] [--fsdp] [--json out.json]
"""

import argparse
import datetime
import json
import os
import socket
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))

BATCH, BLOCK = 16, 32


def _port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank, world, port, config, mode, steps, warmup, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch
    import torch.distributed as dist
    from char_gpt import get_batch, load_corpus, make_model, make_optimizer

    import torchtpu

    torchtpu.eager_mode(mode)
    if world > 1:
        dist.init_process_group(rank=rank, world_size=world, timeout=datetime.timedelta(seconds=300))
    tok, data = load_corpus()
    model = make_model(tok.vocab_size, device="tpu")
    if config == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(model)
    elif config == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("tpu", (world,))
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
    opt = make_optimizer(model)
    gen = torch.Generator().manual_seed(1)
    local = BATCH // world
    times, before = [], None
    for step in range(warmup + steps):
        if step == warmup:
            before = torchtpu.metrics()
        x, y = get_batch(data, BATCH, BLOCK, gen)
        x, y = x[rank * local : (rank + 1) * local].to("tpu"), y[rank * local : (rank + 1) * local].to("tpu")
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        _, loss = model(x, y)
        loss.backward()
        opt.step()
        loss.item()  # the step ends when its loss is on the host
        times.append(time.perf_counter() - t0)
    after = torchtpu.metrics()
    if rank == 0:
        d = {k: after[k] - before[k] for k in after if isinstance(after[k], (int, float))}
        flushes = sum(v for k, v in d.items() if k.startswith("flushes_"))
        with open(out, "w") as f:
            json.dump(
                {
                    "step_ms": statistics.median(times[warmup:]) * 1e3,
                    "collective_share": d["collective_seconds"] / sum(times[warmup:]),
                    "collectives": d["collectives"] / steps,
                    "programs": d["fused_programs_run"] / steps,
                    "flushes": flushes / steps,
                },
                f,
            )
    if world > 1:
        dist.destroy_process_group()


def run(config, mode, steps, warmup):
    import torch.multiprocessing as mp

    world = 1 if config == "single" else 2
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "r.json")
        mp.spawn(worker, args=(world, _port(), config, mode, steps, warmup, out), nprocs=world)
        with open(out) as f:
            return json.load(f)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--fsdp", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    configs = [("single", "strict"), ("ddp", "strict"), ("single", "fused"), ("ddp", "fused")]
    if args.fsdp:
        configs += [("fsdp", "strict"), ("fsdp", "fused")]
    results = {c: [] for c in configs}
    for r in range(args.rounds):
        for c in configs if r % 2 == 0 else configs[::-1]:
            results[c].append(run(*c, args.steps, args.warmup))
        print(f"round {r + 1} done", flush=True)
    print(f"char GPT, global batch {BATCH}x{BLOCK}, medians of {args.rounds} rounds of {args.steps} steps")
    print(
        f"{'configuration':<16}{'step ms':>9}{'vs 1 proc':>10}{'in coll.':>9}{'coll/step':>10}"
        f"{'programs/step':>14}{'flushes/step':>13}"
    )
    table = []
    for (config, mode), runs in results.items():
        row = {k: statistics.median(x[k] for x in runs) for k in runs[0]}
        base = statistics.median(x["step_ms"] for x in results[("single", mode)])
        row.update(config=config, mode=mode, ratio=row["step_ms"] / base)
        table.append(row)
        name = f"{'1 process' if config == 'single' else config.upper() + ' x2'} {mode}"
        print(
            f"{name:<16}{row['step_ms']:>9.1f}{row['ratio']:>10.2f}{row['collective_share']:>9.0%}"
            f"{row['collectives']:>10.1f}{row['programs']:>14.1f}{row['flushes']:>13.1f}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(table, f, indent=1)


if __name__ == "__main__":
    main()
