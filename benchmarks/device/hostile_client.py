"""A job of the hostile-tenant GPU test (tests/gpu/test_hostile_tenant.py): one JSON line per event on stdout.

Modes:
  neighbour  honest: holds ``--hold-gib`` GiB and runs a 4096x4096 matmul loop for ``--train-s`` s, printing its
             rate every 0.25 s (``{"ev": "rate", "t", "it"}``), then ``{"ev": "done", "ok": ...}``.
  raise      the job raised its own ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` (in its script) and allocates
             ``--alloc-gib`` GiB in 1 GiB steps, printing ``{"ev": "alloc", "t", "gib", "ok"}`` for each; then holds.
  escape     the job unset ``CUDA_MPS_PIPE_DIRECTORY`` (in its script): a context outside MPS; allocates
             ``--alloc-gib`` GiB at once, then holds.
With ``COLOC_HOSTILE_CPU=1`` (the CPU check of the Slurm parts) it prints its environment and sleeps: no torch.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

GIB = 1 << 30


def say(**kw: object) -> None:
    kw["t"] = time.time()
    kw["pid"] = os.getpid()
    print(json.dumps(kw), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=("neighbour", "raise", "escape"))
    ap.add_argument("--hold-gib", type=float, default=6.0)
    ap.add_argument("--alloc-gib", type=int, default=20)
    ap.add_argument("--train-s", type=float, default=40.0)
    ap.add_argument("--hold-s", type=float, default=60.0)
    a = ap.parse_args()
    say(ev="start", mode=a.mode, env={k: v for k, v in os.environ.items() if k.startswith(("CUDA_", "COLOC_"))})
    if os.environ.get("COLOC_HOSTILE_CPU") == "1":
        time.sleep(a.hold_s)
        return 0
    import torch
    say(ev="cuda_init")  # the CUDA context is created next: from here the process can appear on the GPU
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    say(ev="ctx")
    keep = []
    if a.mode == "neighbour":
        keep.append(torch.empty(int(a.hold_gib * GIB), dtype=torch.uint8, device="cuda"))
        x = torch.randn(4096, 4096, device="cuda")
        y = torch.randn(4096, 4096, device="cuda")
        t0 = last = time.time()
        n = 0
        try:
            while time.time() - t0 < a.train_s:
                x @ y
                n += 1
                if n % 20 == 0:
                    torch.cuda.synchronize()
                    if time.time() - last >= 0.25:
                        say(ev="rate", it=n)
                        last = time.time()
            torch.cuda.synchronize()
            say(ev="done", ok=True, it=n)
        except Exception as exc:  # noqa: BLE001 - an OOM here is what the test must never see
            say(ev="done", ok=False, err=str(exc)[:300])
            return 1
        return 0
    steps = [1] * a.alloc_gib if a.mode == "raise" else [a.alloc_gib]
    for g in steps:
        try:
            keep.append(torch.empty(g * GIB, dtype=torch.uint8, device="cuda"))
            torch.cuda.synchronize()
            say(ev="alloc", gib=g, total_gib=sum(int(k.numel()) for k in keep) / GIB, ok=True)
        except Exception as exc:  # noqa: BLE001 - the MPS ceiling refusing: record and hold what we have
            say(ev="alloc", gib=g, ok=False, err=type(exc).__name__)
            break
    time.sleep(a.hold_s)
    say(ev="exit")
    return 0


if __name__ == "__main__":
    sys.exit(main())
