"""The host-staged collectives read and write the CPU plugin's device buffers
in place (torchtpu/_distributed.py `_lend`, the core's host_memory): what
gloo gives on CPU tensors, with nothing read back or written back, and
nothing else disturbed: ops recorded before the collective, other views of
the same storage, dtype views, a shard that is a slice of the gathered
tensor (FSDP2), tensors that cannot be lent. World size 2, fused and strict
modes, and with lending turned off (tests/_dist.py bounds every run)."""

import pytest
import torch
import torch.distributed as dist
from _dist import run

import torchtpu


def _data(rank, n, salt=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(10 * rank + salt)
    return torch.randn(n, generator=g).to(dtype)


def _same(tpu, cpu, what):
    got = tpu.cpu()
    assert got.dtype == cpu.dtype and got.shape == cpu.shape, (what, got.dtype, got.shape, cpu.shape)
    assert torch.equal(got, cpu), (what, got, cpu)


def _views():
    return torchtpu.metrics()["host_memory_views"]


def _in_place(rank, world):
    gloo = dist.new_group(backend="gloo")
    other = [_data(k, 8) for k in range(world)]
    total = sum(other)
    d2h, lent = torchtpu.metrics()["d2h_bytes"], _views()

    # a computed tensor; an op recorded before the collective keeps the old value
    t = other[rank].to("tpu") * 1.0
    before = t * 2
    dist.all_reduce(t)
    _same(t, total, "all_reduce")
    _same(before, other[rank] * 2, "an op recorded before the collective")
    _same(t + 1, total + 1, "an op after the collective reads the written buffer")

    # an in-place op recorded before the collective runs first
    u = other[rank].to("tpu")
    u.add_(1)
    dist.all_reduce(u)
    _same(u, sum(o + 1 for o in other), "all_reduce after a recorded add_")

    # a contiguous slice: the rest of its storage is left alone
    base = torch.arange(12.0).reshape(3, 4) + rank
    b = base.to("tpu")
    dist.all_reduce(b[1])
    want = base.clone()
    want[1] = sum(torch.arange(4.0) + 4 + k for k in range(world))
    _same(b, want, "all_reduce of a row")

    # a non-contiguous view cannot be lent: read back and written back
    c = base.to("tpu")
    dist.all_reduce(c[:, 1])
    want = base.clone()
    want[:, 1] = sum(base[:, 1] - rank + k for k in range(world))
    _same(c, want, "all_reduce of a column")

    # a dtype view: gloo sums the int32 bits, as on CPU
    bits = other[rank].clone()
    v = bits.to("tpu")
    dist.all_reduce(v.view(torch.int32))
    dist.all_reduce(bits.view(torch.int32), group=gloo)
    _same(v, bits, "all_reduce of an int32 view of a float tensor")

    # AVG and PREMUL_SUM in place
    a = other[rank].to("tpu") * 1.0
    dist.all_reduce(a, op=dist.ReduceOp.AVG)
    _same(a, total / world, "all_reduce AVG")

    # all_gather_into_tensor into a computed output; FSDP2's shard, a slice of it
    out = torch.zeros(8 * world, device="tpu") + 0.0
    dist.all_gather_into_tensor(out, other[rank].to("tpu") * 1.0)
    _same(out, torch.cat(other), "all_gather_into_tensor")
    flat = torch.zeros(8 * world, device="tpu") + 0.0
    flat[8 * rank : 8 * rank + 8] = other[rank].to("tpu")
    dist.all_gather_into_tensor(flat, flat[8 * rank : 8 * rank + 8])
    _same(flat, torch.cat(other), "all_gather_into_tensor of its own slice")

    # all_gather into chunks of one tensor (views of one storage)
    whole = torch.zeros(8 * world, device="tpu") + 0.0
    dist.all_gather(list(whole.chunk(world)), other[rank].to("tpu"))
    _same(whole, torch.cat(other), "all_gather into chunks of one tensor")

    # reduce_scatter_tensor of a computed input into a computed output
    xs = _data(rank, 4 * world, salt=1)
    full = sum(_data(k, 4 * world, salt=1) for k in range(world))
    rs = torch.zeros(4, device="tpu") + 0.0
    dist.reduce_scatter_tensor(rs, xs.to("tpu") * 1.0)
    _same(rs, full[4 * rank : 4 * rank + 4], "reduce_scatter_tensor")

    # broadcast; reduce: a non-root rank's tensor is left as it was
    bc = other[rank].to("tpu") * 1.0
    dist.broadcast(bc, 1)
    _same(bc, other[1], "broadcast")
    r = other[rank].to("tpu") * 1.0
    dist.reduce(r, 0)
    _same(r, total if rank == 0 else other[rank], "reduce")

    # all_to_all_single, integers
    xa = torch.arange(4 * world, dtype=torch.int64) + 100 * rank
    ya = torch.zeros(4 * world, dtype=torch.int64, device="tpu") + 0
    dist.all_to_all_single(ya, xa.to("tpu") + 0)
    want = torch.cat([torch.arange(4 * rank, 4 * rank + 4) + 100 * k for k in range(world)])
    _same(ya, want, "all_to_all_single")

    torch.tpu.synchronize()
    m = torchtpu.metrics()
    return {"views": m["host_memory_views"] - lent, "d2h": m["d2h_bytes"] - d2h}


@pytest.mark.parametrize("mode", ["fused", "strict"])
def test_collectives_read_and_write_the_buffers_in_place(mode, monkeypatch):
    monkeypatch.setenv("TORCHTPU_EAGER", mode)
    got = run(_in_place, timeout_s=240)
    for g in got:
        assert g["views"] >= 15, g  # the tensors above were lent
        # what was read back: the column, the .cpu() of each check, and no more
        assert g["d2h"] < 4096, g


def test_collectives_copy_when_lending_is_off(monkeypatch):
    monkeypatch.setenv("TORCHTPU_COLLECTIVE_IN_PLACE", "0")
    got = run(_in_place, timeout_s=240)
    for g in got:
        assert g["views"] == 0, g
