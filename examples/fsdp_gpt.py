"""The character-level GPT of char_gpt.py trained with FSDP2 on several
processes, one device each: parameters, gradients and optimizer state are
sharded over the processes (fully_shard per transformer block and at the
root, parameters resharded after forward), each process trains on its slice
of the batch, gradients are clipped by their global norm, and the sharded
state is checkpointed with torch.distributed.checkpoint (DCP) halfway
through; a fresh model then loads the checkpoint and redoes the second half,
which must give the same losses.

    torchrun --nproc-per-node 2 examples/fsdp_gpt.py
    torchrun --nproc-per-node 2 examples/fsdp_gpt.py --steps 20 --bf16    # bfloat16 compute
    torchrun --nproc-per-node 2 examples/fsdp_gpt.py --device cpu         # gloo, for comparison

Written as for CUDA/NCCL; only the device string differs. The device's c10d
backend is "tpu" (torchtpu registers it); on the XLA CPU plugin its
collectives go through the host.
"""

import argparse
import datetime
import shutil
import tempfile

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from char_gpt import get_batch, load_corpus, make_model, make_optimizer
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

import torchtpu  # noqa: F401  registers the "tpu" device and its c10d backend


def build(vocab_size, device, mesh, seed, bf16):
    """The model (same weights on every process for a seed), sharded, and its
    AdamW optimizer (made after fully_shard: it holds the sharded
    parameters)."""
    model = make_model(vocab_size, seed=seed, device=device)
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16) if bf16 else MixedPrecisionPolicy()
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=True)
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=True)
    return model, make_optimizer(model)


def train_step(model, optimizer, x, y):
    """One step on this process's slice of the batch; returns the loss of
    the whole batch (the mean of the processes' losses: equal slices)."""
    optimizer.zero_grad(set_to_none=True)
    _, loss = model(x, y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # the global norm, over every shard
    optimizer.step()
    loss = loss.detach().float()
    dist.all_reduce(loss, op=dist.ReduceOp.AVG)
    return loss.item()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="tpu")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=16, help="the global batch, split over the processes")
    parser.add_argument("--bf16", action="store_true", help="compute in bfloat16 (MixedPrecisionPolicy)")
    parser.add_argument("--checkpoint-dir", help="where DCP writes (default: a temporary folder, removed after)")
    args = parser.parse_args()

    # torchrun sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT and LOCAL_RANK; the
    # backend is the device's own ("tpu" for tpu tensors, gloo for CPU ones)
    dist.init_process_group("cpu:gloo" if args.device == "cpu" else None, timeout=datetime.timedelta(minutes=5))
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.batch_size % world:
        raise SystemExit(f"--batch-size {args.batch_size} does not split over {world} processes")
    mesh = init_device_mesh(args.device, (world,))
    log = print if rank == 0 else (lambda *a: None)

    tok, data = load_corpus()
    gen = torch.Generator().manual_seed(1)  # the same batches on every process
    batches = [get_batch(data, args.batch_size, 32, gen) for _ in range(args.steps)]

    def mine(t):
        return t.chunk(world)[rank].to(args.device)

    model, optimizer = build(tok.vocab_size, args.device, mesh, seed=0, bf16=args.bf16)
    half = args.steps // 2
    folder = [args.checkpoint_dir or (tempfile.mkdtemp(prefix="fsdp_gpt_") if rank == 0 else None)]
    dist.broadcast_object_list(folder)
    folder = folder[0]

    log(f"FSDP2 over {world} processes on {args.device}{' (bfloat16 compute)' if args.bf16 else ''}")
    losses = []
    for step, (x, y) in enumerate(batches):
        if step == half:
            msd, osd = get_state_dict(model, optimizer)
            dcp.save({"model": msd, "optim": osd}, checkpoint_id=folder)
            log(f"saved a DCP checkpoint after step {step} in {folder}")
        losses.append(train_step(model, optimizer, mine(x), mine(y)))
        log(f"step {step + 1:3d}  loss {losses[-1]:.4f}")

    # a fresh model (other weights) resumes from the checkpoint
    model, optimizer = build(tok.vocab_size, args.device, mesh, seed=1, bf16=args.bf16)
    msd, osd = get_state_dict(model, optimizer)
    state = {"model": msd, "optim": osd}
    dcp.load(state, checkpoint_id=folder)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    resumed = [train_step(model, optimizer, mine(x), mine(y)) for x, y in batches[half:]]
    log(f"resumed from the checkpoint: losses {' '.join(f'{v:.4f}' for v in resumed)}")
    same = resumed == losses[half:]
    log("the resumed steps give the same losses" if same else f"MISMATCH: {resumed} vs {losses[half:]}")

    dist.barrier()
    if rank == 0 and not args.checkpoint_dir:
        shutil.rmtree(folder, ignore_errors=True)
    dist.destroy_process_group()
    if not same:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
