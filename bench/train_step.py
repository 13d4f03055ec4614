"""Training-step time and peak memory of the MLP, GPT and ResNet examples:
CPU eager against tpu in the default mode (no setting: fused), debug, strict
and fused modes, and with --compile,
torch.compile: the model with backend "tpu" ("compiled"), the model and the
optimizer step (clipping and a capturable optimizer, one graph) ("compiled
step"), Inductor on CPU, and for the GPT the same model in JAX, jax.jit-ed on
the same PJRT plugin as torchtpu (bench/jax_gpt.py, run with the bench environment's
interpreter: make bench-setup). Each configuration runs in a fresh process,
all in one run. "graph" captures the whole step once with torch.tpu.graph
(torch.cuda.graph's interface) after three warm-up steps and replays it on
each batch; "compiled-graph" does the same with the compiled model and
update. Prints median step times, their ratios, the time of the first three
steps (compiles included: the cold start; for "graph" and "compiled-graph" the
three warm-up steps and the capture), peak resident memory (and its
ratio to CPU eager), against JAX when it runs, and, with --long N, whether resident memory
stays flat over N fused GPT steps. The GPT also runs a loop that reads the
loss back every 10 steps instead of every step ("/read10" rows): in fused
mode each optimizer step launches its program without waiting, so the host
records the next step while the last one runs.

Usage: python bench/train_step.py [--steps 30] [--long 2000] [--compile] [--examples gpt,resnet] [--rounds 5]
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


def _cycle(images, labels, size):
    """A function returning the next batch of size, cycling over the data."""
    batches = [(images[i : i + size], labels[i : i + size]) for i in range(0, len(images), size)]
    state = {"i": 0}

    def batch():
        state["i"] += 1
        return batches[state["i"] % len(batches)]

    return batch


def child(example, device, mode, steps, long_steps):
    import torch

    import torchtpu

    # "<mode>/read10": the loop reads the loss back every 10 steps instead of
    # every step (as training loops that log every N steps do); the step time
    # is then that of blocks of 10 steps, each ending with the read.
    mode, ab, _ = mode.partition("/checks-ab")
    mode, _, reads = mode.partition("/read")
    read_every = int(reads) if reads else 1
    compiled = mode in ("compiled", "compiled-step", "compiled-graph", "inductor")
    graphed = mode in ("graph", "compiled-graph")
    if device == "tpu" and not compiled and not graphed and mode != "default":
        torchtpu.eager_mode(mode)  # "default": the mode a user gets without asking
    import char_gpt
    import mlp_mnist
    import resnet_cifar
    import torch.nn.functional as F

    backend = "tpu" if device == "tpu" else "inductor"
    if example == "gpt":
        tok, data = char_gpt.load_corpus()
        model = char_gpt.make_model(tok.vocab_size, seed=0, device=device)
        clip = 1.0
        opt = char_gpt.make_optimizer(model, capturable=mode in ("compiled-step", "graph", "compiled-graph"))
        g = torch.Generator().manual_seed(0)

        def batch():
            return char_gpt.get_batch(data, 16, 32, g)

        def loss_of(run, x, y):
            return run(x, y)[1]
    elif example == "resnet":
        images, labels = resnet_cifar.synthetic_cifar(num_samples=32 * 8, seed=1)
        torch.manual_seed(0)
        model = resnet_cifar.ResNet().to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9, weight_decay=5e-4)
        clip = 2.0
        batch = _cycle(images, labels, 32)
    else:
        images, labels = mlp_mnist.synthetic_mnist(num_samples=64 * 16, seed=1)
        torch.manual_seed(0)
        model = mlp_mnist.MLP().to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        clip = None
        batch = _cycle(images, labels, 64)
    if example != "gpt":

        def loss_of(run, x, y):
            return F.cross_entropy(run(x), y)

    run = torch.compile(model, backend=backend) if compiled else model
    params = list(model.parameters())

    def update():
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(params, clip)
        opt.step()

    if mode in ("compiled-step", "compiled-graph"):
        update = torch.compile(update, backend=backend)

    if graphed:
        # torch.tpu.graph (torch.cuda.graph's interface): the whole step
        # captured once after warm-up steps, then replayed on new batches
        # copied into the captured input tensors
        sx, sy = (t.to(device) for t in batch())

        def captured():
            loss = loss_of(run, sx, sy)
            loss.backward()
            update()
            return loss

        t_warm = time.perf_counter()
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            captured().item()
        graph = torch.tpu.TPUGraph()
        opt.zero_grad(set_to_none=True)
        with torch.tpu.graph(graph):
            static_loss = captured()
        # the cold start of a captured step: its three warm-up steps (where
        # the programs compile) and the capture, not the replays after them
        warm_s = time.perf_counter() - t_warm

        def step(read=True):
            x, y = batch()
            sx.copy_(x)
            sy.copy_(y)
            graph.replay()
            return static_loss.item() if read else static_loss
    else:
        step = None
        warm_s = None

    def eager_step(read=True):
        x, y = batch()
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        opt.zero_grad(set_to_none=True)
        loss = loss_of(run, x, y)
        loss.backward()
        update()
        return loss.item() if read else loss

    step = step or eager_step
    times, rss = [], []
    total = steps + 5 + long_steps
    first = []  # resident memory at the start of the first steps (their programs compile inside them)
    for i in range(total):
        if i < 3:
            first.append(rss_mb())
        if ab:
            torchtpu._C.value_checks(i % 2 == 0)  # alternate: even steps checked, odd steps not
        t0 = time.perf_counter()
        for k in range(read_every):
            step(read=k == read_every - 1)
        times.append((time.perf_counter() - t0) / read_every)
        if long_steps and i in (200, total - 1):
            rss.append(rss_mb())
    m = torchtpu.metrics() if device == "tpu" else {}
    out = {
        "step_ms": statistics.median(times[5 : 5 + steps]) * 1e3,
        # the first three steps, compiles included (graph modes: the warm-up and the capture)
        "first_step_s": warm_s if graphed else sum(times[:3]),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "programs_compiled": m.get("programs_compiled"),
        "fused_programs_run": m.get("fused_programs_run"),
        "rss_first_steps_mb": first,
        "rss_after_warmup_mb": rss[0] if rss else None,
        "rss_end_mb": rss[-1] if rss else None,
    }
    if ab:
        pairs = [times[i] / times[i + 1] for i in range(6, len(times) - 1, 2)]
        out["checks_ratio"] = statistics.median(pairs)
        out["checks_ratio_range"] = [min(pairs), max(pairs)]
    print("RESULT " + json.dumps(out))


def run(example, device, mode, steps, long_steps=0, **env_extra):
    cmd = [sys.executable, os.path.abspath(__file__), "--child", example, device, mode, str(steps), str(long_steps)]
    env = dict(os.environ, TORCHTPU_CACHE_DIR=os.environ.get("TORCHTPU_CACHE_DIR", ""), **env_extra)
    return _result(subprocess.run(cmd, capture_output=True, text=True, env=env), f"{example} {device} {mode}")


def _result(p, what):
    if p.returncode != 0:
        raise SystemExit(f"{what} failed:\n{p.stderr[-3000:]}")
    line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line[7:])


def jax_python():
    """The bench environment's interpreter, when it has jax (make bench-setup)."""
    py = os.environ.get("TORCHTPU_BENCH_PYTHON") or os.path.join(HERE, "..", ".venv-bench", "bin", "python")
    if os.path.exists(py) and subprocess.run([py, "-c", "import jax"], capture_output=True).returncode == 0:
        return py
    return None


def _jax_run(jax_py, steps, *extra):
    p = subprocess.run(
        [jax_py, os.path.join(HERE, "jax_gpt.py"), "--steps", str(steps), *extra], capture_output=True, text=True
    )
    return _result(p, "jax gpt")


def rounds(ex, steps, n, jax_py=None, compiled=False):
    """Configurations in alternating fresh processes, n times: strict and the
    default mode; for the GPT with a bench environment, JAX; with --compile,
    torch.compile alone and the compiled step captured with torch.tpu.graph.
    On a shared machine one round can land in a quiet or a busy moment, so
    each ratio is quoted as the median of the rounds'."""
    names = ["strict", "default"] + (["compiled", "compiled-graph"] if compiled else [])
    ratios = {}

    def note(key, value):
        ratios.setdefault(key, []).append(value)

    for i in range(n):
        r = {name: run(ex, "tpu", name, steps) for name in names}
        if jax_py and ex == "gpt":
            r["jax"] = _jax_run(jax_py, steps)
        s, d = r["strict"]["step_ms"], r["default"]["step_ms"]
        note("default (fused) faster than strict", s / d)
        line = f"{ex:<8}round {i + 1}: strict {s:.2f} ms, default {d:.2f} ms"
        if "jax" in r:
            j = r["jax"]
            note("default step / JAX step", d / j["step_ms"])
            note("default first three steps / JAX's", r["default"]["first_step_s"] / j["first_step_s"])
            note("default peak RSS / JAX's", r["default"]["peak_rss_mb"] / j["peak_rss_mb"])
            line += f", JAX {j['step_ms']:.2f} ms"
        if compiled:
            c, g = r["compiled"]["step_ms"], r["compiled-graph"]["step_ms"]
            note("compiled alone / compiled-graph", c / g)
            line += f", compiled {c:.2f} ms, compiled-graph {g:.2f} ms"
            if "jax" in r:
                note("compiled alone / JAX step", c / r["jax"]["step_ms"])
                for name in ("strict", "compiled", "compiled-graph"):
                    note(f"{name} first three steps / JAX's", r[name]["first_step_s"] / r["jax"]["first_step_s"])
                    note(f"{name} peak RSS / JAX's", r[name]["peak_rss_mb"] / r["jax"]["peak_rss_mb"])
        print(line)
    for key, v in ratios.items():
        print(f"{ex:<8}{key}: {statistics.median(v):.2f} (median of {n} rounds; {min(v):.2f}-{max(v):.2f})")


def check_ab(ex, steps, modes=("strict", "fused")):
    """What the value checks cost, in one process: steps alternate with the
    checks on and off (both programs cached), and the median of the ratios
    of neighbouring steps is quoted (a busy moment of a shared machine
    slows both steps of a pair)."""
    for mode in modes:
        r = run(ex, "tpu", mode + "/checks-ab", steps)
        lo, hi = r["checks_ratio_range"]
        print(
            f"{ex:<8}{mode}: value checks cost {100 * (r['checks_ratio'] - 1):+.1f}% (median of {steps // 2} "
            f"pairs of neighbouring steps; {lo:.3f}-{hi:.3f}x)"
        )


def check_rounds(ex, steps, n, modes=("strict", "fused")):
    """What the value checks cost: each mode with TORCHTPU_VALUE_CHECKS on and
    off in alternating fresh processes, n times; the median of the pairs'
    ratios (on / off)."""
    for mode in modes:
        ratios = []
        for i in range(n):
            on = run(ex, "tpu", mode, steps, TORCHTPU_VALUE_CHECKS="1")["step_ms"]
            off = run(ex, "tpu", mode, steps, TORCHTPU_VALUE_CHECKS="0")["step_ms"]
            ratios.append(on / off)
            print(f"{ex:<8}{mode} round {i + 1}: checks on {on:.2f} ms, off {off:.2f} ms, {on / off:.3f}x")
        print(
            f"{ex:<8}{mode}: value checks cost {100 * (statistics.median(ratios) - 1):+.1f}% "
            f"(median of {n} rounds; {min(ratios):.3f}-{max(ratios):.3f}x)"
        )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--long", type=int, default=0, help="also run this many fused GPT steps and check RSS")
    ap.add_argument(
        "--compile",
        action="store_true",
        help="also torch.compile (backend tpu, model and whole step), inductor on CPU, and JAX",
    )
    ap.add_argument("--examples", default="mlp,gpt,resnet")
    ap.add_argument(
        "--rounds",
        type=int,
        default=0,
        help="then this many more rounds of strict and fused, alternating (noisy machines)",
    )
    ap.add_argument("--child", nargs=5)
    ap.add_argument(
        "--check-ab",
        action="store_true",
        help="the GPT step with value checks on and off in alternate steps of one process",
    )
    ap.add_argument(
        "--check-rounds",
        type=int,
        default=0,
        help="the GPT step with value checks on and off, strict and fused, in N alternating rounds",
    )
    args = ap.parse_args()
    if args.child:
        ex, dev, mode, steps, long_steps = args.child
        return child(ex, dev, mode, int(steps), int(long_steps))
    if args.check_rounds:
        return check_rounds("gpt", args.steps, args.check_rounds)
    if args.check_ab:
        return check_ab("gpt", args.steps)
    jax_py = jax_python() if args.compile else None
    if args.compile and not jax_py:
        print("jax: not in a bench environment (make bench-setup); the JAX row is left out")
    print(
        f"{'example':<8}{'config':<26}{'step ms':>9}{'vs cpu':>8}{'first3 s':>9}{'peak RSS MB':>13}{'vs cpu':>8}"
        f"{'compiled':>10}"
    )
    for ex in args.examples.split(","):
        rows = {"cpu eager": run(ex, "cpu", "-", args.steps)}
        if args.compile:
            rows["cpu inductor"] = run(ex, "cpu", "inductor", args.steps)
            if ex == "gpt" and jax_py:
                rows["jax jit"] = _jax_run(jax_py, args.steps)
        for mode in ("default", "debug", "strict", "fused", "graph") + (
            ("compiled", "compiled-step", "compiled-graph") if args.compile else ()
        ):
            rows[f"tpu {mode}"] = run(ex, "tpu", mode, args.steps)
        if ex == "gpt":
            blocks = max(args.steps // 5, 4)
            rows["cpu eager/read10"] = run(ex, "cpu", "eager/read10", blocks)
            if jax_py:
                rows["jax jit/read10"] = _jax_run(jax_py, blocks, "--read-every", "10")
            for mode in ("strict", "fused", "graph") + (("compiled-step", "compiled-graph") if args.compile else ()):
                rows[f"tpu {mode}/read10"] = run(ex, "tpu", f"{mode}/read10", blocks)
        cpu = rows["cpu eager"]
        for name, r in rows.items():
            print(
                f"{ex:<8}{name:<26}{r['step_ms']:>9.2f}{r['step_ms'] / cpu['step_ms']:>8.2f}"
                f"{r.get('first_step_s', float('nan')):>9.2f}"
                f"{r['peak_rss_mb']:>13.0f}{r['peak_rss_mb'] / cpu['peak_rss_mb']:>8.2f}"
                f"{'' if r['programs_compiled'] is None else r['programs_compiled']:>10}"
            )
        if "jax jit" in rows:
            j = rows["jax jit"]
            for name in ("default", "strict", "fused", "graph") + (
                ("compiled", "compiled-step", "compiled-graph") if args.compile else ()
            ):
                r = rows[f"tpu {name}"]
                print(
                    f"{ex:<8}tpu {name} against JAX: step {r['step_ms'] / j['step_ms']:.2f}x, first three steps "
                    f"{r['first_step_s'] / j['first_step_s']:.2f}x, peak RSS {r['peak_rss_mb'] / j['peak_rss_mb']:.2f}x"
                )
        if args.compile:
            c, g = rows["tpu compiled"]["step_ms"], rows["tpu compiled-graph"]["step_ms"]
            print(f"{ex:<8}tpu compiled alone: {c / g:.2f}x the compiled step captured with torch.tpu.graph")
        fr = rows["tpu fused"]
        at = " -> ".join(f"{x:.0f}" for x in fr["rss_first_steps_mb"])
        print(
            f"{ex:<8}tpu fused: resident MB at the start of steps 1-3 {at}; peak {fr['peak_rss_mb']:.0f} "
            f"(the step's program compiles inside step 2)"
        )
        s, f = rows["tpu strict"]["step_ms"], fr["step_ms"]
        print(f"{ex:<8}fused is {s / f:.2f}x faster than strict (the loss read back every step)")
        if "tpu fused/read10" in rows:
            s10, f10 = rows["tpu strict/read10"]["step_ms"], rows["tpu fused/read10"]["step_ms"]
            print(f"{ex:<8}fused is {s10 / f10:.2f}x faster than strict (the loss read back every 10 steps)")
        g = rows["tpu graph"]["step_ms"]
        line = f"{ex:<8}tpu graph (torch.tpu.graph, the whole step replayed): {s / g:.2f}x faster than strict"
        if "jax jit" in rows:
            line += f", {g / rows['jax jit']['step_ms']:.2f}x JAX's step time"
        print(line)
        if args.compile:
            for name in ("compiled", "compiled-step", "compiled-graph"):
                c = rows[f"tpu {name}"]["step_ms"]
                line = (
                    f"{ex:<8}tpu {name}: {s / c:.2f}x faster than strict, "
                    f"{c / rows['cpu inductor']['step_ms']:.2f}x CPU inductor's step time"
                )
                if "jax jit" in rows:
                    line += f", {c / rows['jax jit']['step_ms']:.2f}x JAX's step time"
                print(line)
            for name in ("compiled-step", "compiled-graph"):
                if f"tpu {name}/read10" not in rows:
                    continue
                c = rows[f"tpu {name}/read10"]["step_ms"]
                line = (
                    f"{ex:<8}tpu {name}, loss read every 10 steps: "
                    f"{rows['tpu strict/read10']['step_ms'] / c:.2f}x faster than strict"
                )
                if "jax jit/read10" in rows:
                    line += f", {c / rows['jax jit/read10']['step_ms']:.2f}x JAX's step time"
                print(line)
        if args.rounds:
            rounds(ex, args.steps, args.rounds, jax_py, args.compile)
    if args.long:
        r = run("gpt", "tpu", "fused", args.steps, args.long)
        grow = (r["rss_end_mb"] - r["rss_after_warmup_mb"]) / r["rss_after_warmup_mb"] * 100
        print(
            f"gpt fused, {args.long} more steps: RSS {r['rss_after_warmup_mb']:.0f} MB after 200 steps, "
            f"{r['rss_end_mb']:.0f} MB at the end ({grow:+.1f}%)"
        )


if __name__ == "__main__":
    main()
