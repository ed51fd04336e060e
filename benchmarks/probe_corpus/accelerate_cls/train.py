"""An image-classification trainer with Hugging Face ``accelerate`` in the style of its
``examples/complete_cv_example.py``: torchvision model, ``Accelerator(mixed_precision=...)`` from
``accelerate launch``, ``prepare``, ``accelerator.backward``, ``accelerator.save_state`` every
``--checkpointing_steps``. Synthetic data unless ``--data_dir`` holds an ImageFolder.
"""
import argparse
import os

import torch
import torchvision
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader, Dataset


class Synthetic(Dataset):
    def __len__(self):
        return 12800

    def __getitem__(self, i):
        return {"image": torch.randn(3, 224, 224), "label": i % 1000}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data_dir", default="")
    p.add_argument("--model", default="resnet50")
    p.add_argument("--batch_size", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--num_epochs", type=int, default=3)
    p.add_argument("--max_steps", type=int, default=0)
    p.add_argument("--output_dir", default=".")
    p.add_argument("--checkpointing_steps", type=int, default=500)
    p.add_argument("--with_tracking", action="store_true")
    args = p.parse_args()
    accelerator = Accelerator(log_with="all" if args.with_tracking else None, project_dir=args.output_dir)
    set_seed(42)
    if args.data_dir:
        tf = torchvision.transforms.Compose([torchvision.transforms.RandomResizedCrop(224),
                                             torchvision.transforms.ToTensor()])
        base = torchvision.datasets.ImageFolder(args.data_dir, tf)
        ds = [{"image": x, "label": y} for x, y in base]
    else:
        ds = Synthetic()
    loader = DataLoader(ds, shuffle=True, batch_size=args.batch_size, num_workers=4)
    model = torchvision.models.get_model(args.model, num_classes=1000)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.05)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=args.lr, epochs=args.num_epochs,
                                                    steps_per_epoch=len(loader))
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    if args.with_tracking:
        accelerator.init_trackers("cv_example", vars(args))
    step = 0
    for epoch in range(args.num_epochs):
        model.train()
        for batch in loader:
            outputs = model(batch["image"])
            loss = torch.nn.functional.cross_entropy(outputs, batch["label"])
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            step += 1
            if step % args.checkpointing_steps == 0:
                accelerator.save_state(os.path.join(args.output_dir, f"step_{step}"))
            if step % 50 == 0:
                accelerator.print(f"epoch {epoch} step {step} loss {loss.item():.4f}")
            if args.max_steps and step >= args.max_steps:
                break
        if args.max_steps and step >= args.max_steps:
            break
    accelerator.end_training()
    if torch.cuda.is_available():
        accelerator.print(f"max_memory_reserved_mib={torch.cuda.max_memory_reserved() / 2**20:.1f}")


if __name__ == "__main__":
    main()
