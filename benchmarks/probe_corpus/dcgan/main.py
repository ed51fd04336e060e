"""DCGAN in the style of the PyTorch examples: a generator and a discriminator, two Adam optimizers.

``--dataroot DIR`` reads an ImageFolder; without it a synthetic 64x64 image set is made in-process.
"""
import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

nz, ngf, ndf, nc = 100, 64, 64, 3


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(
            nn.ConvTranspose2d(nz, ngf * 8, 4, 1, 0, bias=False), nn.BatchNorm2d(ngf * 8), nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 8, ngf * 4, 4, 2, 1, bias=False), nn.BatchNorm2d(ngf * 4), nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 4, ngf * 2, 4, 2, 1, bias=False), nn.BatchNorm2d(ngf * 2), nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 2, ngf, 4, 2, 1, bias=False), nn.BatchNorm2d(ngf), nn.ReLU(True),
            nn.ConvTranspose2d(ngf, nc, 4, 2, 1, bias=False), nn.Tanh())

    def forward(self, x):
        return self.main(x)


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(
            nn.Conv2d(nc, ndf, 4, 2, 1, bias=False), nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf, ndf * 2, 4, 2, 1, bias=False), nn.BatchNorm2d(ndf * 2), nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf * 2, ndf * 4, 4, 2, 1, bias=False), nn.BatchNorm2d(ndf * 4), nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf * 4, ndf * 8, 4, 2, 1, bias=False), nn.BatchNorm2d(ndf * 8), nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf * 8, 1, 4, 1, 0, bias=False), nn.Sigmoid())

    def forward(self, x):
        return self.main(x).view(-1, 1).squeeze(1)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dataroot", default="")
    p.add_argument("--batchSize", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.0002)
    p.add_argument("--niter", type=int, default=1)
    p.add_argument("--max-steps", type=int, default=0)
    args = p.parse_args()
    device = torch.device("cuda:0")
    if args.dataroot:
        import torchvision.datasets as dset
        import torchvision.transforms as T
        ds = dset.ImageFolder(args.dataroot, T.Compose([T.Resize(64), T.CenterCrop(64), T.ToTensor()]))
    else:
        ds = TensorDataset(torch.rand(4096, nc, 64, 64) * 2 - 1, torch.zeros(4096))
    loader = DataLoader(ds, batch_size=args.batchSize, shuffle=True, num_workers=2)
    netG, netD = Generator().to(device), Discriminator().to(device)
    criterion = nn.BCELoss()
    optD = torch.optim.Adam(netD.parameters(), lr=args.lr, betas=(0.5, 0.999))
    optG = torch.optim.Adam(netG.parameters(), lr=args.lr, betas=(0.5, 0.999))
    step = 0
    for epoch in range(args.niter):
        for real, _ in loader:
            real = real.to(device)
            b = real.size(0)
            netD.zero_grad()
            errD_real = criterion(netD(real), torch.full((b,), 1.0, device=device))
            errD_real.backward()
            fake = netG(torch.randn(b, nz, 1, 1, device=device))
            errD_fake = criterion(netD(fake.detach()), torch.full((b,), 0.0, device=device))
            errD_fake.backward()
            optD.step()
            netG.zero_grad()
            errG = criterion(netD(fake), torch.full((b,), 1.0, device=device))
            errG.backward()
            optG.step()
            step += 1
            if step % 50 == 0:
                print(f"[{epoch}][{step}] Loss_D {(errD_real + errD_fake).item():.3f} Loss_G {errG.item():.3f}")
            if args.max_steps and step >= args.max_steps:
                break
    print(f"max_memory_reserved_mib={torch.cuda.max_memory_reserved() / 2**20:.1f}")


if __name__ == "__main__":
    main()
