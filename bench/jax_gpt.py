"""The GPT example's training step written in JAX and jax.jit-ed: the same
model (token and position embeddings, 2 pre-LayerNorm blocks of causal
self-attention and a GELU MLP, LM head tied to the token embedding), the same
batch (16 x 32 characters of the same corpus), gradient clipping at 1.0 and
AdamW (lr 3e-3, betas 0.9/0.95, weight decay 0.1 on matrices), one jitted
step reading back the loss. The baseline bench/train_step.py compares
torch.compile(backend="tpu") against; it needs jax, which only the bench
environment has (make bench-setup), and prints one RESULT line as the
torch children of train_step.py do.

Usage: python bench/jax_gpt.py [--steps 30] [--read-every 1]
"""

import argparse
import json
import os
import resource
import statistics
import time

import numpy as np

CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "data", "tiny_corpus.txt")
B, T, L, H, C = 16, 32, 2, 4, 64


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument(
        "--read-every",
        type=int,
        default=1,
        help="read the loss back every N steps (the time is per step of blocks of N)",
    )
    args = ap.parse_args()
    # the platform torchtpu runs on in the same benchmark (the same PJRT plugin's compiler)
    os.environ.setdefault("JAX_PLATFORMS", os.environ.get("TORCHTPU_PLATFORM") or "cpu")
    import jax
    import jax.numpy as jnp

    with open(CORPUS, encoding="utf-8") as f:
        text = f.read()
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    data = np.array([stoi[c] for c in text], dtype=np.int32)
    V = len(chars)
    rng = np.random.default_rng(0)

    def normal(*s):
        return jnp.asarray(rng.normal(0.0, 0.02, s).astype(np.float32))

    def block():
        return {
            "ln1_w": jnp.ones(C),
            "ln1_b": jnp.zeros(C),
            "qkv_w": normal(3 * C, C),
            "qkv_b": jnp.zeros(3 * C),
            "proj_w": normal(C, C),
            "proj_b": jnp.zeros(C),
            "ln2_w": jnp.ones(C),
            "ln2_b": jnp.zeros(C),
            "fc_w": normal(4 * C, C),
            "fc_b": jnp.zeros(4 * C),
            "out_w": normal(C, 4 * C),
            "out_b": jnp.zeros(C),
        }

    params = {
        "wte": normal(V, C),
        "wpe": normal(T, C),
        "lnf_w": jnp.ones(C),
        "lnf_b": jnp.zeros(C),
        "blocks": [block() for _ in range(L)],
    }

    def layer_norm(x, w, b):
        m = x.mean(-1, keepdims=True)
        v = ((x - m) ** 2).mean(-1, keepdims=True)
        return (x - m) / jnp.sqrt(v + 1e-5) * w + b

    def linear(x, w, b=None):
        y = x @ w.T
        return y if b is None else y + b

    causal = jnp.tril(jnp.ones((T, T), bool))

    def loss_fn(p, idx, tgt):
        x = p["wte"][idx] + p["wpe"][jnp.arange(T)]
        for bp in p["blocks"]:
            h = layer_norm(x, bp["ln1_w"], bp["ln1_b"])
            q, k, v = jnp.split(linear(h, bp["qkv_w"], bp["qkv_b"]), 3, axis=2)
            heads = lambda t: t.reshape(B, T, H, C // H).transpose(0, 2, 1, 3)  # noqa: E731
            q, k, v = heads(q), heads(k), heads(v)
            a = (q @ k.transpose(0, 1, 3, 2)) / np.sqrt(C // H)
            a = jax.nn.softmax(jnp.where(causal, a, -jnp.inf), axis=-1)
            y = (a @ v).transpose(0, 2, 1, 3).reshape(B, T, C)
            x = x + linear(y, bp["proj_w"], bp["proj_b"])
            h = layer_norm(x, bp["ln2_w"], bp["ln2_b"])
            x = x + linear(jax.nn.gelu(linear(h, bp["fc_w"], bp["fc_b"]), approximate=False), bp["out_w"], bp["out_b"])
        logits = linear(layer_norm(x, p["lnf_w"], p["lnf_b"]), p["wte"])
        logp = jax.nn.log_softmax(logits.reshape(-1, V), -1)
        return -jnp.take_along_axis(logp, tgt.reshape(-1, 1), 1).mean()

    lr, b1, b2, eps = 3e-3, 0.9, 0.95, 1e-8

    @jax.jit
    def step(p, m, v, t, idx, tgt):
        loss, g = jax.value_and_grad(loss_fn)(p, idx, tgt)
        norm = jnp.sqrt(sum(jnp.sum(x * x) for x in jax.tree_util.tree_leaves(g)))
        scale = jnp.minimum(1.0, 1.0 / (norm + 1e-6))
        g = jax.tree_util.tree_map(lambda x: x * scale, g)
        t = t + 1
        m = jax.tree_util.tree_map(lambda m, g: b1 * m + (1 - b1) * g, m, g)
        v = jax.tree_util.tree_map(lambda v, g: b2 * v + (1 - b2) * g * g, v, g)

        def update(p, m, v):
            p = p * (1 - lr * (0.1 if p.ndim >= 2 else 0.0))
            return p - lr * (m / (1 - b1**t)) / (jnp.sqrt(v / (1 - b2**t)) + eps)

        return jax.tree_util.tree_map(update, p, m, v), m, v, t, loss

    m = jax.tree_util.tree_map(jnp.zeros_like, params)
    v = jax.tree_util.tree_map(jnp.zeros_like, params)
    t = jnp.float32(0)
    times = []
    for _ in range(args.steps + 5):
        t0 = time.perf_counter()
        for _ in range(args.read_every):
            ix = rng.integers(0, len(data) - T - 1, B)
            idx = jnp.asarray(np.stack([data[j : j + T] for j in ix]))
            tgt = jnp.asarray(np.stack([data[j + 1 : j + T + 1] for j in ix]))
            params, m, v, t, loss = step(params, m, v, t, idx, tgt)
        float(loss)
        times.append((time.perf_counter() - t0) / args.read_every)
    print(
        "RESULT "
        + json.dumps(
            {
                "step_ms": statistics.median(times[5:]) * 1e3,
                "first_step_s": sum(times[:3]),  # the first three steps, compiles included
                "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                "programs_compiled": None,
                "jax": jax.__version__,
            }
        )
    )


if __name__ == "__main__":
    main()
