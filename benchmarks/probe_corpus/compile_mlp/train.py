"""A torch.compile'd residual MLP on tabular-style synthetic data (Adam, 4,096-wide layers)."""
import argparse

import torch
import torch.nn as nn


class ResMLP(nn.Module):
    def __init__(self, d_in, width, depth, n_out):
        super().__init__()
        self.inp = nn.Linear(d_in, width)
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width), nn.GELU())
                                    for _ in range(depth))
        self.out = nn.Linear(width, n_out)

    def forward(self, x):
        x = self.inp(x)
        for b in self.blocks:
            x = x + b(x)
        return self.out(x)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--width", type=int, default=4096)
    p.add_argument("--depth", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--no-compile", action="store_true")
    args = p.parse_args()
    model = ResMLP(256, args.width, args.depth, 10).to("cuda")
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    step_model = model if args.no_compile else torch.compile(model)
    for step in range(args.steps):
        x = torch.randn(args.batch_size, 256, device="cuda")
        y = torch.randint(0, 10, (args.batch_size,), device="cuda")
        loss = nn.functional.cross_entropy(step_model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 10 == 0:
            print(f"step {step} loss {loss.item():.3f}")
    print(f"max_memory_reserved_mib={torch.cuda.max_memory_reserved() / 2**20:.1f}")


if __name__ == "__main__":
    main()
