#!/usr/bin/env python3
"""Device probe (issue 4): CPU cost and agreement of the two ways to read the GPU energy counter
(nvmlDeviceGetTotalEnergyConsumption vs nvmlDeviceGetFieldValues(NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION)), and of
process utilization, while a torch process runs. Prints JSON.

H100, 2026-11-23: both ways cost 3-5 ms of CPU per read (the same driver path) and agree (20 of 20 field reads
between two direct reads), so the field API is no cheaper: the energy counter stays a direct read.

    python3 benchmarks/device/nvml_energy_probe.py
"""
import json, statistics, subprocess, sys, time
sys.path.insert(0, __import__("os").path.dirname(__file__))
from nvml_call_cost import TRAIN, cost  # noqa: E402
import pynvml as nv  # noqa: E402

trainer = subprocess.Popen([sys.executable, "-c", TRAIN, "600"], stdout=subprocess.PIPE, text=True)
assert "READY" in trainer.stdout.readline()
time.sleep(2)
try:
    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(0)
    F = nv.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION
    out = {"direct": cost(lambda: nv.nvmlDeviceGetTotalEnergyConsumption(h), 40, 0.105),
           "fieldvalues": cost(lambda: nv.nvmlDeviceGetFieldValues(h, [F]), 40, 0.105),
           "fieldvalues_at_1hz_gap": cost(lambda: nv.nvmlDeviceGetFieldValues(h, [F]), 5, 1.0),
           "direct_at_1hz_gap": cost(lambda: nv.nvmlDeviceGetTotalEnergyConsumption(h), 5, 1.0)}
    pairs = []
    for _ in range(20):
        time.sleep(0.1)
        a = nv.nvmlDeviceGetTotalEnergyConsumption(h)
        fv = nv.nvmlDeviceGetFieldValues(h, [F])[0]
        b = nv.nvmlDeviceGetTotalEnergyConsumption(h)
        pairs.append((a, fv.value.ullVal, b, fv.nvmlReturn, fv.timestamp, fv.latencyUsec))
    out["pairs_direct_fv_direct_ret_ts_lat"] = pairs
    out["fv_between_directs"] = sum(1 for a, f, b, *_ in pairs if a <= f <= b)
finally:
    trainer.kill()
print(json.dumps(out))
