"""A PyTorch Lightning image classifier in the style of the Lightning examples: a ResNet-18 on
CIFAR-10-sized images, ``Trainer(accelerator="gpu", devices=1, precision=...)``, SGD + OneCycle,
a ModelCheckpoint callback and a CSV logger. Synthetic data unless ``--data_dir`` holds CIFAR-10.
"""
import argparse

import torch
import torch.nn.functional as F
import torchvision
from torch.utils.data import DataLoader, Dataset

try:
    import lightning as L
    from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint
    from lightning.pytorch.loggers import CSVLogger
except ImportError:  # the older package name
    import pytorch_lightning as L
    from pytorch_lightning.callbacks import LearningRateMonitor, ModelCheckpoint
    from pytorch_lightning.loggers import CSVLogger


class Synthetic(Dataset):
    def __len__(self):
        return 50000

    def __getitem__(self, i):
        return torch.randn(3, 32, 32), i % 10


class LitResNet(L.LightningModule):
    def __init__(self, lr=0.05, steps_per_epoch=196, epochs=30):
        super().__init__()
        self.save_hyperparameters()
        self.model = torchvision.models.resnet18(num_classes=10)
        self.model.conv1 = torch.nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
        self.model.maxpool = torch.nn.Identity()

    def forward(self, x):
        return F.log_softmax(self.model(x), dim=1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.nll_loss(self(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9, weight_decay=5e-4)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, 0.1, epochs=self.hparams.epochs,
                                                    steps_per_epoch=self.hparams.steps_per_epoch)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data_dir", default="")
    p.add_argument("--batch_size", type=int, default=256)
    p.add_argument("--max_epochs", type=int, default=30)
    p.add_argument("--max_steps", type=int, default=-1)
    p.add_argument("--precision", default="32-true")
    p.add_argument("--num_workers", type=int, default=4)
    args = p.parse_args()
    if args.data_dir:
        ds = torchvision.datasets.CIFAR10(args.data_dir, train=True,
                                          transform=torchvision.transforms.ToTensor())
    else:
        ds = Synthetic()
    loader = DataLoader(ds, batch_size=args.batch_size, shuffle=True, num_workers=args.num_workers,
                        drop_last=True)
    model = LitResNet(steps_per_epoch=len(loader), epochs=args.max_epochs)
    trainer = L.Trainer(accelerator="gpu", devices=1, precision=args.precision, max_epochs=args.max_epochs,
                        max_steps=args.max_steps, logger=CSVLogger("logs"),
                        callbacks=[ModelCheckpoint(monitor="train_loss", save_last=True),
                                   LearningRateMonitor(logging_interval="step")],
                        enable_progress_bar=False)
    trainer.fit(model, loader)
    print(f"max_memory_reserved_mib={torch.cuda.max_memory_reserved() / 2**20:.1f}")


if __name__ == "__main__":
    main()
