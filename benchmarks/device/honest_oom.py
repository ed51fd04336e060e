"""A job of the honest-rerun GPU test (tests/gpu/test_honest_rerun.py): an honest training job whose memory outgrows
a 2 GiB grant in one of four patterns (issue 31, "the lost rerun"). One JSON line per event on stdout; the CUDA
OOM is PyTorch's own (``torch.OutOfMemoryError: CUDA out of memory. Tried to allocate ...``), left uncaught, so
the job fails with PyTorch's traceback on stderr exactly as a user's job does.

Patterns (each needs about ``--need-gib`` GiB, more than the grant, much less than a GPU):
  one-alloc   CUDA context, then the first step allocates ``--need-gib`` GiB in ONE call (it fails at once under
              the fence: the sampler never sees memory near the grant).
  gradual     every training step keeps 128 MiB more (activations of a growing sequence) up to ``--need-gib``.
  mid-peak    1 GiB held while training; half-way, one step needs ``--need-gib`` - 1 GiB more for a moment.
  eval-peak   0.8 GiB held while training; the evaluation pass at the end needs ``--need-gib`` - 0.8 GiB more.
On a whole GPU (the rerun) every pattern completes and prints ``{"ev": "done", "ok": true}``.

``--cpu-check`` (the CPU check of the Slurm parts, fake GPUs, no torch): the job compares ``--need-gib`` with its
``SLURM_SHARDS_ON_NODE`` GiB and prints PyTorch's message for the allocation that would fail, then exits 1, or
prints ``done``. It checks the plumbing only (no CUDA, no MPS fence, no sampler evidence).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

GIB = 1 << 30
MIB = 1 << 20


def say(**kw: object) -> None:
    kw["t"] = time.time()
    kw["pid"] = os.getpid()
    print(json.dumps(kw), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("pattern", choices=("one-alloc", "gradual", "mid-peak", "eval-peak"))
    ap.add_argument("--need-gib", type=float, default=4.0)
    ap.add_argument("--train-s", type=float, default=6.0)
    ap.add_argument("--cpu-check", action="store_true")
    a = ap.parse_args()
    say(ev="start", pattern=a.pattern, env={k: v for k, v in os.environ.items()
                                            if k.startswith(("CUDA_", "COLOC_", "SLURM_SHARDS"))})
    if a.cpu_check:
        return cpu_check(a)
    import torch

    dev = torch.device("cuda")
    torch.zeros(1, device=dev)
    torch.cuda.synchronize()
    say(ev="ctx")
    x = torch.randn(1024, 1024, device=dev)

    def step(n: int = 1) -> None:
        for _ in range(n):
            x @ x
        torch.cuda.synchronize()

    keep = []
    if a.pattern == "one-alloc":
        keep.append(torch.empty(int(a.need_gib * GIB), dtype=torch.uint8, device=dev))  # the first step's tensor
        step(20)
    elif a.pattern == "gradual":
        held = 0
        while held < a.need_gib * GIB:
            keep.append(torch.empty(128 * MIB, dtype=torch.uint8, device=dev))
            held += 128 * MIB
            step(5)
            time.sleep(0.5)  # one training step: the sampler (0.5 s, 0.1 s near the grant) sees each
            say(ev="held", gib=round(held / GIB, 3))
    else:
        base_gib = 1.0 if a.pattern == "mid-peak" else 0.8
        keep.append(torch.empty(int(base_gib * GIB), dtype=torch.uint8, device=dev))
        t0 = time.time()
        peak_at = a.train_s / 2 if a.pattern == "mid-peak" else a.train_s
        while time.time() - t0 < peak_at:
            step(5)
            time.sleep(0.05)
        say(ev="peak", extra_gib=a.need_gib - base_gib)
        tmp = torch.empty(int((a.need_gib - base_gib) * GIB), dtype=torch.uint8, device=dev)
        step(5)
        del tmp
        torch.cuda.empty_cache()
        while time.time() - t0 < a.train_s:
            step(5)
            time.sleep(0.05)
    say(ev="done", ok=True, max_reserved_gib=round(torch.cuda.max_memory_reserved() / GIB, 3))
    return 0


def cpu_check(a: argparse.Namespace) -> int:
    """The Slurm parts alone (module docstring): fail as PyTorch would under a grant of SLURM_SHARDS_ON_NODE GiB."""
    have = float(os.environ.get("SLURM_SHARDS_ON_NODE") or 0)
    if have >= a.need_gib:
        say(ev="done", ok=True, max_reserved_gib=a.need_gib)
        return 0
    tried = {"one-alloc": a.need_gib, "gradual": 0.125, "mid-peak": a.need_gib - 1.0,
             "eval-peak": a.need_gib - 0.8}[a.pattern]
    print(f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {tried:.2f} GiB. GPU 0 has a total "
          f"capacity of {have:.2f} GiB of which 0 bytes is free.", file=sys.stderr, flush=True)
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
