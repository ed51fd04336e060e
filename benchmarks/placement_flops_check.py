"""Do the estimator trace's FLOPs agree with those measured on the GPU? (CPU only, no GPU.)

For each workload of the placement profile (``placement_bench.json``, ``profile``: FLOPs of one training step
counted by ``torch.utils.flop_counter.FlopCounterMode`` on the H100, ``benchmarks/device/pile_workloads.py``),
trace the same model, batch and input with the ``#COLOC model=`` estimator (``estimate.trace.trace_spec``: meta
tensors, fp32, SGD with momentum as the profile) and print a table: workload, trace GFLOP/step, profile
GFLOP/step, their ratio. ``--memory`` also traces each workload without FLOP counting and says whether the
replayed peaks (allocated, reserved) are the same.

Usage::

    .venv/bin/python -m benchmarks.placement_flops_check [--profile PATH] [--memory] [--only NAME ...]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, List

HERE = os.path.dirname(os.path.abspath(__file__))
DEVICE_DIR = os.path.join(HERE, "device")
DEFAULT_PROFILE = os.path.join(DEVICE_DIR, "results", "h100-placement-profile", "placement_bench.json")


def workload_model(name: str) -> Any:
    """``#COLOC model=`` target: the model of workload ``name`` (``benchmarks/device/workloads.py``)."""
    from benchmarks.device import workloads

    return workloads.build(name)[0]


def main(argv: List[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default=DEFAULT_PROFILE)
    ap.add_argument("--memory", action="store_true", help="also check that FLOP counting leaves the peaks alone")
    ap.add_argument("--only", nargs="*", default=None, help="workload names to check (default: all)")
    a = ap.parse_args(argv)
    from slurm_coloc.estimate.spec import ModelSpec
    from slurm_coloc.estimate.trace import trace_spec

    with open(a.profile, encoding="utf-8") as fh:
        profile = json.load(fh)["profile"]
    head = f"{'workload':<26} {'trace GFLOP':>12} {'profile GFLOP':>14} {'ratio':>6} {'trace_s':>8}"
    print(head + ("  memory unchanged" if a.memory else ""))
    worst = 1.0
    for name, row in profile.items():
        if a.only and name not in a.only:
            continue
        spec = ModelSpec(model=f"{os.path.abspath(__file__)}:workload_model", kwargs={"name": name},
                         input_shape=tuple(row["input_shape"]), batch_size=int(row["batch"]),
                         optimizer="sgd-momentum", precision="fp32")
        t0 = time.perf_counter()
        res = trace_spec(spec)
        wall_s = time.perf_counter() - t0
        gflop = res.flops_per_step / 1e9 if res.flops_per_step is not None else float("nan")
        prof = row.get("gflop_per_step")
        ratio = gflop / prof if prof else float("nan")
        if prof:
            worst = max(worst, ratio, 1 / ratio if ratio > 0 else float("inf"))
        line = f"{name:<26} {gflop:>12.2f} {prof if prof is not None else float('nan'):>14.2f} {ratio:>6.3f} " \
               f"{wall_s:>8.1f}"
        if a.memory:
            plain = trace_spec(spec, count_flops=False)
            same = (plain.peak_allocated_b, plain.peak_reserved_b) == (res.peak_allocated_b, res.peak_reserved_b)
            line += f"  {'yes' if same else 'NO'} ({res.peak_reserved_b / 2**20:.0f} MiB reserved)"
        print(line, flush=True)
    print(f"largest disagreement: x{worst:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
