"""End to end: an MLP (2 hidden layers, cross-entropy, SGD with momentum)
trained 50 steps on tpu matches the same run on CPU; a small transformer
block's forward and backward match too."""

import torch
import torch.nn as nn
import torch.nn.functional as F

import torchtpu  # noqa: F401


def _mlp():
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))


def _train(device, steps=50):
    torch.manual_seed(0)
    model = _mlp()
    g = torch.Generator().manual_seed(1)
    xs = torch.randn(steps, 16, 32, generator=g)
    teacher = torch.randn(32, 10, generator=g)
    ys = (xs @ teacher).argmax(-1)  # a learnable target, so the loss falls
    model = model.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for i in range(steps):
        x, y = xs[i].to(device), ys[i].to(device)
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_mlp_50_steps_matches_cpu():
    cpu = _train("cpu")
    tpu = _train("tpu")
    assert len(tpu) == 50
    for i, (a, b) in enumerate(zip(cpu, tpu)):
        assert abs(a - b) <= 1e-4 * abs(a), (i, a, b)
    assert tpu[-1] < tpu[0]


class Block(nn.Module):
    def __init__(self, d=32, h=4):
        super().__init__()
        self.h = h
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)
        self.emb = nn.Embedding(50, d)
        self.head = nn.Linear(d, 50)

    def forward(self, idx):
        x = self.emb(idx)
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q = q.view(B, T, self.h, C // self.h).transpose(1, 2)
        k = k.view(B, T, self.h, C // self.h).transpose(1, 2)
        v = v.view(B, T, self.h, C // self.h).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / (C // self.h) ** 0.5)
        mask = torch.tril(torch.ones(T, T, device=idx.device)).view(1, 1, T, T)
        att = att.masked_fill(mask == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.proj(y)
        x = x + self.out(F.gelu(self.fc(self.ln2(x))))
        return self.head(x)


def test_transformer_block_forward_backward():
    torch.manual_seed(0)
    m = Block()
    idx = torch.randint(0, 50, (2, 8))
    tgt = torch.randint(0, 50, (2, 8))
    loss = F.cross_entropy(m(idx).view(-1, 50), tgt.view(-1))
    loss.backward()
    grads = {n: p.grad.clone() for n, p in m.named_parameters()}
    m.zero_grad()
    mt = m.to("tpu")
    loss_t = F.cross_entropy(mt(idx.to("tpu")).view(-1, 50), tgt.to("tpu").view(-1))
    loss_t.backward()
    torch.testing.assert_close(loss_t.cpu(), loss, rtol=1e-5, atol=1e-5)
    for n, p in mt.named_parameters():
        torch.testing.assert_close(p.grad.cpu(), grads[n], rtol=1e-4, atol=1e-5, msg=n)
