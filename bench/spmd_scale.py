"""How torchtpu's SPMD programs for a TPU pod scale with the number of chips,
against JAX's program for the same step and the same shardings.

The step: a GPT (token and position embeddings, pre-LayerNorm blocks of causal
self-attention and a GELU MLP, LM head tied to the token embedding), cross
entropy, AdamW (lr 3e-3, betas 0.9/0.95, weight decay 0.1 on matrices, none on
vectors), no gradient clipping. Sizes from the flags (the issue's figure is
--d 512 --layers 8; the defaults are a small config that runs in minutes).

The mesh has two axes, ("data", "model"):
  tp    (N/4) x 4: the batch split over "data"; the attention's qkv and the
        MLP's first layer split by output features over "model", the two
        output projections by input features (Megatron); the rest replicated.
  dp    N x 1: the batch split over "data", every parameter replicated.
  fsdp  (N/4) x 4: the batch split over "data"; every matrix split by rows
        over "data" and by columns over "model", every vector over "model"
        (where the sizes divide); the Adam moments laid out as their parameter.
The per-device batch is fixed (--batch): the global batch is it times the
"data" axis's size. The Adam moments are made before the first step, laid out
as their parameter, in both frameworks.

For each N and mode, a fresh child process with TORCHTPU_NUM_DEVICES=N (the
CPU plugin's N devices) and TORCHTPU_AOT_TOPOLOGY set runs the step for real
on the CPU plugin, and every program it makes is also compiled by libtpu for
the topology's chips (no chip needed). Above --max-n (or with
--compile-only) the child has one device and a compile-only mesh
(TORCHTPU_SPMD_COMPILE_ONLY=1): the programs over the mesh are compiled by
libtpu for the N chips and not run, the layouts of what they write are
libtpu's partitioner's, and no loss is read. Modes:
  fused  the default eager mode: a training loop of --steps steps
  graph  the step captured once with torch.tpu.graph, replayed --steps times
The steady step's programs are those compiled by the last step that compiled
anything (a later step compiled nothing); the child reports, per program,
torchtpu.aot_report()'s per-chip memory (arguments, outputs, temporaries,
peak), flops and bytes accessed, and libtpu's compile seconds, with the
programs run per step and the child's max RSS. JAX's side: the same model and
shardings (NamedSharding over a mesh of the topology's devices, the same
shape), one jitted step (parameters and moments donated) compiled for the
same topology with jax.experimental.topologies, its memory_analysis() and
cost_analysis(). Ratios are torchtpu's figure over JAX's (the step's sums of
flops and bytes, the largest peak). Memory, flops and bytes are per chip.

Usage:
  python bench/spmd_scale.py [--n 4,8,16] [--modes fused,graph] [--layout tp]
      [--d 128 --layers 2 --heads 4 --seq 64 --vocab 256 --batch 8]
      [--max-n 16] [--compile-only] [--zero-grad before|after] [--json out.json]
In fused mode the step's program is launched at the next step's first op;
the last step's tail is left unrun (the child ends with os._exit).
"""

import argparse
import glob
import json
import math
import os
import re
import resource
import subprocess
import sys
import tempfile
import time

TOPOLOGIES = {
    1: "v5e:1x1",
    4: "v5e:2x2",
    8: "v5e:2x4",
    16: "v5e:4x4",
    64: "v5e:8x8",
    256: "v5e:16x16",
    512: "v5p:8x8x8",
}
MIB = 2**20


# ---- the shared description: shapes, mesh, layouts --------------------------------------


def param_shapes(cfg):
    """name -> shape, in torch's naming (the tied head reads wte.weight)."""
    d, v, t = cfg["d"], cfg["vocab"], cfg["seq"]
    shapes = {"wte.weight": (v, d), "wpe.weight": (t, d)}
    for i in range(cfg["layers"]):
        b = f"blocks.{i}."
        shapes.update(
            {
                b + "ln1.weight": (d,),
                b + "ln1.bias": (d,),
                b + "qkv.weight": (3 * d, d),
                b + "qkv.bias": (3 * d,),
                b + "proj.weight": (d, d),
                b + "proj.bias": (d,),
                b + "ln2.weight": (d,),
                b + "ln2.bias": (d,),
                b + "fc.weight": (4 * d, d),
                b + "fc.bias": (4 * d,),
                b + "out.weight": (d, 4 * d),
                b + "out.bias": (d,),
            }
        )
    shapes.update({"lnf.weight": (d,), "lnf.bias": (d,)})
    return shapes


def mesh_shape(n, layout):
    if layout == "none":
        if n != 1:
            raise SystemExit(f"layout none is one device, got N={n}")
        return (1, 1)
    if layout == "dp":
        return (n, 1)
    if n % 4:
        raise SystemExit(f"layout {layout} needs N divisible by 4, got {n}")
    return (n // 4, 4)


def spec_of(name, shape, layout, mesh):
    """The mesh axis ("data", "model" or None) each dimension is split over."""
    data, model = mesh
    spec = [None] * len(shape)
    if layout == "tp":
        leaf = name.split(".")[-2:]
        if leaf[0] in ("qkv", "fc"):
            spec[0] = "model"  # by output features (weight rows, bias)
        elif leaf[0] in ("proj", "out") and leaf[1] == "weight":
            spec[1] = "model"  # by input features
    elif layout == "fsdp":
        if len(shape) == 2:
            spec = ["data" if shape[0] % data == 0 else None, "model" if shape[1] % model == 0 else None]
        elif shape[0] % model == 0:
            spec = ["model"]
    return tuple(spec)


BATCH_SPEC = ("data", None)


# ---- the torchtpu child ----------------------------------------------------------------


def torch_model(cfg):
    import torch
    import torch.nn.functional as F
    from torch import nn

    d, h = cfg["d"], cfg["heads"]

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
            q, k, v = (z.view(b, t, h, d // h).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
            return x + self.out(F.gelu(self.fc(self.ln2(x))))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(cfg["vocab"], d), nn.Embedding(cfg["seq"], d)
            self.blocks = nn.ModuleList(Block() for _ in range(cfg["layers"]))
            self.lnf = nn.LayerNorm(d)
            for m in self.modules():  # GPT-2's initialization
                if isinstance(m, (nn.Linear, nn.Embedding)):
                    nn.init.normal_(m.weight, std=0.02)
                if isinstance(m, nn.Linear):
                    nn.init.zeros_(m.bias)

        def forward(self, idx, tgt):
            pos = torch.arange(idx.shape[1], device=idx.device)
            x = self.wte(idx) + self.wpe(pos)
            for blk in self.blocks:
                x = blk(x)
            logits = self.lnf(x) @ self.wte.weight.t()  # tied head
            return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1))

    return GPT()


def child_torch(a):
    import torch

    import torchtpu
    from torchtpu import _C, spmd
    from torchtpu.spmd import Replicate, Shard

    cfg, layout, n, mode = a["cfg"], a["layout"], a["n"], a["mode"]
    graph = mode in ("graph", "compile-graph")  # captured with torch.tpu.graph
    compiled = mode in ("compile", "compile-graph")  # the model through torch.compile
    only = a.get("compile_only", False)  # no values: no loss is read
    t_start = time.perf_counter()
    # float32 matrix products at --precision, as JAX's (torch's default and the bench's: highest)
    torch.set_float32_matmul_precision({"highest": "highest", "high": "high", "default": "medium"}[a["precision"]])
    shape = mesh_shape(n, layout)
    mesh = spmd.Mesh(shape, ("data", "model")) if layout != "none" else None

    def placements(spec):
        return [Shard(spec.index(ax)) if ax in spec else Replicate() for ax in ("data", "model")]

    def place(t, spec):  # a host tensor onto the mesh, or onto the one device
        return spmd.shard(t, mesh, placements(spec)) if mesh else t.to("tpu")

    torch.manual_seed(0)
    model = torch_model(cfg).to("tpu")
    shapes = param_shapes(cfg)
    params = dict(model.named_parameters())
    assert {k: tuple(p.shape) for k, p in params.items()} == shapes, "model and param_shapes disagree"
    specs = {k: spec_of(k, s, layout, shape) for k, s in shapes.items()}
    for k, p in params.items():
        if mesh:
            spmd.shard_(p, mesh, placements(specs[k]))
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
    from char_gpt import make_optimizer  # the examples' AdamW (decay on matrices only)

    opt = make_optimizer(model, capturable=graph)
    for k, p in params.items():  # the moments, laid out as their parameter
        opt.state[p] = {
            "step": place(torch.zeros(()), ()) if graph else torch.tensor(0.0),
            "exp_avg": place(torch.zeros(p.shape), specs[k]),
            "exp_avg_sq": place(torch.zeros(p.shape), specs[k]),
        }
    gb = cfg["batch"] * shape[0]
    gen = torch.Generator().manual_seed(1)

    def batch():
        ix = torch.randint(0, cfg["vocab"], (gb, cfg["seq"] + 1), generator=gen)
        return ix[:, :-1].contiguous(), ix[:, 1:].contiguous()

    def on_mesh(t):
        return place(t, BATCH_SPEC)

    run = torch.compile(model, backend="tpu") if compiled else model
    update = torch.compile(opt.step, backend="tpu") if mode == "compile-graph" else opt.step
    amp = a.get("autocast")
    zero_after = a.get("zero_grad") == "after"  # the step ends in zero_grad: no gradient outlives it

    def step(x, y):
        with torch.autocast("tpu", dtype=getattr(torch, amp or "bfloat16"), enabled=amp is not None):
            loss = run(x, y)
        loss.backward()
        update()
        if zero_after:
            opt.zero_grad(set_to_none=True)
        return loss

    def snap():
        m = torchtpu.metrics()
        spmd = m["spmd_programs_run"] + m["spmd_programs_compile_only"]
        runs = [p["runs"] for p in _C.aot_report()["programs"]]
        return len(runs), m["fused_programs_run"] + m["graph_replays"], spmd, runs

    snaps, times, losses = [], [], []
    with torchtpu.eager_mode("fused"):
        snaps.append(snap())
        if graph:
            sx, sy = (on_mesh(t) for t in batch())
            for _ in range(2 if compiled else 0):  # torch.compile's graphs made before the capture
                opt.zero_grad(set_to_none=True)
                step(sx, sy)
                torch.tpu.synchronize()
            opt.zero_grad(set_to_none=True)
            g = torch.tpu.TPUGraph()
            with torch.tpu.graph(g):
                static_loss = step(sx, sy)
        for _ in range(a["steps"]):
            s = time.perf_counter()
            x, y = batch()
            if graph:
                sx.copy_(x)
                sy.copy_(y)
                g.replay()
                losses.append(None if only else static_loss.item())  # a replay runs at once: nothing to flush
            else:
                if not zero_after:
                    opt.zero_grad(set_to_none=True)
                loss = step(on_mesh(x), on_mesh(y))
                # compile only: the step's program made where .item() would make it (the
                # gradients alive, the loss an output), with nothing read
                losses.append(torch.tpu.synchronize() if only else loss.item())
            times.append(time.perf_counter() - s)
            snaps.append(snap())
    raw = _C.aot_report()  # no sync: the last step's recorded tail is not run (nor compiled)
    progs = raw["programs"]
    cyc = est_cycles(os.environ.get("SPMD_SCALE_DUMP"))  # libtpu's modules, one per program compiled
    if cyc is not None and len(cyc) == len(progs):
        progs = [dict(p, est_cycles=c) for p, c in zip(progs, cyc)]
    # the last step that compiled any program; the steady step: the programs the
    # last step launched (a step that compiled nothing), each with its launches
    last = max((i for i in range(1, len(snaps)) if snaps[i][0] > snaps[i - 1][0]), default=None)
    before, after = snaps[-2][3] if len(snaps) > 1 else [], snaps[-1][3]
    launches = [r - (before[i] if i < len(before) else 0) for i, r in enumerate(after)]
    steady = [dict(p, launches=k) for p, k in zip(progs, launches) if k > 0]
    keep = (
        "name ok error error_kind partitions flops bytes_accessed transcendentals optimal_seconds argument_bytes "
        "output_bytes alias_bytes temp_bytes peak_bytes code_bytes compile_seconds cached launches est_cycles"
    ).split()
    return {
        "side": "torchtpu",
        "mode": a["mode"],
        "autocast": amp,
        "compile_only": only,
        "topology": raw["topology"],
        "kind": raw["kind"],
        "chips": raw["devices"],
        "hbm_bytes": raw["hbm_bytes"],
        "mesh": list(shape),
        "global_batch": gb,
        "params": sum(p.numel() for p in model.parameters()),
        "programs": [{k: p.get(k) for k in keep} for p in steady],
        "steady_from_step": last,
        "steady": last is not None and last < len(snaps) - 1,
        "programs_per_step": sum(p["launches"] for p in steady) if len(snaps) > 1 else None,
        "mesh_programs_per_step": snaps[-1][2] - snaps[-2][2] if len(snaps) > 1 else None,
        "programs_compiled": len(progs),
        "programs_refused": sum(not p["ok"] for p in progs),
        "tpu_compile_s_all": sum(p["compile_seconds"] or 0 for p in progs),
        "step_s": times,
        "losses": losses,
        "wall_s": time.perf_counter() - t_start,
        "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


# ---- the JAX child ---------------------------------------------------------------------


def child_jax(a):
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    if "TPU_LIBRARY_PATH" not in os.environ:
        import libtpu

        os.environ["TPU_LIBRARY_PATH"] = glob.glob(os.path.join(os.path.dirname(libtpu.__file__), "libtpu*.so"))[0]
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental import topologies
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    cfg, layout, n = a["cfg"], a["layout"], a["n"]
    t_start = time.perf_counter()
    topo = topologies.get_topology_desc(platform="tpu", topology_name=a["topology"])
    shape = mesh_shape(n, layout)
    mesh = Mesh(np.array(topo.devices[:n]).reshape(shape), ("data", "model"))
    shapes = param_shapes(cfg)
    specs = {k: spec_of(k, s, layout, shape) for k, s in shapes.items()}
    d, h, T, V = cfg["d"], cfg["heads"], cfg["seq"], cfg["vocab"]
    gb = cfg["batch"] * shape[0]

    # torch.autocast's bf16 step: matrix products in bfloat16 (linear, attention, the head),
    # layer norm, softmax and the loss in float32, the parameters and moments float32
    low = jnp.bfloat16 if a.get("autocast") else None

    def mm(x, w):
        return x.astype(low) @ w.astype(low) if low else x @ w

    def ln(x, p):
        x = x.astype(jnp.float32)
        m = x.mean(-1, keepdims=True)
        v = ((x - m) ** 2).mean(-1, keepdims=True)
        return (x - m) / jnp.sqrt(v + 1e-5) * p[".weight"] + p[".bias"]

    def lin(x, p):
        b = p[".bias"].astype(low) if low else p[".bias"]
        return mm(x, p[".weight"].T) + b

    causal = jnp.tril(jnp.ones((T, T), bool))

    def loss_fn(w, idx, tgt):
        def sub(prefix):
            return {k[len(prefix) :]: v for k, v in w.items() if k.startswith(prefix)}

        x = w["wte.weight"][idx] + w["wpe.weight"][jnp.arange(T)]
        for i in range(cfg["layers"]):
            b = f"blocks.{i}."
            q, k, v = jnp.split(lin(ln(x, sub(b + "ln1")), sub(b + "qkv")), 3, axis=2)
            q, k, v = (z.reshape(gb, T, h, d // h).transpose(0, 2, 1, 3) for z in (q, k, v))
            att = mm(q, k.transpose(0, 1, 3, 2)).astype(jnp.float32) / math.sqrt(d // h)
            att = jax.nn.softmax(jnp.where(causal, att, -jnp.inf), axis=-1)
            y = mm(att, v).transpose(0, 2, 1, 3).reshape(gb, T, d)
            x = x + lin(y, sub(b + "proj"))
            x = x + lin(jax.nn.gelu(lin(ln(x, sub(b + "ln2")), sub(b + "fc")), approximate=False), sub(b + "out"))
        logits = mm(ln(x, sub("lnf")), w["wte.weight"].T)
        logp = jax.nn.log_softmax(logits.reshape(-1, V).astype(jnp.float32), -1)
        return -jnp.take_along_axis(logp, tgt.reshape(-1, 1), 1).mean()

    lr, b1, b2, eps = 3e-3, 0.9, 0.95, 1e-8

    def step(w, m, v, t, idx, tgt):
        loss, g = jax.value_and_grad(loss_fn)(w, idx, tgt)
        t = t + 1
        m = {k: b1 * m[k] + (1 - b1) * g[k] for k in w}
        v = {k: b2 * v[k] + (1 - b2) * g[k] * g[k] for k in w}

        def update(k):
            p = w[k] * (1 - lr * (0.1 if w[k].ndim >= 2 else 0.0))
            return p - lr * (m[k] / (1 - b1**t)) / (jnp.sqrt(v[k] / (1 - b2**t)) + eps)

        return {k: update(k) for k in w}, m, v, t, loss

    def sds(s, spec, dtype=jnp.float32):
        return jax.ShapeDtypeStruct(s, dtype, sharding=NamedSharding(mesh, P(*spec)))

    w = {k: sds(s, specs[k]) for k, s in shapes.items()}
    tok = sds((gb, T), BATCH_SPEC, jnp.int32)
    t0 = sds((), ())
    shard = jax.tree_util.tree_map(lambda s: s.sharding, (w, w, w, t0))
    jitted = jax.jit(step, out_shardings=shard + (NamedSharding(mesh, P()),), donate_argnums=(0, 1, 2, 3))
    s = time.perf_counter()
    with jax.default_matmul_precision(a.get("precision", "highest")):  # torch's float32 default: highest
        lowered = jitted.lower(w, w, w, t0, tok, tok)
    lower_s = time.perf_counter() - s
    s = time.perf_counter()
    compiled = lowered.compile()
    compile_s = time.perf_counter() - s
    if os.environ.get("SPMD_SCALE_JAX_HLO"):  # the optimized program's text, to compare with torchtpu's
        with open(os.environ["SPMD_SCALE_JAX_HLO"], "w") as f:
            f.write(compiled.as_text())
    ma, ca = compiled.memory_analysis(), compiled.cost_analysis()
    ca = ca[0] if isinstance(ca, list) else ca

    def mem(k):
        return getattr(ma, k, None)

    return {
        "side": "jax",
        "mode": "jit",
        "topology": a["topology"],
        "kind": topo.devices[0].device_kind,
        "chips": len(topo.devices),
        "mesh": list(shape),
        "global_batch": gb,
        "params": sum(math.prod(s) for s in shapes.values()),
        "programs": [
            {
                "name": "jax.jit(step)",
                "ok": True,
                "partitions": n,
                "flops": ca.get("flops"),
                "bytes_accessed": ca.get("bytes accessed"),
                "transcendentals": ca.get("transcendentals"),
                "optimal_seconds": ca.get("optimal_seconds"),
                "argument_bytes": mem("argument_size_in_bytes"),
                "output_bytes": mem("output_size_in_bytes"),
                "alias_bytes": mem("alias_size_in_bytes"),
                "temp_bytes": mem("temp_size_in_bytes"),
                "peak_bytes": mem("peak_memory_in_bytes"),
                "code_bytes": mem("generated_code_size_in_bytes"),
                "compile_seconds": compile_s,
                "est_cycles": (est_cycles(os.environ.get("SPMD_SCALE_DUMP")) or [None])[-1],
            }
        ],
        "programs_per_step": 1,
        "lower_s": lower_s,
        "jax": jax.__version__,
        "wall_s": time.perf_counter() - t_start,
        "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def est_cycles(dump_dir):
    """libtpu's per-instruction cycle estimates (`estimated_cycles` in its
    after-codegen dumps, XLA_FLAGS=--xla_dump_to), summed over each TPU
    module's top-level instructions, in compile order; None without dumps.
    A second figure beside bytes accessed, which also counts VMEM prefetches
    and moves with memory space assignment's choices for the same math."""
    if not dump_dir or not os.path.isdir(dump_dir):
        return None
    names = [f for f in os.listdir(dump_dir) if ".cl_" in f and f.endswith(".after_codegen.txt")]
    out = []
    for f in sorted(names, key=lambda f: int(re.match(r"module_(\d+)", f).group(1))):
        text = open(os.path.join(dump_dir, f)).read()
        at = text.find("\nENTRY")
        entry = text[at:].split("\n}\n")[0] if at >= 0 else ""
        out.append(sum(int(c) for c in re.findall(r'"estimated_cycles":"?(\d+)', entry)))
    return out


# ---- the parent ------------------------------------------------------------------------


def run_child(args, timeout):
    env = dict(os.environ)
    only = args.get("compile_only", False)
    env.update(
        TORCHTPU_NUM_DEVICES="1" if only else str(args["n"]),
        TORCHTPU_SPMD_COMPILE_ONLY="1" if only else "0",
        TORCHTPU_AOT_TOPOLOGY=args["topology"],
        TPU_SKIP_MDS_QUERY="1",
        ALLOW_MULTIPLE_LIBTPU_LOAD="1",
    )
    env.setdefault("TPU_ACCELERATOR_TYPE", "v5litepod-4")  # only quiets libtpu's warnings
    env.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    if not args.get("cache"):
        env["TORCHTPU_CACHE_DIR"] = ""  # every program compiled here, its seconds measured
    dump = tempfile.TemporaryDirectory() if args.get("cycles") else None
    if dump:  # libtpu's optimized programs, for their cycle estimates (est_cycles)
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} --xla_dump_to={dump.name} --xla_dump_hlo_as_text".strip()
        env["SPMD_SCALE_DUMP"] = dump.name
    s = time.perf_counter()
    try:
        p = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--child", json.dumps(args)],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as e:
        tail = (e.stderr or b"")[-2000:]
        tail = tail.decode(errors="replace") if isinstance(tail, bytes) else tail
        return {"error": f"timed out after {timeout} s", "stderr_tail": tail}
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    if p.returncode or not lines:
        return {"error": f"child exited with {p.returncode}", "stderr_tail": p.stderr[-4000:]}
    out = json.loads(lines[-1][7:])
    out["child_wall_s"] = time.perf_counter() - s
    if dump:
        dump.cleanup()
    return out


def totals(r):
    """The step's sums (flops, bytes, compile seconds, argument/output) and largest peak/temp."""
    ps = [p for p in r.get("programs", []) if p.get("ok")]

    def tot(k, f=sum, per_launch=False):
        vals = [p[k] * (p.get("launches") or 1 if per_launch else 1) for p in ps if p.get(k) is not None]
        return f(vals) if vals else None

    return {
        "flops": tot("flops", per_launch=True),
        "bytes_accessed": tot("bytes_accessed", per_launch=True),
        "transcendentals": tot("transcendentals", per_launch=True),
        "optimal_seconds": tot("optimal_seconds", per_launch=True),
        "est_cycles": tot("est_cycles", per_launch=True),
        "argument_bytes": tot("argument_bytes"),
        "output_bytes": tot("output_bytes"),
        "temp_bytes": tot("temp_bytes", max),
        "peak_bytes": tot("peak_bytes", max),
        "compile_seconds": tot("compile_seconds"),
    }


def fmt(v, scale=1.0, digits=1):
    if v is None:
        return "-"
    return f"{v / scale:,.{digits}f}"


def ratio(a, b):
    return f"{a / b:.2f}" if a is not None and b else "-"


def table(results):
    head = (
        "| N | topology | mesh | batch | side | program | progs/step | arg MiB | out MiB | temp MiB | peak MiB "
        "| GFLOP | MB accessed | TPU compile s | max RSS MB | flops/JAX | bytes/JAX | peak/JAX | temp/JAX |"
    )
    rows = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in results:
        jt = totals(r["jax"]) if r.get("jax") and "error" not in r["jax"] else None
        for side in ("jax", "fused", "graph", "compile", "compile-graph"):
            x = r.get(side)
            if x is None:
                continue
            pre = f"| {r['n']} | {r['topology']} | {'x'.join(map(str, r['mesh']))} | {r['global_batch']} | "
            name = "jax" if side == "jax" else f"torchtpu {side}" + (" (compile only)" if x.get("compile_only") else "")
            if "error" in x:
                tail = (x.get("stderr_tail") or "").strip().splitlines()
                msg = x["error"] + (": " + tail[-1][:160] if tail else "")
                rows.append(pre + f"{name} | {msg.replace('|', '/')} |" + " |" * 13)
                continue
            progs = [p for p in x["programs"]]
            t = totals(x)
            pps = x.get("programs_per_step")
            note = "" if side == "jax" or x.get("steady") else " (not steady)"
            for i, p in enumerate(progs + ([None] if len(progs) > 1 else [])):
                q = t if p is None else p
                label = "step total" if p is None else (p["name"][:40] + ("" if p["ok"] else " REFUSED"))
                last = p is None or len(progs) == 1
                rows.append(
                    pre + f"{name} | {label}{note} | {pps if i == 0 else ''} | {fmt(q.get('argument_bytes'), MIB)} | "
                    f"{fmt(q.get('output_bytes'), MIB)} | {fmt(q.get('temp_bytes'), MIB)} | "
                    f"{fmt(q.get('peak_bytes'), MIB)} | {fmt(q.get('flops'), 1e9, 3)} | "
                    f"{fmt(q.get('bytes_accessed'), 1e6)} | {fmt(q.get('compile_seconds'))} | "
                    f"{fmt(x.get('max_rss_mb'), 1, 0) if last else ''} | "
                    + (
                        " | ".join(ratio(t[k], jt[k]) for k in ("flops", "bytes_accessed", "peak_bytes", "temp_bytes"))
                        if last and jt
                        else " | | | "
                    )
                    + " |"
                )
    return "\n".join(rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--n", default="4,8,16", help="chip counts (4, 8, 16, 64, 256, 512)")
    ap.add_argument("--max-n", type=int, default=16, help="run on N CPU devices up to this; above: compile only")
    ap.add_argument("--compile-only", action="store_true", help="every N on a compile-only mesh (one device)")
    ap.add_argument(
        "--modes", default="fused,graph", help="torchtpu modes: fused, graph, compile, compile-graph (empty: none)"
    )
    ap.add_argument("--no-jax", action="store_true")
    ap.add_argument("--layout", choices=["tp", "dp", "fsdp", "none"], default="tp", help="none: N=1, no mesh")
    ap.add_argument("--autocast", choices=["bfloat16"], help="the forward pass and loss under torch.autocast")
    ap.add_argument(
        "--precision",
        choices=["highest", "high", "default"],
        default="highest",
        help="float32 matrix products, both sides: highest (torch's default), high, default (JAX's on TPU: bf16)",
    )
    ap.add_argument(
        "--zero-grad",
        choices=["before", "after"],
        default="before",
        help="the loop's opt.zero_grad(set_to_none=True): before the forward pass (the gradients alive when the "
        "loss is read: outputs of the step) or after opt.step() (none outlives the step, as in JAX's)",
    )
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8, help="per-device batch (global: times the data axis)")
    ap.add_argument("--steps", type=int, default=3, help="steps (fused) or replays (graph)")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per child process")
    ap.add_argument("--cache", action="store_true", help="keep torchtpu's disk cache on (compile seconds then stale)")
    ap.add_argument("--cycles", action="store_true", help="also libtpu's summed cycle estimates (dumps its programs)")
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.child:
        a = json.loads(args.child)
        out = child_jax(a) if a["side"] == "jax" else child_torch(a)
        print("RESULT " + json.dumps(out), flush=True)
        sys.stderr.flush()
        os._exit(0)  # no teardown: nothing left recorded is run or compiled

    cfg = {k: getattr(args, k) for k in ("d", "layers", "heads", "seq", "vocab", "batch")}
    modes = [m for m in args.modes.split(",") if m]
    results = []
    for n in (int(v) for v in args.n.split(",")):
        if n not in TOPOLOGIES:
            raise SystemExit(f"no topology for N={n}: one of {sorted(TOPOLOGIES)}")
        shape = mesh_shape(n, args.layout)
        r = {"n": n, "topology": TOPOLOGIES[n], "mesh": shape, "global_batch": args.batch * shape[0]}
        only = args.compile_only or n > args.max_n
        base = {"n": n, "topology": TOPOLOGIES[n], "cfg": cfg, "layout": args.layout, "cache": args.cache}
        base["autocast"] = args.autocast
        base["precision"] = args.precision
        base["zero_grad"] = args.zero_grad
        base["compile_only"] = only
        base["cycles"] = args.cycles
        sides = ([("jax", "jit")] if not args.no_jax else []) + [("torch", m) for m in modes]
        for side, mode in sides:
            how = " (compile only)" if only and side == "torch" else ""
            print(f"N={n} {TOPOLOGIES[n]} {side} {mode}{how} ...", file=sys.stderr, flush=True)
            out = run_child(dict(base, side=side, mode=mode, steps=args.steps), args.timeout)
            r["jax" if side == "jax" else mode] = out
            brief = out.get("error") or f"{out.get('child_wall_s', 0):.0f} s"
            print(f"  {brief}", file=sys.stderr, flush=True)
            if args.json:
                with open(args.json, "w") as f:
                    json.dump({"cfg": cfg, "layout": args.layout, "results": results + [r]}, f, indent=1)
        results.append(r)
    params = sum(math.prod(s) for s in param_shapes(cfg).values())
    print(
        f"GPT d={cfg['d']} layers={cfg['layers']} heads={cfg['heads']} T={cfg['seq']} vocab={cfg['vocab']} "
        f"({params / 1e6:.2f}M parameters), AdamW, per-device batch {cfg['batch']}, layout {args.layout}; "
        "memory, flops and bytes per chip (libtpu's figures)\n"
    )
    print(table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cfg": cfg, "layout": args.layout, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
