"""GPU memory a one-process NCCL group adds outside PyTorch's caching allocator (device benchmark).

A job that calls ``init_process_group("nccl")`` (``torchrun`` scripts, DDP on one GPU) gets an NCCL communicator at
its first collective: NCCL's buffers are ``cudaMalloc``/``cuMem`` allocations that NVML counts for the process and
``torch.cuda.memory_reserved`` does not. The probe runs such scripts in a one-process gloo group, so its traced
peak misses them. This measures them: per model, the process's NVML memory minus the allocator's reserved bytes
(the non-allocator part: CUDA context, libraries, NCCL) after the first CUDA op, after a training step without a
process group, and after a DDP training step in a one-process NCCL group (rank 0 of 1, TCP store on
127.0.0.1). Run each case in its own process (``--case``); without it, runs every case and prints a table.

Usage (GPU machine): ``/opt/torch/.venv/bin/python3 benchmarks/device/nccl_overhead.py [--out FILE.json]``.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
from typing import Any, Dict, List

MIB = 2 ** 20
MODELS = ("linear", "resnet18", "resnet50")
CASES = [(m, ddp) for m in MODELS for ddp in (False, True)]


def nvml_process_mib() -> float:
    """This process's used GPU memory (MiB) as NVML reports it (``nvidia-smi --query-compute-apps``)."""
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        pid, mib = (x.strip() for x in line.split(","))
        if int(pid) == os.getpid():
            return float(mib)
    return float("nan")


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_case(model_name: str, ddp: bool) -> Dict[str, Any]:
    """One case in this process: the non-allocator MiB at each stage (module docstring)."""
    import torch
    import torchvision

    dev = torch.device("cuda", 0)
    torch.ones(1, device=dev)
    torch.cuda.synchronize()
    row: Dict[str, Any] = {"model": model_name, "ddp_nccl": ddp, "torch": torch.__version__,
                           "nccl": ".".join(map(str, torch.cuda.nccl.version()))}
    row["context_mib"] = nvml_process_mib() - torch.cuda.memory_reserved() / MIB
    if model_name == "linear":
        model: Any = torch.nn.Linear(20, 1).to(dev)
        x, y = torch.randn(32, 20, device=dev), torch.randn(32, 1, device=dev)
        loss_fn: Any = torch.nn.MSELoss()
    else:
        model = getattr(torchvision.models, model_name)(num_classes=100).to(dev)
        x, y = torch.randn(32, 3, 64, 64, device=dev), torch.randint(0, 100, (32,), device=dev)
        loss_fn = torch.nn.CrossEntropyLoss()
    if ddp:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1,
                                device_id=dev)
        model = DistributedDataParallel(model, device_ids=[0])
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(3):
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
    torch.cuda.synchronize()
    row["reserved_mib"] = torch.cuda.memory_reserved() / MIB
    row["nvml_mib"] = nvml_process_mib()
    row["outside_allocator_mib"] = row["nvml_mib"] - row["reserved_mib"]
    if ddp:
        import torch.distributed as dist

        dist.destroy_process_group()
    return row


def main(argv: List[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", help="MODEL:0|1 (one case, JSON line on stdout)")
    ap.add_argument("--out", help="write the rows as JSON here")
    a = ap.parse_args(argv)
    if a.case:
        m, d = a.case.split(":")
        print(json.dumps(run_case(m, d == "1")))
        return 0
    rows = []
    for m, ddp in CASES:
        p = subprocess.run([sys.executable, __file__, "--case", f"{m}:{int(ddp)}"], capture_output=True, text=True,
                           timeout=180)
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
        rows.append(json.loads(lines[-1]) if lines else {"model": m, "ddp_nccl": ddp, "error": p.stderr[-400:]})
    print("| model | NCCL group + DDP | context MiB | reserved MiB | NVML MiB | outside the allocator MiB |")
    print("|---|---|---:|---:|---:|---:|")
    for r in rows:
        if "error" in r:
            print(f"| {r['model']} | {r['ddp_nccl']} | error: {r['error'].splitlines()[-1] if r['error'] else ''} |")
            continue
        print(f"| {r['model']} | {'yes' if r['ddp_nccl'] else 'no'} | {r['context_mib']:.0f} | {r['reserved_mib']:.0f} "
              f"| {r['nvml_mib']:.0f} | {r['outside_allocator_mib']:.0f} |")
    if rows and "torch" in rows[0]:
        print(f"\ntorch {rows[0]['torch']}, NCCL {rows[0]['nccl']}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
