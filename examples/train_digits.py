"""Train a small CNN on scikit-learn's bundled handwritten digits (1,797 real 8x8 images, no download).

Runs on CUDA when present, else CPU; prints per-epoch loss and the final test accuracy (>= 95% expected).
Importing this file builds nothing: coloc-sbatch imports ``DigitsCNN`` to estimate memory.

    python examples/train_digits.py --epochs 30 --batch 64
"""
from __future__ import annotations

import argparse
import time

import torch
from torch import nn


class DigitsCNN(nn.Module):
    """A small CNN for 1x8x8 digit images -> 10 classes (~30k parameters)."""

    def __init__(self, channels: int = 32, num_classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU(),
            nn.Conv2d(channels, 2 * channels, 3, padding=1), nn.BatchNorm2d(2 * channels), nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Dropout(0.2), nn.Linear(2 * channels * 16, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def load_data(seed: int = 0):
    """Digits as float tensors scaled to [0, 1], split 80/20 (stratified)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=0.2, random_state=seed, stratify=y)
    return xtr, xte, ytr, yte


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    xtr, xte, ytr, yte = load_data(args.seed)
    model = DigitsCNN().to(device)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    loss_fn = nn.CrossEntropyLoss()
    t0 = time.time()
    for epoch in range(args.epochs):
        model.train()
        perm = torch.randperm(len(xtr))
        total = 0.0
        for i in range(0, len(xtr), args.batch):
            idx = perm[i:i + args.batch]
            xb, yb = xtr[idx].to(device), ytr[idx].to(device)
            opt.zero_grad()
            loss = loss_fn(model(xb), yb)
            loss.backward()
            opt.step()
            total += loss.item() * len(idx)
        if epoch % 10 == 0 or epoch == args.epochs - 1:
            print(f"epoch {epoch + 1}/{args.epochs} loss {total / len(xtr):.4f}", flush=True)
    model.eval()
    with torch.no_grad():
        pred = model(xte.to(device)).argmax(1).cpu()
    acc = (pred == yte).float().mean().item()
    peak = torch.cuda.max_memory_reserved() // 2**20 if device.type == "cuda" else 0
    print(f"device {device} test_accuracy {acc:.4f} train_s {time.time() - t0:.1f} peak_reserved_mib {peak}")
    if acc < 0.95:
        raise SystemExit(f"test accuracy {acc:.4f} below 0.95")


if __name__ == "__main__":
    main()
