"""A small ResNet (BasicBlocks: Conv2d, BatchNorm2d, ReLU, residual adds,
adaptive average pooling, a Linear head) trained on synthetic CIFAR-shaped data
(32x32 RGB, 10 classes) with SGD + momentum and gradient-norm clipping.

A normal PyTorch training script: the only device-specific thing is the device
string ("tpu" by default, `--device cpu` to run on the host).

    python examples/resnet_cifar.py --steps 20
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

import torchtpu  # noqa: F401  registers the "tpu" device

NUM_CLASSES = 10


def synthetic_cifar(num_samples, seed=0, noise=0.8):
    """Learnable CIFAR-shaped data: a smooth random 3x32x32 template per class
    (upsampled 8x8 noise) plus per-pixel Gaussian noise. CPU tensors."""
    g = torch.Generator().manual_seed(seed)
    coarse = torch.rand(NUM_CLASSES, 3, 8, 8, generator=g)
    templates = F.interpolate(coarse, size=(32, 32), mode="bilinear", align_corners=False)
    labels = torch.randint(0, NUM_CLASSES, (num_samples,), generator=g)
    images = templates[labels] + noise * torch.randn(num_samples, 3, 32, 32, generator=g)
    return (images - 0.5) / 0.5, labels


class BasicBlock(nn.Module):
    def __init__(self, in_ch, out_ch, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_ch, out_ch, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_ch)
        self.conv2 = nn.Conv2d(out_ch, out_ch, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_ch)
        self.shortcut = nn.Identity()
        if stride != 1 or in_ch != out_ch:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False), nn.BatchNorm2d(out_ch)
            )

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    def __init__(self, widths=(16, 32, 64), num_classes=NUM_CLASSES):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, widths[0], 3, padding=1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU()
        )
        blocks, ch = [], widths[0]
        for i, w in enumerate(widths):
            blocks.append(BasicBlock(ch, w, stride=1 if i == 0 else 2))
            ch = w
        self.blocks = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(ch, num_classes)

    def forward(self, x):
        x = self.blocks(self.stem(x))
        return self.head(torch.flatten(self.pool(x), 1))


def train(
    device,
    steps,
    seed=0,
    batch_size=32,
    lr=0.02,
    momentum=0.9,
    weight_decay=5e-4,
    max_grad_norm=2.0,
    noise=0.8,
    log=None,
):
    """Trains `steps` steps on `device`; returns the per-step losses."""
    device = torch.device(device)
    images, labels = synthetic_cifar(num_samples=batch_size * steps, seed=seed + 1, noise=noise)

    torch.manual_seed(seed)
    model = ResNet().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)

    model.train()
    losses = []
    for step in range(steps):
        sl = slice(step * batch_size, (step + 1) * batch_size)
        x = images[sl].to(device, non_blocking=True)
        y = labels[sl].to(device, non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        optimizer.step()
        losses.append(loss.item())
        if log:
            log(f"step {step + 1:3d}  loss {losses[-1]:.4f}")
    return losses


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="tpu")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    losses = train(args.device, args.steps, seed=args.seed, log=print)
    print(f"first loss {losses[0]:.4f}  last loss {losses[-1]:.4f}")


if __name__ == "__main__":
    main()
