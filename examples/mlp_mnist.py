"""An MLP trained on synthetic MNIST-shaped data (28x28 single-channel images,
10 classes) with SGD + momentum and a learning-rate schedule.

A normal PyTorch training script: the only device-specific thing is the device
string ("tpu" by default, `--device cpu` to run on the host).

    python examples/mlp_mnist.py --steps 20
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import torchtpu  # noqa: F401  registers the "tpu" device

NUM_CLASSES = 10


def synthetic_mnist(num_samples, seed=0, noise=0.7):
    """Learnable MNIST-shaped data: one random 28x28 template per class,
    each image is its class template plus Gaussian noise. Returns CPU tensors
    (images [N, 1, 28, 28] float32, labels [N] int64)."""
    g = torch.Generator().manual_seed(seed)
    templates = torch.rand(NUM_CLASSES, 1, 28, 28, generator=g)
    labels = torch.randint(0, NUM_CLASSES, (num_samples,), generator=g)
    images = templates[labels] + noise * torch.randn(num_samples, 1, 28, 28, generator=g)
    images = (images - 0.5) / 0.5
    return images, labels


class MLP(nn.Module):
    def __init__(self, hidden=(128, 64), num_classes=NUM_CLASSES):
        super().__init__()
        layers, width = [nn.Flatten()], 28 * 28
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        layers.append(nn.Linear(width, num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x):
        return self.net(x)


def train(device, steps, seed=0, batch_size=64, lr=0.05, momentum=0.9, log=None):
    """Trains `steps` SGD steps on `device`; returns the per-step losses."""
    device = torch.device(device)
    images, labels = synthetic_mnist(num_samples=batch_size * 16, seed=seed + 1)
    loader = DataLoader(
        TensorDataset(images, labels),
        batch_size=batch_size,
        shuffle=True,
        drop_last=True,
        generator=torch.Generator().manual_seed(seed + 2),
    )

    torch.manual_seed(seed)
    model = MLP().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.5)

    model.train()
    losses = []
    while len(losses) < steps:
        for x, y in loader:
            if len(losses) == steps:
                break
            x = x.to(device, non_blocking=True)
            y = y.to(device, non_blocking=True)
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            scheduler.step()
            losses.append(loss.item())
            if log:
                log(f"step {len(losses):3d}  loss {losses[-1]:.4f}  lr {scheduler.get_last_lr()[0]:.4f}")
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
