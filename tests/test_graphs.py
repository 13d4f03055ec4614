"""torch.tpu.graph / torch.tpu.TPUGraph (torch.cuda.graph's interface): a
whole training step captured once into one program, replayed on new inputs
copied into the captured tensors, with CPU eager's values; nothing runs at
capture; sync points inside a capture are errors that leave the tensors as
they were."""

import copy
import os
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torchtpu

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
import char_gpt  # noqa: E402


def _m():
    return torchtpu.metrics()


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))


def _batches(n):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(4, 8, generator=g), torch.randn(4, 1, generator=g)) for _ in range(n)]


def _cpu_losses(model, opt, loss_fn, batches):
    out = []
    for x, y in batches:
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        out.append(loss.item())
    return out


def _train_captured(step, opt, sx, sy, batches, warm=2, untouched=()):
    """Warm-up steps on the first batches, a capture of step(), replays on the
    rest (each batch copied into sx, sy); returns the losses and the metrics
    before the capture, after it and after the replays. The tensors in
    untouched must keep their values through the capture (nothing runs)."""
    got = []
    for x, y in batches[:warm]:  # warm-up: the optimizer makes its state
        sx.copy_(x)
        sy.copy_(y)
        opt.zero_grad(set_to_none=True)
        got.append(step().item())
    graph = torch.tpu.TPUGraph()
    opt.zero_grad(set_to_none=True)
    before = [t.detach().cpu() for t in untouched]
    torch.tpu.synchronize()  # fused mode: the last warm-up step's update runs here, not in the capture's count
    m = [_m()]
    with torch.tpu.graph(graph):
        assert torch.tpu.is_current_stream_capturing()
        static_loss = step()
    assert not torch.tpu.is_current_stream_capturing()
    m.append(_m())
    for t, b in zip(untouched, before):
        assert torch.equal(t.detach().cpu(), b)
    for x, y in batches[warm:]:
        sx.copy_(x)
        sy.copy_(y)
        graph.replay()
        got.append(static_loss.item())
    m.append(_m())
    return got, m


def test_captured_step_replays_like_cpu_eager():
    cpu = _mlp()
    dev = copy.deepcopy(cpu).to("tpu")
    opt_c = torch.optim.Adam(cpu.parameters(), lr=0.01)
    opt_t = torch.optim.Adam(dev.parameters(), lr=0.01, capturable=True)
    data = _batches(8)
    want = _cpu_losses(cpu, opt_c, F.mse_loss, data)

    sx, sy = torch.zeros(4, 8, device="tpu"), torch.zeros(4, 1, device="tpu")

    def step():
        loss = F.mse_loss(dev(sx), sy)
        loss.backward()
        opt_t.step()
        return loss

    got, (m0, m1, m2) = _train_captured(step, opt_t, sx, sy, data, untouched=list(dev.parameters()))
    # the capture compiles the step and runs nothing; each replay runs it, compiling nothing
    assert m1["programs_compiled"] - m0["programs_compiled"] == 1
    assert m1["fused_programs_run"] == m0["fused_programs_run"]
    assert m2["programs_compiled"] == m1["programs_compiled"]
    assert m2["graph_replays"] - m1["graph_replays"] == 6
    assert m2["fused_programs_run"] - m1["fused_programs_run"] == 6
    assert max(abs(a - b) for a, b in zip(want, got)) < 1e-5, (want, got)
    for p, q in zip(dev.parameters(), cpu.parameters()):
        assert (p.detach().cpu() - q.detach()).abs().max() < 1e-5
        assert (p.grad.cpu() - q.grad).abs().max() < 1e-5  # the captured gradients hold the last replay's


@pytest.mark.parametrize("compiled", [False, True])
def test_gpt_step_captured_matches_eager(compiled):
    tok, data = char_gpt.load_corpus()

    def setup(device):
        model = char_gpt.make_model(tok.vocab_size, seed=0, device=device)
        decay = [p for p in model.parameters() if p.dim() >= 2]
        rest = [p for p in model.parameters() if p.dim() < 2]
        opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
            lr=3e-3,
            betas=(0.9, 0.95),
            capturable=device != "cpu",
        )
        return model, opt

    g = torch.Generator().manual_seed(0)
    batches = [char_gpt.get_batch(data, 8, 32, g) for _ in range(7)]
    model, opt = setup("cpu")
    want = []
    for x, y in batches:
        opt.zero_grad(set_to_none=True)
        loss = model(x, y)[1]
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        want.append(loss.item())

    model, opt = setup("tpu")
    run = torch.compile(model, backend="tpu") if compiled else model
    params = list(model.parameters())
    sx, sy = (t.to("tpu") for t in batches[0])

    def step():
        loss = run(sx, sy)[1]
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        return loss

    got, (_, m1, m2) = _train_captured(step, opt, sx, sy, batches)
    assert m2["graph_replays"] - m1["graph_replays"] == 5
    assert m2["programs_compiled"] == m1["programs_compiled"]
    assert max(abs(a - b) / abs(a) for a, b in zip(want, got)) < 1e-4, (want, got)


def test_sync_point_inside_a_capture_is_an_error_and_changes_nothing():
    model = _mlp().to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 8, device="tpu")
    before = [p.detach().cpu() for p in model.parameters()]
    g = torch.tpu.TPUGraph()
    with pytest.raises(RuntimeError, match=r"\.item\(\).*torch\.tpu\.graph"):
        with torch.tpu.graph(g):
            loss = model(x).sum()
            loss.backward()
            opt.step()
            loss.item()
    assert not torch.tpu.is_current_stream_capturing()
    for p, b in zip(model.parameters(), before):
        assert torch.equal(p.detach().cpu(), b)
    g.replay()  # nothing was captured: a no-op
    for p, b in zip(model.parameters(), before):
        assert torch.equal(p.detach().cpu(), b)
    # eager work goes on as before, in the mode it was in
    assert torch.equal((x + 1).cpu(), x.cpu() + 1)
    assert torchtpu.get_eager_mode() == "fused"


def test_host_step_count_optimizer_is_refused_inside_a_capture():
    model = _mlp().to("tpu")
    opt = torch.optim.Adam(model.parameters(), lr=0.01)  # capturable=False
    model(torch.randn(4, 8, device="tpu")).sum().backward()
    opt.step()
    with pytest.raises(RuntimeError, match="capturable=True"):
        with torch.tpu.graph(torch.tpu.TPUGraph()):
            opt.step()


def test_dropout_draws_new_numbers_at_each_replay():
    torch.manual_seed(0)
    x = torch.ones(64, 64, device="tpu")
    g = torch.tpu.TPUGraph()
    with torch.tpu.graph(g):
        out = F.dropout(x, 0.5, training=True)
    seen = []
    for _ in range(3):
        g.replay()
        y = out.cpu()
        assert set(y.unique().tolist()) <= {0.0, 2.0}
        assert 0.3 < (y == 0).float().mean().item() < 0.7
        seen.append(y)
    assert not torch.equal(seen[0], seen[1]) and not torch.equal(seen[1], seen[2])


def test_captures_do_not_nest_and_replay_outlives_the_tensors():
    g, h = torch.tpu.TPUGraph(), torch.tpu.TPUGraph()
    a = torch.ones(3, device="tpu")
    with torch.tpu.graph(g):
        a.mul_(2)
        with pytest.raises(RuntimeError, match="do not nest"):
            h.capture_begin()
    b = a  # the plan keeps the record alive even when the names go
    del a
    g.replay()
    g.replay()
    assert b.cpu().tolist() == [4.0, 4.0, 4.0]
    with pytest.raises(TypeError, match="TPUGraph"):
        torch.tpu.graph(object())


@pytest.mark.parametrize("compiled", [False, True])
def test_batchnorm_statistics_update_at_each_replay(compiled):
    torch.manual_seed(0)
    cpu = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 2))
    dev = copy.deepcopy(cpu).to("tpu")
    opt_c = torch.optim.SGD(cpu.parameters(), lr=0.1, momentum=0.9)
    opt_t = torch.optim.SGD(dev.parameters(), lr=0.1, momentum=0.9)
    run = torch.compile(dev, backend="tpu") if compiled else dev
    g = torch.Generator().manual_seed(2)
    data = [(torch.randn(5, 3, 8, 8, generator=g), torch.randint(0, 2, (5,), generator=g)) for _ in range(6)]
    want = _cpu_losses(cpu, opt_c, F.cross_entropy, data)
    sx, sy = data[0][0].to("tpu"), data[0][1].to("tpu")

    def step():
        loss = F.cross_entropy(run(sx), sy)
        loss.backward()
        opt_t.step()
        return loss

    got, _ = _train_captured(step, opt_t, sx, sy, data)
    assert max(abs(a - b) for a, b in zip(want, got)) < 1e-4, (want, got)
    bn_c, bn_t = cpu[1], dev[1]
    assert torch.allclose(bn_t.running_mean.cpu(), bn_c.running_mean, atol=1e-5)
    assert torch.allclose(bn_t.running_var.cpu(), bn_c.running_var, atol=1e-5)
    assert bn_t.num_batches_tracked.item() == bn_c.num_batches_tracked.item() == 6
