"""Training workloads of the device benchmarks (issue 8): a model, synthetic data, a timed SGD loop.

Run as a job (``python3 workloads.py <name> --measure-s 15``) it trains on synthetic inputs and prints one
line
``COLOC_BENCH {json}`` with samples/s over the steady window and a progress timeline (``[t_unix, samples]``
every ~0.5 s) from which the collector computes aggregate throughput over the window where all jobs overlap.
``--steps N`` runs a fixed amount of work instead (trace replay). ``--ballast-mib`` holds extra device memory
(replay: a task's measured peak memory). The model callables are also the ``#COLOC model=`` targets of the job
scripts, so coloc-sbatch estimates their memory.

Workloads (docs/facts.md §12, "Collocation throughput on one H100"): ``small_cnn`` (28x28x1, batch 64),
``resnet18_32`` (ResNet-18 on 3x32x32, batch 32), ``resnet50_224`` (ResNet-50 on 3x224x224, batch 32); SGD,
fp32. Replay adds torchvision models by name (``tv:<model>:<C>x<H>x<W>:<batch>:<classes>``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Dict, List, Tuple

import torch
from torch import nn


class SmallCNN(nn.Module):
    """Two conv layers + two linear layers on 1x28x28 inputs, 10 classes (MNIST-size)."""

    def __init__(self, channels: int = 32, classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, channels, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(channels, 2 * channels, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Sequential(
            nn.Flatten(), nn.Linear(2 * channels * 7 * 7, 128), nn.ReLU(), nn.Linear(128, classes)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def small_cnn(classes: int = 10) -> nn.Module:
    """#COLOC target: the small CNN."""
    return SmallCNN(classes=classes)


def resnet18(classes: int = 10) -> nn.Module:
    """#COLOC target: torchvision ResNet-18."""
    import torchvision

    return torchvision.models.resnet18(num_classes=classes)


def resnet50(classes: int = 1000) -> nn.Module:
    """#COLOC target: torchvision ResNet-50."""
    import torchvision

    return torchvision.models.resnet50(num_classes=classes)


# name -> (builder, input shape, batch, classes)
WORKLOADS: Dict[str, Tuple[Any, Tuple[int, ...], int, int]] = {
    "small_cnn": (small_cnn, (1, 28, 28), 64, 10),
    "resnet18_32": (resnet18, (3, 32, 32), 32, 10),
    "resnet50_224": (resnet50, (3, 224, 224), 32, 1000),
}


def build(name: str) -> Tuple[nn.Module, Tuple[int, ...], int, int]:
    """Model, input shape, batch and classes of workload ``name`` (or ``tv:model:CxHxW:batch:classes``)."""
    if name.startswith("pile:"):  # the placement benchmark's models (pile_workloads.py)
        if __package__:  # imported as benchmarks.device.workloads (workload_profile.py)
            from benchmarks.device.pile_workloads import build_pile
        else:  # run by path as a Slurm job (job_*.sh): this file's folder is sys.path[0]
            from pile_workloads import build_pile

        return build_pile(name[len("pile:"):])
    if name.startswith("tv:"):
        import torchvision

        _, model, shape, batch, classes = name.split(":")
        kwargs: Dict[str, Any] = {"num_classes": int(classes)}
        if model == "inception_v3":
            kwargs.update(aux_logits=False, init_weights=False)
        return (
            getattr(torchvision.models, model)(**kwargs),
            tuple(int(s) for s in shape.split("x")),
            int(batch),
            int(classes),
        )
    if name not in WORKLOADS:
        raise SystemExit(f"workloads.py: unknown workload {name!r} (known: {', '.join(WORKLOADS)}, tv:...)")
    builder, shape, batch, classes = WORKLOADS[name]
    return builder(classes=classes), shape, batch, classes


def main(argv: List[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workload")
    ap.add_argument("--warmup-s", type=float, default=4.0)
    ap.add_argument("--measure-s", type=float, default=15.0)
    ap.add_argument("--steps", type=int, default=0, help="fixed work: this many steps after 5 warm-up steps")
    ap.add_argument("--ballast-mib", type=int, default=0)
    ap.add_argument("--tag", default="")
    ap.add_argument("--cudnn-benchmark", type=int, choices=(0, 1), default=1,
                    help="cuDNN autotuning in the warm-up steps (1, default); 0 skips its start-up cost")
    a = ap.parse_args(argv)
    t_launch = time.time()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cudnn.benchmark = bool(a.cudnn_benchmark)
    model, shape, batch, classes = build(a.workload)
    model = model.to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    g = torch.Generator(device=dev).manual_seed(0)
    xs = [torch.randn((batch, *shape), device=dev, generator=g) for _ in range(4)]
    ys = [torch.randint(0, classes, (batch,), device=dev, generator=g) for _ in range(4)]
    ballast = torch.empty(a.ballast_mib * 2**20, dtype=torch.uint8, device=dev) if a.ballast_mib > 0 else None

    def step(i: int) -> None:
        opt.zero_grad(set_to_none=True)
        out = model(xs[i % 4])
        if not isinstance(out, torch.Tensor):  # GoogLeNet / Inception in training mode: (logits, aux...)
            out = out.logits if hasattr(out, "logits") else out[0]
        loss = loss_fn(out, ys[i % 4])
        loss.backward()
        opt.step()

    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    i = 0
    t_ready = time.time()
    warm_end = t_ready + a.warmup_s if not a.steps else 0.0
    while (a.steps and i < 5) or (not a.steps and time.time() < warm_end):
        step(i)
        i += 1
    sync()
    t0 = time.time()
    timeline: List[List[float]] = [[t0, 0]]
    n = 0
    last_mark = t0
    end = t0 + a.measure_s
    while (n < a.steps) if a.steps else (time.time() < end):
        step(i)
        i += 1
        n += 1
        if n % 10 == 0:
            now = time.time()
            if now - last_mark >= 0.5:
                sync()
                now = time.time()
                timeline.append([now, n * batch])
                last_mark = now
    sync()
    t1 = time.time()
    timeline.append([t1, n * batch])
    peak = torch.cuda.max_memory_reserved() / 2**20 if dev.type == "cuda" else None
    rec = {
        "workload": a.workload,
        "tag": a.tag,
        "job_id": os.environ.get("SLURM_JOB_ID"),
        "user": os.environ.get("USER"),
        "device": str(dev),
        "batch": batch,
        "steps": n,
        "samples_per_s": n * batch / (t1 - t0),
        "t_launch": t_launch,
        "t_ready": t_ready,
        "t0": t0,
        "t1": t1,
        "peak_reserved_mib": peak,
        "ballast_mib": a.ballast_mib,
        "env": {
            k: os.environ.get(k)
            for k in (
                "CUDA_VISIBLE_DEVICES",
                "CUDA_MPS_PIPE_DIRECTORY",
                "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
                "COLOC_SHARE",
                "SLURM_SHARDS_ON_NODE",
                "LD_LIBRARY_PATH",
            )
        },
        "timeline": [[round(t, 3), s] for t, s in timeline],
    }
    print("COLOC_BENCH " + json.dumps(rec), flush=True)
    del ballast
    return 0


if __name__ == "__main__":
    sys.exit(main())
