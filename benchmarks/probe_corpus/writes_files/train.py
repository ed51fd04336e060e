"""A trainer that writes before its first step, as many do: a run directory with its config,
a log file, a TensorBoard-style event file, and an initial checkpoint; then a ViT-ish transformer
encoder trains on synthetic sequences and saves a checkpoint every ``--save-every`` steps."""
import argparse
import json
import os
import time

import torch
import torch.nn as nn


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--run-dir", default="runs/exp1")
    p.add_argument("--d-model", type=int, default=512)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--save-every", type=int, default=10)
    args = p.parse_args()
    os.makedirs(args.run_dir, exist_ok=True)
    with open(os.path.join(args.run_dir, "config.json"), "w") as fh:
        json.dump(vars(args), fh)
    log = open(os.path.join(args.run_dir, "train.log"), "a")
    log.write(f"start {time.ctime()}\n")
    layer = nn.TransformerEncoderLayer(args.d_model, 8, 4 * args.d_model, batch_first=True)
    model = nn.Sequential(nn.TransformerEncoder(layer, args.layers), nn.Linear(args.d_model, 100)).cuda()
    torch.save(model.state_dict(), os.path.join(args.run_dir, "init.pt"))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    for step in range(1, args.steps + 1):
        x = torch.randn(args.batch_size, args.seq, args.d_model, device="cuda")
        y = torch.randint(0, 100, (args.batch_size * args.seq,), device="cuda")
        loss = nn.functional.cross_entropy(model(x).reshape(-1, 100), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        log.write(f"step {step} loss {loss.item():.4f}\n")
        if step % args.save_every == 0:
            torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, os.path.join(args.run_dir, "ckpt.pt"))
    log.close()
    print(f"max_memory_reserved_mib={torch.cuda.max_memory_reserved() / 2**20:.1f}")


if __name__ == "__main__":
    main()
