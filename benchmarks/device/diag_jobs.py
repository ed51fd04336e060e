"""Training jobs with one known problem each, for the diagnosis benchmark (``diagnose_bench.py``).

Run as a job: ``python3 diag_jobs.py KIND --measure-s 40``; prints one ``COLOC_BENCH {json}`` line (samples/s).

Kinds (the finding ``slurm_coloc/report/diagnose.py`` must give first):
  input_bound   ResNet-18 on 3x224x224, batch 32, fed by a DataLoader with ONE worker that blurs every image
                on the CPU (heavy augmentation): the GPU waits for input            -> ``input-bound``
  fp32_matmul   an 8-layer 4096-wide MLP, batch 1024, fp32 with TF32 off (PyTorch's default for matmul): busy
                SMs, tensor cores idle; AMP (bf16) would use them                   -> ``no-tensor-cores``
  tiny_batch    ResNet-50 on 3x224x224 at batch 2: little parallel work per kernel -> ``low-occupancy``
  (the over-request job is ResNet-18/32 of workloads.py submitted with ``#COLOC mem=`` 4x its need.)
The models are also ``#COLOC model=`` targets (``diag_jobs.py:mlp``), so coloc-sbatch estimates their memory.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Dict, List

import torch
from torch import nn

MLP_WIDTH = 4096
MLP_LAYERS = 8


def mlp(width: int = MLP_WIDTH, layers: int = MLP_LAYERS, classes: int = 10) -> nn.Module:
    """#COLOC target: ``layers`` Linear(width, width)+ReLU blocks and a classifier head."""
    blocks: List[nn.Module] = []
    for _ in range(layers):
        blocks += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*blocks, nn.Linear(width, classes))


class BlurredImages(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Synthetic 3x224x224 images, each blurred ``passes`` times with a 15x15 box filter on the CPU."""

    def __init__(self, n: int = 100_000, passes: int = 6) -> None:
        self.n, self.passes = n, passes
        self.kernel = torch.full((3, 1, 15, 15), 1.0 / 225)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        g = torch.Generator().manual_seed(i)
        x = torch.rand((1, 3, 224, 224), generator=g)
        for _ in range(self.passes):
            x = torch.nn.functional.conv2d(x, self.kernel, padding=7, groups=3)
        return x[0], i % 10


def _worker_init(_: int) -> None:
    torch.set_num_threads(1)  # one loader worker = one busy CPU


def main(argv: List[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kind", choices=("input_bound", "fp32_matmul", "tiny_batch"))
    ap.add_argument("--measure-s", type=float, default=40.0)
    ap.add_argument("--tag", default="")
    a = ap.parse_args(argv)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = False
    loss_fn = nn.CrossEntropyLoss()
    if a.kind == "fp32_matmul":
        model, batch = mlp(), 1024
        data = iter(lambda: (torch.randn(batch, MLP_WIDTH, device=dev), torch.randint(0, 10, (batch,), device=dev)),
                    None)
    else:
        import torchvision

        if a.kind == "input_bound":
            model, batch = torchvision.models.resnet18(num_classes=10), 32
            loader = torch.utils.data.DataLoader(BlurredImages(), batch_size=batch, num_workers=1,
                                                 worker_init_fn=_worker_init, pin_memory=dev.type == "cuda")
            data = ((x.to(dev, non_blocking=True), y.to(dev)) for x, y in loader)
        else:
            model, batch = torchvision.models.resnet50(num_classes=1000), 2
            xs = torch.randn(batch, 3, 224, 224, device=dev)
            ys = torch.randint(0, 1000, (batch,), device=dev)
            data = iter(lambda: (xs, ys), None)
    model = model.to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    t_ready = time.time()
    end = t_ready + a.measure_s
    n = 0
    while time.time() < end:
        x, y = next(data)
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        opt.step()
        n += 1
    if dev.type == "cuda":
        torch.cuda.synchronize()
    t1 = time.time()
    rec: Dict[str, Any] = {
        "workload": a.kind, "tag": a.tag, "job_id": os.environ.get("SLURM_JOB_ID"), "batch": batch, "steps": n,
        "samples_per_s": n * batch / (t1 - t_ready), "t0": t_ready, "t1": t1,
        "peak_reserved_mib": torch.cuda.max_memory_reserved() / 2**20 if dev.type == "cuda" else None}
    print("COLOC_BENCH " + json.dumps(rec), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
