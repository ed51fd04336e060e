"""ImageNet trainer in the style of the PyTorch examples: ``main.py -a resnet50 -b 256 [DIR]``.

With a DIR holding ``train/`` class folders it reads them with ImageFolder; without one it trains
on a synthetic ImageNet-shaped set made in-process (``--dummy``-style: random 3x224x224, 1000 classes).
"""
import argparse

import torch
import torch.nn as nn
import torchvision.models as models
from torch.utils.data import DataLoader, Dataset


class Synthetic(Dataset):
    def __init__(self, n=12800):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.randn(3, 224, 224), int(i % 1000)


def main():
    p = argparse.ArgumentParser(description="PyTorch ImageNet Training")
    p.add_argument("data", nargs="?", default="")
    p.add_argument("-a", "--arch", default="resnet18")
    p.add_argument("-b", "--batch-size", type=int, default=256)
    p.add_argument("-j", "--workers", type=int, default=4)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--max-steps", type=int, default=0)
    args = p.parse_args()
    device = torch.device("cuda")
    model = models.__dict__[args.arch]().to(device)
    criterion = nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.SGD(model.parameters(), args.lr, momentum=0.9, weight_decay=1e-4)
    if args.data:
        import torchvision.datasets as datasets
        import torchvision.transforms as T
        ds = datasets.ImageFolder(args.data + "/train", T.Compose([T.RandomResizedCrop(224), T.ToTensor()]))
    else:
        ds = Synthetic()
    loader = DataLoader(ds, batch_size=args.batch_size, shuffle=True, num_workers=args.workers, pin_memory=True)
    model.train()
    for i, (images, target) in enumerate(loader):
        images = images.cuda(non_blocking=True)
        target = target.cuda(non_blocking=True)
        loss = criterion(model(images), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if i % 10 == 0:
            print(f"[{i}/{len(loader)}] loss {loss.item():.4f}")
        if args.max_steps and i + 1 >= args.max_steps:
            break
    print(f"max_memory_reserved_mib={torch.cuda.max_memory_reserved() / 2**20:.1f}")


if __name__ == "__main__":
    main()
