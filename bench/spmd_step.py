"""Programs over several devices of one process (TORCHTPU_NUM_DEVICES=4, CPU plugin).

Three measures, each a ratio against a baseline measured in the same run, in
fresh processes that alternate over the rounds:

  step       the char-GPT training step (examples/spmd_gpt.py, fused mode) laid
             over 4 devices (data parallel, and 2x2 data x tensor parallel)
             against the same step on one device: the first step's seconds
             (the compile included), the steady step's, and the programs per
             step.
  allreduce  one all_reduce of 4 tensors (one per device) as an in-program
             collective (torchtpu.replicas, one program over 4 replicas)
             against the host-staged route (read the 4 back, sum on the host,
             write the sum to each device), for the same bytes.
  memory     bytes per device of the model's parameters laid out FSDP-style
             (every parameter split along dim 0 where it divides by 4) against
             replicated, and the peak per device over 3 training steps.

On 2 shared cores the devices share the cores: the step times show the cost
of partitioning, not a speed-up.

Usage: python bench/spmd_step.py [--rounds 3] [--steps 10] [--json out.json]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def child_step(kind, steps):
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import spmd_gpt
    import torch

    import torchtpu

    t0 = time.perf_counter()
    model, optimizer, mesh, data = spmd_gpt.setup(kind, 0)
    gen = torch.Generator().manual_seed(1)
    times, programs = [], []
    with torchtpu.eager_mode("fused"):
        for _ in range(steps):
            x, y = spmd_gpt.get_batch(data, 16, model.cfg.block_size, gen)
            before = torchtpu.metrics()
            s = time.perf_counter()
            x, y = (spmd_gpt.batch_on(mesh, x), spmd_gpt.batch_on(mesh, y)) if mesh else (x.to("tpu"), y.to("tpu"))
            spmd_gpt.train_step(model, optimizer, x, y)
            times.append(time.perf_counter() - s)
            after = torchtpu.metrics()
            programs.append(after["fused_programs_run"] - before["fused_programs_run"])
    return {
        "first_s": times[0] + (time.perf_counter() - t0 - sum(times)),
        "step_ms": statistics.median(times[steps // 2 :]) * 1e3,
        "programs_per_step": statistics.median(programs[1:]),
        "compile_s": torchtpu.metrics()["compile_seconds"],
    }


def child_allreduce(sizes):
    import torch

    import torchtpu  # noqa: F401
    from torchtpu import replicas

    out = {}
    for nbytes in sizes:
        n = nbytes // 4
        ts = [torch.full((n,), float(i + 1), device=f"tpu:{i}") for i in range(4)]
        iters = max(3, min(100, (16 << 20) // nbytes))

        def in_program():
            return replicas.all_reduce(ts)

        def host_staged():
            total = sum(t.cpu() for t in ts)
            return [total.to(f"tpu:{i}") for i in range(4)]

        res = {}
        for name, fn in (("in_program", in_program), ("host_staged", host_staged)):
            r = fn()
            assert torch.equal(r[3].cpu(), torch.full((n,), 10.0))
            samples = []
            for _ in range(3):
                torch.tpu.synchronize()
                s = time.perf_counter()
                for _ in range(iters):
                    r = fn()
                r[0].cpu()
                samples.append((time.perf_counter() - s) / iters)
            res[name] = statistics.median(samples) * 1e3
        out[str(nbytes)] = res
    return out


def child_memory():
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import spmd_gpt
    import torch

    import torchtpu
    from torchtpu import spmd
    from torchtpu.spmd import Replicate, Shard

    res = {}
    for layout in ("replicated", "fsdp"):
        base = [torch.tpu.memory_allocated(i) for i in range(4)]
        tok, data = spmd_gpt.load_corpus()
        model = spmd_gpt.make_model(tok.vocab_size, seed=0, device="tpu")
        mesh = spmd.Mesh((4,), ("dp",))
        for p in model.parameters():
            split = layout == "fsdp" and p.dim() >= 1 and p.shape[0] % 4 == 0
            spmd.shard_(p, mesh, [Shard(0)] if split else [Replicate()])
        params = [torch.tpu.memory_allocated(i) - b for i, b in zip(range(4), base)]
        optimizer = spmd_gpt.make_optimizer(model)
        gen = torch.Generator().manual_seed(1)
        torch.tpu.reset_peak_memory_stats()
        with torchtpu.eager_mode("fused"):
            for _ in range(3):
                x, y = spmd_gpt.get_batch(data, 16, model.cfg.block_size, gen)
                spmd_gpt.train_step(model, optimizer, spmd_gpt.batch_on(mesh, x), spmd_gpt.batch_on(mesh, y))
        peaks = [torch.tpu.max_memory_allocated(i) - b for i, b in zip(range(4), base)]
        res[layout] = {"param_bytes": params, "peak_bytes": peaks}
        del model, optimizer
    return res


def run_child(args):
    env = dict(os.environ, TORCHTPU_NUM_DEVICES="4")
    p = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(args)], env=env, capture_output=True, text=True, timeout=1800
    )
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    if not lines:
        raise SystemExit(f"child {args} failed:\n{p.stderr[-3000:]}")
    return json.loads(lines[-1][7:])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--sizes", default="65536,1048576,16777216")
    ap.add_argument("--json")
    ap.add_argument("--child")
    a = ap.parse_args()
    if a.child:
        spec = json.loads(a.child)
        what = spec["what"]
        if what == "step":
            r = child_step(spec["kind"], spec["steps"])
        elif what == "allreduce":
            r = child_allreduce(spec["sizes"])
        else:
            r = child_memory()
        print("RESULT " + json.dumps(r))
        return

    sizes = [int(s) for s in a.sizes.split(",")]
    steps = {k: [] for k in ("one", "dp", "2x2")}
    allreduce = []
    for rnd in range(a.rounds):
        order = ["one", "dp", "2x2"] if rnd % 2 == 0 else ["2x2", "dp", "one"]
        for kind in order:
            steps[kind].append(run_child({"what": "step", "kind": kind, "steps": a.steps}))
        allreduce.append(run_child({"what": "allreduce", "sizes": sizes}))
    memory = run_child({"what": "memory"})

    def med(rows, key):
        return statistics.median(r[key] for r in rows)

    print("step (fused mode, medians over rounds)")
    print(f"{'layout':8} {'first s':>8} {'x one':>6} {'step ms':>8} {'x one':>6} {'programs':>9}")
    one_first, one_step = med(steps["one"], "first_s"), med(steps["one"], "step_ms")
    report = {"step": {}, "allreduce": {}, "memory": memory}
    for kind in ("one", "dp", "2x2"):
        f, s, p = med(steps[kind], "first_s"), med(steps[kind], "step_ms"), med(steps[kind], "programs_per_step")
        print(f"{kind:8} {f:8.2f} {f / one_first:6.2f} {s:8.1f} {s / one_step:6.2f} {p:9.1f}")
        report["step"][kind] = {"first_s": f, "step_ms": s, "programs_per_step": p}
    print("\nall_reduce of 4 tensors (ms a call, medians over rounds)")
    print(f"{'bytes':>10} {'in-program':>11} {'host-staged':>12} {'staged/in':>10}")
    for nb in sizes:
        i = statistics.median(r[str(nb)]["in_program"] for r in allreduce)
        h = statistics.median(r[str(nb)]["host_staged"] for r in allreduce)
        print(f"{nb:10d} {i:11.3f} {h:12.3f} {h / i:10.2f}")
        report["allreduce"][nb] = {"in_program_ms": i, "host_staged_ms": h}
    print("\nmemory per device (bytes; parameters, and the peak over 3 steps)")
    for layout, r in memory.items():
        print(f"{layout:10} params {r['param_bytes']}  peak {r['peak_bytes']}")
    rp, fp = memory["replicated"]["param_bytes"][0], memory["fsdp"]["param_bytes"][0]
    rk, fk = memory["replicated"]["peak_bytes"][0], memory["fsdp"]["peak_bytes"][0]
    print(f"fsdp/replicated: parameters {fp / rp:.2f}, peak {fk / rk:.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
