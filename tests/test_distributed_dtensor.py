"""DTensor and tensor parallelism on tpu (torch.distributed.tensor) across 2
processes, each compared with the same computation on unsharded CPU tensors
in the same process: placements and every redistribution, DTensor ops and
their gradients, ColwiseParallel/RowwiseParallel modules (an MLP, an
attention block, the TP tutorial's sequence-parallel transformer with loss
parallel), trained for a few SGD steps (the MLP in fused mode too), and
DTensor's random ops. One spawned run holds all the checks (a spawn costs seconds on 2
cores); every collective is bounded by the group's timeout and the run by a
join deadline, so a hang fails the test instead of stalling it. A 2-D mesh
needs 4 processes: TORCHTPU_TEST_WORLD4=1 runs that check too (slow on 2
cores)."""

import copy
import datetime
import os
import socket
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

COLLECTIVE_TIMEOUT = datetime.timedelta(seconds=30)
JOIN_DEADLINE_S = 150
TOL = 1e-5


# ---- running a function on every rank --------------------------------------


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank, fn, world, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    import torchtpu  # noqa: F401

    torch.tpu.init()  # the device is this process's before DeviceMesh looks for one
    dist.init_process_group(rank=rank, world_size=world, timeout=COLLECTIVE_TIMEOUT)
    try:
        fn(rank, world)
    finally:
        dist.destroy_process_group()


def _spawn(fn, world):
    """Runs fn(rank, world) in world processes; a failure on any rank is raised
    here (and ends the others), a run past the deadline is killed."""
    ctx = mp.start_processes(_entry, args=(fn, world, _free_port()), nprocs=world, join=False, start_method="spawn")
    deadline = time.monotonic() + JOIN_DEADLINE_S
    try:
        while not ctx.join(timeout=5):
            if time.monotonic() > deadline:
                pytest.fail(f"the {world} processes did not finish within {JOIN_DEADLINE_S} s")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
                p.join(5)


# ---- helpers on every rank --------------------------------------------------


def _close(got, want, tol=TOL):
    from torch.distributed.tensor import DTensor

    if isinstance(got, DTensor):
        got = got.full_tensor()
    torch.testing.assert_close(got.detach().cpu(), want.detach(), atol=tol, rtol=tol)


def _randn(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _on_all_ranks(t):
    """t (a CPU tensor) of every rank."""
    out = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
    return out


# ---- the checks --------------------------------------------------------------


def _check_placements(mesh, rank, world):
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
    from torch.distributed.tensor._dtensor_spec import DTensorSpec
    from torch.distributed.tensor._redistribute import redistribute_local_tensor

    X = _randn(5, 6, seed=1)  # 5 rows: uneven shards (3 and 2)
    plain = [Shard(0), Shard(1), Replicate()]
    for p in plain:
        d = distribute_tensor(X.to("tpu"), mesh, [p])
        want = X.chunk(world, p.dim)[rank] if isinstance(p, Shard) else X
        assert d.to_local().device.type == "tpu"
        assert torch.equal(d.to_local().cpu(), want)
        assert torch.equal(d.full_tensor().cpu(), X)
    # every redistribution a user may ask for, from Partial too
    for src in [*plain, Partial()]:
        for dst in [*plain, Partial()] if src == Partial() else plain:
            if src == Partial():
                d = DTensor.from_local((X / world).to("tpu"), mesh, [Partial()])
            else:
                d = distribute_tensor(X.to("tpu"), mesh, [src])
            e = d.redistribute(mesh, [dst])
            assert e.placements == (dst,)
            _close(e, X, 1e-6)
    # Replicate -> Partial, which DTensor does inside its ops and gradients
    d = distribute_tensor(X.to("tpu"), mesh, [Replicate()])
    spec = DTensorSpec(mesh, (Partial(),), tensor_meta=d._spec.tensor_meta)
    local = redistribute_local_tensor(d.to_local(), d._spec, spec)
    _close(DTensor.from_local(local, mesh, [Partial()], shape=X.shape, stride=X.stride()), X)
    # each reduction of Partial, to Replicate and to each Shard
    mine = X + rank
    wants = {
        "sum": sum(X + r for r in range(world)),
        "avg": sum(X + r for r in range(world)) / world,
        "max": X + (world - 1),
        "min": X,
    }
    for op, want in wants.items():
        p = DTensor.from_local(mine.to("tpu"), mesh, [Partial(op)])
        for dst in plain:
            _close(p.redistribute(mesh, [dst]), want, 1e-6)
    # other dtypes are moved exactly
    for dt in (torch.bfloat16, torch.int64, torch.float64):
        Y = (X * 8).to(dt)
        d = distribute_tensor(Y.to("tpu"), mesh, [Shard(0)]).redistribute(mesh, [Shard(1)])
        f = d.redistribute(mesh, [Replicate()]).to_local().cpu()
        assert f.dtype == dt and torch.equal(f, Y)
    # a rank with an empty shard
    Z = _randn(1, 3, seed=2)
    d = distribute_tensor(Z.to("tpu"), mesh, [Shard(0)])
    assert d.to_local().shape == ((1, 3) if rank == 0 else (0, 3))
    assert torch.equal(d.full_tensor().cpu(), Z)
    _close(d.sum(), Z.sum())
    # async: the result waits for its collective where it is used
    a = distribute_tensor(X.to("tpu"), mesh, [Shard(0)]).redistribute(mesh, [Replicate()], async_op=True)
    _close(a.to_local() * 2, X * 2)


def _check_ops(mesh, rank, world):
    from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor

    A, B = _randn(6, 8, seed=3), _randn(8, 4, seed=4)

    def dt(t, p):
        return distribute_tensor(t.to("tpu"), mesh, [p])

    a0, a1, b0 = dt(A, Shard(0)), dt(A, Shard(1)), dt(B, Shard(0))
    _close(a0 @ dt(B, Replicate()), A @ B)
    y = a1 @ b0  # contraction over the sharded dim: a Partial sum
    assert y.placements == (Partial(),)
    _close(y, A @ B)
    _close(a0 + a1, A + A)
    s = a0.sum()
    assert s.placements == (Partial(),)
    _close(s, A.sum())
    _close(a1.mean(), A.mean())
    _close(a1.amax(1), A.amax(1))
    _close(a1.var(1), A.var(1))
    for a in (a0, a1):  # softmax along a replicated and along the sharded dim
        _close(torch.softmax(a, 1), torch.softmax(A, 1))
        _close(F.log_softmax(a, 1), F.log_softmax(A, 1))
    _close(F.layer_norm(a0, (8,)), F.layer_norm(A, (8,)))
    _close(F.gelu(a1), F.gelu(A))
    _close(torch.addmm(dt(torch.ones(4), Replicate()), a1, b0), torch.addmm(torch.ones(4), A, B))
    # gradients
    ar, br = A.clone().requires_grad_(), B.clone().requires_grad_()
    at, bt = a0.detach().requires_grad_(), dt(B, Shard(1)).requires_grad_()
    torch.softmax(ar @ br, -1).pow(2).sum().backward()
    torch.softmax(at @ bt, -1).pow(2).sum().backward()
    assert at.grad.placements == (Shard(0),)
    _close(at.grad, ar.grad)
    _close(bt.grad, br.grad)
    # in-place ops on a shard, and through a view of the unsharded dim
    d = dt(A, Shard(0))
    d.add_(1).mul_(2)
    d[:, 1:3].zero_()
    W = (A + 1) * 2
    W[:, 1:3] = 0
    _close(d, W, 0)


class _MLP(nn.Module):
    def __init__(self, d=8, h=16):
        super().__init__()
        self.w1, self.w2 = nn.Linear(d, h), nn.Linear(h, d)

    def forward(self, x):
        return self.w2(F.relu(self.w1(x)))


class _Attention(nn.Module):
    """Multi-head self-attention as in the TP tutorial: heads are split from
    the projections by view(-1), so each rank runs its own heads."""

    def __init__(self, d=16, nh=4):
        super().__init__()
        self.hd = d // nh
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(d, d, bias=False) for _ in range(4))

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = (w(x).view(b, t, -1, self.hd).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(a.transpose(1, 2).reshape(b, t, -1))


def _mlp_plan():
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {"w1": ColwiseParallel(), "w2": RowwiseParallel()}


def _attention_plan(prefix="", out=None):
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    wo = RowwiseParallel() if out is None else RowwiseParallel(output_layouts=out)
    return {**{f"{prefix}{w}": ColwiseParallel() for w in ("wq", "wk", "wv")}, f"{prefix}wo": wo}


def _train_and_compare(mesh, make, plan, x, adam=False, steps=3):
    """The module sharded by plan on tpu against the unsharded one on CPU:
    outputs, every gradient (clipped by norm) and the parameters after
    `steps` optimizer steps (SGD with momentum, or AdamW)."""
    from torch.distributed.tensor.parallel import parallelize_module

    torch.manual_seed(0)
    ref = make()
    tp = parallelize_module(copy.deepcopy(ref).to("tpu"), mesh, plan)
    if adam:
        opts = [torch.optim.AdamW(m.parameters(), lr=0.01) for m in (ref, tp)]
    else:
        opts = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in (ref, tp)]
    for _ in range(steps):
        y = ref(x)
        y.pow(2).mean().backward()
        yt = tp(x.to("tpu"))
        yt.pow(2).mean().backward()
        _close(yt, y)
        for p, pt in zip(ref.parameters(), tp.parameters()):
            _close(pt.grad, p.grad)
        norms = [nn.utils.clip_grad_norm_(m.parameters(), 0.5) for m in (ref, tp)]
        _close(norms[1], norms[0])
        for o in opts:
            o.step()
            o.zero_grad()
    for p, pt in zip(ref.parameters(), tp.parameters()):
        _close(pt, p)


class _Block(nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.attention_norm, self.ffn_norm = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attention, self.feed_forward = _Attention(d), _MLP(d, 2 * d)

    def forward(self, x):
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


class _Transformer(nn.Module):
    def __init__(self, vocab=16, d=16):
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList([_Block(d)])
        self.norm, self.output = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, ids):
        h = self.tok_embeddings(ids)
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h))


def _check_sequence_parallel_transformer(mesh):
    """The TP tutorial's plan: vocab-parallel embedding, sequence-parallel
    norms, colwise/rowwise attention and feed-forward, a colwise output
    whose sharded logits go to the loss as they are (loss_parallel)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        loss_parallel,
        parallelize_module,
    )

    torch.manual_seed(0)
    ref = _Transformer()
    tp = copy.deepcopy(ref).to("tpu")
    parallelize_module(
        tp,
        mesh,
        {
            "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
            "norm": SequenceParallel(),
            "output": ColwiseParallel(input_layouts=Shard(1), use_local_output=False),
        },
    )
    blk = {
        "attention_norm": SequenceParallel(),
        "attention": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        **_attention_plan("attention.", out=Shard(1)),
        "ffn_norm": SequenceParallel(),
        "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
    }
    parallelize_module(tp.layers[0], mesh, blk)
    g = torch.Generator().manual_seed(5)
    ids, target = torch.randint(0, 16, (2, 6), generator=g), torch.randint(0, 16, (2, 6), generator=g)
    loss = F.cross_entropy(ref(ids).flatten(0, 1), target.flatten())
    loss.backward()
    with loss_parallel():
        logits = tp(ids.to("tpu"))
        assert logits.placements == (Shard(2),)
        lt = F.cross_entropy(logits.flatten(0, 1), target.to("tpu").flatten())
        lt.backward()
    _close(lt, loss)
    for p, pt in zip(ref.parameters(), tp.parameters()):
        _close(pt.grad, p.grad)


def _check_loss_parallel_on_cpu(rank, world):
    """loss_parallel is not the tpu's: the same on a CPU mesh (gloo)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, loss_parallel, parallelize_module

    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    ref = nn.Linear(8, 6)
    tp = parallelize_module(copy.deepcopy(ref), mesh, ColwiseParallel(use_local_output=False))
    x, target = _randn(4, 8, seed=6), torch.tensor([0, 5, 3, 1])
    loss = F.cross_entropy(ref(x), target)
    loss.backward()
    with loss_parallel():
        lt = F.cross_entropy(tp(x), target)
        lt.backward()
    _close(lt, loss)
    _close(tp.weight.grad, ref.weight.grad)


def _check_random(mesh, rank, world):
    import torch.distributed.tensor as dtensor
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    torch.manual_seed(5)
    for dt in (torch.float32, torch.float64):
        d = dtensor.randn(8, 4, dtype=dt, device_mesh=mesh, placements=[Shard(0)])
        assert d.to_local().device.type == "tpu" and d.dtype == dt
        full = d.full_tensor().cpu()
        assert not torch.equal(full[:4], full[4:])  # each shard its own numbers
    r = dtensor.rand(4, 4, device_mesh=mesh, placements=[Replicate()]).to_local().cpu()
    assert all(torch.equal(o, r) for o in _on_all_ranks(r))  # replicas draw the same
    states = _on_all_ranks(torch.tpu.get_rng_state())
    assert all(torch.equal(s, states[0]) for s in states)  # and the generators stay in step
    drop = F.dropout(distribute_tensor(torch.ones(8, 4, device="tpu"), mesh, [Shard(0)]), 0.5).full_tensor().cpu()
    assert set(drop.unique().tolist()) <= {0.0, 2.0} and not torch.equal(drop[:4], drop[4:])


def _world2(rank, world):
    from torch.distributed.device_mesh import init_device_mesh

    import torchtpu

    mesh = init_device_mesh("tpu", (world,))
    _check_placements(mesh, rank, world)
    _check_ops(mesh, rank, world)
    _train_and_compare(mesh, _MLP, _mlp_plan(), _randn(4, 8, seed=7))
    _train_and_compare(mesh, _Attention, _attention_plan(), _randn(2, 6, 16, seed=8), adam=True)
    with torchtpu.eager_mode("fused"):  # collectives end the recorded program (a download)
        _train_and_compare(mesh, _MLP, _mlp_plan(), _randn(4, 8, seed=7))
    _check_sequence_parallel_transformer(mesh)
    _check_loss_parallel_on_cpu(rank, world)
    _check_random(mesh, rank, world)


def _world4(rank, world):
    """A 2 x 2 mesh ("dp", "tp"): 2-D placements, and the MLP tensor-parallel
    over "tp" with its batch split over "dp"."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import parallelize_module

    mesh = init_device_mesh("tpu", (2, 2), mesh_dim_names=("dp", "tp"))
    X = _randn(6, 8, seed=1)
    pls = [[Shard(0), Shard(1)], [Shard(1), Shard(0)], [Replicate(), Shard(0)], [Shard(0), Replicate()]]
    for a in pls:
        for b in [*pls, [Replicate(), Replicate()]]:
            _close(distribute_tensor(X.to("tpu"), mesh, a).redistribute(mesh, b), X, 0)
    p = DTensor.from_local(X.to("tpu"), mesh, [Partial(), Partial()]).redistribute(mesh, [Shard(0), Shard(1)])
    _close(p, 4 * X)
    torch.manual_seed(0)
    ref = _MLP()
    tp = parallelize_module(copy.deepcopy(ref).to("tpu"), mesh["tp"], _mlp_plan())
    x = _randn(4, 8, seed=7)
    y = ref(x)
    y.pow(2).mean().backward()
    dp = mesh.get_local_rank("dp")
    yt = tp(x.chunk(2)[dp].to("tpu"))
    (yt.pow(2).sum() / y.numel()).backward()
    _close(yt, y.chunk(2)[dp])
    for p in tp.parameters():  # data parallel over "dp"
        dist.all_reduce(p.grad.to_local(), group=mesh.get_group("dp"))
    for p, pt in zip(ref.parameters(), tp.parameters()):
        _close(pt.grad, p.grad)


def test_dtensor_and_tensor_parallel_two_processes():
    _spawn(_world2, 2)


@pytest.mark.skipif(not os.environ.get("TORCHTPU_TEST_WORLD4"), reason="4 processes: TORCHTPU_TEST_WORLD4=1")
def test_dtensor_two_dimensional_mesh_four_processes():
    _spawn(_world4, 4)
