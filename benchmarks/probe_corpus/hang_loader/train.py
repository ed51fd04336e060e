"""A trainer whose data loading hangs: its dataset waits for a file another job should write
(``--ready-file``, default ``data/READY``) and polls forever when it never appears. On the GPU it
trains normally once the file exists (``touch data/READY``)."""
import argparse
import os
import time

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


class WaitingData(Dataset):
    def __init__(self, ready_file):
        self.ready_file = ready_file

    def __len__(self):
        return 10000

    def __getitem__(self, i):
        while not os.path.exists(self.ready_file):
            time.sleep(0.5)
        return torch.randn(3, 64, 64), i % 10


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ready-file", default="data/READY")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--steps", type=int, default=20)
    args = p.parse_args()
    model = nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(64, 10)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(WaitingData(args.ready_file), batch_size=args.batch_size)
    for step, (x, y) in enumerate(loader):
        loss = nn.functional.cross_entropy(model(x.cuda()), y.cuda())
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step + 1 >= args.steps:
            break
    print(f"max_memory_reserved_mib={torch.cuda.max_memory_reserved() / 2**20:.1f}")


if __name__ == "__main__":
    main()
