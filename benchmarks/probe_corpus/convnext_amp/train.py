"""A timm-style image-classification trainer: ``train.py --model convnext_tiny --amp -b 64``.

Uses timm's model registry when timm is installed, torchvision's models otherwise; AMP fp16 with
GradScaler, AdamW, channels-last, synthetic 224 px data unless ``--data-dir`` holds an ImageFolder.
"""
import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


def create_model(name, num_classes):
    try:
        import timm
        return timm.create_model(name, num_classes=num_classes)
    except ImportError:
        import torchvision.models as tvm
        return tvm.get_model(name, num_classes=num_classes)


class Synthetic(Dataset):
    def __len__(self):
        return 6400

    def __getitem__(self, i):
        return torch.randn(3, 224, 224), i % 1000


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data-dir", default="")
    p.add_argument("--model", default="resnet50")
    p.add_argument("-b", "--batch-size", type=int, default=128)
    p.add_argument("--amp", action="store_true")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--max-steps", type=int, default=0)
    args = p.parse_args()
    model = create_model(args.model, 1000).cuda()
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.05)
    scaler = torch.amp.GradScaler("cuda", enabled=args.amp)
    if args.data_dir:
        import torchvision.datasets as datasets
        import torchvision.transforms as T
        ds = datasets.ImageFolder(args.data_dir, T.Compose([T.RandomResizedCrop(224), T.ToTensor()]))
    else:
        ds = Synthetic()
    loader = DataLoader(ds, batch_size=args.batch_size, shuffle=True, num_workers=4, drop_last=True)
    loss_fn = nn.CrossEntropyLoss(label_smoothing=0.1)
    for step, (x, y) in enumerate(loader):
        x, y = x.cuda(), y.cuda()
        with torch.autocast("cuda", dtype=torch.float16, enabled=args.amp):
            loss = loss_fn(model(x), y)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        if step % 20 == 0:
            print(f"step {step} loss {loss.item():.3f}")
        if args.max_steps and step + 1 >= args.max_steps:
            break
    print(f"max_memory_reserved_mib={torch.cuda.max_memory_reserved() / 2**20:.1f}")


if __name__ == "__main__":
    main()
