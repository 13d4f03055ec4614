"""What training scripts use besides ops: optimizers (foreach, fused,
capturable), LR schedulers, gradient clipping, RNG state, autocast, module
moves, checkpoints, memory queries, pinned memory and data loading. Each is
checked against the same code on CPU."""

import copy
import io
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torchtpu


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))


def _steps(model, opt, x, sched=None, n=4, clip=None):
    for _ in range(n):
        opt.zero_grad(set_to_none=True)
        model(x).pow(2).mean().backward()
        if clip:
            nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        if sched:
            sched.step()


def _compare(make_opt_cpu, make_opt_tpu, sched=None, clip=None):
    m = _net()
    mt = copy.deepcopy(m).to("tpu")
    oc, ot = make_opt_cpu(m.parameters()), make_opt_tpu(mt.parameters())
    sc = sched(oc) if sched else None
    st = sched(ot) if sched else None
    x = torch.randn(5, 8, generator=torch.Generator().manual_seed(1))
    _steps(m, oc, x, sc, clip=clip)
    _steps(mt, ot, x.to("tpu"), st, clip=clip)
    for a, b in zip(m.parameters(), mt.parameters()):
        assert b.device.type == "tpu"
        torch.testing.assert_close(b.cpu(), a, rtol=1e-5, atol=1e-6)
    return oc, ot


OPTS = {
    "sgd": lambda p, **k: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01, **k),
    "adam": lambda p, **k: torch.optim.Adam(p, lr=0.01, **k),
    "adamw": lambda p, **k: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1, **k),
    "adam_amsgrad": lambda p, **k: torch.optim.Adam(p, lr=0.01, amsgrad=True, **k),
    "rmsprop": lambda p, **k: torch.optim.RMSprop(p, lr=0.01, momentum=0.5, **k),
    "adagrad": lambda p, **k: torch.optim.Adagrad(p, lr=0.1, **k),
    "sgd_plain": lambda p, **k: torch.optim.SGD(p, lr=0.1, **k),
    "adagrad_decay": lambda p, **k: torch.optim.Adagrad(p, lr=0.1, lr_decay=0.01, weight_decay=0.05, **k),
}


@pytest.mark.parametrize("name", sorted(OPTS))
@pytest.mark.parametrize("foreach", [False, True])
def test_optimizer_matches_cpu(name, foreach):
    make = OPTS[name]
    _compare(lambda p: make(p, foreach=foreach), lambda p: make(p, foreach=foreach))


def test_foreach_is_the_default_path_on_tpu():
    from torch.optim.optimizer import _default_to_fused_or_foreach

    p = [torch.zeros(2, device="tpu", requires_grad=True)]
    fused, foreach = _default_to_fused_or_foreach(p, differentiable=False, use_fused=False)
    assert foreach and not fused


@pytest.mark.parametrize("name", ["adam", "adamw", "adam_amsgrad", "sgd", "sgd_plain", "adagrad", "adagrad_decay"])
def test_fused_optimizers_match_cpu_fused(name):
    make = OPTS[name]
    _compare(lambda p: make(p, fused=True), lambda p: make(p, fused=True))


def test_fused_adam_is_one_program_per_step_and_lr_changes_do_not_recompile():
    m = _net().to("tpu")
    opt = torch.optim.AdamW(m.parameters(), lr=0.01, fused=True)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, 10)
    x = torch.randn(5, 8, device="tpu")
    _steps(m, opt, x, sched, n=2)
    calls = []
    handle = torch.ops.aten._fused_adamw_.default
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args, kwargs=None):
            if func is handle:
                calls.append(func)
            return func(*args, **(kwargs or {}))

    compiled = torchtpu.metrics()["programs_compiled"]
    with Count():
        _steps(m, opt, x, sched, n=3)
    assert len(calls) == 3
    assert torchtpu.metrics()["programs_compiled"] == compiled  # new learning rates are inputs


def test_fused_adam_tensor_lr_and_many_parameters():
    # 60 parameters: more than one group of the fused program
    torch.manual_seed(0)
    ps = [torch.randn(3, 2) for _ in range(60)]
    pt = [p.to("tpu").requires_grad_() for p in ps]
    ps = [p.requires_grad_() for p in ps]
    oc = torch.optim.Adam(ps, lr=torch.tensor(0.01), fused=True)
    ot = torch.optim.Adam(pt, lr=torch.tensor(0.01), fused=True)
    for params, opt in ((ps, oc), (pt, ot)):
        for _ in range(2):
            opt.zero_grad()
            sum((p * p).sum() for p in params).backward()
            opt.step()
    for a, b in zip(ps, pt):
        torch.testing.assert_close(b.cpu(), a.detach(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["adam", "adamw", "sgd"])
def test_capturable_matches_cpu(name):
    make = OPTS[name]
    kw = {"capturable": True} if name != "sgd" else {}
    _, ot = _compare(lambda p: make(p), lambda p: make(p, **kw))
    if kw:
        steps = [s["step"] for s in ot.state.values()]
        assert all(s.device.type == "tpu" for s in steps)


def test_schedulers_and_clip_grad_norm():
    sched = lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.05, total_steps=10)  # noqa: E731
    _compare(lambda p: OPTS["sgd"](p), lambda p: OPTS["sgd"](p), sched=sched, clip=0.5)
    _compare(
        lambda p: OPTS["adamw"](p),
        lambda p: OPTS["adamw"](p),
        sched=lambda o: torch.optim.lr_scheduler.StepLR(o, 1, 0.5),
        clip=0.1,
    )


def test_zero_grad_set_to_none():
    m = _net().to("tpu")
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    m(torch.randn(2, 8, device="tpu")).sum().backward()
    assert all(p.grad is not None for p in m.parameters())
    opt.zero_grad(set_to_none=True)
    assert all(p.grad is None for p in m.parameters())


def test_optimizer_state_dict_round_trip():
    m = _net().to("tpu")
    opt = torch.optim.AdamW(m.parameters(), lr=0.01)
    _steps(m, opt, torch.randn(4, 8, device="tpu"), n=2)
    sd = copy.deepcopy(opt.state_dict())
    opt2 = torch.optim.AdamW(m.parameters(), lr=0.01)
    opt2.load_state_dict(sd)
    for s in opt2.state.values():
        assert s["exp_avg"].device.type == "tpu"


# ---- RNG ----------------------------------------------------------------------


def test_manual_seed_seeds_the_device():
    torch.manual_seed(123)
    a = torch.rand(5, device="tpu").cpu()
    torch.manual_seed(123)
    b = torch.rand(5, device="tpu").cpu()
    assert torch.equal(a, b)
    c = torch.rand(5, device="tpu").cpu()
    assert not torch.equal(b, c)


def test_rng_state_get_set():
    torch.manual_seed(7)
    state = torch.tpu.get_rng_state()
    # CUDA's layout (DTensor's random ops move the offset in place): seed, offset
    assert state.dtype == torch.uint8 and state.shape == (16,)
    assert state[:8].view(torch.int64).item() == 7 and state[8:].view(torch.int64).item() == 0
    a = torch.randn(4, device="tpu").cpu()
    assert torch.tpu.get_rng_state()[8:].view(torch.int64).item() > 0
    torch.tpu.set_rng_state(state)
    assert torch.equal(torch.randn(4, device="tpu").cpu(), a)
    # a moved offset starts a different stream
    moved = state.clone()
    moved[8:] = torch.tensor([4], dtype=torch.int64).view(torch.uint8)
    torch.tpu.set_rng_state(moved)
    assert not torch.equal(torch.randn(4, device="tpu").cpu(), a)
    with pytest.raises(ValueError, match="16-byte uint8"):
        torch.tpu.set_rng_state(torch.zeros(3, dtype=torch.int64))


def test_rng_state_all_round_trips_like_cuda():
    # accelerate's and the HF Trainer's checkpoints save get_rng_state_all()
    # (the Trainer through device_module.random) and restore it
    torch.manual_seed(5)
    states = torch.tpu.get_rng_state_all()
    assert len(states) == torch.tpu.device_count() and all(torch.equal(s, states[0]) for s in states)
    a = torch.rand(6, device="tpu").cpu()
    torch.tpu.random.set_rng_state_all(states)
    assert torch.equal(torch.rand(6, device="tpu").cpu(), a)
    assert torch.equal(torch.tpu.random.get_rng_state(), torch.tpu.get_rng_state())
    before = torch.tpu.get_rng_state()
    other = states[0].clone()
    other[8] += 1
    with pytest.raises(ValueError, match="share one generator"):
        torch.tpu.set_rng_state_all([states[0], other])
    with pytest.raises(ValueError, match="16-byte uint8"):
        torch.tpu.set_rng_state_all([torch.zeros(2)])
    with pytest.raises(ValueError, match="got none"):
        torch.tpu.set_rng_state_all([])
    assert torch.equal(torch.tpu.get_rng_state(), before)  # the refused calls set nothing
    torch.tpu.set_rng_state_all(states)
    assert torch.equal(torch.tpu.get_rng_state(), states[0])


def test_out_of_memory_error_is_torch_tpu_s_and_torch_s():
    assert torch.tpu.OutOfMemoryError is torchtpu.OutOfMemoryError
    assert issubclass(torch.tpu.OutOfMemoryError, torch.OutOfMemoryError)
    assert issubclass(torch.tpu.OutOfMemoryError, MemoryError)


def test_rng_offset_unit_covers_any_sampler():
    """DTensor starts shard k of a random op at offset k x the shard's numel;
    one offset unit is 32 random words, more than any sampler draws for an
    element, so streams one unit apart share no bits."""
    state = torch.tpu.get_rng_state()
    draws = []
    for off in (0, 1):
        s = state.clone()
        s[8:] = torch.tensor([off], dtype=torch.int64).view(torch.uint8)
        torch.tpu.set_rng_state(s)
        draws.append(set(torch.randint(0, 2**62, (16,), device="tpu").tolist()))
    assert not draws[0] & draws[1]


def test_fork_rng_restores_the_device_generator():
    torch.manual_seed(3)
    with torch.random.fork_rng(device_type="tpu"):
        torch.randn(10, device="tpu")
    a = torch.randn(4, device="tpu").cpu()
    torch.manual_seed(3)
    assert torch.equal(torch.randn(4, device="tpu").cpu(), a)


def test_dropout_is_reproducible_for_a_seed():
    x = torch.ones(64, 64, device="tpu")
    torch.manual_seed(11)
    a = F.dropout(x, 0.5, training=True).cpu()
    torch.manual_seed(11)
    b = F.dropout(x, 0.5, training=True).cpu()
    assert torch.equal(a, b)
    assert 0.4 < (a == 0).float().mean().item() < 0.6


# ---- autocast -----------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_policy(dtype):
    x = torch.randn(4, 8, device="tpu")
    w = torch.randn(3, 8, device="tpu")
    y = torch.tensor([0, 1, 2, 1], device="tpu")
    conv = nn.Conv2d(2, 4, 3).to("tpu")
    img = torch.randn(1, 2, 6, 6, device="tpu")
    with torch.autocast("tpu", dtype=dtype):
        h = F.linear(x, w)
        assert h.dtype == dtype
        assert (x @ w.t()).dtype == dtype
        assert torch.bmm(x[None], w.t()[None]).dtype == dtype
        assert conv(img).dtype == dtype
        assert F.cross_entropy(h, y).dtype == torch.float32
        assert torch.softmax(h, -1).dtype == torch.float32
        assert h.sum().dtype == torch.float32
        assert F.layer_norm(h, (3,)).dtype == torch.float32
        assert (h + 1).dtype == dtype  # not in any list: runs in its input's dtype
        assert torch.cat([h, x[:, :3]]).dtype == torch.float32  # promote
        assert x.double().mm(w.double().t()).dtype == torch.float64  # float64 is never cast
    assert F.linear(x, w).dtype == torch.float32  # outside the region


def test_autocast_default_dtype_is_bfloat16():
    # the TPU's 16-bit type, as PyTorch/XLA's; torch's own default for the device is float16
    assert torch.get_autocast_dtype("tpu") == torch.bfloat16
    x = torch.randn(4, 8, device="tpu")
    with torch.autocast("tpu"):
        assert (x @ x.t()).dtype == torch.bfloat16
    with torch.autocast("tpu", dtype=torch.float16):
        assert (x @ x.t()).dtype == torch.float16


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_loss_and_grads_match_cpu_autocast(dtype):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 5))
    mt = copy.deepcopy(m).to("tpu")
    x, y = torch.randn(8, 16), torch.randint(0, 5, (8,))
    with torch.autocast("cpu", dtype=dtype):
        lc = F.cross_entropy(m(x), y)
    with torch.autocast("tpu", dtype=dtype):
        lt = F.cross_entropy(mt(x.to("tpu")), y.to("tpu"))
    assert lt.dtype == lc.dtype == torch.float32
    assert abs(lt.item() - lc.item()) <= 0.01 * abs(lc.item())
    lc.backward()
    lt.backward()
    for a, b in zip(m.parameters(), mt.parameters()):
        assert b.grad.dtype == torch.float32
        torch.testing.assert_close(b.grad.cpu(), a.grad, rtol=0.05, atol=0.02)


def test_matmul_precision_knob():
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("medium")
        assert torch.tpu.get_matmul_precision() == "medium"
        torch.tpu.set_matmul_precision("high")
        assert torch.tpu.get_matmul_precision() == "high"
        with pytest.raises(ValueError, match="expected one of"):
            torch.tpu.set_matmul_precision("fast")
    finally:
        torch.set_float32_matmul_precision(before)
    assert torch.tpu.get_matmul_precision() == before


# ---- modules and checkpoints ---------------------------------------------------


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(11, 6)
        self.bn = nn.BatchNorm1d(6)
        self.head = nn.Linear(6, 11, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, idx):
        return self.head(self.bn(self.emb(idx)))


def test_module_to_tpu_keeps_tied_weights_and_parameter_identity():
    m = Tied()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)  # made before the move, as on CUDA
    w = m.emb.weight
    m.to("tpu")
    assert m.head.weight is m.emb.weight is w and w.device.type == "tpu"
    assert len(list(m.parameters())) == 3
    m(torch.tensor([1, 2, 3], device="tpu")).sum().backward()
    before = w.detach().cpu()
    opt.step()
    assert not torch.equal(w.detach().cpu(), before)
    m.cpu()
    assert m.head.weight is m.emb.weight and w.device.type == "cpu"
    m.tpu()
    assert m.head.weight is m.emb.weight and w.device.type == "tpu"


def test_batchnorm_buffers_update():
    m = Tied().to("tpu")
    c = copy.deepcopy(m).cpu()
    idx = torch.tensor([1, 2, 3, 4])
    m(idx.to("tpu"))
    c(idx)
    torch.testing.assert_close(m.bn.running_mean.cpu(), c.bn.running_mean)
    torch.testing.assert_close(m.bn.running_var.cpu(), c.bn.running_var)
    assert m.bn.num_batches_tracked.item() == 1


def test_deepcopy_of_a_model_on_tpu():
    m = Tied().to("tpu")
    d = copy.deepcopy(m)
    assert d.emb.weight.device.type == "tpu" and d.head.weight is d.emb.weight
    assert d.emb.weight is not m.emb.weight
    torch.testing.assert_close(d.emb.weight.cpu(), m.emb.weight.cpu())


def _roundtrip(obj, **kw):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, **kw)


def test_save_and_load_tpu_tensors():
    t = torch.randn(3, 4, device="tpu")
    view = t[:, 1]
    got = _roundtrip({"t": t, "v": view})
    assert got["t"].device.type == "tpu" and torch.equal(got["t"].cpu(), t.cpu())
    assert got["v"].device.type == "tpu" and torch.equal(got["v"].cpu(), view.cpu())
    assert got["v"].untyped_storage().data_ptr() == got["t"].untyped_storage().data_ptr()  # views stay views
    cpu = _roundtrip({"t": t}, map_location="cpu")["t"]
    assert cpu.device.type == "cpu" and torch.equal(cpu, t.cpu())
    moved = _roundtrip({"t": t.cpu()}, map_location="tpu")["t"]
    assert moved.device.type == "tpu" and torch.equal(moved.cpu(), t.cpu())
    bf = _roundtrip(torch.randn(5).bfloat16().to("tpu"))
    assert bf.dtype == torch.bfloat16 and bf.device.type == "tpu"


def test_safetensors_weights_load_to_the_cpu_then_move(tmp_path):
    """docs/training.md's recipe: safetensors refuses device="tpu" by its own
    check; loading to the CPU and moving gives the same module."""
    st = pytest.importorskip("safetensors.torch")
    torch.manual_seed(0)
    src = torch.nn.Linear(4, 3).to("tpu")
    path = str(tmp_path / "w.safetensors")
    st.save_file({k: v.cpu() for k, v in src.state_dict().items()}, path)
    with pytest.raises(Exception, match="device tpu is invalid"):
        st.load_file(path, device="tpu")
    dst = torch.nn.Linear(4, 3)
    dst.load_state_dict(st.load_file(path))
    dst.to("tpu")
    x = torch.randn(2, 4, device="tpu")
    assert torch.equal(dst(x).cpu(), src(x).cpu())
    moved = {k: v.to("tpu") for k, v in st.load_file(path).items()}
    assert all(v.device.type == "tpu" for v in moved.values())


@pytest.mark.parametrize("reentrant", [False, True])
def test_activation_checkpoint_recomputes_dropout_with_the_same_mask(reentrant):
    """torch.utils.checkpoint saves the tpu generator for the recomputed
    forward (it reads torch.tpu._initialized): the gradients are those of the
    forward that ran."""
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 8).to("tpu")
    x = torch.randn(4, 8, device="tpu", requires_grad=True)

    def f(t):
        return torch.nn.functional.dropout(lin(t), 0.5)

    grads = []
    for ck in (True, False):
        torch.manual_seed(1)
        y = checkpoint(f, x, use_reentrant=reentrant) if ck else f(x)
        (y * torch.arange(8.0, device="tpu")).sum().backward()
        grads.append((y.detach().cpu(), x.grad.cpu(), lin.weight.grad.cpu()))
        x.grad = lin.weight.grad = lin.bias.grad = None
    for a, b in zip(*grads):
        assert torch.equal(a, b)


def test_state_dict_checkpoint_resumes_identically():
    m = Tied().to("tpu")
    opt = torch.optim.AdamW(m.parameters(), lr=0.01)
    idx = torch.tensor([1, 2, 3, 4, 5], device="tpu")
    for _ in range(2):
        opt.zero_grad()
        m(idx).logsumexp(-1).mean().backward()
        opt.step()
    ck = _roundtrip({"model": m.state_dict(), "opt": opt.state_dict()})

    def resume(device, ck):
        r = Tied().to(device)
        o = torch.optim.AdamW(r.parameters(), lr=0.01)
        r.load_state_dict(ck["model"])
        o.load_state_dict(ck["opt"])
        o.zero_grad()
        loss = r(idx.to(device)).logsumexp(-1).mean()
        loss.backward()
        o.step()
        return loss.item(), r

    opt.zero_grad()
    loss = m(idx).logsumexp(-1).mean()
    loss.backward()
    opt.step()
    lt, rt = resume("tpu", ck)
    lc, rc = resume("cpu", _roundtrip({"model": ck["model"], "opt": ck["opt"]}, map_location="cpu"))
    assert lt == loss.item()
    assert abs(lc - loss.item()) <= 1e-5 * abs(loss.item())
    torch.testing.assert_close(rt.emb.weight.cpu(), m.emb.weight.cpu(), rtol=0, atol=0)


def test_untyped_storage_on_tpu():
    s = torch.UntypedStorage(8, device="tpu")
    assert s.device.type == "tpu" and s.nbytes() == 8
    s.copy_(torch.UntypedStorage(8).fill_(3))
    assert torch.tensor([], dtype=torch.uint8, device="tpu").set_(s).cpu().tolist() == [3] * 8
    assert torch.UntypedStorage(4).device.type == "cpu"


def test_memory_queries():
    base = torch.tpu.memory_allocated()
    torch.tpu.reset_peak_memory_stats()
    t = torch.empty(1000, dtype=torch.float32, device="tpu").fill_(1)
    torch.tpu.synchronize()  # fused mode computes at a sync point
    assert torch.tpu.memory_allocated() >= base + 4000
    assert torch.tpu.max_memory_allocated() >= torch.tpu.memory_allocated()
    del t
    assert torch.tpu.memory_allocated() <= base + 64  # a few cached 0-d scalar inputs may remain
    assert torch.tpu.max_memory_allocated() >= base + 4000
    stats = torch.tpu.memory_stats()
    assert stats["allocated_bytes.all.current"] == torch.tpu.memory_allocated()
    free, total = torch.tpu.mem_get_info()
    assert 0 < free <= total
    with torch.tpu.device(0):
        pass


def test_pinned_memory_and_non_blocking_loader():
    ds = torch.utils.data.TensorDataset(torch.arange(12.0).reshape(6, 2), torch.arange(6))
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        loader = torch.utils.data.DataLoader(ds, batch_size=4, pin_memory=True)
        got = [(x.to("tpu", non_blocking=True), y.to("tpu", non_blocking=True)) for x, y in loader]
        p = torch.ones(3).pin_memory()
    assert torch.equal(p, torch.ones(3)) and not p.is_pinned()
    assert [x.cpu().tolist() for x, _ in got] == [[[0, 1], [2, 3], [4, 5], [6, 7]], [[8, 9], [10, 11]]]
    assert got[1][1].device.type == "tpu"


def test_torch_accelerator_memory_and_synchronize():
    t = torch.ones(256, device="tpu")
    torch.accelerator.synchronize()
    torch.accelerator.empty_cache()
    assert torch.accelerator.memory_allocated() >= 1024
    assert torch.accelerator.max_memory_allocated() >= torch.accelerator.memory_allocated()
    assert torch.accelerator.memory_stats()["allocated_bytes.all.current"] == torch.tpu.memory_allocated()
    torch.accelerator.reset_peak_memory_stats()
    free, total = torch.accelerator.get_memory_info()
    assert 0 < free <= total
    del t


def test_grad_scaler_unscales_many_parameters():
    """Unscaling more gradients than one call takes (64): every gradient is
    unscaled, and an inf in one past the first group still skips the step."""
    ps = [torch.nn.Parameter(torch.ones(3)) for _ in range(100)]
    pt = [torch.nn.Parameter(torch.ones(3, device="tpu")) for _ in range(100)]
    for bad in (False, True):
        for group in (ps, pt):
            dev = group[0].device.type
            opt = torch.optim.SGD(group, lr=0.5)
            scaler = torch.amp.GradScaler(dev, init_scale=4.0)
            scaler.scale(torch.ones((), device=dev))  # as scaler.scale(loss) would: the scale exists
            for i, p in enumerate(group):
                p.grad = torch.full((3,), 4.0 * (i + 1), device=dev)
            if bad:
                group[90].grad[1] = float("inf")
            scaler.step(opt)
            scaler.update()
            assert scaler.get_scale() == (2.0 if bad else 4.0)
        for a, b in zip(ps, pt):
            torch.testing.assert_close(b.detach().cpu(), a.detach())


@pytest.mark.parametrize("fused", [False, True])
def test_grad_scaler_matches_cpu(fused):
    """torch.amp.GradScaler("tpu"): unscaling, the inf check (a step with an
    inf is skipped and the scale backs off) and scale growth, as on CPU."""
    torch.manual_seed(0)
    m = _net()
    mt = copy.deepcopy(m).to("tpu")
    got = {}
    for dev, mm in (("cpu", m), ("tpu", mt)):
        opt = torch.optim.AdamW(mm.parameters(), lr=0.01, fused=fused)
        scaler = torch.amp.GradScaler(dev, init_scale=2.0**16, growth_interval=2)
        trace = []
        for i in range(6):
            x = torch.randn(5, 8, generator=torch.Generator().manual_seed(i))
            if i == 3:
                x[0, 0] = float("inf")
            x = x.to(dev)
            opt.zero_grad()
            with torch.autocast(dev, dtype=torch.bfloat16):
                loss = mm(x).float().pow(2).mean()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            trace.append(scaler.get_scale())
        got[dev] = trace
    assert got["tpu"] == got["cpu"] == [65536.0, 131072.0, 131072.0, 65536.0, 65536.0, 131072.0]
    for a, b in zip(m.parameters(), mt.parameters()):
        torch.testing.assert_close(b.cpu(), a, rtol=1e-5, atol=1e-6)
