"""DistributedDataParallel on tpu: two processes, each with half the batch,
train as one process on the full batch (on the CPU) does: gradient buckets as
views of one flat buffer, several buckets, no_sync() accumulation, a
compression comm hook, fused mode, torch.compile, and the
char-GPT example. Each run bounded in time (tests/_dist.py)."""

import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from _dist import run
from torch.nn.parallel import DistributedDataParallel as DDP

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 32)
        self.fc2 = nn.Linear(32, 32)
        self.fc3 = nn.Linear(32, 4)

    def forward(self, x):
        return self.fc3(torch.tanh(self.fc2(torch.relu(self.fc1(x)))))


def _batches(steps, n=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(n, 8, generator=g), torch.randint(0, 4, (n,), generator=g)) for _ in range(steps)]


def _max_diff(a, b):
    return max((p.detach().cpu() - q.detach().cpu()).abs().max().item() for p, q in zip(a, b))


def _reference(batches, accumulate=1):
    """One process, the full batch, on the CPU."""
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for i in range(0, len(batches), accumulate):
        opt.zero_grad()
        total = 0.0
        for x, y in batches[i : i + accumulate]:
            loss = F.cross_entropy(model(x), y) / accumulate
            loss.backward()
            total += loss.item()
        opt.step()
        losses.append(total)
    return list(model.parameters()), losses


def _train(rank, world, batches, accumulate=1, hook=None, compiled=False, **ddp):
    torch.manual_seed(0)
    model = MLP().to("tpu")
    model = DDP(model, **ddp)
    run_model = torch.compile(model, backend="tpu") if compiled else model
    if hook is not None:
        model.register_comm_hook(None, hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for i in range(0, len(batches), accumulate):
        opt.zero_grad()
        total = 0.0
        for j, (x, y) in enumerate(batches[i : i + accumulate]):
            half = x.shape[0] // world
            xs, ys = x[rank * half : (rank + 1) * half].to("tpu"), y[rank * half : (rank + 1) * half].to("tpu")
            last = j == accumulate - 1
            ctx = model.no_sync() if not last else _nothing()
            with ctx:
                loss = F.cross_entropy(run_model(xs), ys) / accumulate
                loss.backward()
            t = loss.detach().clone()
            dist.all_reduce(t, op=dist.ReduceOp.AVG)
            total += t.item()
        opt.step()
        losses.append(total)
    return model, losses


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def _ddp_mlp(rank, world):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    import torchtpu

    steps = 20
    batches = _batches(steps)
    ref, ref_losses = _reference(batches)
    out = {}

    # several buckets (a tiny bucket cap), gradients as views of the buckets
    model, losses = _train(rank, world, batches, gradient_as_bucket_view=True, bucket_cap_mb=0.002)
    assert len(model.reducer._get_zeros_like_grad_buckets()) > 1, "one bucket"
    assert all(p.grad._is_view() for p in model.parameters()), "gradients are not views of the bucket"
    out["buckets"] = (_max_diff(model.parameters(), ref), max(abs(a - b) for a, b in zip(losses, ref_losses)))

    # find_unused_parameters and static_graph: torch 2.13 cannot run them
    # for a device registered from Python (torchtpu._patches); a clear error
    # at construction, not at the first backward
    for kw in ({"find_unused_parameters": True}, {"static_graph": True}):
        try:
            DDP(MLP().to("tpu"), **kw)
        except NotImplementedError as e:
            assert "C++ device hook" in str(e) and next(iter(kw)) in str(e), e
        else:
            raise AssertionError(f"DDP({kw}) on tpu did not raise")

    # fused mode: the steps are recorded, the collectives are sync points
    with torchtpu.eager_mode("fused"):
        model, losses = _train(rank, world, batches)
    out["fused"] = (_max_diff(model.parameters(), ref), max(abs(a - b) for a, b in zip(losses, ref_losses)))

    # torch.compile of the DDP model (the collectives run between graphs)
    model, losses = _train(rank, world, batches, compiled=True)
    out["compiled"] = (_max_diff(model.parameters(), ref), max(abs(a - b) for a, b in zip(losses, ref_losses)))

    # no_sync: two micro-batches per step, the gradients synchronized on the second
    ref2, ref2_losses = _reference(batches, accumulate=2)
    model, losses = _train(rank, world, batches, accumulate=2)
    out["no_sync"] = (_max_diff(model.parameters(), ref2), max(abs(a - b) for a, b in zip(losses, ref2_losses)))

    # a compression hook: against the same DDP on CPU tensors with gloo
    gloo = dist.new_group(backend="gloo")
    # (torch's DDP refuses the bf16 hook on every device but CUDA and XPU:
    # a TypeError, on the CPU as on tpu)
    for dev, group in (("cpu", gloo), ("tpu", None)):
        m = DDP(MLP().to(dev), process_group=group)
        try:
            m.register_comm_hook(group, default_hooks.bf16_compress_hook)
        except TypeError:
            pass
        else:
            raise AssertionError(f"bf16_compress_hook accepted on {dev}")
    for name, hook in (("fp16", default_hooks.fp16_compress_hook), ("allreduce", default_hooks.allreduce_hook)):
        model, _ = _train(rank, world, batches[:5], hook=hook)
        torch.manual_seed(0)
        cpu = DDP(MLP(), process_group=gloo)
        cpu.register_comm_hook(gloo, hook)
        opt = torch.optim.SGD(cpu.parameters(), lr=0.1, momentum=0.9)
        for x, y in batches[:5]:
            half = x.shape[0] // world
            opt.zero_grad()
            F.cross_entropy(cpu(x[rank * half : (rank + 1) * half]), y[rank * half : (rank + 1) * half]).backward()
            opt.step()
        # fp16: a rounding difference of the float32 gradients (tpu and CPU
        # accumulate in different orders) can flip an fp16 rounding: 1e-3
        # of a gradient, times the learning rate
        tol = 1e-4 if name == "fp16" else 1e-6
        out[f"{name} hook"] = (_max_diff(model.parameters(), cpu.parameters()) * 1e-6 / tol, 0.0)
    return out


def test_ddp_trains_as_one_process_on_the_full_batch():
    results = run(_ddp_mlp, timeout_s=300)
    for r in results:
        for what, (params, losses) in r.items():
            assert params <= 1e-6 and losses <= 1e-6, (what, params, losses)


def _ddp_gpt(rank, world, steps):
    sys.path.insert(0, EXAMPLES)
    from char_gpt import get_batch, load_corpus, make_model

    tok, data = load_corpus()
    g = torch.Generator().manual_seed(0)
    batches = [get_batch(data, 8, 16, g) for _ in range(steps)]
    kw = {"block_size": 16, "n_layer": 1, "n_head": 2, "n_embd": 32}

    ref = make_model(tok.vocab_size, **kw)
    opt = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9)
    ref_losses = []
    for x, y in batches:
        opt.zero_grad()
        _, loss = ref(x, y)
        loss.backward()
        opt.step()
        ref_losses.append(loss.item())

    model = DDP(make_model(tok.vocab_size, device="tpu", **kw))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for x, y in batches:
        half = x.shape[0] // world
        opt.zero_grad()
        _, loss = model(x[rank * half : (rank + 1) * half].to("tpu"), y[rank * half : (rank + 1) * half].to("tpu"))
        loss.backward()
        opt.step()
        t = loss.detach()
        dist.all_reduce(t, op=dist.ReduceOp.AVG)
        losses.append(t.item())
    return _max_diff(model.module.parameters(), ref.parameters()), max(abs(a - b) for a, b in zip(losses, ref_losses))


def test_ddp_char_gpt_trains_as_one_process():
    for params, losses in run(_ddp_gpt, args=(20,), timeout_s=300):
        assert params <= 1e-6 and losses <= 1e-5, (params, losses)
