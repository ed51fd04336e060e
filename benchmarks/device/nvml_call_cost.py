#!/usr/bin/env python3
"""CPU cost of each NVML call the sampler makes, on the GPU machine, while one torch process trains (issue 4).

Device-side script (may import pynvml, see docs/design.md). For each call: CPU time of the calling process
(``time.process_time``: user + system, so the driver's ioctls count) and wall time, per call, over ``--n`` calls
spaced ``--gap-s`` apart; then the same for a whole ``NvmlReader.read()``. Prints one JSON object.

    python3 -m benchmarks.device.nvml_call_cost --n 100 --out $OUT/nvml_call_cost.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List

TRAIN = r"""
import time, torch
m = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(8)]).cuda()
x = torch.randn(256, 4096, device="cuda")
opt = torch.optim.SGD(m.parameters(), lr=1e-3)
print("READY", flush=True)
t0 = time.time()
while time.time() - t0 < float(__import__("sys").argv[1]):
    opt.zero_grad(); m(x).sum().backward(); opt.step(); torch.cuda.synchronize()
"""


def cost(fn: Callable[[], Any], n: int, gap_s: float) -> Dict[str, float]:
    """Median/mean CPU and wall ms of ``fn`` over ``n`` calls."""
    cpu: List[float] = []
    wall: List[float] = []
    for _ in range(n):
        time.sleep(gap_s)
        c0, w0 = time.process_time(), time.perf_counter()
        try:
            fn()
        except Exception:  # noqa: BLE001 - NOT_FOUND etc. still cost time
            pass
        cpu.append((time.process_time() - c0) * 1000)
        wall.append((time.perf_counter() - w0) * 1000)
    return {"cpu_ms_mean": round(statistics.mean(cpu), 4), "cpu_ms_median": round(statistics.median(cpu), 4),
            "wall_ms_median": round(statistics.median(wall), 4)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--gap-s", type=float, default=0.11)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    trainer = subprocess.Popen([sys.executable, "-c", TRAIN, "600"], stdout=subprocess.PIPE, text=True)
    assert trainer.stdout is not None and "READY" in trainer.stdout.readline()
    time.sleep(3)
    try:
        import pynvml as nv

        from slurm_coloc.nvml import NvmlReader
        nv.nvmlInit()
        h = nv.nvmlDeviceGetHandleByIndex(0)
        s1, s2 = nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()
        last = [int((time.time() - 2) * 1e6)]

        def putil() -> None:
            r = nv.nvmlDeviceGetProcessUtilization(h, last[0])
            last[0] = max([last[0]] + [int(s.timeStamp) for s in r])

        calls: Dict[str, Callable[[], Any]] = {
            "utilization": lambda: nv.nvmlDeviceGetUtilizationRates(h),
            "memory": lambda: nv.nvmlDeviceGetMemoryInfo(h),
            "power": lambda: nv.nvmlDeviceGetPowerUsage(h),
            "energy": lambda: nv.nvmlDeviceGetTotalEnergyConsumption(h),
            "temperature": lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
            "sm_clock": lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
            "compute_processes": lambda: nv.nvmlDeviceGetComputeRunningProcesses(h),
            "mps_processes": lambda: nv.nvmlDeviceGetMPSComputeRunningProcesses(h),
            "process_utilization": putil,
            "gpm_sample_get": lambda: nv.nvmlGpmSampleGet(h, s1),
            "uuid": lambda: nv.nvmlDeviceGetUUID(h),
            "name": lambda: nv.nvmlDeviceGetName(h),
        }
        out: Dict[str, Any] = {"procs_seen": len(nv.nvmlDeviceGetComputeRunningProcesses(h))}
        for k, fn in calls.items():
            out[k] = cost(fn, a.n, a.gap_s)
        r = NvmlReader()
        r.read()
        out["NvmlReader.read"] = cost(r.read, a.n, a.gap_s)
        out["sleep_only"] = cost(lambda: None, a.n, a.gap_s)
        nv.nvmlGpmSampleFree(s1)
        nv.nvmlGpmSampleFree(s2)
    finally:
        trainer.kill()
    print(json.dumps(out, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
