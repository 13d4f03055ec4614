"""The character-level GPT of char_gpt.py trained with DistributedDataParallel:
one process per device, each on its share of the batch. Written as for
CUDA/NCCL; only the device string differs.

    torchrun --nproc-per-node 2 examples/ddp_gpt.py --steps 20
    torchrun --nproc-per-node 2 examples/ddp_gpt.py --device cpu   # gloo, for comparison
"""

import argparse
import time

import torch
import torch.distributed as dist
from char_gpt import get_batch, load_corpus, make_model, make_optimizer, train_step
from torch.nn.parallel import DistributedDataParallel as DDP

import torchtpu  # noqa: F401  registers the "tpu" device and its c10d backend


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="tpu")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=16, help="the global batch, split over the processes")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    # torchrun sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT; the backend
    # is the device's own ("tpu" for tpu tensors, gloo for CPU ones)
    dist.init_process_group("cpu:gloo" if args.device == "cpu" else None)
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.batch_size % world:
        raise SystemExit(f"--batch-size {args.batch_size} does not split over {world} processes")
    local = args.batch_size // world

    tok, data = load_corpus()
    model = DDP(make_model(tok.vocab_size, seed=args.seed, device=args.device))  # same weights on every rank
    optimizer = make_optimizer(model)
    gen = torch.Generator().manual_seed(args.seed + 1)  # the same global batches on every rank
    start = time.perf_counter()
    for step in range(args.steps):
        x, y = get_batch(data, args.batch_size, 32, gen)
        x, y = x[rank * local : (rank + 1) * local], y[rank * local : (rank + 1) * local]
        loss = train_step(model, optimizer, x.to(args.device), y.to(args.device))
        mean = torch.tensor([loss], device=args.device)
        dist.all_reduce(mean)  # the loss over the global batch
        if rank == 0:
            print(f"step {step + 1:3d}  loss {mean.item() / world:.4f}")
    if rank == 0:
        print(f"{world} processes, {args.steps} steps, {(time.perf_counter() - start) / args.steps * 1e3:.1f} ms/step")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
