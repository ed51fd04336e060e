"""Train torchvision's ResNet-18 on CIFAR-sized 32x32 inputs (synthetic data, no download) for a fixed
number of steps and print throughput; the collocation workload of docs/benchmarks.md.

    python examples/train_resnet_cifar.py --steps 200 --batch 128
"""
from __future__ import annotations

import argparse
import time

import torch
import torchvision


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--amp", action="store_true", help="autocast to fp16 on CUDA")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = torchvision.models.resnet18(num_classes=10).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    x = torch.randn(args.batch, 3, 32, 32, device=device)
    y = torch.randint(0, 10, (args.batch,), device=device)
    t0 = None
    for step in range(args.steps):
        if step == 5:  # warm-up done
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.time()
        with torch.autocast(device.type, dtype=torch.float16, enabled=args.amp and device.type == "cuda"):
            loss = loss_fn(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.time() - (t0 or time.time())
    done = max(0, args.steps - 5)
    peak = torch.cuda.max_memory_reserved() // 2**20 if device.type == "cuda" else 0
    print(f"device {device} steps {args.steps} loss {loss.item():.3f} "
          f"samples_per_s {done * args.batch / max(elapsed, 1e-9):.1f} "
          f"peak_reserved_mib {peak}")


if __name__ == "__main__":
    main()
