"""A small torch training client for the device tests (run as a separate process, maybe as another user).

Prints one JSON line: tag, pid, seconds to the first CUDA op, training steps done, and the outcome of an
optional big allocation made after ``--alloc-after-s`` (``oom`` True when torch raised
torch.OutOfMemoryError).
"""
import argparse
import json
import os
import time

t_start = time.time()
ap = argparse.ArgumentParser()
ap.add_argument("--tag", required=True)
ap.add_argument("--seconds", type=float, default=8.0)
ap.add_argument("--alloc-gib", type=float, default=0.0)
ap.add_argument("--alloc-after-s", type=float, default=2.0)
ap.add_argument("--hold-after-alloc-s", type=float, default=0.0)
a = ap.parse_args()

import torch  # noqa: E402

out = {"tag": a.tag, "pid": os.getpid(), "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"),
       "limit": os.environ.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"), "job": os.environ.get("SLURM_JOB_ID")}
try:
    x = torch.randn(64, 2048, device="cuda")
    out["first_cuda_s"] = round(time.time() - t_start, 3)
    out["t_first_cuda"] = time.time()
    model = torch.nn.Sequential(torch.nn.Linear(2048, 2048), torch.nn.ReLU(),
                                torch.nn.Linear(2048, 2048)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    steps, allocated, big = 0, False, None
    t0 = time.time()
    while time.time() - t0 < a.seconds:
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        steps += 1
        if steps % 20 == 0:
            torch.cuda.synchronize()
        if a.alloc_gib and not allocated and time.time() - t0 >= a.alloc_after_s:
            allocated = True
            try:
                big = torch.empty(int(a.alloc_gib * 2**30), dtype=torch.uint8, device="cuda")
                big.fill_(1)
                torch.cuda.synchronize()
                out["oom"] = False
                if a.hold_after_alloc_s:
                    time.sleep(a.hold_after_alloc_s)
            except torch.OutOfMemoryError as exc:
                out["oom"] = True
                out["oom_msg"] = str(exc).splitlines()[0][:200]
                break
    torch.cuda.synchronize()
    out["steps"] = steps
    out["t_end"] = time.time()
    out["max_reserved_mib"] = round(torch.cuda.max_memory_reserved() / 2**20, 1)
except Exception as exc:  # report, do not hide
    out["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
print(json.dumps(out), flush=True)
