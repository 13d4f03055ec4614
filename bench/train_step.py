"""Training-step time and peak memory of the MLP and GPT examples: CPU eager
against tpu in debug, strict and fused modes (and, with --compile, torch.compile
with backend "tpu" against Inductor on CPU), each in a fresh process, all in
one run. Prints median step times, their ratios, peak resident memory (and its
ratio to CPU eager), and, with --long N, whether resident memory stays flat
over N fused GPT steps.

Usage: python bench/train_step.py [--steps 30] [--long 2000] [--compile]
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))


def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def child(example, device, mode, steps, long_steps):
    import torch

    import torchtpu

    compiled = mode in ("compiled", "inductor")
    if device == "tpu" and not compiled:
        torchtpu.eager_mode(mode)
    import torch.nn.functional as F

    import char_gpt
    import mlp_mnist

    if example == "gpt":
        tok, data = char_gpt.load_corpus()
        model = char_gpt.make_model(tok.vocab_size, seed=0, device=device)
        opt = char_gpt.make_optimizer(model)
        run = torch.compile(model, backend="tpu" if device == "tpu" else "inductor") if compiled else model
        g = torch.Generator().manual_seed(0)

        def step():
            x, y = char_gpt.get_batch(data, 16, 32, g)
            return char_gpt.train_step(run, opt, x.to(device, non_blocking=True), y.to(device, non_blocking=True))
    else:
        images, labels = mlp_mnist.synthetic_mnist(num_samples=64 * 16, seed=1)
        torch.manual_seed(0)
        model = mlp_mnist.MLP().to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        run = torch.compile(model, backend="tpu" if device == "tpu" else "inductor") if compiled else model
        batches = [(images[i:i + 64], labels[i:i + 64]) for i in range(0, len(images), 64)]
        state = {"i": 0}

        def step():
            x, y = batches[state["i"] % len(batches)]
            state["i"] += 1
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(run(x), y)
            loss.backward()
            opt.step()
            return loss.item()
    times, rss = [], []
    total = steps + 5 + long_steps
    for i in range(total):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
        if long_steps and i in (200, total - 1):
            rss.append(rss_mb())
    m = torchtpu.metrics() if device == "tpu" else {}
    out = {
        "step_ms": statistics.median(times[5:5 + steps]) * 1e3,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "programs_compiled": m.get("programs_compiled"),
        "fused_programs_run": m.get("fused_programs_run"),
        "rss_after_warmup_mb": rss[0] if rss else None,
        "rss_end_mb": rss[-1] if rss else None,
    }
    print("RESULT " + json.dumps(out))


def run(example, device, mode, steps, long_steps=0):
    cmd = [sys.executable, os.path.abspath(__file__), "--child", example, device, mode, str(steps), str(long_steps)]
    env = dict(os.environ, TORCHTPU_CACHE_DIR=os.environ.get("TORCHTPU_CACHE_DIR", ""))
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        raise SystemExit(f"{example} {device} {mode} failed:\n{p.stderr[-3000:]}")
    line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line[7:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--long", type=int, default=0, help="also run this many fused GPT steps and check RSS")
    ap.add_argument("--compile", action="store_true", help="also torch.compile: backend tpu, and inductor on CPU")
    ap.add_argument("--child", nargs=5)
    args = ap.parse_args()
    if args.child:
        ex, dev, mode, steps, long_steps = args.child
        return child(ex, dev, mode, int(steps), int(long_steps))
    print(f"{'example':<8}{'config':<14}{'step ms':>9}{'vs cpu':>8}{'peak RSS MB':>13}{'vs cpu':>8}{'compiled':>10}")
    for ex in ("mlp", "gpt"):
        rows = {"cpu eager": run(ex, "cpu", "-", args.steps)}
        if args.compile:
            rows["cpu inductor"] = run(ex, "cpu", "inductor", args.steps)
        for mode in ("debug", "strict", "fused") + (("compiled",) if args.compile else ()):
            rows[f"tpu {mode}"] = run(ex, "tpu", mode, args.steps)
        cpu = rows["cpu eager"]
        for name, r in rows.items():
            print(f"{ex:<8}{name:<14}{r['step_ms']:>9.2f}{r['step_ms'] / cpu['step_ms']:>8.2f}"
                  f"{r['peak_rss_mb']:>13.0f}{r['peak_rss_mb'] / cpu['peak_rss_mb']:>8.2f}"
                  f"{'' if r['programs_compiled'] is None else r['programs_compiled']:>10}")
        s, f = rows["tpu strict"]["step_ms"], rows["tpu fused"]["step_ms"]
        print(f"{ex:<8}fused is {s / f:.2f}x faster than strict")
        if args.compile:
            c = rows["tpu compiled"]["step_ms"]
            print(f"{ex:<8}compiled is {s / c:.2f}x faster than strict; CPU inductor / tpu compiled: "
                  f"{rows['cpu inductor']['step_ms'] / c:.2f}")
    if args.long:
        r = run("gpt", "tpu", "fused", args.steps, args.long)
        grow = (r["rss_end_mb"] - r["rss_after_warmup_mb"]) / r["rss_after_warmup_mb"] * 100
        print(f"gpt fused, {args.long} more steps: RSS {r['rss_after_warmup_mb']:.0f} MB after 200 steps, "
              f"{r['rss_end_mb']:.0f} MB at the end ({grow:+.1f}%)")


if __name__ == "__main__":
    main()
