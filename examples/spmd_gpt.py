"""Train the character GPT over several devices of one process with SPMD programs.

    TORCHTPU_NUM_DEVICES=4 python examples/spmd_gpt.py                 # data parallel over 4 devices
    TORCHTPU_NUM_DEVICES=4 python examples/spmd_gpt.py --mesh 2x2      # 2 data x 2 tensor parallel
    TORCHTPU_NUM_DEVICES=4 python examples/spmd_gpt.py --check         # and compare with one device

The step is the one-device step of char_gpt.py, unchanged: the parameters and
the batch are laid over a mesh of devices (torchtpu.spmd), and each op that
reads them runs as one program over the whole mesh, partitioned by XLA (in
fused mode the step's ops are one such program). Data parallel: parameters
replicated, the batch split over the devices. 2x2: the batch split over "dp";
the attention's qkv and the MLP's first layer split by output features over
"tp", the attention's and the MLP's output projections by input features
(Megatron's column and row split).
"""

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from char_gpt import get_batch, load_corpus, make_model, make_optimizer, train_step  # noqa: E402

import torchtpu  # noqa: E402
from torchtpu import spmd  # noqa: E402
from torchtpu.spmd import Replicate, Shard  # noqa: E402


def lay_out(model, mesh, tensor_parallel):
    """Lays every parameter over the mesh (in place)."""
    split = {}
    if tensor_parallel:
        for block in model.blocks:
            split[block.attn.qkv.weight] = 0  # column split: output features
            split[block.attn.qkv.bias] = 0
            split[block.attn.proj.weight] = 1  # row split: input features
            split[block.mlp[0].weight] = 0
            split[block.mlp[0].bias] = 0
            split[block.mlp[2].weight] = 1
    for p in model.parameters():
        if p in split:
            spmd.shard_(p, mesh, [Replicate(), Shard(split[p])])
        else:
            spmd.shard_(p, mesh, [Replicate()] * len(mesh.shape))


def batch_on(mesh, x):
    """The batch split over the mesh's first axis ("dp")."""
    return spmd.shard(x, mesh, [Shard(0)] + [Replicate()] * (len(mesh.shape) - 1))


def setup(mesh_kind, seed, **cfg):
    """The model on tpu:0, laid over the mesh; its optimizer; the mesh (None: one device)."""
    tok, data = load_corpus()
    model = make_model(tok.vocab_size, seed=seed, device="tpu", **cfg)
    mesh = None
    if mesh_kind != "one":
        n = torch.tpu.device_count()
        mesh = spmd.Mesh((n,), ("dp",)) if mesh_kind == "dp" else spmd.Mesh((2, 2), ("dp", "tp"))
        lay_out(model, mesh, mesh_kind == "2x2")
    return model, make_optimizer(model), mesh, data


def run(mesh_kind, steps, mode, seed=0, batch_size=16, compiled=False, **cfg):
    """steps training steps in an eager mode (the model under
    torch.compile(backend="tpu") with compiled): (losses, parameters on the
    host, programs run, seconds)."""
    model, optimizer, mesh, data = setup(mesh_kind, seed, **cfg)
    step_model = torch.compile(model, backend="tpu") if compiled else model
    gen = torch.Generator().manual_seed(seed + 1)
    losses = []
    before = torchtpu.metrics()
    start = time.perf_counter()
    with torchtpu.eager_mode(mode):
        for _ in range(steps):
            x, y = get_batch(data, batch_size, model.cfg.block_size, gen)
            x, y = (batch_on(mesh, x), batch_on(mesh, y)) if mesh else (x.to("tpu"), y.to("tpu"))
            losses.append(train_step(step_model, optimizer, x, y))
    seconds = time.perf_counter() - start
    after = torchtpu.metrics()
    programs = (
        after["spmd_programs_run" if mesh else "fused_programs_run"]
        - before["spmd_programs_run" if mesh else "fused_programs_run"]
    )
    params = [p.detach().cpu() for p in model.parameters()]
    return losses, params, programs, seconds


def run_graph(mesh_kind, steps, seed=0, batch_size=16, warm=2, **cfg):
    """The same step captured once with torch.tpu.graph and replayed: (losses,
    parameters, programs over the mesh run by the replays, replays)."""
    model, optimizer, mesh, data = setup(mesh_kind, seed, **cfg)
    for group in optimizer.param_groups:
        group["capturable"] = True  # its step count stays on the device
    gen = torch.Generator().manual_seed(seed + 1)
    batches = [get_batch(data, batch_size, model.cfg.block_size, gen) for _ in range(steps)]
    sx, sy = batch_on(mesh, batches[0][0]), batch_on(mesh, batches[0][1])
    losses = []
    with torchtpu.eager_mode("fused"):
        for x, y in batches[:warm]:
            sx.copy_(x)
            sy.copy_(y)
            losses.append(train_step(model, optimizer, sx, sy))

        def step():
            _, loss = model(sx, sy)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            return loss

        optimizer.zero_grad(set_to_none=True)
        graph = torch.tpu.TPUGraph()
        with torch.tpu.graph(graph):
            static_loss = step()
        before = torchtpu.metrics()
        for x, y in batches[warm:]:
            sx.copy_(x)
            sy.copy_(y)
            graph.replay()
            losses.append(static_loss.item())
        after = torchtpu.metrics()
    params = [p.detach().cpu() for p in model.parameters()]
    return (
        losses,
        params,
        after["spmd_programs_run"] - before["spmd_programs_run"],
        after["graph_replays"] - before["graph_replays"],
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mesh", choices=["dp", "2x2"], default="dp")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--mode", choices=["strict", "fused"], default="fused")
    parser.add_argument("--partitioner", choices=["shardy", "gspmd"], default="shardy")
    parser.add_argument("--compile", action="store_true", help='the model under torch.compile(backend="tpu")')
    parser.add_argument("--check", action="store_true", help="also train on one device and compare")
    args = parser.parse_args()
    if torch.tpu.device_count() < (4 if args.mesh == "2x2" else 2):
        raise SystemExit("run with several devices: TORCHTPU_NUM_DEVICES=4 python examples/spmd_gpt.py")
    spmd.set_partitioner(args.partitioner)
    losses, params, programs, seconds = run(args.mesh, args.steps, args.mode, compiled=args.compile)
    for i, loss in enumerate(losses):
        if i % 5 == 0 or i == len(losses) - 1:
            print(f"step {i:3d}  loss {loss:.4f}")
    print(
        f"{args.mesh} over {torch.tpu.device_count()} devices, {args.mode} mode, {args.partitioner}: "
        f"{seconds / args.steps * 1e3:.1f} ms a step, {programs / args.steps:.1f} programs over the mesh a step"
    )
    if args.check:
        ref, ref_params, _, _ = run("one", args.steps, args.mode, compiled=args.compile)
        dl = max(abs(a - b) for a, b in zip(losses, ref))
        dp = max((a - b).abs().max().item() for a, b in zip(params, ref_params))
        print(f"against one device: losses differ by at most {dl:.2e}, parameters by {dp:.2e}")


if __name__ == "__main__":
    main()
